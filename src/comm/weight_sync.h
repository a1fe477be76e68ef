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

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "model/weights.h"
#include "rpc/clients.h"

namespace gyre::comm {

// A payload made piece by piece while it is being sent, for a sender that never holds all of
// it: a trainer whose parameters are split (trainer.shard: parameters) gathers one unit of the
// model at a time. The pieces tile the payload in order; each is produced once, in order, when
// the first reader needs one of its bytes, and dropped once every reader still reading is past
// it. The readers (one per receiver, numbered from 0) read in increasing offsets and say when
// they stop; a reader that never stops holds every piece from where it is on.
//
// With `max_held_bytes` set, a reader that is ahead of another one waits for it rather than have
// a new piece made while more than that many bytes are held: the readers then move in step, and
// the stream holds about one bucket however far apart the receivers' links are. The reader
// furthest behind never waits (so the readers, each on a thread of its own, always progress), and
// a reader that has not moved for `patience_s` is not waited for: a receiver that stalls costs
// memory (the pieces between it and the others), not the other receivers' transfers.
//
// Thread-safety: every method may be called from any thread; production runs under the
// stream's lock, so one reader waits while another's piece is made.
class PayloadStream {
 public:
  // Fills `bytes` (resized by the producer) with piece `index`; called in order 0, 1, ... (an
  // exception it throws is its failure).
  using Producer = std::function<Status(size_t index, std::vector<uint8_t>* bytes)>;
  // `starts`: where each piece begins (ascending, the first 0); `total` bytes in all.
  // `max_held_bytes` 0: no bound.
  static constexpr double kPatienceSeconds = 10.0;
  PayloadStream(uint64_t total, std::vector<uint64_t> starts, Producer produce, int readers,
                uint64_t max_held_bytes = 0, double patience_s = kPatienceSeconds);

  uint64_t total() const { return total_; }
  // Copies bytes [offset, offset + n) into `out` for reader `reader`. Fails with the producer's
  // error, or kFailedPrecondition for bytes already dropped (a reader went back).
  Status Read(int reader, uint64_t offset, uint64_t n, uint8_t* out);
  // Reader `reader` reads no more (it finished or failed).
  void Finish(int reader);
  // Produces every piece no reader asked for (a producer whose pieces are collectives must run
  // all of them), keeping none: every reader is finished first. Returns the first production
  // failure, if any.
  Status Drain();
  // The most bytes of pieces held at once so far.
  uint64_t peak_bytes() const;

 private:
  // Produces pieces until the one holding byte `last` is made (lock held).
  Status ProduceThrough(uint64_t last);
  void DropPassed();  // pieces every active reader is past (lock held)
  // Whether an active reader that moved within patience_ is behind reader `reader`, and
  // until when to wait for one to move (lock held).
  bool SomeReaderBehind(int reader, std::chrono::steady_clock::time_point* until) const;
  // The byte after piece `index` (the next piece's start, or the payload's end).
  uint64_t PieceEnd(size_t index) const {
    return index + 1 < starts_.size() ? starts_[index + 1] : total_;
  }

  const uint64_t total_;
  const std::vector<uint64_t> starts_;
  const Producer produce_;
  const uint64_t max_held_;
  const std::chrono::steady_clock::duration patience_;
  mutable std::mutex mu_;
  std::condition_variable moved_;                  // a reader moved on or finished
  size_t next_ = 0;                                // the next piece to produce
  std::map<size_t, std::vector<uint8_t>> pieces_;  // made and not dropped
  std::vector<uint64_t> position_;                 // per reader: bytes it is past
  std::vector<bool> active_;
  std::vector<std::chrono::steady_clock::time_point> moved_at_;  // per reader: its last move
  bool started_ = false;                                         // a reader has read
  uint64_t held_ = 0, peak_ = 0;
  Status error_;
};

struct WeightPayload {
  int64_t version = 0;
  std::vector<model::TensorEntry> manifest;
  std::vector<uint8_t> bytes;
  // When set, the bytes come from here instead (`bytes` is empty); receiver k of a publish is
  // reader k.
  std::shared_ptr<PayloadStream> stream;
  uint64_t size() const { return stream ? stream->total() : bytes.size(); }
};

// Bucket bytes [offset, offset + n) of `payload` for reader `reader`: a pointer into `bytes`, or
// `scratch` filled from the stream.
StatusOr<const uint8_t*> PayloadBytes(const WeightPayload& payload, int reader, uint64_t offset,
                                      uint64_t n, std::vector<uint8_t>* scratch);

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
// `reader`: this receiver's reader number of a streamed payload (finished on return).
StatusOr<SendResult> SendWeights(v1::Rollout::StubInterface* stub, const WeightPayload& payload,
                                 int64_t bucket_bytes, double timeout_s, int corrupt_bucket = -1,
                                 rpc::Cancellation* cancel = nullptr, int reader = 0);

// Streams `payload` to every one of `addresses` at once (SendWeights each) and appends one
// PublishResult per address to `resp`, in order, named by `ids`: the receipt and the checksums
// sent, or the error. Used by a trainer's grpc publish and by a rollout worker's relay.
// `cancels`, when given, holds one cancellation per address (see SendWeights).
void SendToEach(const WeightPayload& payload,
                const google::protobuf::RepeatedPtrField<std::string>& addresses,
                const google::protobuf::RepeatedPtrField<std::string>& ids, int64_t bucket_bytes,
                double timeout_s, v1::PublishWeightsResponse* resp,
                const std::vector<rpc::Cancellation*>* cancels = nullptr);

// Reads a transfer from `reader` bucket by bucket, with ReceiveWeightStream's checks, without
// keeping it: `start` gets the version, the manifest and the payload's size once the first chunk
// arrived (an error from it refuses the transfer), `bucket` each bucket's bytes, in payload order,
// once its checks passed (an error from it ends the transfer). The stream is read to its end
// either way, so that the sender sees the outcome. Fills `receipt` on success.
Status ReceiveWeightBuckets(
    grpc::ServerReaderInterface<v1::WeightChunk>* reader, v1::WeightReceipt* receipt,
    uint64_t max_total_bytes,
    const std::function<Status(int64_t version, const std::vector<model::TensorEntry>& manifest,
                               uint64_t total_bytes)>& start,
    const std::function<Status(uint64_t offset, const uint8_t* data, size_t size)>& bucket);

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
