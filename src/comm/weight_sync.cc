#include "comm/weight_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>
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

PayloadStream::PayloadStream(uint64_t total, std::vector<uint64_t> starts, Producer produce,
                             int readers, uint64_t max_held_bytes, double patience_s)
    : total_(total),
      starts_(std::move(starts)),
      produce_(std::move(produce)),
      max_held_(max_held_bytes),
      patience_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(patience_s))),
      position_(static_cast<size_t>(std::max(0, readers)), 0),
      active_(static_cast<size_t>(std::max(0, readers)), true),
      moved_at_(static_cast<size_t>(std::max(0, readers)), std::chrono::steady_clock::now()) {}

Status PayloadStream::ProduceThrough(uint64_t last) {
  while (error_.ok() && next_ < starts_.size() && starts_[next_] <= last) {
    const size_t index = next_++;
    const uint64_t end = PieceEnd(index);
    std::vector<uint8_t> bytes;
    try {
      error_ = produce_(index, &bytes);
    } catch (const std::exception& e) {
      error_ = Internal("weight payload piece " + std::to_string(index) + ": " + e.what());
    }
    if (error_.ok() && bytes.size() != end - starts_[index]) {
      error_ = Internal("weight payload piece " + std::to_string(index) + " has " +
                        std::to_string(bytes.size()) + " bytes, expected " +
                        std::to_string(end - starts_[index]));
    }
    if (!error_.ok()) break;
    held_ += bytes.size();
    peak_ = std::max(peak_, held_);
    pieces_.emplace(index, std::move(bytes));
  }
  return error_;
}

void PayloadStream::DropPassed() {
  uint64_t low = total_;
  for (size_t r = 0; r < position_.size(); ++r) {
    if (active_[r]) low = std::min(low, position_[r]);
  }
  for (auto it = pieces_.begin(); it != pieces_.end();) {
    if (PieceEnd(it->first) > low) break;
    held_ -= it->second.size();
    it = pieces_.erase(it);
  }
}

bool PayloadStream::SomeReaderBehind(int reader,
                                     std::chrono::steady_clock::time_point* until) const {
  const uint64_t mine = position_[static_cast<size_t>(reader)];
  const auto now = std::chrono::steady_clock::now();
  bool behind = false;
  for (size_t r = 0; r < position_.size(); ++r) {
    // A reader that has not moved for patience_ is not waited for.
    if (active_[r] && position_[r] < mine && now - moved_at_[r] < patience_) {
      *until = behind ? std::min(*until, moved_at_[r] + patience_) : moved_at_[r] + patience_;
      behind = true;
    }
  }
  return behind;
}

Status PayloadStream::Read(int reader, uint64_t offset, uint64_t n, uint8_t* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (reader < 0 || static_cast<size_t>(reader) >= position_.size()) {
    return InvalidArgument("weight payload stream has no reader " + std::to_string(reader));
  }
  if (offset > total_ || n > total_ - offset) {
    return InvalidArgument("read past the end of the weight payload");
  }
  if (n == 0) return Status::Ok();
  // Reads go forward: what lies before `offset` this reader will not read, and is not held for it.
  if (!started_) {  // the readers start together: none has been slow yet
    started_ = true;
    std::fill(moved_at_.begin(), moved_at_.end(), std::chrono::steady_clock::now());
  }
  uint64_t& position = position_[static_cast<size_t>(reader)];
  if (offset > position) {
    position = offset;
    moved_at_[static_cast<size_t>(reader)] = std::chrono::steady_clock::now();
    DropPassed();
    moved_.notify_all();
  }
  const uint64_t last = offset + n - 1;
  while (error_.ok() && next_ < starts_.size() && starts_[next_] <= last) {
    const uint64_t next_bytes = PieceEnd(next_) - starts_[next_];
    std::chrono::steady_clock::time_point until;
    if (max_held_ > 0 && !pieces_.empty() && held_ + next_bytes > max_held_ &&
        SomeReaderBehind(reader, &until)) {
      moved_.wait_until(lock, until);
      continue;
    }
    if (!ProduceThrough(starts_[next_]).ok()) break;
    DropPassed();  // a piece every reader skips goes at once
  }
  if (!error_.ok()) {
    moved_.notify_all();  // the readers waiting fail now
    return error_;
  }
  uint64_t done = 0;
  while (done < n) {
    const uint64_t at = offset + done;
    // The piece holding byte `at`: the last start <= at.
    const size_t index = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), at) -
                                             starts_.begin() - 1);
    auto it = pieces_.find(index);
    if (it == pieces_.end()) {
      return FailedPrecondition("weight payload byte " + std::to_string(at) +
                                " was dropped before reader " + std::to_string(reader) +
                                " read it");
    }
    const uint64_t in_piece = at - starts_[index];
    const uint64_t k = std::min<uint64_t>(n - done, it->second.size() - in_piece);
    std::memcpy(out + done, it->second.data() + in_piece, k);
    done += k;
  }
  position = offset + n;
  moved_at_[static_cast<size_t>(reader)] = std::chrono::steady_clock::now();
  DropPassed();
  moved_.notify_all();
  return Status::Ok();
}

void PayloadStream::Finish(int reader) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reader < 0 || static_cast<size_t>(reader) >= active_.size()) return;
  active_[static_cast<size_t>(reader)] = false;
  DropPassed();
  moved_.notify_all();
}

