#pragma once
// The small policy-gradient batch the trainer tests share, and the controller's split of it over
// data-parallel ranks.

#include <cstdint>
#include <vector>

#include "controller/sharding.h"
#include "trainer/policy_trainer.h"

namespace gyre::testing {

// `samples` samples of 3 prompt tokens and 2 to 6 response tokens (ids below 24), advantages
// of both signs; with `mask_one`, sample 2 has one response token masked out.
inline std::vector<trainer::TrainSample> SmallTrainBatch(int samples = 11, bool mask_one = true) {
  std::vector<trainer::TrainSample> b;
  for (int i = 0; i < samples; ++i) {
    trainer::TrainSample s;
    s.prompt = {1, static_cast<int32_t>(3 + i % 9), 5};
    s.response.assign(2 + (i * 7) % 5, static_cast<int32_t>(7 + i));
    s.rollout_logprobs.assign(s.response.size(), -1.0f);
    s.advantage = (i % 2 == 0 ? 1.0f : -0.5f) * (1 + i % 4);
    b.push_back(s);
  }
  if (mask_one && samples > 2) {
    b[2].loss_mask.assign(b[2].response.size(), 1.0f);
    b[2].loss_mask[1] = 0;
  }
  return b;
}

// Rank r's part of `batch` for `minis` global mini-batches, as the controller shards it, with
// its mini-batch sizes in opts->mini_batch_sizes; one rank gets the whole batch. *indices
// (optional) gets the samples' indices in `batch`.
inline std::vector<trainer::TrainSample> RankShard(const std::vector<trainer::TrainSample>& batch,
                                                   int ranks, int r, int minis,
                                                   trainer::TrainOptions* opts,
                                                   std::vector<size_t>* indices = nullptr) {
  if (ranks == 1) {
    if (indices != nullptr) {
      for (size_t i = 0; i < batch.size(); ++i) indices->push_back(i);
    }
    return batch;
  }
  std::vector<int64_t> tokens;
  for (const auto& s : batch) tokens.push_back(s.prompt.size() + s.response.size());
  const auto shards = controller::ShardBatch(tokens, ranks, minis);
  std::vector<trainer::TrainSample> out;
  for (size_t i : shards.samples[r]) {
    out.push_back(batch[i]);
    if (indices != nullptr) indices->push_back(i);
  }
  opts->mini_batch_sizes.assign(shards.mini_batch_sizes[r].begin(),
                                shards.mini_batch_sizes[r].end());
  return out;
}

}  // namespace gyre::testing
