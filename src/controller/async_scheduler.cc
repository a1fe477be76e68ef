#include "controller/async_scheduler.h"

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/logging.h"

namespace gyre::controller {

namespace {

std::vector<uint64_t> SampleIds(const std::vector<GroupJob>& groups) {
  std::vector<uint64_t> ids;
  for (const auto& g : groups) {
    for (int i = 0; i < g.group.n(); ++i) {
      ids.push_back(g.group.first_sample_id() + static_cast<uint64_t>(i));
    }
  }
  return ids;
}

GroupJob JobOf(const v1::CarriedGroup& cg) {
  GroupJob job;
  job.group = cg.group();
  job.problem.prompt = cg.prompt();
  job.problem.answer = cg.answer();
  job.problem.is_messages = cg.prompt_is_messages();
  return job;
}

v1::CarriedGroup CarriedOf(const GroupJob& job) {
  v1::CarriedGroup cg;
  *cg.mutable_group() = job.group;
  cg.set_prompt(job.problem.prompt);
  cg.set_answer(job.problem.answer);
  cg.set_prompt_is_messages(job.problem.is_messages);
  return cg;
}

// The oldest policy version among the samples' tokens (`fallback` when they have none).
int64_t OldestVersion(const std::vector<v1::Sample>& samples, int64_t fallback) {
  int64_t oldest = fallback;
  bool any = false;
  for (const auto& s : samples) {
    for (int64_t v : s.versions()) {
      oldest = any ? std::min(oldest, v) : v;
      any = true;
    }
  }
  return oldest;
}

}  // namespace

AsyncScheduler::AsyncScheduler(const JobConfig& cfg, WorkerPool* pool, SampleLedger* ledger,
                               v1::SamplingParams sampling, int64_t version,
                               const AsyncCarried* restore)
    : cfg_(cfg),
      pool_(pool),
      ledger_(ledger),
      sampling_(std::move(sampling)),
      per_step_(cfg.rollout.prompts_per_step),
      k_(cfg.algorithm.max_staleness),
      published_version_(version) {
  if (restore != nullptr) {
    // Group ids grow with admission, so their order is the admission order; the absolute
    // numbers only need to stay below those of groups admitted from now on.
    std::vector<const v1::CarriedGroup*> groups;
    for (const auto& cg : restore->groups) groups.push_back(&cg);
    std::sort(groups.begin(), groups.end(), [](const auto* a, const auto* b) {
      return a->group().group_id() < b->group().group_id();
    });
    uint64_t order = 0;
    for (const v1::CarriedGroup* cg : groups) {
      admitted_order_[cg->group().group_id()] = order;
      if (cg->finished_size() == 0) {
        queue_.emplace_back(JobOf(*cg), order++);
        continue;
      }
      ReadyGroup rg;
      rg.job = JobOf(*cg);
      rg.samples.assign(cg->finished().begin(), cg->finished().end());
      rg.gen_version = OldestVersion(rg.samples, version);
      rg.admitted = order++;
      ready_.push_back(std::move(rg));
    }
    admitted_ = std::max<int64_t>(restore->admitted, static_cast<int64_t>(order));
  }
  dispatcher_ = std::thread([this] { DispatchLoop(); });
}

AsyncScheduler::~AsyncScheduler() { Shutdown(); }

void AsyncScheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !dispatcher_.joinable()) return;
    stop_ = true;
    for (auto& [id, c] : cancels_) c->Cancel();
  }
  cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
  for (auto& f : calls_) f.wait();
  calls_.clear();
}

Status AsyncScheduler::Admit(int64_t steps_done,
                             const std::function<StatusOr<std::vector<GroupJob>>(int64_t)>& draw) {
  const int64_t bound = (k_ + steps_done + 1) * per_step_;
  int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    count = bound - admitted_;
  }
  if (count <= 0) return Status::Ok();
  GYRE_ASSIGN_OR_RETURN(std::vector<GroupJob> groups, draw(count));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (GroupJob& g : groups) {
      const uint64_t order = static_cast<uint64_t>(admitted_++);
      admitted_order_[g.group.group_id()] = order;
      queue_.emplace_back(std::move(g), order);
    }
  }
  cv_.notify_all();
  return Status::Ok();
}

namespace {

int64_t SamplesOf(const std::vector<GroupJob>& groups) {
  int64_t n = 0;
  for (const auto& g : groups) n += g.group.n();
  return n;
}

}  // namespace

