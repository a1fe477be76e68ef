#pragma once
// What the tensor-parallel engine test and its follower process (tp_follower_main.cc) share:
// the model, the requests, the engine limits and the weight update of a slice.

#include <c10/core/InferenceMode.h>

#include <map>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "rollout/rollout_engine.h"
#include "testing/tiny_model.h"

namespace gyre::rollout::tp_fixture {

// The model (seed 5) and the next version (seed 9).
inline model::ModelSpec Spec() { return testing::TinyQwen3Spec(26, 64); }
constexpr uint64_t kFirstSeed = 5, kNextSeed = 9;
constexpr double kInitStd = 0.2;
// The follower refuses this version, to fail an update.
constexpr int64_t kRefusedVersion = 3;

// A weight update of a slice: rank `rank`'s slices of `whole`'s parameters.
inline Status CopySlices(const model::Transformer& whole, model::Transformer* slice, int rank,
                         int ranks) {
  c10::InferenceMode guard;
  std::map<std::string, at::Tensor> src;
  for (const auto& [name, t] : whole.NamedParameters()) src[name] = t;
  for (auto& [name, t] : slice->NamedParameters()) {
    t.detach().copy_(model::TensorParallelSliceOf(name, src.at(name), rank, ranks));
  }
  return Status::Ok();
}

inline std::vector<Request> Requests() {
  std::vector<Request> out;
  auto add = [&](std::vector<int32_t> prompt, uint64_t seed, float t, int max_new, int n) {
    Request r;
    r.prompt = std::move(prompt);
    r.seed = seed;
    r.n = n;
    r.sampling.temperature = t;
    r.sampling.max_new_tokens = max_new;
    out.push_back(r);
    return &out.back();
  };
  add({3, 7, 1, 9, 4, 2}, 1, 0.0f, 12, 1);  // greedy
  add({5, 5, 8}, 2, 1.0f, 14, 3);           // a group: one prefill, copy-on-write
  add({2, 8, 5, 0, 25, 13, 6, 11, 17}, 3, 0.8f, 10, 2)->sampling.top_k = 5;
  add({12, 19}, 4, 1.2f, 16, 1)->sampling.top_p = 0.85f;
  add({21, 4, 9, 9}, 5, 0.9f, 11, 2)->sampling.min_p = 0.1f;
  add({1, 2, 3, 4, 5, 6, 7}, 6, 0.0f, 9, 1);
  return out;
}

inline EngineConfig TightPool() {
  EngineConfig c;
  c.block_size = 4;
  c.num_blocks = 14;  // too few for everyone at once: preemption and recompute
  c.max_running = 8;
  c.max_step_tokens = 24;
  return c;
}

}  // namespace gyre::rollout::tp_fixture
