#pragma once
// PromptEncoder: how a job turns its problems into model input (data.chat_template, the
// tokenizer's BOS) and which sampling its rollouts use (rollout.sampling and the tokenizer's
// stop ids for training; greedy for evaluation).
//
// Thread contract: immutable after construction; the tokenizer (not owned) must outlive it.

#include <cstdint>
#include <vector>

#include "controller/rollout_scheduler.h"
#include "controller/sample_ledger.h"
#include "controller/task.h"
#include "gyre/config.h"
#include "gyre/status.h"
#include "gyre/v1/gyre.pb.h"
#include "text/episode_chat.h"
#include "text/text_tokenizer.h"

namespace gyre::controller {

// The ledger entries of `jobs`' samples, each with the prompt's origin ("file:line" of a dataset
// record, or the prompt text of a generated problem).
std::vector<NewSample> QueuedSamples(const std::vector<GroupJob>& jobs);

class PromptEncoder {
 public:
  PromptEncoder(const JobConfig& cfg, const text::TextTokenizer* tokenizer)
      : cfg_(cfg), tokenizer_(tokenizer) {}

  // The prompt's token ids: the problem rendered with data.chat_template (a list of messages
  // needs one), encoded, after the tokenizer's BOS when it has one.
  StatusOr<std::vector<int32_t>> Encode(const Problem& problem) const;
  // Every held-out and dataset prompt of `problems` encodes and leaves room for
  // rollout.max_new_tokens within model.max_seq_len; the error names the record.
  Status CheckAll(const ProblemSource& problems) const;
  // A training group of `problem`: rollout.group_size samples with ids group_id * n ... and a
  // sampling seed derived from job.seed and the group id alone, so a group draws the same tokens
  // on whichever worker and at whichever step it runs.
  StatusOr<GroupJob> TrainingGroup(const Problem& problem, uint64_t group_id) const;
  // The same group with n samples (1 <= n <= rollout.group_size: sample ids stay in the group's
  // own range), for a sampling policy's rounds (rollout.budget).
  StatusOr<GroupJob> TrainingGroup(const Problem& problem, uint64_t group_id, int n) const;
  // An evaluation group of `problem`: one sample, seed 0 (evaluation samples greedily).
  StatusOr<GroupJob> EvalGroup(const Problem& problem, uint64_t group_id) const;
  // A supervised warm-up sample: the prompt and the problem's answer, ended by a stop id. In an
  // environment job: the record's "demonstration" (a list of chat messages, optionally with
  // "tools"), cut as an episode would be (text::RenderDemonstration): the model's turns, each
  // ended by a stop id, train; the text between them is masked out.
  StatusOr<v1::Sample> SftSample(const Problem& problem) const;

  // Environment jobs (env.address or env.command): groups carry the problem's task instead of
  // prompt ids, and warm-up samples are rendered with `render` (env.chat_template).
  void SetEpisodeChat(text::ChatRenderFn render) { episode_render_ = std::move(render); }
  bool episodes() const { return cfg_.env.enabled(); }

  // Training rollouts: rollout.sampling, max_new_tokens, the stop ids and stop strings.
  v1::SamplingParams Training() const;
  // Evaluation: greedy, with the same limits and stops.
  v1::SamplingParams Greedy() const;

 private:
  StatusOr<GroupJob> Group(const Problem& problem, uint64_t group_id, int n,
                           uint64_t first_sample_id, uint64_t seed) const;

  StatusOr<v1::Sample> DemonstrationSample(const Problem& problem) const;

  const JobConfig cfg_;
  const text::TextTokenizer* tokenizer_;
  text::ChatRenderFn episode_render_;
};

}  // namespace gyre::controller
