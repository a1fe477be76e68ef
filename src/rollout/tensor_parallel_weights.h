#pragma once
// Weight updates of a tensor-parallel rollout worker (rollout.tensor_parallel; docs/rollout.md,
// "Tensor parallelism"): rank 0 receives a policy version whole, as any rollout worker does
// (grpc or gloo), and hands every rank its slices over the worker's group, one tensor at a time:
// it broadcasts each whole tensor and every rank copies its slice (model/tensor_parallel.h) into
// its parameters. Besides the version rank 0 received, a rank holds at most one whole tensor
// (its receive buffer) at a time.
//
// The two functions run together, rank 0's SendSlices against every other rank's
// ReceiveSlices, in the same order (as the swap of RolloutEngine::UpdateWeights and of each
// follower's Follow). Collective failures throw std::runtime_error (TensorParallelGroup's
// convention); the engine turns them into its Status.

#include <cstdint>
#include <vector>

#include "gyre/status.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace gyre::rollout {

// Rank 0. `have` is whether the version arrived: when it did not, or when `manifest` does not
// name exactly the whole parameters of `slices` (by name, with shapes that slice to theirs, in
// float32, bfloat16 or float16, inside the payload), the other ranks are told so and nothing is
// loaded anywhere (the error is returned). Otherwise every rank loads its slices.
Status SendSlices(const Status& have, const std::vector<model::TensorEntry>& manifest,
                  const uint8_t* payload, uint64_t payload_bytes, const model::NamedTensors& slices,
                  model::TensorParallelGroup* group);

// Every other rank: receives the version rank 0 sends and copies its slices into `slices` (this
// rank's parameters). An error when rank 0 refused the version (nothing loaded) or a tensor does
// not slice to this rank's shape.
Status ReceiveSlices(const model::NamedTensors& slices, model::TensorParallelGroup* group);

}  // namespace gyre::rollout
