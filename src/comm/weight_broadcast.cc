#include "comm/weight_broadcast.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>

#include "common/crc32.h"

namespace gyre::comm {
namespace {

constexpr char kMagic[8] = {'G', 'Y', 'R', 'E', 'W', 'T', 'S', '1'};
constexpr uint64_t kMaxManifestBytes = 64ull << 20;
constexpr uint64_t kMaxPayloadBytes = 1ull << 40;

// The fixed-size header, little-endian on every host Gyre supports (x86-64, aarch64).
struct Header {
  char magic[8];
  int64_t version;
  uint64_t total_bytes;
  int64_t bucket_bytes;
  uint64_t num_buckets;
  uint64_t manifest_bytes;
  uint64_t reserved[2];
};
static_assert(sizeof(Header) == 64, "the header is 64 bytes on the wire");

void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + 4);
}
void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + 8);
}
void PutString(std::vector<uint8_t>* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->insert(out->end(), s.begin(), s.end());
}

std::vector<uint8_t> EncodeManifest(const std::vector<model::TensorEntry>& manifest) {
  std::vector<uint8_t> out;
  PutU32(&out, static_cast<uint32_t>(manifest.size()));
  for (const auto& e : manifest) {
    PutString(&out, e.name);
    PutString(&out, e.dtype);
    PutU32(&out, static_cast<uint32_t>(e.shape.size()));
    for (int64_t d : e.shape) PutU64(&out, static_cast<uint64_t>(d));
    PutU64(&out, e.offset);
    PutU64(&out, e.nbytes);
  }
  return out;
}

// Reads the manifest; every length is checked against the bytes that remain.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool U32(uint32_t* v) { return Take(v, 4); }
  bool U64(uint64_t* v) { return Take(v, 8); }
  bool String(std::string* s) {
    uint32_t len;
    if (!U32(&len) || len > n_) return false;
    s->assign(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    n_ -= len;
    return true;
  }
  bool done() const { return n_ == 0; }

 private:
  bool Take(void* v, size_t k) {
    if (n_ < k) return false;
    std::memcpy(v, p_, k);
    p_ += k;
    n_ -= k;
    return true;
  }
  const uint8_t* p_;
  size_t n_;
};

Status DecodeManifest(const std::vector<uint8_t>& bytes, uint64_t total,
                      std::vector<model::TensorEntry>* manifest) {
  Reader r(bytes.data(), bytes.size());
  uint32_t count;
  if (!r.U32(&count)) return InvalidArgument("weight manifest is truncated");
  manifest->clear();
  for (uint32_t i = 0; i < count; ++i) {
    model::TensorEntry e;
    uint32_t ndim;
    if (!r.String(&e.name) || !r.String(&e.dtype) || !r.U32(&ndim) || ndim > 16) {
      return InvalidArgument("weight manifest entry " + std::to_string(i) + " is malformed");
    }
    for (uint32_t d = 0; d < ndim; ++d) {
      uint64_t dim;
      if (!r.U64(&dim)) return InvalidArgument("weight manifest entry " + e.name + " truncated");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!r.U64(&e.offset) || !r.U64(&e.nbytes)) {
      return InvalidArgument("weight manifest entry " + e.name + " truncated");
    }
    if (e.offset > total || e.nbytes > total - e.offset) {
      return InvalidArgument("tensor " + e.name + " lies outside the payload");
    }
    manifest->push_back(std::move(e));
  }
  if (!r.done()) return InvalidArgument("weight manifest has trailing bytes");
  return Status::Ok();
}

