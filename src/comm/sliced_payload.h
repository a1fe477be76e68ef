#pragma once
// One tensor-parallel rank's share of a policy version (rollout.tensor_parallel; docs/rollout.md,
// "Tensor parallelism"): the publisher sends each rank of a tensor-parallel rollout worker only
// its slices, as a version of its own over the usual bucketed, checksummed protocol
// (weight_broadcast.h), so that no rollout rank receives bytes it does not keep.
//
// The slices are those of model/tensor_parallel.h, chosen by each tensor's name: rows or columns
// of a split tensor, the whole of a replicated one. The sliced payload is made while it is sent,
// in pieces of at most a few MiB read from the whole payload in increasing offsets (a streamed
// whole payload, e.g. a sharded trainer's, is read as one of its readers), so the publisher holds
// one piece per receiving rank on top of what the whole payload holds.

#include <cstdint>
#include <string>

#include "comm/weight_sync.h"
#include "gyre/status.h"

namespace gyre::comm {

// The bytes a piece of a sliced payload covers at most (whole rows of a tensor at a time; one row
// when a row is larger).
constexpr uint64_t kSlicePieceBytes = uint64_t{4} << 20;

// The weight group of tensor-parallel rank `rank` of a rollout worker whose group is `group`.
std::string TensorParallelWeightGroup(const std::string& group, int rank);

// Rank `rank` of `size`'s slices of every tensor of `whole`, in the whole payload's offset order,
// as a streamed payload with one reader. `whole` is read as reader `reader` (when it is streamed)
// and must outlive the result; the caller finishes that reader once the slices are sent. Errors
// (nothing is read): a tensor whose shape or bytes do not fit the payload, or whose split
// dimension does not divide over `size` ranks.
StatusOr<WeightPayload> SlicedPayload(const WeightPayload& whole, int reader, int rank, int size);

}  // namespace gyre::comm
