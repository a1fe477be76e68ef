#include "controller/rollout_scheduler.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include "common/logging.h"

namespace gyre::controller {

namespace {

// One Generate call per worker at once; an empty request is not sent. Adds each call's
// duration to stats->busy_s.
std::vector<std::pair<Status, v1::GenerateResponse>> GenerateOnEach(
    WorkerPool* pool, const std::vector<Worker*>& workers,
    const std::vector<v1::GenerateRequest>& reqs, double timeout_s, GenerateStats* stats) {
  std::vector<double> seconds(workers.size(), 0.0);
  std::vector<std::future<std::pair<Status, v1::GenerateResponse>>> futures;
  for (size_t a = 0; a < workers.size(); ++a) {
    futures.push_back(std::async(
        std::launch::async, [pool, w = workers[a], &req = reqs[a], timeout_s, &sec = seconds[a]] {
          v1::GenerateResponse resp;
          if (req.groups_size() == 0 && req.resume_size() == 0) {
            return std::make_pair(Status::Ok(), std::move(resp));
          }
          const auto t0 = std::chrono::steady_clock::now();
          Status s = pool->Invoke(w->id, timeout_s, [&](const rpc::Call& c) {
            return w->rollout->Generate(c, req, &resp);
          });
          sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          return std::make_pair(std::move(s), std::move(resp));
        }));
  }
  std::vector<std::pair<Status, v1::GenerateResponse>> out;
  for (auto& f : futures) out.push_back(f.get());
  for (size_t a = 0; a < workers.size(); ++a) stats->busy_s[workers[a]->id] += seconds[a];
  return out;
}

void AddCounters(const v1::GenerateResponse& resp, GenerateStats* stats) {
  stats->generated_tokens += resp.generated_tokens();
  stats->prefill_tokens += resp.prefill_tokens();
  stats->prefix_shared_tokens += resp.prefix_shared_tokens();
}

}  // namespace

RolloutScheduler::RolloutScheduler(const JobConfig& cfg, WorkerPool* pool)
    : cfg_(cfg), pool_(pool) {}

template <typename Id>
Status RolloutScheduler::AfterGenerateFailure(Worker* w, const Status& s,
                                              const std::vector<Id>& groups,
                                              std::vector<Id>* retry) {
  if (s.code() == StatusCode::kInvalidArgument) return s.WithContext("generate on " + w->id);
  GYRE_RETURN_IF_ERROR(pool_->AfterWorkFailure(w, "generate failed: " + s.message()));
  GYRE_LOG_WARN("re-queueing {} group(s) from {}", groups.size(), w->id);
  retry->insert(retry->end(), groups.begin(), groups.end());
  return Status::Ok();
}

Status RolloutScheduler::RecordDispatch(const LedgerSink* sink, const Worker& w,
                                        const v1::GenerateRequest& req) {
  if (sink == nullptr || sink->ledger == nullptr) return Status::Ok();
  std::vector<uint64_t> ids;
  auto add = [&](uint64_t id) {
    if (generating_.insert(id).second) ids.push_back(id);
  };
  for (const auto& g : req.groups()) {
    for (int i = 0; i < g.n(); ++i) add(g.first_sample_id() + static_cast<uint64_t>(i));
  }
  for (const auto& r : req.resume()) add(r.sample_id());
  if (ids.empty()) return Status::Ok();
  return sink->ledger->Move(ids, SampleState::kGenerating, {sink->step, sink->version, w.id, ""});
}

Status RolloutScheduler::RecordFailure(const LedgerSink* sink, const Worker& w,
                                       const v1::GenerateRequest& req, const std::string& why) {
  if (sink == nullptr || sink->ledger == nullptr) return Status::Ok();
  std::vector<uint64_t> ids;
  auto add = [&](uint64_t id) {
    if (generating_.erase(id)) ids.push_back(id);
  };
  for (const auto& g : req.groups()) {
    for (int i = 0; i < g.n(); ++i) add(g.first_sample_id() + static_cast<uint64_t>(i));
  }
  for (const auto& r : req.resume()) add(r.sample_id());
  if (ids.empty()) return Status::Ok();
  return sink->ledger->Move(ids, SampleState::kQueued, {sink->step, sink->version, w.id, why});
}

Status RolloutScheduler::RecordFinished(const LedgerSink* sink, const Worker& w,
                                        const v1::GenerateResponse& resp) {
  if (sink == nullptr || sink->ledger == nullptr) return Status::Ok();
  std::vector<uint64_t> ids;
  for (const auto& s : resp.samples()) {
    if (generating_.erase(s.sample_id())) ids.push_back(s.sample_id());
  }
  if (ids.empty()) return Status::Ok();
  return sink->ledger->Move(ids, SampleState::kFinished, {sink->step, sink->version, w.id, ""});
}

StatusOr<std::vector<v1::Sample>> RolloutScheduler::GenerateAll(const std::vector<GroupJob>& jobs,
                                                                const v1::SamplingParams& sampling,
                                                                int64_t min_version,
                                                                GenerateStats* stats,
                                                                const LedgerSink* sink) {
  std::map<uint64_t, std::vector<v1::Sample>> by_group;
  std::vector<size_t> pending(jobs.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  while (!pending.empty()) {
    GYRE_RETURN_IF_ERROR(pool_->CheckHealth());
    std::vector<Worker*> alive = pool_->AliveRollouts();
    if (alive.empty()) return Aborted("no rollout workers are alive");
    std::vector<std::vector<size_t>> assign(alive.size());
    for (size_t k = 0; k < pending.size(); ++k) assign[k % alive.size()].push_back(pending[k]);
    std::vector<v1::GenerateRequest> reqs(alive.size());
    for (size_t a = 0; a < alive.size(); ++a) {
      *reqs[a].mutable_sampling() = sampling;
      if (env_address_) reqs[a].set_env_address(env_address_());
      reqs[a].set_min_policy_version(min_version);
      for (size_t j : assign[a]) *reqs[a].add_groups() = jobs[j].group;
      GYRE_RETURN_IF_ERROR(RecordDispatch(sink, *alive[a], reqs[a]));
    }
    auto results = GenerateOnEach(pool_, alive, reqs, cfg_.cluster.rpc_timeout_s, stats);
    std::vector<size_t> retry;
    for (size_t a = 0; a < alive.size(); ++a) {
      auto& [s, resp] = results[a];
      if (s.ok()) {
        AddCounters(resp, stats);
        GYRE_RETURN_IF_ERROR(RecordFinished(sink, *alive[a], resp));
        for (auto& sample : *resp.mutable_samples()) {
          by_group[sample.group_id()].push_back(std::move(sample));
        }
        continue;
      }
      GYRE_RETURN_IF_ERROR(AfterGenerateFailure(alive[a], s, assign[a], &retry));
      GYRE_RETURN_IF_ERROR(
          RecordFailure(sink, *alive[a], reqs[a], "generate failed: " + s.message()));
    }
    pending = retry;
  }
  std::vector<v1::Sample> out;
  for (const auto& j : jobs) {
    auto& v = by_group[j.group.group_id()];
    if (static_cast<int>(v.size()) != j.group.n()) {
      return Internal("group " + std::to_string(j.group.group_id()) + " came back with " +
                      std::to_string(v.size()) + " samples, expected " +
                      std::to_string(j.group.n()));
    }
    for (auto& s : v) out.push_back(std::move(s));
  }
  return out;
}

StatusOr<std::vector<v1::Sample>> RolloutScheduler::GeneratePartial(
    std::vector<GroupJob>* jobs, int64_t target_groups, const v1::SamplingParams& sampling,
    int64_t min_version, GenerateStats* stats, const LedgerSink* sink) {
  const int n = cfg_.rollout.group_size;
  for (GroupJob& j : *jobs) partial_[j.group.group_id()].job = std::move(j);
  jobs->clear();
  auto completed = [&] {
    int64_t c = 0;
    for (const auto& [gid, pg] : partial_) c += static_cast<int>(pg.finished.size()) == n;
    return c;
  };
  std::vector<uint64_t> pending;
  for (const auto& [gid, pg] : partial_) {
    if (static_cast<int>(pg.finished.size()) < n) pending.push_back(gid);
  }
  while (completed() < target_groups && !pending.empty()) {
    GYRE_RETURN_IF_ERROR(pool_->CheckHealth());
    std::vector<Worker*> alive = pool_->AliveRollouts();
    if (alive.empty()) return Aborted("no rollout workers are alive");
    // A group goes back to the worker that holds its kept KV when that one is alive.
    std::vector<std::vector<uint64_t>> assign(alive.size());
    size_t rr = 0;
    for (uint64_t gid : pending) {
      size_t a = alive.size();
      for (size_t k = 0; k < alive.size(); ++k) {
        if (alive[k]->id == partial_[gid].worker) a = k;
      }
      if (a == alive.size()) a = rr++ % alive.size();
      assign[a].push_back(gid);
    }
    const int64_t still = target_groups - completed();
    std::vector<v1::GenerateRequest> reqs(alive.size());
    for (size_t a = 0; a < alive.size(); ++a) {
      v1::GenerateRequest& req = reqs[a];
      *req.mutable_sampling() = sampling;
      req.set_min_policy_version(min_version);
      const int64_t share = static_cast<int64_t>(assign[a].size());
      const int64_t target =
          std::min<int64_t>(share, (still * share + static_cast<int64_t>(pending.size()) - 1) /
                                       static_cast<int64_t>(pending.size()));
      req.set_target_finished_groups(static_cast<int32_t>(target));
      for (uint64_t gid : assign[a]) {
        PartialGroup& pg = partial_[gid];
        bool started = !pg.finished.empty();
        for (const auto& [sid, sample] : pg.unfinished) started |= sample.response_ids_size() > 0;
        if (!started) {
          *req.add_groups() = pg.job.group;  // not started: the whole group, prefix shared
        } else {
          for (const auto& [sid, sample] : pg.unfinished) *req.add_resume() = sample;
          stats->resumed_samples += static_cast<int64_t>(pg.unfinished.size());
        }
      }
      GYRE_RETURN_IF_ERROR(RecordDispatch(sink, *alive[a], req));
    }
    auto results = GenerateOnEach(pool_, alive, reqs, cfg_.cluster.rpc_timeout_s, stats);
    std::vector<uint64_t> retry;
    for (size_t a = 0; a < alive.size(); ++a) {
      auto& [s, resp] = results[a];
      if (s.ok()) {
        AddCounters(resp, stats);
        GYRE_RETURN_IF_ERROR(RecordFinished(sink, *alive[a], resp));
        for (auto& sample : *resp.mutable_samples()) {
          PartialGroup& pg = partial_[sample.group_id()];
          pg.unfinished.erase(sample.sample_id());
          pg.finished[sample.sample_id()] = std::move(sample);
        }
        for (auto& sample : *resp.mutable_unfinished()) {
          PartialGroup& pg = partial_[sample.group_id()];
          pg.unfinished[sample.sample_id()] = std::move(sample);
          pg.worker = alive[a]->id;
        }
        continue;
      }
      GYRE_RETURN_IF_ERROR(AfterGenerateFailure(alive[a], s, assign[a], &retry));
      GYRE_RETURN_IF_ERROR(
          RecordFailure(sink, *alive[a], reqs[a], "generate failed: " + s.message()));
    }
    pending = retry;
  }
  // The finished groups leave the groups in flight; the others carry over.
  std::vector<v1::Sample> out;
  for (auto it = partial_.begin(); it != partial_.end();) {
    if (static_cast<int>(it->second.finished.size()) != n) {
      ++it;
      continue;
    }
    for (auto& [sid, sample] : it->second.finished) out.push_back(std::move(sample));
    jobs->push_back(std::move(it->second.job));
    it = partial_.erase(it);
  }
  return out;
}

std::vector<v1::CarriedGroup> RolloutScheduler::SaveCarried() const {
  std::vector<v1::CarriedGroup> out;
  for (const auto& [gid, pg] : partial_) {
    v1::CarriedGroup cg;
    *cg.mutable_group() = pg.job.group;
    cg.set_prompt(pg.job.problem.prompt);
    cg.set_answer(pg.job.problem.answer);
    cg.set_prompt_is_messages(pg.job.problem.is_messages);
    for (const auto& [sid, f] : pg.finished) *cg.add_finished() = f;
    for (const auto& [sid, u] : pg.unfinished) *cg.add_unfinished() = u;
    cg.set_worker(pg.worker);
    out.push_back(std::move(cg));
  }
  return out;
}

Status RolloutScheduler::RestoreCarried(const std::vector<v1::CarriedGroup>& groups,
                                        SampleLedger* ledger) {
  partial_.clear();
  generating_.clear();
  for (const v1::CarriedGroup& cg : groups) {
    PartialGroup pg;
    pg.job.group = cg.group();
    pg.job.problem.prompt = cg.prompt();
    pg.job.problem.answer = cg.answer();
    pg.job.problem.is_messages = cg.prompt_is_messages();
    for (const v1::Sample& f : cg.finished()) pg.finished[f.sample_id()] = f;
    for (const v1::Sample& u : cg.unfinished()) pg.unfinished[u.sample_id()] = u;
    pg.worker = cg.worker();
    if (ledger != nullptr) {
      for (const auto& [sid, u] : pg.unfinished) {
        StatusOr<SampleRecord> r = ledger->Find(sid);
        if (!r.ok())
          return r.status().WithContext("carried group " + std::to_string(cg.group().group_id()));
        if (r->state == SampleState::kGenerating) generating_.insert(sid);
      }
    }
    partial_[cg.group().group_id()] = std::move(pg);
  }
  return Status::Ok();
}

}  // namespace gyre::controller