uint64_t BucketCount(uint64_t total, int64_t bucket_bytes) {
  return std::max<uint64_t>(1, (total + bucket_bytes - 1) / static_cast<uint64_t>(bucket_bytes));
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace {

// The root's side of one version, whatever memory the payload is in. `precomputed` holds the
// bucket checksums of a device payload (computed on its device before the header goes out);
// host payloads are checksummed bucket by bucket as they are sent.
// A streamed host payload (`streamed`, base null) is read bucket by bucket as reader `reader`.
StatusOr<PublishResult> PublishCore(Communicator* comm, int64_t version,
                                    const std::vector<model::TensorEntry>& entries, uint8_t* base,
                                    uint64_t total, int64_t bucket_bytes, Deadline deadline,
                                    const std::vector<uint32_t>* precomputed, int corrupt_bucket,
                                    const WeightPayload* streamed = nullptr, int reader = 0) {
  if (bucket_bytes <= 0) return InvalidArgument("bucket_bytes must be positive");
  if (version < 0) return InvalidArgument("policy versions are >= 0");
  const auto t0 = std::chrono::steady_clock::now();
  const int root = comm->rank();
  const uint64_t num_buckets = BucketCount(total, bucket_bytes);
  if (precomputed != nullptr && precomputed->size() != num_buckets) {
    return InvalidArgument("device checksums do not match the bucket count");
  }
  std::vector<uint8_t> manifest = EncodeManifest(entries);

  Header h = {};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = version;
  h.total_bytes = total;
  h.bucket_bytes = bucket_bytes;
  h.num_buckets = num_buckets;
  h.manifest_bytes = manifest.size();
  GYRE_RETURN_IF_ERROR(comm->Broadcast(&h, sizeof(h), root, deadline));
  GYRE_RETURN_IF_ERROR(comm->Broadcast(manifest.data(), manifest.size(), root, deadline));

  PublishResult result;
  result.version = version;
  result.bytes = total;
  result.bucket_bytes = bucket_bytes;
  result.receivers = comm->size() - 1;
  result.bucket_crc32.reserve(num_buckets);
  std::vector<uint8_t> scratch, streamed_bucket;
  for (uint64_t b = 0; b < num_buckets; ++b) {
    const uint64_t off = b * static_cast<uint64_t>(bucket_bytes);
    const uint64_t n = std::min<uint64_t>(bucket_bytes, total - std::min(total, off));
    // Collectives write into their buffer on every rank, the root's included in principle;
    // Gloo's and NCCL's broadcasts only read it on the root, so the payload is sent in place.
    // (A streamed payload has no base: its bytes come from the stream.)
    uint8_t* p = base != nullptr ? base + off : nullptr;
    if (streamed != nullptr) {
      // The receivers are waiting on this bucket's broadcast: a failed read aborts the group so
      // that they fail now rather than at the deadline.
      StatusOr<const uint8_t*> bytes = PayloadBytes(*streamed, reader, off, n, &streamed_bucket);
      if (!bytes.ok()) {
        comm->Abort();
        return bytes.status().WithContext("weight payload of version " + std::to_string(version));
      }
      p = streamed_bucket.data();
    }
    result.bucket_crc32.push_back(precomputed ? (*precomputed)[b] : Crc32(p, n));
    if (precomputed == nullptr && static_cast<int64_t>(b) == corrupt_bucket && n > 0) {
      scratch.assign(p, p + n);
      scratch[n / 2] ^= 0x5a;
      p = scratch.data();
    }
    GYRE_RETURN_IF_ERROR(
        comm->Broadcast(p, n, root, deadline)
            .WithContext("bucket " + std::to_string(b) + " of version " + std::to_string(version)));
  }
  std::vector<uint32_t> crcs = result.bucket_crc32;
  GYRE_RETURN_IF_ERROR(comm->Broadcast(crcs.data(), crcs.size() * 4, root, deadline));
  // Positive acknowledgement: each receiver adds 1 once it verified every bucket. Counting
  // confirmations rather than rejections matters: after a peer closed its connections cleanly,
  // Gloo can complete a collective without it, and a missing peer must not read as success.
  float confirmed = 0;
  GYRE_RETURN_IF_ERROR(comm->AllReduceSum(&confirmed, 1, DataType::kFloat32, deadline)
                           .WithContext("acknowledgement of version " + std::to_string(version)));
  if (confirmed != static_cast<float>(result.receivers)) {
    const int missing = result.receivers - static_cast<int>(confirmed);
    return DataLoss(std::to_string(missing) + " of " + std::to_string(result.receivers) +
                    " receivers did not confirm version " + std::to_string(version) +
                    " (a bucket checksum mismatch, or a receiver that left)");
  }
  result.seconds = Since(t0);
  return result;
}

}  // namespace

StatusOr<PublishResult> PublishWeights(Communicator* comm, const WeightPayload& payload,
                                       int64_t bucket_bytes, Deadline deadline, int corrupt_bucket,
                                       int reader) {
  StatusOr<PublishResult> r = PublishCore(
      comm, payload.version, payload.manifest,
      payload.stream ? nullptr : const_cast<uint8_t*>(payload.bytes.data()), payload.size(),
      bucket_bytes, deadline, nullptr, corrupt_bucket, payload.stream ? &payload : nullptr, reader);
  if (payload.stream) payload.stream->Finish(reader);
  return r;
}

StatusOr<PublishResult> PublishDeviceWeights(Communicator* comm, const DevicePayload& payload,
                                             int64_t bucket_bytes, Deadline deadline) {
  if (bucket_bytes <= 0) return InvalidArgument("bucket_bytes must be positive");
  GYRE_ASSIGN_OR_RETURN(auto crcs, DeviceBucketCrc32(payload.data, payload.bytes, bucket_bytes,
                                                     payload.device, deadline));
  return PublishCore(comm, payload.version, payload.manifest, static_cast<uint8_t*>(payload.data),
                     payload.bytes, bucket_bytes, deadline, &crcs, -1);
}

namespace {

// publish(group, k): the k-th of `groups`; skipped(k), when given, for a group that cannot be
// published to (so that a streamed payload's reader k stops holding the others back).
template <typename PublishFn>
std::vector<FanoutResult> FanOut(const std::vector<Communicator*>& groups, PublishFn publish,
                                 const std::function<void(int)>& skipped = nullptr) {
  std::vector<std::future<StatusOr<PublishResult>>> futures;
  for (size_t k = 0; k < groups.size(); ++k) {
    Communicator* c = groups[k];
    futures.push_back(std::async(std::launch::async, [c, k, &publish, &skipped] {
      if (c->size() != 2 || c->rank() != 0) {
        if (skipped) skipped(static_cast<int>(k));
        return StatusOr<PublishResult>(
            InvalidArgument("PublishToEach needs two-member groups with the publisher as rank 0"));
      }
      return publish(c, static_cast<int>(k));
    }));
  }
  std::vector<FanoutResult> out(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    auto r = futures[i].get();
    out[i].status = r.status();
    if (r.ok()) out[i].result = std::move(*r);
  }
  return out;
}

}  // namespace

std::vector<FanoutResult> PublishToEach(const std::vector<Communicator*>& groups,
                                        const WeightPayload& payload, int64_t bucket_bytes,
                                        Deadline deadline) {
  // Group k reads a streamed payload as reader k; a reader whose group fails to start stops
  // holding pieces back all the same (PublishWeights finishes it).
  return FanOut(
      groups,
      [&](Communicator* c, int k) {
        return PublishWeights(c, payload, bucket_bytes, deadline, -1, k);
      },
      [&](int k) {
        if (payload.stream) payload.stream->Finish(k);
      });
}

std::vector<FanoutResult> PublishEachItsOwn(const std::vector<Communicator*>& groups,
                                            const std::vector<const WeightPayload*>& payloads,
                                            int64_t bucket_bytes, Deadline deadline,
                                            const std::function<void(int)>& done) {
  if (payloads.size() != groups.size()) {
    std::vector<FanoutResult> out(groups.size());
    for (auto& r : out) r.status = InvalidArgument("one payload per group is needed");
    return out;
  }
  return FanOut(
      groups,
      [&](Communicator* c, int k) {
        auto r =
            PublishWeights(c, *payloads[static_cast<size_t>(k)], bucket_bytes, deadline, -1, 0);
        if (done) done(k);
        return r;
      },
      done);
}

std::vector<FanoutResult> PublishDeviceToEach(const std::vector<Communicator*>& groups,
                                              const DevicePayload& payload, int64_t bucket_bytes,
                                              Deadline deadline) {
  if (bucket_bytes <= 0 || groups.empty()) {
    std::vector<FanoutResult> out(groups.size());
    for (auto& r : out) r.status = InvalidArgument("bucket_bytes must be positive");
    return out;
  }
  // Checksums once, for every receiver.
  auto crcs =
      DeviceBucketCrc32(payload.data, payload.bytes, bucket_bytes, payload.device, deadline);
  if (!crcs.ok()) {
    std::vector<FanoutResult> out(groups.size());
    for (auto& r : out) r.status = crcs.status();
    return out;
  }
  return FanOut(groups, [&](Communicator* c, int) {
    return PublishCore(c, payload.version, payload.manifest, static_cast<uint8_t*>(payload.data),
                       payload.bytes, bucket_bytes, deadline, &*crcs, -1);
  });
}

Status PublishEndOfStream(Communicator* comm, Deadline deadline) {
  Header h = {};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kEndOfStream;
  return comm->Broadcast(&h, sizeof(h), comm->rank(), deadline);
}

namespace {

// The receiver's side of one version. `prepare(total, bucket)` returns where the payload goes (host
// or device memory); `device_checksums`, when set, computes every bucket's CRC-32 after the last
// bucket arrived (device payloads); host payloads are checksummed bucket by bucket. With
// `on_bucket` (host memory only), the memory prepare(total, bucket) returns need hold only
// `bucket` bytes (one bucket, at most `total`): every bucket lands at its start, handed to
// on_bucket(offset, data, size) as it arrives; after its first error on_bucket is not called again,
// the buckets are still received (the group stays in step), the root is told no and the error is
// returned.
using PrepareFn = std::function<StatusOr<uint8_t*>(uint64_t total, uint64_t bucket)>;
using ChecksumFn = std::function<StatusOr<std::vector<uint32_t>>(
    const uint8_t* base, uint64_t total, int64_t bucket_bytes)>;

StatusOr<Receipt> ReceiveCore(Communicator* comm, int root, Deadline deadline,
                              std::vector<model::TensorEntry>* manifest_out, int64_t* version_out,
                              const PrepareFn& prepare, const ChecksumFn& device_checksums,
                              const BucketFn& on_bucket = nullptr) {
  if (root == comm->rank()) return InvalidArgument("the root does not receive its own weights");
  const auto t0 = std::chrono::steady_clock::now();
  Header h = {};
  GYRE_RETURN_IF_ERROR(comm->Broadcast(&h, sizeof(h), root, deadline));
  // A header we cannot follow leaves this member out of step with the group for good.
  auto malformed = [&](const std::string& why) {
    comm->Abort();
    return InvalidArgument("weight stream header: " + why);
  };
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return malformed("bad magic");
  if (h.version == kEndOfStream) return OutOfRange("the publisher ended the weight stream");
  if (h.version < 0) return malformed("negative version " + std::to_string(h.version));
  if (h.bucket_bytes <= 0) return malformed("bucket size " + std::to_string(h.bucket_bytes));
  if (h.total_bytes > kMaxPayloadBytes) return malformed("payload too large");
  if (h.manifest_bytes > kMaxManifestBytes) return malformed("manifest too large");
  if (h.num_buckets != BucketCount(h.total_bytes, h.bucket_bytes)) {
    return malformed("bucket count does not match the sizes");
  }
  std::vector<uint8_t> manifest(h.manifest_bytes);
  GYRE_RETURN_IF_ERROR(comm->Broadcast(manifest.data(), manifest.size(), root, deadline));
  Status manifest_status = DecodeManifest(manifest, h.total_bytes, manifest_out);
  if (!manifest_status.ok()) {
    comm->Abort();
    return manifest_status;
  }
  *version_out = h.version;
  auto base = prepare(h.total_bytes, std::min<uint64_t>(h.total_bytes, h.bucket_bytes));
  if (!base.ok()) {
    // The publisher is about to send buckets this member cannot take.
    comm->Abort();
    return base.status();
  }
  Receipt receipt;
  receipt.version = h.version;
  receipt.bytes = h.total_bytes;
  receipt.bucket_crc32.reserve(h.num_buckets);
  Status sink;  // on_bucket's first error
  for (uint64_t b = 0; b < h.num_buckets; ++b) {
    const uint64_t off = b * static_cast<uint64_t>(h.bucket_bytes);
    const uint64_t n =
        std::min<uint64_t>(h.bucket_bytes, h.total_bytes - std::min(h.total_bytes, off));
    uint8_t* p = on_bucket ? *base : *base + off;
    GYRE_RETURN_IF_ERROR(comm->Broadcast(p, n, root, deadline)
                             .WithContext("bucket " + std::to_string(b) + " of version " +
                                          std::to_string(h.version)));
    if (!device_checksums) receipt.bucket_crc32.push_back(Crc32(p, n));
    if (on_bucket && sink.ok()) sink = on_bucket(off, p, n);
  }
  std::vector<uint32_t> sent(h.num_buckets);
  GYRE_RETURN_IF_ERROR(comm->Broadcast(sent.data(), sent.size() * 4, root, deadline));
  Status verdict = sink;
  if (device_checksums) {
    auto crcs = device_checksums(*base, h.total_bytes, h.bucket_bytes);
    if (crcs.ok()) {
      receipt.bucket_crc32 = std::move(*crcs);
    } else {
      verdict = crcs.status();
    }
  }
  for (uint64_t b = 0; verdict.ok() && b < h.num_buckets; ++b) {
    if (b >= receipt.bucket_crc32.size() || sent[b] != receipt.bucket_crc32[b]) {
      verdict = DataLoss("bucket " + std::to_string(b) + " of version " +
                         std::to_string(h.version) + " failed its CRC-32 check");
    }
  }
  float confirmed = verdict.ok() ? 1.0f : 0.0f;
  GYRE_RETURN_IF_ERROR(comm->AllReduceSum(&confirmed, 1, DataType::kFloat32, deadline));
  GYRE_RETURN_IF_ERROR(verdict);
  receipt.seconds = Since(t0);
  return receipt;
}

}  // namespace

StatusOr<Receipt> ReceivePublishedWeights(Communicator* comm, int root, Deadline deadline,
                                          WeightPayload* payload) {
  return ReceiveCore(
      comm, root, deadline, &payload->manifest, &payload->version,
      [payload](uint64_t total, uint64_t) -> StatusOr<uint8_t*> {
        payload->bytes.resize(total);
        return payload->bytes.data();
      },
      nullptr);
}

StatusOr<Receipt> ReceivePublishedBuckets(Communicator* comm, int root, Deadline deadline,
                                          const ManifestFn& on_manifest,
                                          const BucketFn& on_bucket) {
  std::vector<model::TensorEntry> manifest;
  int64_t version = 0;
  std::vector<uint8_t> bucket;
  Status refused;  // on_manifest's error: the buckets are received and dropped
  return ReceiveCore(
      comm, root, deadline, &manifest, &version,
      [&](uint64_t total, uint64_t bucket_bytes) -> StatusOr<uint8_t*> {
        refused = on_manifest(version, manifest, total);
        bucket.resize(bucket_bytes);
        return bucket.data();
      },
      nullptr,
      [&](uint64_t offset, const uint8_t* data, size_t size) -> Status {
        if (!refused.ok()) return refused;
        return on_bucket(offset, data, size);
      });
}

StatusOr<Receipt> ReceiveDeviceWeights(Communicator* comm, int root, int device, Deadline deadline,
                                       std::vector<model::TensorEntry>* manifest,
                                       std::unique_ptr<DeviceBuffer>* buffer) {
  int64_t version = 0;
  return ReceiveCore(
      comm, root, deadline, manifest, &version,
      [buffer, device](uint64_t total, uint64_t) -> StatusOr<uint8_t*> {
        GYRE_RETURN_IF_ERROR(EnsureDeviceBuffer(total, device, buffer));
        return static_cast<uint8_t*>((*buffer)->data());
      },
      [device, deadline](const uint8_t* base, uint64_t total, int64_t bucket_bytes) {
        return DeviceBucketCrc32(base, total, bucket_bytes, device, deadline);
      });
}

}  // namespace gyre::comm
