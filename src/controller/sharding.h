#pragma once
// Data-parallel batch sharding: how the controller splits one training batch over M trainer
// ranks so that every optimizer step (global mini-batch) is shared out with balanced work.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gyre::controller {

struct DpShards {
  // samples[r]: indices into the batch held by rank r, mini-batch by mini-batch, and in batch
  // order within a mini-batch.
  std::vector<std::vector<size_t>> samples;
  // mini_batch_sizes[r][m]: how many of samples[r] belong to global mini-batch m.
  std::vector<std::vector<int32_t>> mini_batch_sizes;
};

// The batch's samples, with `tokens[i]` tokens each (prompt + response: the forward/backward
// cost), are first cut into `minis` consecutive global mini-batches exactly as one trainer cuts
// them (mini-batch m = [n*m/minis, n*(m+1)/minis)); each mini-batch is then spread over `ranks`
// by longest-processing-time greedy: samples by decreasing tokens (ties: lower index first) each
// go to the rank with the fewest tokens so far (ties: lower rank). Deterministic. A rank may get
// nothing when a mini-batch has fewer samples than ranks. Requires ranks >= 1, minis >= 1.
//
// groups (optional, one key per sample): samples with the same key (a GRPO group: the same
// prompt) stay together, so that a trainer sharing prompts (trainer.prompt_sharing) computes
// each prompt once. Within a mini-batch the greedy then places whole groups, by decreasing total
// tokens, as long as the mini-batch has at least two groups per rank; with fewer, groups would
// leave ranks idle or unbalanced, and samples are placed one by one as without keys.
DpShards ShardBatch(const std::vector<int64_t>& tokens, int ranks, int minis,
                    const std::vector<uint64_t>& groups = {});

}  // namespace gyre::controller
