#include "controller/step_scorer.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "algorithm/registry.h"
#include "common/logging.h"

namespace gyre::controller {

Status StepScorer::Score(const std::vector<GroupJob>& jobs, std::vector<v1::Sample>* samples,
                         int step, int64_t version, SampleLedger* ledger, StepScores* out) const {
  const MoveContext here{step, version, "", ""};
  std::vector<uint64_t> stale_ids, scored_ids;
  // Every fresh sample's reward first, in one batch (PeekReward may already have some).
  std::vector<int64_t> staleness_of(samples->size(), -1);  // -1: stale
  std::map<size_t, StatusOr<double>> rewards_of;
  {
    std::vector<const Problem*> problems;
    std::vector<const v1::Sample*> todo;
    std::vector<size_t> where;
    size_t at = 0;
    for (size_t g = 0; g < jobs.size(); ++g) {
      const int n = jobs[g].group.n() > 0 ? jobs[g].group.n() : group_size_;
      if (at + static_cast<size_t>(n) > samples->size()) {
        return Internal("scoring: group " + std::to_string(jobs[g].group.group_id()) + " needs " +
                        std::to_string(n) + " samples from index " + std::to_string(at) +
                        ", only " + std::to_string(samples->size()) + " came back");
      }
      for (int i = 0; i < n; ++i, ++at) {
        const v1::Sample& s = (*samples)[at];
        if (episodes_) {
          ++out->episodes;
          out->env_turns += s.env_turns();
          if (s.episode_status().empty()) ++out->env_terminated;
          if (s.reward_status() == v1::REWARD_STATUS_ERROR) ++out->env_failures;
        }
        // Staleness: (trainer version now) - (oldest version among its tokens).
        int64_t oldest = version;
        for (int64_t v : s.versions()) oldest = std::min(oldest, v);
        if (version - oldest > algorithm_.max_staleness) continue;
        staleness_of[at] = version - oldest;
        auto it = cache_.find(s.sample_id());
        if (it != cache_.end()) {
          rewards_of.emplace(at, it->second);
          cache_.erase(it);
          continue;
        }
        problems.push_back(&jobs[g].problem);
        todo.push_back(&s);
        where.push_back(at);
      }
    }
    std::vector<StatusOr<double>> got = Rewards(problems, todo);
    for (size_t k = 0; k < got.size(); ++k) rewards_of.emplace(where[k], std::move(got[k]));
  }
  size_t begin = 0;  // the group's first sample: groups may differ in size (rollout.budget)
  for (size_t g = 0; g < jobs.size(); ++g) {
    const int n = jobs[g].group.n() > 0 ? jobs[g].group.n() : group_size_;
    std::vector<v1::Sample> kept;
    std::vector<float> rewards;
    std::vector<int64_t> staleness;
    // reward.on_failure: drop_group: a failed reward takes its whole group out.
    std::string group_failure;
    if (on_failure_ == "drop_group") {
      for (int i = 0; i < n && group_failure.empty(); ++i) {
        auto it = rewards_of.find(begin + i);
        if (it != rewards_of.end() && !it->second.ok()) {
          group_failure =
              "reward failed for sample " + std::to_string((*samples)[begin + i].sample_id()) +
              " of its group (reward.on_failure: drop_group): " + it->second.status().message();
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      v1::Sample& s = (*samples)[begin + i];
      if (staleness_of[begin + i] < 0) {
        ++out->stale;
        stale_ids.push_back(s.sample_id());
        continue;
      }
      StatusOr<double> r = rewards_of.at(begin + i);
      if (!group_failure.empty()) {
        if (r.ok()) {
          ++out->reward_group_drops;
        } else {
          ++out->reward_errors;
        }
        MoveContext c = here;
        c.reason = r.ok() ? group_failure : "reward failed: " + r.status().message();
        GYRE_RETURN_IF_ERROR(ledger->Move({s.sample_id()}, SampleState::kDropped, c));
        continue;
      }
      bool zeroed = false;
      if (!r.ok()) {
        // A failed reward leaves its sample out (and is counted), never a silent 0, unless the
        // job says to count it as 0 (reward.on_failure: zero, reported as reward_zeroed).
        ++out->reward_errors;
        const std::string why = r.status().message();
        if (out->reward_errors <= 3) {
          GYRE_LOG_WARN("reward failed for sample {}: {}", s.sample_id(), why);
        }
        // A failed episode may have no tokens at all: there is nothing to train with a 0.
        if (on_failure_ == "zero" && s.response_ids_size() > 0) {
          ++out->reward_zeroed;
          zeroed = true;
          r = 0.0;
        } else {
          MoveContext c = here;
          c.reason = "reward failed: " + why;
          GYRE_RETURN_IF_ERROR(ledger->Move({s.sample_id()}, SampleState::kDropped, c));
          continue;
        }
      }
      const int64_t oldest_gap = staleness_of[begin + i];
      // Correctness is the task's reward; training sees it after the overlong shaping.
      const double penalty =
          OverlongPenalty(s.response_ids_size(), max_new_tokens_, algorithm_.overlong_buffer,
                          algorithm_.overlong_penalty);
      const double shaped = *r + penalty;
      if (penalty < 0) ++out->overlong;
      s.set_reward(static_cast<float>(shaped));
      s.set_reward_status(zeroed ? v1::REWARD_STATUS_ERROR : v1::REWARD_STATUS_OK);
      staleness.push_back(oldest_gap);
      out->reward_sum += shaped;
      ++out->scored;
      if (*r >= reward_->correct_threshold()) ++out->correct;
      scored_ids.push_back(s.sample_id());
      rewards.push_back(static_cast<float>(shaped));
      kept.push_back(std::move(s));
    }
    begin += static_cast<size_t>(n);
    if (kept.empty()) continue;
    // Dynamic sampling (DAPO): a group whose rewards are all equal has no advantage signal.
    bool all_equal = true;
    for (float r : rewards) all_equal = all_equal && r == rewards.front();
    if (algorithm_.filter_zero_variance && all_equal) {
      ++out->filtered_groups;
      std::vector<uint64_t> ids;
      for (const auto& k : kept) ids.push_back(k.sample_id());
      GYRE_RETURN_IF_ERROR(ledger->Move(scored_ids, SampleState::kScored, here));
      scored_ids.clear();
      MoveContext c = here;
      c.reason = "zero reward variance: all " + std::to_string(kept.size()) + " rewards " +
                 nlohmann::json(rewards.front()).dump() + " (algorithm.filter_zero_variance)";
      GYRE_RETURN_IF_ERROR(ledger->Move(ids, SampleState::kFiltered, c));
      continue;
    }
    out->group_sizes.push_back(static_cast<int32_t>(kept.size()));
    for (int64_t st : staleness) ++out->staleness[st];
    for (size_t i = 0; i < kept.size(); ++i) {
      out->rewards.push_back(rewards[i]);
      out->kept.push_back(std::move(kept[i]));
    }
  }
  // The ledger: kept samples are scored; the others ended above, with the reason.
  if (!stale_ids.empty()) {
    MoveContext c = here;
    c.reason = "stale: tokens older than algorithm.max_staleness " +
               std::to_string(algorithm_.max_staleness) + " versions";
    GYRE_RETURN_IF_ERROR(ledger->Move(stale_ids, SampleState::kDropped, c));
  }
  if (!scored_ids.empty()) {
    GYRE_RETURN_IF_ERROR(ledger->Move(scored_ids, SampleState::kScored, here));
  }
  cache_.clear();  // what PeekReward kept for samples that left before their reward (stale)
  return Status::Ok();
}

RewardInput StepScorer::Input(const Problem& problem, const v1::Sample& sample) const {
  RewardInput in;
  in.prompt = problem.prompt;
  in.answer = problem.answer;
  std::vector<int32_t> resp(sample.response_ids().begin(), sample.response_ids().end());
  in.response = tokenizer_->Decode(resp);
  in.finished = sample.finish_reason() == v1::FINISH_REASON_STOP;
  // Unique within the job: evaluation samples share sample ids but never group ids.
  in.id = "g" + std::to_string(sample.group_id()) + "/s" + std::to_string(sample.sample_id());
  return in;
}

StatusOr<double> StepScorer::Reward(const Problem& problem, const v1::Sample& sample) const {
  return Rewards({&problem}, {&sample}).front();
}

std::vector<StatusOr<double>> StepScorer::Rewards(
    const std::vector<const Problem*>& problems,
    const std::vector<const v1::Sample*>& samples) const {
  std::vector<StatusOr<double>> out(samples.size(), StatusOr<double>(Internal("not scored")));
  std::vector<size_t> todo;
  for (size_t i = 0; i < samples.size(); ++i) {
    const v1::Sample& s = *samples[i];
    if (episodes_ && s.reward_status() == v1::REWARD_STATUS_ERROR) {
      out[i] = Internal("the episode's environment failed: " + s.episode_status());
    } else if (episodes_ && env_reward_) {
      out[i] = static_cast<double>(s.reward());
    } else {
      todo.push_back(i);
    }
  }
  for (int attempt = 0; attempt <= retries_ && !todo.empty(); ++attempt) {
    std::vector<RewardInput> inputs;
    for (size_t i : todo) inputs.push_back(Input(*problems[i], *samples[i]));
    std::vector<StatusOr<double>> got = reward_->ScoreBatch(inputs);
    std::vector<size_t> failed;
    for (size_t k = 0; k < todo.size(); ++k) {
      const size_t i = todo[k];
      if (k >= got.size()) {
        out[i] = Internal("the reward returned " + std::to_string(got.size()) + " scores for " +
                          std::to_string(inputs.size()) + " inputs");
      } else if (!got[k].ok()) {
        out[i] = Internal(got[k].status().ToString());
      } else if (!std::isfinite(*got[k])) {
        out[i] = Internal("non-finite value");
      } else {
        out[i] = *got[k];
        continue;
      }
      failed.push_back(i);
    }
    if (!failed.empty() && attempt < retries_) {
      GYRE_LOG_INFO("{} rewards failed; scoring them again (reward.retries: {} of {})",
                    failed.size(), attempt + 1, retries_);
    }
    todo = std::move(failed);
  }
  return out;
}

StatusOr<double> StepScorer::PeekReward(const Problem& problem, const v1::Sample& sample) const {
  auto r = Reward(problem, sample);
  if (r.ok()) cache_[sample.sample_id()] = *r;
  return r;
}

StatusOr<int> StepScorer::SetAdvantages(StepScores* scores) const {
  std::vector<uint8_t> zero_var;
  std::vector<int32_t> lengths;  // response tokens (opo's weights)
  lengths.reserve(scores->kept.size());
  for (const v1::Sample& s : scores->kept) lengths.push_back(s.response_ids_size());
  GYRE_ASSIGN_OR_RETURN(std::vector<float> adv,
                        algorithm::ComputeAdvantages(algorithm_.advantage, scores->rewards,
                                                     scores->group_sizes, &zero_var, &lengths));
  if (algorithm_.advantage == "median") {
    // MC-GRPO: an odd group's median is one of its rewards; the first sample holding it has
    // advantage 0 and is left out, so G + 1 samples train G.
    std::vector<v1::Sample> kept;
    std::vector<float> rewards, kept_adv;
    std::vector<int32_t> sizes;
    size_t begin = 0;
    for (int32_t n : scores->group_sizes) {
      int64_t pivot = -1;
      if (n >= 3 && n % 2 == 1) {
        std::vector<float> sorted(scores->rewards.begin() + begin,
                                  scores->rewards.begin() + begin + n);
        std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
        const float median = sorted[n / 2];
        for (int32_t i = 0; i < n && pivot < 0; ++i) {
          if (scores->rewards[begin + i] == median) pivot = i;
        }
      }
      for (int32_t i = 0; i < n; ++i) {
        if (i == pivot) {
          scores->pivot_ids.push_back(scores->kept[begin + i].sample_id());
          continue;
        }
        kept.push_back(std::move(scores->kept[begin + i]));
        rewards.push_back(scores->rewards[begin + i]);
        kept_adv.push_back(adv[begin + i]);
      }
      sizes.push_back(pivot >= 0 ? n - 1 : n);
      begin += n;
    }
    scores->kept = std::move(kept);
    scores->rewards = std::move(rewards);
    scores->group_sizes = std::move(sizes);
    adv = std::move(kept_adv);
  }
  for (size_t i = 0; i < scores->kept.size(); ++i) scores->kept[i].set_advantage(adv[i]);
  int zero = 0;
  for (uint8_t z : zero_var) zero += z;
  return zero;
}

double OverlongPenalty(int64_t length, int max_new_tokens, int buffer, double penalty) {
  if (buffer <= 0) return 0.0;
  const int64_t over = length - (static_cast<int64_t>(max_new_tokens) - buffer);
  if (over <= 0) return 0.0;
  return -penalty * std::min<double>(static_cast<double>(over) / buffer, 1.0);
}

}  // namespace gyre::controller
