#pragma once
// The CPU weight plane over gRPC streaming: a trainer sends a policy version as a manifest plus
// fixed-size buckets, each with a CRC-32; the receiving rollout worker checks every bucket,
// loads the parameters only when all of them arrived intact, and answers with a receipt
// (version + the CRC-32 it computed per bucket). The sender compares the receipt with what it
// sent, so a corrupted or partial transfer is an error on both sides, never silently used.
//
// Thread-safety: SendWeights may run concurrently for different receivers over a shared
// payload. ReceiveWeights runs on a gRPC handler thread; the caller serialises it with any
// forward pass that reads the same parameters.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "model/weights.h"
#include "rpc/clients.h"

namespace gyre::comm {

struct WeightPayload {
  int64_t version = 0;
  std::vector<model::TensorEntry> manifest;
  std::vector<uint8_t> bytes;
};

struct SendResult {
  v1::WeightReceipt receipt;
  std::vector<uint32_t> sent_crc32;
  double seconds = 0;
};

// The manifest on the wire (TensorSpec) and back.
void ManifestToProto(const std::vector<model::TensorEntry>& manifest,
                     google::protobuf::RepeatedPtrField<v1::TensorSpec>* out);
std::vector<model::TensorEntry> ManifestFromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs);

// Streams `payload` to one rollout worker within `timeout_s`. `corrupt_bucket` >= 0 flips a byte
// of that bucket after its checksum is computed (fault injection for tests). `cancel` (optional)
// ends the stream at once when cancelled, before or during the transfer.
StatusOr<SendResult> SendWeights(v1::Rollout::StubInterface* stub, const WeightPayload& payload,
                                 int64_t bucket_bytes, double timeout_s, int corrupt_bucket = -1,
                                 rpc::Cancellation* cancel = nullptr);

// Streams `payload` to every one of `addresses` at once (SendWeights each) and appends one
// PublishResult per address to `resp`, in order, named by `ids`: the receipt and the checksums
// sent, or the error. Used by a trainer's grpc publish and by a rollout worker's relay.
// `cancels`, when given, holds one cancellation per address (see SendWeights).
void SendToEach(const WeightPayload& payload,
                const google::protobuf::RepeatedPtrField<std::string>& addresses,
                const google::protobuf::RepeatedPtrField<std::string>& ids, int64_t bucket_bytes,
                double timeout_s, v1::PublishWeightsResponse* resp,
                const std::vector<rpc::Cancellation*>* cancels = nullptr);

// Reads a full transfer from `reader` into `payload` (its byte vector is reused) and verifies
// every bucket's CRC-32 and that the buckets cover the payload contiguously, in order; fills
// `receipt` on success. A transfer declaring more than `max_total_bytes` is refused before
// anything is allocated. On error `payload` must not be used.
Status ReceiveWeightStream(grpc::ServerReaderInterface<v1::WeightChunk>* reader,
                           WeightPayload* payload, v1::WeightReceipt* receipt,
                           uint64_t max_total_bytes);

// ReceiveWeightStream (capped at the bytes of `params`), then loads the weights into `params`.
// On error nothing is loaded. On success fills `receipt` and stores the version in *version.
Status ReceiveWeights(grpc::ServerReaderInterface<v1::WeightChunk>* reader,
                      const model::NamedTensors& params, v1::WeightReceipt* receipt);

}  // namespace gyre::comm