Status PayloadStream::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < active_.size(); ++r) active_[r] = false;
  DropPassed();
  moved_.notify_all();
  while (error_.ok() && next_ < starts_.size()) {
    GYRE_RETURN_IF_ERROR(ProduceThrough(starts_[next_]));
    DropPassed();
  }
  return error_;
}

uint64_t PayloadStream::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

StatusOr<const uint8_t*> PayloadBytes(const WeightPayload& payload, int reader, uint64_t offset,
                                      uint64_t n, std::vector<uint8_t>* scratch) {
  if (!payload.stream) return payload.bytes.data() + offset;
  scratch->resize(n);
  GYRE_RETURN_IF_ERROR(payload.stream->Read(reader, offset, n, scratch->data()));
  return static_cast<const uint8_t*>(scratch->data());
}

StatusOr<SendResult> SendWeights(v1::Rollout::StubInterface* stub, const WeightPayload& payload,
                                 int64_t bucket_bytes, double timeout_s, int corrupt_bucket,
                                 rpc::Cancellation* cancel, int reader) {
  // A streamed payload's reader stops holding pieces back on every way out.
  struct FinishGuard {
    const WeightPayload& payload;
    int reader;
    ~FinishGuard() {
      if (payload.stream) payload.stream->Finish(reader);
    }
  } finish{payload, reader};
  if (bucket_bytes <= 0) return InvalidArgument("bucket_bytes must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t total = payload.size();
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
  std::vector<uint8_t> scratch;
  Status read;
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
    StatusOr<const uint8_t*> bytes = PayloadBytes(payload, reader, off, n, &scratch);
    if (!bytes.ok()) {
      read = bytes.status();
      ctx.TryCancel();
      break;
    }
    const uint8_t* p = *bytes;
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
  const Status finished = rpc::FromGrpc(writer->Finish(), "weight transfer");
  GYRE_RETURN_IF_ERROR(read.WithContext("weight payload"));
  GYRE_RETURN_IF_ERROR(finished);
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

Status ReceiveWeightBuckets(
    grpc::ServerReaderInterface<v1::WeightChunk>* reader, v1::WeightReceipt* receipt,
    uint64_t max_total_bytes,
    const std::function<Status(int64_t version, const std::vector<model::TensorEntry>& manifest,
                               uint64_t total_bytes)>& start,
    const std::function<Status(uint64_t offset, const uint8_t* data, size_t size)>& bucket) {
  const auto t0 = std::chrono::steady_clock::now();
  v1::WeightChunk chunk;
  if (!reader->Read(&chunk)) return InvalidArgument("weight transfer carried no chunks");
  const int64_t version = chunk.version();
  const uint64_t total = chunk.total_bytes();
  const uint32_t num_buckets = chunk.num_buckets();
  if (num_buckets == 0) return InvalidArgument("first weight chunk has num_buckets = 0");
  // The receiver sizes its buffers from the sender's word: never beyond what it can take, and
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
  std::vector<uint32_t> crcs;
  uint64_t received = 0;
  Status error = start(version, ManifestFromProto(chunk.manifest()), total);
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
    const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
    const uint32_t crc = model::Crc32(bytes, data.size());
    if (crc != chunk.crc32()) {
      error = DataLoss("bucket " + std::to_string(chunk.bucket_index()) + " of version " +
                       std::to_string(version) + " failed its CRC-32 check");
      continue;
    }
    error = bucket(chunk.offset(), bytes, data.size());
    received += data.size();
    crcs.push_back(crc);
  } while (reader->Read(&chunk));
  GYRE_RETURN_IF_ERROR(error);
  if (crcs.size() != num_buckets || received != total) {
    return DataLoss("weight transfer of version " + std::to_string(version) + " ended after " +
                    std::to_string(crcs.size()) + " of " + std::to_string(num_buckets) +
                    " buckets");
  }
  receipt->set_version(version);
  for (uint32_t c : crcs) receipt->add_bucket_crc32(c);
  receipt->set_bytes(total);
  receipt->set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

Status ReceiveWeightStream(grpc::ServerReaderInterface<v1::WeightChunk>* reader,
                           WeightPayload* payload, v1::WeightReceipt* receipt,
                           uint64_t max_total_bytes) {
  std::vector<uint8_t>& buffer = payload->bytes;
  int64_t version = 0;
  std::vector<model::TensorEntry> manifest;
  GYRE_RETURN_IF_ERROR(ReceiveWeightBuckets(
      reader, receipt, max_total_bytes,
      [&](int64_t v, const std::vector<model::TensorEntry>& m, uint64_t total) {
        version = v;
        manifest = m;
        buffer.resize(total);
        return Status::Ok();
      },
      [&](uint64_t offset, const uint8_t* data, size_t size) {
        std::copy(data, data + size, buffer.begin() + static_cast<int64_t>(offset));
        return Status::Ok();
      }));
  payload->version = version;
  payload->manifest = std::move(manifest);
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
                                                      bucket_bytes, timeout_s, cancel, i] {
      auto stub = v1::Rollout::NewStub(rpc::MakeChannel(address));
      return SendWeights(stub.get(), payload, bucket_bytes, timeout_s, -1, cancel, i);
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
