#pragma once
// What a job reads and checks before any worker process starts: the reward (built-in, custom
// or a reward service), the model's sequence limit, the tokenizer, the problem stream, the
// prompt encoder (with the episode chat template of environment jobs), and every prompt, which
// must encode and fit: a bad record found when drawn could be hours in. Then the services the
// job's scoring and episodes talk to (reward.type: service, env.address or env.command), and the
// step scorer and sampling policy built on them.
//
// Thread contract: the job thread only, before the cluster starts.

#include <memory>

#include "controller/job_state.h"

namespace gyre::controller {

// Sets job->reward (null for reward.type: service until StartJobServices), tokenizer, problems
// and prompts. `custom_reward` is RunOptions::reward.
Status LoadJobInputs(std::shared_ptr<RewardFn> custom_reward, JobState* job);

// The checks of a job against its model (the built-in model's shape, or model.path's config.json)
// that the config alone cannot make: model.max_seq_len within the model's, the heads, MLP and
// vocabulary splitting over trainer.tensor_parallel, and trainer.memory_limit_gb
// (trainer_memory.h). Part of LoadJobInputs; `gyre validate` runs it too.
Status CheckJobModel(const JobConfig& cfg);

// Starts (or connects to) the reward service and the environment server the job names; their
// logs go to <run_dir>/logs, which must exist.
Status StartJobServices(JobState* job);

// Sets job->scorer and job->policy (after StartJobServices: they use the reward).
void MakeScorer(JobState* job);

}  // namespace gyre::controller
