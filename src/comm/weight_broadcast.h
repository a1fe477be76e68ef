#pragma once
// Bucketed, checksummed weight publishing over a Communicator (host memory: Gloo).
//
// One policy version moves from the root (a trainer) to every other member (rollout workers) as
// a sequence of broadcasts that every member issues in the same order:
//   1. a 64-byte header: magic, policy version, total bytes, bucket bytes, bucket count,
//      manifest bytes (a header with version kEndOfStream ends a receiver's loop instead);
//   2. the manifest (tensor names, dtypes, shapes, offsets) in a small binary encoding;
//   3. the payload in fixed-size buckets, each received straight into the receiver's buffer;
//   4. the root's CRC-32 of every bucket (4 bytes each, computed before sending);
//   5. an acknowledgement: a sum all-reduce of one float per member, 1 from each receiver that
//      verified every bucket, so the root learns the outcome in-band and the time it reports
//      covers the receivers' verification. Confirmations are counted, not rejections: Gloo can
//      complete a collective after a peer closed its connections cleanly, and a receiver that
//      is gone must not count as one that accepted.
// A receiver checks every bucket against the root's CRC-32 and returns a Receipt (version, its
// own CRC-32 per bucket) that the caller reports to the controller, which compares it with the
// root's list. On any error the receiver's buffer must not be used.
//
// Thread-safety: one call at a time per communicator (as for Communicator).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/device_weights.h"
#include "comm/weight_sync.h"

namespace gyre::comm {

// The version carried by the end-of-stream header.
constexpr int64_t kEndOfStream = -2;

struct PublishResult {
  int64_t version = 0;
  uint64_t bytes = 0;
  int64_t bucket_bytes = 0;
  std::vector<uint32_t> bucket_crc32;  // the root's, one per bucket
  int receivers = 0;                   // communicator size - 1
  double seconds = 0;                  // header to acknowledgement
};

struct Receipt {
  int64_t version = 0;
  uint64_t bytes = 0;
  std::vector<uint32_t> bucket_crc32;  // computed by the receiver, one per bucket
  double seconds = 0;
};

// Root side. `bucket_bytes` > 0. Fails with kDataLoss when any receiver did not confirm the
// version (the message says how many), with the communicator's error when a collective fails (then
// the communicator is aborted and the group must be formed again). `corrupt_bucket` >= 0 flips one
// byte of that bucket on the wire after its checksum was taken (fault injection for tests).
// A streamed payload (WeightPayload::stream) is read as reader `reader`, finished on return.
StatusOr<PublishResult> PublishWeights(Communicator* comm, const WeightPayload& payload,
                                       int64_t bucket_bytes, Deadline deadline,
                                       int corrupt_bucket = -1, int reader = 0);

// One receiver's outcome in PublishToEach.
struct FanoutResult {
  Status status;
  PublishResult result;  // valid when status is OK
};

// Publishes one version to several receivers, each over its own two-member group in which the
// caller is the root (rank 0), all concurrently (group k reads a streamed payload as reader k): a
// receiver that dies or stalls fails only its own transfer (its communicator is then aborted; form
// a new group to re-sync it), and the others complete within `deadline`. Results are in the order
// of `groups`.
std::vector<FanoutResult> PublishToEach(const std::vector<Communicator*>& groups,
                                        const WeightPayload& payload, int64_t bucket_bytes,
                                        Deadline deadline);

// PublishToEach with a payload of its own for each group (group k sends *payloads[k], read as
// reader 0 when streamed), e.g. each tensor-parallel rank of a rollout worker its slices
// (sliced_payload.h); done(k), when set, runs as group k's transfer ends, whatever its outcome.
std::vector<FanoutResult> PublishEachItsOwn(const std::vector<Communicator*>& groups,
                                            const std::vector<const WeightPayload*>& payloads,
                                            int64_t bucket_bytes, Deadline deadline,
                                            const std::function<void(int)>& done = nullptr);

// A policy version in device memory (the NCCL transport): `bytes` at `data` on CUDA `device`,
// laid out as `manifest` (model::ParameterManifest). The caller synchronised the copies that
// filled it.
struct DevicePayload {
  int64_t version = 0;
  std::vector<model::TensorEntry> manifest;
  void* data = nullptr;
  uint64_t bytes = 0;
  int device = 0;
};

// PublishWeights for a device payload over a communicator that takes device memory (NCCL). The
// bucket checksums are computed on the device (device_weights.h) and equal the host CRC-32.
StatusOr<PublishResult> PublishDeviceWeights(Communicator* comm, const DevicePayload& payload,
                                             int64_t bucket_bytes, Deadline deadline);

// PublishToEach for a device payload: checksums once, then every two-member group concurrently.
std::vector<FanoutResult> PublishDeviceToEach(const std::vector<Communicator*>& groups,
                                              const DevicePayload& payload, int64_t bucket_bytes,
                                              Deadline deadline);

// Tells every receiver of `comm` that no more versions follow (their ReceivePublishedWeights
// returns kOutOfRange).
Status PublishEndOfStream(Communicator* comm, Deadline deadline);

// Receiver side: receives one version from `root` into `*payload` (its byte vector is reused
// between calls). Errors: kDataLoss naming the first bucket whose CRC-32 differs from the root's
// (the other members still finish the transfer; the root is told through the
// acknowledgement), kInvalidArgument for a malformed header or manifest (the communicator is
// aborted: the stream can no longer be followed), kOutOfRange at the end of the stream, and the
// communicator's errors.
StatusOr<Receipt> ReceivePublishedWeights(Communicator* comm, int root, Deadline deadline,
                                          WeightPayload* payload);

// ReceivePublishedWeights without holding the version: one bucket-sized buffer. Once the header
// and manifest arrived, on_manifest(version, manifest, payload bytes) (an error from it refuses
// the version: the buckets are still received and dropped); then on_bucket(offset, data, size)
// for every bucket in payload order (after its first error, no more calls). The buckets' CRC-32
// list comes from the root after the last bucket, so what on_bucket was given may be used only
// when this returns OK (kDataLoss otherwise, and the root is told no). The callbacks' errors are
// returned as they are; the other errors are ReceivePublishedWeights'.
using ManifestFn = std::function<Status(
    int64_t version, const std::vector<model::TensorEntry>& manifest, uint64_t payload_bytes)>;
using BucketFn = std::function<Status(uint64_t offset, const uint8_t* data, size_t size)>;
StatusOr<Receipt> ReceivePublishedBuckets(Communicator* comm, int root, Deadline deadline,
                                          const ManifestFn& on_manifest, const BucketFn& on_bucket);

// ReceivePublishedWeights into device memory: the payload lands in *buffer (allocated or grown
// on `device` as needed) and is checked on the device. Same errors; on any error the buffer's
// contents must not be used.
StatusOr<Receipt> ReceiveDeviceWeights(Communicator* comm, int root, int device, Deadline deadline,
                                       std::vector<model::TensorEntry>* manifest,
                                       std::unique_ptr<DeviceBuffer>* buffer);

}  // namespace gyre::comm