Worker* AsyncScheduler::PickWorker(const std::vector<Worker*>& alive, int64_t chunk_samples) const {
  std::map<std::string, int64_t> load;  // samples outstanding per worker
  for (const auto& [id, in] : inflight_) load[in.worker] += SamplesOf(in.groups);
  Worker* best = nullptr;
  int64_t best_load = 0;
  for (Worker* w : alive) {
    const auto b = busy_.find(w->id);
    const bool has_calls = b != busy_.end() && b->second.calls > 0;
    if (cfg_.rollout.dispatch == "idle") {
      if (!has_calls) return w;
      continue;
    }
    const int64_t l = load.count(w->id) ? load.at(w->id) : 0;
    // A worker with calls in flight takes more only within its running batch.
    if (has_calls && l + chunk_samples > cfg_.rollout.max_running) continue;
    if (best == nullptr || l < best_load) {
      best = w;
      best_load = l;
    }
  }
  return best;
}

void AsyncScheduler::CallStarted(const std::string& worker) {
  Busy& b = busy_[worker];
  const auto now = SteadyClock::now();
  if (b.calls++ == 0) b.since = now;
}

void AsyncScheduler::CallEnded(const std::string& worker) {
  Busy& b = busy_[worker];
  const auto now = SteadyClock::now();
  if (--b.calls == 0) b.seconds += std::chrono::duration<double>(now - b.since).count();
}

void AsyncScheduler::DispatchLoop() {
  const int64_t chunk_cfg = cfg_.rollout.async_chunk_groups;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Calls that ended are let go of here, so their threads do not pile up.
    calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                                [](std::future<void>& f) {
                                  return f.wait_for(std::chrono::seconds(0)) ==
                                         std::future_status::ready;
                                }),
                 calls_.end());
    Worker* target = nullptr;
    int64_t chunk = 0;
    if (!paused_ && !queue_.empty()) {
      const std::vector<Worker*> alive = pool_->AliveRollouts();
      if (!alive.empty()) {
        chunk = chunk_cfg > 0
                    ? chunk_cfg
                    : std::max<int64_t>(1, (per_step_ + static_cast<int64_t>(alive.size()) - 1) /
                                               static_cast<int64_t>(alive.size()));
        int64_t samples = 0, taken = 0;
        for (const auto& [job, order] : queue_) {
          if (taken++ == chunk) break;
          samples += job.group.n();
        }
        target = PickWorker(alive, samples);
      }
    }
    if (target == nullptr) {
      // Woken by a posted result, an admission, a resume or shutdown; the pool's view of which
      // workers are alive changes without telling us, so look again every 50 ms.
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    const uint64_t call = next_call_++;
    Inflight sent;
    sent.worker = target->id;
    sent.dispatch_version = published_version_;
    sent.incarnation = pool_->Incarnation(target->id);
    v1::GenerateRequest req;
    *req.mutable_sampling() = sampling_;
    req.set_min_policy_version(published_version_);
    while (!queue_.empty() && static_cast<int64_t>(sent.groups.size()) < chunk) {
      *req.add_groups() = queue_.front().first.group;
      sent.groups.push_back(std::move(queue_.front().first));
      queue_.pop_front();
    }
    if (ledger_ != nullptr) {
      Status s = ledger_->Move(SampleIds(sent.groups), SampleState::kGenerating,
                               {-1, published_version_, target->id, ""});
      if (!s.ok() && fatal_.ok()) fatal_ = s;
    }
    auto cancel = std::make_shared<rpc::Cancellation>();
    cancels_[call] = cancel;
    inflight_[call] = std::move(sent);
    CallStarted(target->id);
    ++running_;
    const double timeout = cfg_.cluster.rpc_timeout_s;
    calls_.push_back(std::async(
        std::launch::async, [this, call, w = target, req = std::move(req), cancel, timeout] {
          Result r;
          r.call = call;
          r.worker = w->id;
          // Each finished group is posted as it arrives, so a batch can use it before the rest
          // of the call's groups are done.
          auto post = [this, w, call](v1::GenerateResponse& part) {
            Result p;
            p.call = call;
            p.worker = w->id;
            p.part = true;
            p.resp = std::move(part);
            {
              std::lock_guard<std::mutex> l(mu_);
              results_.push_back(std::move(p));
            }
            cv_.notify_all();
          };
          r.status = pool_->Invoke(w->id, timeout, cancel.get(), [&](const rpc::Call& c) {
            return w->rollout->GenerateStream(c, req, post);
          });
          {
            std::lock_guard<std::mutex> l(mu_);
            results_.push_back(std::move(r));
            --running_;
          }
          cv_.notify_all();
        }));
  }
}

