#include "comm/weight_sync.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "rpc/rpc_util.h"

namespace gyre::comm {

void ManifestToProto(const std::vector<model::TensorEntry>& manifest,
                     google::protobuf::RepeatedPtrField<v1::TensorSpec>* out) {
  for (const auto& e : manifest) {
    v1::TensorSpec* s = out->Add();
    s->set_name(e.name);
    for (int64_t d : e.shape) s->add_shape(d);
    s->set_dtype(e.dtype);
    s->set_offset(e.offset);
    s->set_nbytes(e.nbytes);
  }
}

std::vector<model::TensorEntry> ManifestFromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs) {
  std::vector<model::TensorEntry> manifest;
  for (const auto& s : specs) {
    model::TensorEntry e;
    e.name = s.name();
    e.shape.assign(s.shape().begin(), s.shape().end());
    e.dtype = s.dtype();
    e.offset = s.offset();
    e.nbytes = s.nbytes();
    manifest.push_back(std::move(e));
  }
  return manifest;
}

StatusOr<SendResult> SendWeights(v1::Rollout::StubInterface* stub, const WeightPayload& payload,
                                 int64_t bucket_bytes, double timeout_s, int corrupt_bucket,
                                 rpc::Cancellation* cancel) {
  if (bucket_bytes <= 0) return InvalidArgument("bucket_bytes must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t total = payload.bytes.size();
  const uint32_t num_buckets =
      static_cast<uint32_t>(std::max<uint64_t>(1, (total + bucket_bytes - 1) / bucket_bytes));
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout_s);
  // Cleared before ctx goes out of scope, on every path.
  struct HookGuard {
    rpc::Cancellation* cancel;
    ~HookGuard() {
      if (cancel) cancel->ClearHook();
    }
  } hook{cancel};
  if (cancel) cancel->SetHook([&ctx] { ctx.TryCancel(); });
  v1::WeightReceipt receipt;
  auto writer = stub->LoadWeights(&ctx, &receipt);
  SendResult result;
  for (uint32_t b = 0; b < num_buckets; ++b) {
    v1::WeightChunk chunk;
    chunk.set_version(payload.version);
    chunk.set_bucket_index(b);
    const uint64_t off = static_cast<uint64_t>(b) * bucket_bytes;
    const uint64_t n = std::min<uint64_t>(bucket_bytes, total - std::min(total, off));
    chunk.set_offset(off);
    if (b == 0) {
      chunk.set_total_bytes(total);
      chunk.set_num_buckets(num_buckets);
      ManifestToProto(payload.manifest, chunk.mutable_manifest());
    }
    const uint8_t* p = payload.bytes.data() + off;
    const uint32_t crc = model::Crc32(p, n);
    chunk.set_crc32(crc);
    chunk.set_data(p, n);
    if (static_cast<int>(b) == corrupt_bucket && n > 0) {
      (*chunk.mutable_data())[n / 2] ^= 0x5a;
    }
    result.sent_crc32.push_back(crc);
    if (!writer->Write(chunk)) break;  // the receiver gave up; Finish() says why
  }
  writer->WritesDone();
  GYRE_RETURN_IF_ERROR(rpc::FromGrpc(writer->Finish(), "weight transfer"));
  if (receipt.version() != payload.version) {
    return DataLoss("receipt is for version " + std::to_string(receipt.version()) +
                    ", sent version " + std::to_string(payload.version));
  }
  if (static_cast<size_t>(receipt.bucket_crc32_size()) != result.sent_crc32.size()) {
    return DataLoss("receipt lists " + std::to_string(receipt.bucket_crc32_size()) +
                    " buckets, sent " + std::to_string(result.sent_crc32.size()));
  }
  for (size_t b = 0; b < result.sent_crc32.size(); ++b) {
    if (receipt.bucket_crc32(static_cast<int>(b)) != result.sent_crc32[b]) {
      return DataLoss("bucket " + std::to_string(b) + " checksum mismatch in the receipt");
    }
  }
  result.receipt = receipt;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

Status ReceiveWeightStream(grpc::ServerReaderInterface<v1::WeightChunk>* reader,
                           WeightPayload* payload, v1::WeightReceipt* receipt,
                           uint64_t max_total_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  v1::WeightChunk chunk;
  if (!reader->Read(&chunk)) return InvalidArgument("weight transfer carried no chunks");
  const int64_t version = chunk.version();
  const uint64_t total = chunk.total_bytes();
  const uint32_t num_buckets = chunk.num_buckets();
  if (num_buckets == 0) return InvalidArgument("first weight chunk has num_buckets = 0");
  // The buffer is sized from the sender's word: never beyond what this receiver can take, and
  // never with more buckets than bytes (each bucket but an empty payload's carries some).
  if (total > max_total_bytes) {
    return InvalidArgument("weight transfer of version " + std::to_string(version) + " declares " +
                           std::to_string(total) + " bytes, more than the " +
                           std::to_string(max_total_bytes) + " this receiver accepts");
  }
  if (num_buckets > std::max<uint64_t>(1, total)) {
    return InvalidArgument("weight transfer of version " + std::to_string(version) + " declares " +
                           std::to_string(num_buckets) + " buckets for " + std::to_string(total) +
                           " bytes");
  }
  std::vector<model::TensorEntry> manifest = ManifestFromProto(chunk.manifest());
  std::vector<uint8_t>& buffer = payload->bytes;
  buffer.resize(total);
  std::vector<uint32_t> crcs;
  uint64_t received = 0;
  Status error;
  do {
    if (!error.ok()) continue;  // drain the stream so the sender sees our status
    if (chunk.version() != version) {
      error = InvalidArgument("chunk for version " + std::to_string(chunk.version()) +
                              " inside a transfer of version " + std::to_string(version));
      continue;
    }
    if (chunk.bucket_index() != crcs.size()) {
      error =
          InvalidArgument("bucket " + std::to_string(chunk.bucket_index()) +
                          " arrived out of order (expected " + std::to_string(crcs.size()) + ")");
      continue;
    }
    const std::string& data = chunk.data();
    if (chunk.offset() > total || data.size() > total - chunk.offset()) {
      error = InvalidArgument("bucket " + std::to_string(chunk.bucket_index()) +
                              " lies outside the payload");
      continue;
    }
    // Buckets tile the payload in order: each starts where the previous one ended, so every
    // byte is written exactly once (two buckets at offset 0 would leave a hole unwritten).
    if (chunk.offset() != received) {
      error = InvalidArgument("bucket " + std::to_string(chunk.bucket_index()) +
                              " starts at byte " + std::to_string(chunk.offset()) + ", expected " +
                              std::to_string(received) + " (buckets must cover the payload " +
                              "contiguously)");
      continue;
    }
    if (data.empty() && total > 0) {
      error = InvalidArgument("bucket " + std::to_string(chunk.bucket_index()) + " is empty");
      continue;
    }
    const uint32_t crc = model::Crc32(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    if (crc != chunk.crc32()) {
      error = DataLoss("bucket " + std::to_string(chunk.bucket_index()) + " of version " +
                       std::to_string(version) + " failed its CRC-32 check");
      continue;
    }
    std::copy(data.begin(), data.end(), buffer.begin() + static_cast<int64_t>(chunk.offset()));
    received += data.size();
    crcs.push_back(crc);
  } while (reader->Read(&chunk));
  GYRE_RETURN_IF_ERROR(error);
  if (crcs.size() != num_buckets || received != total) {
    return DataLoss("weight transfer of version " + std::to_string(version) + " ended after " +
                    std::to_string(crcs.size()) + " of " + std::to_string(num_buckets) +
                    " buckets");
  }
  payload->version = version;
  payload->manifest = std::move(manifest);
  receipt->set_version(version);
  for (uint32_t c : crcs) receipt->add_bucket_crc32(c);
  receipt->set_bytes(total);
  receipt->set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

Status ReceiveWeights(grpc::ServerReaderInterface<v1::WeightChunk>* reader,
                      const model::NamedTensors& params, v1::WeightReceipt* receipt) {
  uint64_t expected = 0;
  for (const auto& [name, t] : params) expected += static_cast<uint64_t>(t.nbytes());
  WeightPayload payload;
  GYRE_RETURN_IF_ERROR(ReceiveWeightStream(reader, &payload, receipt, expected));
  return model::LoadFlatParameters(payload.manifest, payload.bytes.data(), payload.bytes.size(),
                                   params)
      .WithContext("weights of version " + std::to_string(payload.version));
}

void SendToEach(const WeightPayload& payload,
                const google::protobuf::RepeatedPtrField<std::string>& addresses,
                const google::protobuf::RepeatedPtrField<std::string>& ids, int64_t bucket_bytes,
                double timeout_s, v1::PublishWeightsResponse* resp,
                const std::vector<rpc::Cancellation*>* cancels) {
  std::vector<std::future<StatusOr<SendResult>>> futures;
  for (int i = 0; i < addresses.size(); ++i) {
    rpc::Cancellation* cancel =
        cancels != nullptr && static_cast<size_t>(i) < cancels->size() ? (*cancels)[i] : nullptr;
    futures.push_back(std::async(std::launch::async, [&payload, address = addresses.Get(i),
                                                      bucket_bytes, timeout_s, cancel] {
      auto stub = v1::Rollout::NewStub(rpc::MakeChannel(address));
      return SendWeights(stub.get(), payload, bucket_bytes, timeout_s, -1, cancel);
    }));
  }
  for (int i = 0; i < addresses.size(); ++i) {
    auto r = futures[static_cast<size_t>(i)].get();
    v1::PublishResult* pr = resp->add_results();
    pr->set_rollout_id(i < ids.size() ? ids.Get(i) : "");
    pr->set_ok(r.ok());
    if (r.ok()) {
      *pr->mutable_receipt() = r->receipt;
      for (uint32_t c : r->sent_crc32) pr->add_sent_crc32(c);
    } else {
      pr->set_error(r.status().ToString());
    }
  }
}

}  // namespace gyre::comm
