#pragma once
// What one trainer process needs to hold for a job, from the model's shape and the trainers'
// layout, and the check of trainer.memory_limit_gb against it (docs/distributed.md, "Memory
// limit"). Torch-free: the controller refuses a job that cannot fit before any process starts.

#include <string>

#include "gyre/config.h"
#include "gyre/status.h"
#include "model/model_spec.h"

namespace gyre::controller {

struct TrainerMemory {
  double parameters = 0;     // of the model
  double startup_bytes = 0;  // the whole float32 model every trainer builds when it starts, and
                             // with shard: parameters its first slices, made before it is freed
  double state_bytes = 0;    // kept between steps: float32 weights, gradients, AdamW moments and
                             // the KL term's reference weights, each whole or this rank's slice
  double needed_bytes() const { return startup_bytes > state_bytes ? startup_bytes : state_bytes; }
  std::string breakdown;  // how state_bytes is made up, for messages
};

// `shard`: trainer.shard; `trainers`: trainer.workers; `reference`: the job has a KL term;
// `tensor_parallel`: trainer.tensor_parallel (each trainer holds about 1/T of every tensor, and
// the layout shards over the trainers / T holding the same slice).
TrainerMemory EstimateTrainerMemory(double parameters, const std::string& shard, int trainers,
                                    bool reference, int tensor_parallel = 1);

// trainer.memory_limit_gb against the estimate for `spec` (the job's model): an
// kInvalidArgument that names the memory needed, the limit and the layouts that would fit;
// Ok when there is no limit or it fits. The estimate leaves out what the process needs besides
// (libraries, activations, buffers), so passing is necessary, not sufficient.
Status CheckTrainerMemory(const model::ModelSpec& spec, const JobConfig& cfg);

}  // namespace gyre::controller