Status AsyncScheduler::HandlePart(Result r, int64_t version, int64_t step) {
  gen_.generated_tokens += r.resp.generated_tokens();
  gen_.prefill_tokens += r.resp.prefill_tokens();
  gen_.prefix_shared_tokens += r.resp.prefix_shared_tokens();
  std::map<uint64_t, std::vector<v1::Sample>> by_group;
  for (auto& smp : *r.resp.mutable_samples()) by_group[smp.group_id()].push_back(std::move(smp));
  std::vector<ReadyGroup> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Inflight& in = inflight_.at(r.call);
    for (auto& [gid, samples] : by_group) {
      auto it = std::find_if(in.groups.begin(), in.groups.end(),
                             [gid = gid](const GroupJob& g) { return g.group.group_id() == gid; });
      if (it == in.groups.end()) {
        return Internal("rollout worker " + r.worker + " streamed back group " +
                        std::to_string(gid) + ", which it was not generating");
      }
      if (static_cast<int>(samples.size()) != it->group.n()) {
        return Internal("group " + std::to_string(gid) + " came back from " + r.worker + " with " +
                        std::to_string(samples.size()) + " samples, expected " +
                        std::to_string(it->group.n()));
      }
      std::sort(samples.begin(), samples.end(), [](const v1::Sample& a, const v1::Sample& b) {
        return a.sample_id() < b.sample_id();
      });
      ReadyGroup rg;
      rg.gen_version = OldestVersion(samples, in.dispatch_version);
      rg.samples = std::move(samples);
      rg.job = std::move(*it);
      rg.admitted = admitted_order_.at(gid);
      in.groups.erase(it);
      done.push_back(std::move(rg));
    }
  }
  if (ledger_ != nullptr) {
    std::vector<uint64_t> ids;
    for (const auto& rg : done) {
      for (const auto& smp : rg.samples) ids.push_back(smp.sample_id());
    }
    GYRE_RETURN_IF_ERROR(ledger_->Move(ids, SampleState::kFinished, {step, version, r.worker, ""}));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& rg : done) ready_.push_back(std::move(rg));
  return Status::Ok();
}

Status AsyncScheduler::Handle(Result r, int64_t version, int64_t step) {
  if (r.part) return HandlePart(std::move(r), version, step);
  int64_t incarnation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incarnation = inflight_.at(r.call).incarnation;
  }
  Worker* w = pool_->Get(r.worker);
  // Until this is handled the call stays in inflight_ (its samples count as the worker's load),
  // so the dispatcher cannot give the worker its room before a failure has been dealt with.
  auto release = [&]() {
    Inflight sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent = std::move(inflight_.at(r.call));
      inflight_.erase(r.call);
      cancels_.erase(r.call);
      CallEnded(r.worker);
    }
    cv_.notify_all();  // the worker has room again
    return sent;
  };
  if (r.status.ok()) {
    Inflight sent = release();
    if (!sent.groups.empty()) {
      return Internal("rollout worker " + r.worker + " ended its generate stream without " +
                      std::to_string(sent.groups.size()) + " of its groups (first: " +
                      std::to_string(sent.groups.front().group.group_id()) + ")");
    }
    return Status::Ok();
  }
  if (r.status.code() == StatusCode::kInvalidArgument) {
    release();
    return r.status.WithContext("generate on " + w->id);
  }
  const std::string why = "generate failed: " + r.status.message();
  // A call made to a process that has since been replaced (the monitor saw it die and the pool
  // restarted it) says nothing about the new one: only its groups go back.
  if (pool_->Incarnation(w->id) == incarnation) {
    GYRE_RETURN_IF_ERROR(pool_->AfterWorkFailure(w, why));
  }
  // The groups it streamed back before failing are kept; the others go back to the queue.
  Inflight sent = release();
  if (sent.groups.empty()) return Status::Ok();
  GYRE_LOG_WARN("re-queueing {} group(s) from {}", sent.groups.size(), w->id);
  if (ledger_ != nullptr) {
    GYRE_RETURN_IF_ERROR(
        ledger_->Move(SampleIds(sent.groups), SampleState::kQueued, {step, version, w->id, why}));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Back to the front, in admission order, so they are sent again first.
  for (auto it = sent.groups.rbegin(); it != sent.groups.rend(); ++it) {
    const uint64_t order = admitted_order_.at(it->group.group_id());
    queue_.emplace_front(std::move(*it), order);
  }
  cv_.notify_all();
  return Status::Ok();
}

