#pragma once
// Fixtures for the checkpoint targets (fuzz_controller_state, fuzz_carried_groups) and the seed
// generator: a job config with partial rollouts and a controller state holding carried groups
// that pass every check. The targets load these once at start-up (and abort if they no longer
// load: the fixture drifted from the format), the seed generator writes them as seeds, so both
// sides always agree. No libtorch.

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "controller/checkpoint.h"
#include "controller/task.h"
#include "gyre/config.h"
#include "gyre/v1/checkpoint.pb.h"

namespace gyre::fuzz {

// The job the fixture checkpoint was written under: partial rollouts (which need a staleness of 1),
// groups of 4, responses of up to 8 tokens, held-out set drawn small so ProblemSource::Create stays
// cheap.
inline JobConfig FixtureJobConfig() {
  JobConfig c;
  c.rollout.partial_rollouts = true;
  c.algorithm.max_staleness = 1;
  c.rollout.group_size = 4;
  c.rollout.max_new_tokens = 8;
  c.data.eval_size = 4;
  return c;
}

// A sample of group `g` (its `index`-th), with `tokens` response tokens.
inline v1::Sample FixtureSample(const v1::PromptGroup& g, int index, int tokens, bool finished,
                                int64_t version) {
  v1::Sample s;
  s.set_sample_id(g.first_sample_id() + static_cast<uint64_t>(index));
  s.set_group_id(g.group_id());
  *s.mutable_prompt_ids() = g.prompt_ids();
  for (int t = 0; t < tokens; ++t) {
    s.add_response_ids(3 + (index + t) % 7);
    s.add_logprobs(-0.5f - 0.1f * static_cast<float>(t));
    s.add_kept_mass(1.0f);
    s.add_versions(version);
    s.add_loss_mask(1.0f);
  }
  s.set_seed(g.seed() + static_cast<uint64_t>(index));
  s.set_kv_version(version);
  s.set_finish_reason(finished ? (index % 2 ? v1::FINISH_REASON_LENGTH : v1::FINISH_REASON_STOP)
                               : v1::FINISH_REASON_ABORT);
  return s;
}

// Two carried groups: one started (2 finished and 2 unfinished samples), one not started yet.
inline std::vector<v1::CarriedGroup> FixtureCarriedGroups() {
  std::vector<v1::CarriedGroup> out;
  for (int k = 0; k < 2; ++k) {
    v1::CarriedGroup cg;
    v1::PromptGroup* g = cg.mutable_group();
    g->set_group_id(9 + static_cast<uint64_t>(k));
    for (int32_t id : {1, 4, 2, 5 + k}) g->add_prompt_ids(id);
    g->set_n(4);
    g->set_first_sample_id(36 + 4 * static_cast<uint64_t>(k));
    g->set_seed(1000 + 17 * static_cast<uint64_t>(k));
    cg.set_prompt(k == 0 ? "12+30=" : "[{\"role\": \"user\", \"content\": \"7+8=\"}]");
    cg.set_answer(k == 0 ? "42" : "15");
    cg.set_prompt_is_messages(k == 1);
    cg.set_worker("rollout-" + std::to_string(k));
    if (k == 0) {
      *cg.add_finished() = FixtureSample(*g, 0, 3, true, 6);
      *cg.add_finished() = FixtureSample(*g, 1, 8, true, 7);
      *cg.add_unfinished() = FixtureSample(*g, 2, 2, false, 7);
      *cg.add_unfinished() = FixtureSample(*g, 3, 5, false, 6);
    }
    out.push_back(std::move(cg));
  }
  return out;
}

// A controller state after GRPO step 3 of FixtureJobConfig(), with FixtureCarriedGroups().
inline controller::ControllerState FixtureControllerState() {
  const JobConfig config = FixtureJobConfig();
  controller::ControllerState s;
  s.grpo_step = 3;
  s.policy_version = 7;
  s.next_group_id = 12;
  auto source = controller::ProblemSource::Create(config.data, config.job.seed);
  GYRE_CHECK(source.ok()) << source.status();
  for (int i = 0; i < 5; ++i) source->Next();
  s.problem_stream = source->SaveState();
  s.accuracy_before_rl = 0.25;
  s.final_mean_reward = 0.5;
  s.wall_seconds = 12.5;
  s.config_yaml = config::DumpJobConfig(config);
  s.metrics_jsonl = "{\"step\": 1, \"reward\": 0.25}\n{\"step\": 2, \"reward\": 0.5}\n";
  s.carried_groups = FixtureCarriedGroups();
  s.format_version = 2;
  return s;
}

}  // namespace gyre::fuzz