bool AsyncScheduler::BatchReady(int64_t version) const {
  const int64_t oldest_allowed = version - k_;  // groups generated before this must be trained
  if (published_version_ < oldest_allowed + 1 && !queue_.empty()) return false;
  for (const auto& [id, in] : inflight_) {
    if (in.dispatch_version < oldest_allowed + 1) return false;
  }
  return static_cast<int64_t>(ready_.size()) >= per_step_;
}

StatusOr<std::vector<ReadyGroup>> AsyncScheduler::NextBatch(int64_t version, int64_t step) {
  const auto t0 = SteadyClock::now();
  while (true) {
    std::vector<Result> results;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!fatal_.ok()) return fatal_;
      results.swap(results_);
    }
    for (Result& r : results) GYRE_RETURN_IF_ERROR(Handle(std::move(r), version, step));
    GYRE_RETURN_IF_ERROR(pool_->CheckHealth());
    std::unique_lock<std::mutex> lock(mu_);
    if (results_.empty() && BatchReady(version)) break;
    if (results_.empty()) {
      if (pool_->AliveRollouts().empty()) return Aborted("no rollout workers are alive");
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Oldest generation first (every group that must be trained now is among them), then
  // admission order.
  std::sort(ready_.begin(), ready_.end(), [](const ReadyGroup& a, const ReadyGroup& b) {
    return a.gen_version != b.gen_version ? a.gen_version < b.gen_version : a.admitted < b.admitted;
  });
  size_t take = static_cast<size_t>(per_step_);
  while (take < ready_.size() && ready_[take].gen_version <= version - k_) ++take;
  std::vector<ReadyGroup> batch(std::make_move_iterator(ready_.begin()),
                                std::make_move_iterator(ready_.begin() + take));
  ready_.erase(ready_.begin(), ready_.begin() + take);
  for (const auto& rg : batch) admitted_order_.erase(rg.job.group.group_id());
  gen_wait_s_ = SecondsSince(t0);
  return batch;
}

Status AsyncScheduler::Pause() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = true;
  }
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (running_ == 0) return Status::Ok();
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (running_ == 0) return Status::Ok();
    }
    GYRE_RETURN_IF_ERROR(pool_->CheckHealth());
  }
}

StatusOr<AsyncCarried> AsyncScheduler::Checkpoint(int64_t version, int64_t step) {
  std::vector<Result> results;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!paused_ || running_ != 0) {
      return FailedPrecondition("AsyncScheduler::Checkpoint needs a paused scheduler (Pause)");
    }
    if (!fatal_.ok()) return fatal_;
    results.swap(results_);
  }
  for (Result& r : results) GYRE_RETURN_IF_ERROR(Handle(std::move(r), version, step));
  std::lock_guard<std::mutex> lock(mu_);
  if (!inflight_.empty()) return Internal("a generate call is still in flight at a checkpoint");
  AsyncCarried out;
  out.admitted = admitted_;
  for (const auto& [job, order] : queue_) out.groups.push_back(CarriedOf(job));
  for (const ReadyGroup& rg : ready_) {
    v1::CarriedGroup cg = CarriedOf(rg.job);
    for (const auto& smp : rg.samples) *cg.add_finished() = smp;
    out.groups.push_back(std::move(cg));
  }
  std::sort(out.groups.begin(), out.groups.end(), [](const auto& a, const auto& b) {
    return a.group().group_id() < b.group().group_id();
  });
  return out;
}

void AsyncScheduler::Resume(int64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    published_version_ = version;
    paused_ = false;
  }
  cv_.notify_all();
}

AsyncStats AsyncScheduler::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  AsyncStats s;
  s.admitted = admitted_;
  s.queued = static_cast<int64_t>(queue_.size());
  for (const auto& [id, in] : inflight_) s.in_flight += static_cast<int64_t>(in.groups.size());
  s.ready = static_cast<int64_t>(ready_.size());
  s.wait_s = gen_wait_s_;
  s.generate = gen_;
  const auto now = SteadyClock::now();
  for (auto& [worker, b] : busy_) {
    double seconds = b.seconds;
    if (b.calls > 0) seconds += std::chrono::duration<double>(now - b.since).count();
    s.generate.busy_s[worker] += seconds;
    b.seconds = 0;
    b.since = now;
  }
  gen_ = GenerateStats();
  return s;
}

}  // namespace gyre::controller
