#include "controller/async_scheduler.h"

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/logging.h"

namespace gyre::controller {

namespace {

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

// The piece of `group` with its samples [first, first + n) (ids).
v1::PromptGroup PieceOf(const v1::PromptGroup& group, uint64_t first, int n) {
  v1::PromptGroup piece = group;
  piece.set_first_sample_id(first);
  piece.set_seed(group.seed() + (first - group.first_sample_id()));
  piece.set_n(n);
  return piece;
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
      ahead_(cfg.algorithm.max_staleness / std::max(1, cfg.trainer.mini_batches)),
      published_version_(version) {
  if (restore != nullptr) {
    // Group ids grow with admission, so their order is the admission order; the absolute
    // numbers only need to stay below those of groups admitted from now on.
    std::vector<const v1::CarriedGroup*> carried;
    for (const auto& cg : restore->groups) carried.push_back(&cg);
    std::sort(carried.begin(), carried.end(), [](const auto* a, const auto* b) {
      return a->group().group_id() < b->group().group_id();
    });
    uint64_t order = 0;
    for (const v1::CarriedGroup* cg : carried) {
      const uint64_t gid = cg->group().group_id();
      Assembling& a = groups_[gid];
      a.job = JobOf(*cg);
      a.order = order++;
      std::set<uint64_t> known;
      for (const auto& smp : cg->finished()) {
        known.insert(smp.sample_id());
        a.finished.push_back(smp);
        for (int64_t v : smp.versions()) a.oldest = std::min(a.oldest, v);
      }
      std::vector<Unit> units;
      for (const auto& smp : cg->unfinished()) {
        known.insert(smp.sample_id());
        Unit u;
        u.is_resume = true;
        u.resume = smp;
        u.order = a.order;
        units.push_back(std::move(u));
      }
      // The others are generated afresh, in contiguous runs.
      const uint64_t first = cg->group().first_sample_id();
      const uint64_t end = first + static_cast<uint64_t>(cg->group().n());
      for (uint64_t id = first; id < end;) {
        if (known.count(id) > 0) {
          ++id;
          continue;
        }
        uint64_t last = id;
        while (last < end && known.count(last) == 0) ++last;
        Unit u;
        u.piece = PieceOf(cg->group(), id, static_cast<int>(last - id));
        u.order = a.order;
        units.push_back(std::move(u));
        id = last;
      }
      for (Unit& u : units) queue_.push_back(std::move(u));
      if (static_cast<int>(a.finished.size()) == cg->group().n()) {
        ReadyGroup rg;
        rg.job = std::move(a.job);
        rg.samples = std::move(a.finished);
        rg.gen_version = OldestVersion(rg.samples, version);
        rg.admitted = a.order;
        ready_.push_back(std::move(rg));
        groups_.erase(gid);
      }
    }
    admitted_ = std::max<int64_t>(restore->admitted, static_cast<int64_t>(order));
  }
  dispatcher_ = std::thread([this] {
    NameThisThread("gyre-dispatch");
    DispatchLoop();
  });
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
  const int64_t bound = (ahead_ + steps_done + 1) * per_step_;
  int64_t count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    count = bound - admitted_;
  }
  if (count <= 0) return Status::Ok();
  GYRE_ASSIGN_OR_RETURN(std::vector<GroupJob> groups, draw(count));
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int split = cfg_.rollout.split_groups;
    for (GroupJob& g : groups) {
      const uint64_t order = static_cast<uint64_t>(admitted_++);
      const int n = g.group.n();
      const int size = split > 0 ? std::min(split, n) : n;
      for (int first = 0; first < n; first += size) {
        Unit u;
        u.piece = PieceOf(g.group, g.group.first_sample_id() + first, std::min(size, n - first));
        u.order = order;
        queue_.push_back(std::move(u));
      }
      Assembling& a = groups_[g.group.group_id()];
      a.job = std::move(g);
      a.order = order;
    }
  }
  cv_.notify_all();
  return Status::Ok();
}

Worker* AsyncScheduler::PickWorker(const std::vector<Worker*>& alive, int64_t chunk_samples,
                                   bool tail) const {
  const std::map<std::string, int64_t> load = Loads();
  std::set<std::string> tail_workers;  // workers running a tail call
  for (const auto& [id, in] : inflight_) {
    if (in.tail && !in.expected.empty()) tail_workers.insert(in.worker);
  }
  // The least loaded worker among those `eligible`, within its running batch.
  auto pick = [&](const std::function<bool(const Worker*)>& eligible) -> Worker* {
    Worker* best = nullptr;
    int64_t best_load = 0;
    for (Worker* w : alive) {
      if (!eligible(w)) continue;
      // A call whose samples have all streamed back no longer occupies its worker, even while
      // the job thread, busy training, has not handled its end yet.
      const int64_t l = load.count(w->id) ? load.at(w->id) : 0;
      if (cfg_.rollout.dispatch == "idle") {
        if (l == 0) return w;
        continue;
      }
      // A worker still generating takes more only within its running batch.
      if (l > 0 && l + chunk_samples > cfg_.rollout.max_running) continue;
      if (best == nullptr || l < best_load) {
        best = w;
        best_load = l;
      }
    }
    return best;
  };
  auto is_tail = [&](const Worker* w) { return tail_workers.count(w->id) > 0; };
  size_t others = 0;  // alive workers running no tail call
  for (const Worker* w : alive) others += is_tail(w) ? 0 : 1;
  // New work goes to a tail worker only when every worker is one, so tail batches stay small.
  if (!tail) {
    if (others == 0) return pick([](const Worker*) { return true; });
    return pick([&](const Worker* w) { return !is_tail(w); });
  }
  // Long tails make a new tail worker while at least one other worker stays for new work;
  // otherwise they join a tail worker.
  if (others > 1) {
    if (Worker* w = pick([&](const Worker* x) { return !is_tail(x); })) return w;
  }
  return tail_workers.empty() ? pick([](const Worker*) { return true; }) : pick(is_tail);
}

std::map<std::string, int64_t> AsyncScheduler::Loads() const {
  std::map<std::string, int64_t> load;
  for (const auto& [id, in] : inflight_) load[in.worker] += in.load();
  return load;
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
    bool tail = false;
    if (!paused_ && !queue_.empty()) {
      const std::vector<Worker*> alive = pool_->AliveRollouts();
      if (!alive.empty()) {
        chunk = chunk_cfg > 0
                    ? chunk_cfg
                    : std::max<int64_t>(1, (per_step_ + static_cast<int64_t>(alive.size()) - 1) /
                                               static_cast<int64_t>(alive.size()));
        // Unfinished samples taken out of calls (repacking, stealing) go out together, up to a
        // running batch per call, so they are packed onto as few workers as they fill; long
        // tails (between_steps_repack) up to rollout.tail_batch per call.
        const bool resumes = queue_.front().is_resume;
        tail = resumes && queue_.front().tail;
        if (resumes) chunk = cfg_.rollout.max_running;
        const int64_t most = tail ? std::min<int64_t>(cfg_.rollout.tail_batch, chunk)
                                  : std::numeric_limits<int64_t>::max();
        int64_t samples = 0, taken = 0;
        for (const Unit& u : queue_) {
          if (taken == chunk || (resumes && !u.is_resume) || u.tail != tail ||
              samples + u.samples() > most) {
            break;
          }
          ++taken;
          samples += u.samples();
        }
        chunk = taken;
        target = PickWorker(alive, samples, tail);
      }
    }
    if (target == nullptr) {
      if (MaybeSteal()) continue;
      // Woken by a posted result, an admission, a resume or shutdown; the pool's view of which
      // workers are alive changes without telling us, so look again every 50 ms.
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    const uint64_t call = next_call_++;
    Inflight sent;
    sent.worker = target->id;
    sent.tail = tail;
    sent.dispatch_version = published_version_;
    sent.oldest_version = published_version_;
    sent.incarnation = pool_->Incarnation(target->id);
    v1::GenerateRequest req;
    *req.mutable_sampling() = sampling_;
    req.set_min_policy_version(published_version_);
    std::vector<uint64_t> ids;
    for (int64_t n = 0; !queue_.empty() && n < chunk; ++n) {
      Unit& u = queue_.front();
      if (u.is_resume) {
        const uint64_t id = u.resume.sample_id();
        sent.expected[id] = u.resume.group_id();
        for (int64_t v : u.resume.versions())
          sent.oldest_version = std::min(sent.oldest_version, v);
        ids.push_back(id);
        *req.add_resume() = u.resume;
        sent.resumed[id] = std::move(u.resume);
      } else {
        for (int i = 0; i < u.piece.n(); ++i) {
          const uint64_t id = u.piece.first_sample_id() + static_cast<uint64_t>(i);
          sent.expected[id] = u.piece.group_id();
          ids.push_back(id);
        }
        *req.add_groups() = std::move(u.piece);
      }
      queue_.pop_front();
    }
    if (ledger_ != nullptr) {
      Status s =
          ledger_->Move(ids, SampleState::kGenerating, {-1, published_version_, target->id, ""});
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
          NameThisThread("gyre-generate");
          Result r;
          r.call = call;
          r.worker = w->id;
          // Each finished unit is posted as it arrives, so a batch can use it before the rest
          // of the call's units are done.
          auto post = [this, w, call](v1::GenerateResponse& part) {
            Result p;
            p.call = call;
            p.worker = w->id;
            p.part = true;
            p.resp = std::move(part);
            {
              std::lock_guard<std::mutex> l(mu_);
              inflight_.at(call).streamed += p.resp.samples_size();
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

bool AsyncScheduler::MaybeSteal() {
  if (!cfg_.rollout.work_stealing || paused_ || stop_ || !queue_.empty() || !preempting_.empty() ||
      SteadyClock::now() < steal_backoff_until_) {
    return false;
  }
  const std::vector<Worker*> alive = pool_->AliveRollouts();
  const std::map<std::string, int64_t> load = Loads();
  Worker* thief = nullptr;
  for (Worker* w : alive) {
    if (load.count(w->id) == 0 || load.at(w->id) == 0) {
      thief = w;
      break;
    }
  }
  if (thief == nullptr) return false;
  Worker* victim = nullptr;
  int64_t most = 1;
  for (Worker* w : alive) {
    const auto l = load.find(w->id);
    if (l != load.end() && l->second > most) {
      victim = w;
      most = l->second;
    }
  }
  if (victim == nullptr) return false;
  // Half of its outstanding samples, oldest call and sample first.
  v1::PreemptRequest req;
  for (const auto& [id, in] : inflight_) {
    if (in.worker != victim->id) continue;
    for (const auto& [sid, gid] : in.expected) {
      if (req.sample_ids_size() == most / 2) break;
      req.add_sample_ids(sid);
    }
  }
  StartPreempt(victim, std::move(req), "taken over by an idle worker", Take::kSteal);
  GYRE_LOG_DEBUG("{} takes up to {} sample(s) over from {}", thief->id, most / 2, victim->id);
  return true;
}

void AsyncScheduler::StartPreempt(Worker* w, v1::PreemptRequest req, const std::string& why,
                                  Take take) {
  preempting_.insert(w->id);
  const uint64_t call = next_call_++;
  auto cancel = std::make_shared<rpc::Cancellation>();
  cancels_[call] = cancel;
  ++running_;
  const double timeout = cfg_.cluster.rpc_timeout_s;
  calls_.push_back(std::async(std::launch::async, [this, call, w, why, take, req = std::move(req),
                                                   cancel, timeout] {
    NameThisThread("gyre-preempt");
    const bool steal = take == Take::kSteal;
    v1::PreemptResponse resp;
    const Status s = pool_->Invoke(w->id, timeout, cancel.get(), [&](const rpc::Call& c) {
      return w->rollout->Preempt(c, req, &resp);
    });
    std::lock_guard<std::mutex> l(mu_);
    if (!s.ok()) {
      GYRE_LOG_DEBUG("taking samples out of {} failed: {}", w->id, s.ToString());
    }
    // Each taken sample leaves the call that was generating it (if that call has not failed
    // and been re-queued meanwhile) and goes back to the queue, to be continued elsewhere.
    std::vector<Unit> units;
    std::vector<uint64_t> ids;
    for (v1::Sample& smp : *resp.mutable_unfinished()) {
      const uint64_t id = smp.sample_id();
      for (auto& [cid, in] : inflight_) {
        if (in.worker != w->id || in.expected.erase(id) == 0) continue;
        in.resumed.erase(id);
        Unit u;
        u.is_resume = true;
        u.tail = take == Take::kTail;
        u.order = groups_.count(smp.group_id()) > 0 ? groups_.at(smp.group_id()).order : 0;
        u.resume = std::move(smp);
        units.push_back(std::move(u));
        ids.push_back(id);
        break;
      }
    }
    if (steal && ids.empty()) {
      steal_backoff_until_ = SteadyClock::now() + std::chrono::milliseconds(20);
    }
    if (!ids.empty()) {
      GYRE_LOG_DEBUG("{} sample(s) of {} go back to the queue ({})", ids.size(), w->id, why);
      (steal ? stolen_ : repacked_) += static_cast<int64_t>(ids.size());
      if (ledger_ != nullptr) {
        Status m = ledger_->Move(ids, SampleState::kQueued, {-1, published_version_, w->id, why});
        if (!m.ok() && fatal_.ok()) fatal_ = m;
      }
      Requeue(std::move(units));
    }
    // The ends of this worker's calls held back meanwhile can be handled now.
    std::vector<Result> held;
    for (Result& r : deferred_) (r.worker == w->id ? results_ : held).push_back(std::move(r));
    deferred_.swap(held);
    preempting_.erase(w->id);
    cancels_.erase(call);
    --running_;
    cv_.notify_all();
  }));
}

std::vector<AsyncScheduler::Unit> AsyncScheduler::Remaining(const Inflight& in) const {
  std::vector<Unit> units;
  for (auto it = in.expected.begin(); it != in.expected.end();) {
    const auto [id, gid] = *it;
    const auto a = groups_.find(gid);
    const uint64_t order = a == groups_.end() ? 0 : a->second.order;
    const auto r = in.resumed.find(id);
    if (r != in.resumed.end()) {
      Unit u;
      u.is_resume = true;
      u.tail = in.tail;
      u.resume = r->second;
      u.order = order;
      units.push_back(std::move(u));
      ++it;
      continue;
    }
    // A run of consecutive fresh samples of one group.
    uint64_t last = id;
    auto next = it;
    while (next != in.expected.end() && next->first == last && next->second == gid &&
           in.resumed.count(next->first) == 0) {
      ++last;
      ++next;
    }
    if (a != groups_.end()) {
      Unit u;
      u.piece = PieceOf(a->second.job.group, id, static_cast<int>(last - id));
      u.order = order;
      units.push_back(std::move(u));
    }
    it = next;
  }
  return units;
}

void AsyncScheduler::Requeue(std::vector<Unit> units) {
  // Back to the front, in admission order, so they are sent again first.
  std::stable_sort(units.begin(), units.end(),
                   [](const Unit& a, const Unit& b) { return a.order < b.order; });
  for (auto it = units.rbegin(); it != units.rend(); ++it) queue_.push_front(std::move(*it));
  cv_.notify_all();
}

Status AsyncScheduler::Collect(v1::Sample sample, int64_t dispatch_version) {
  const uint64_t gid = sample.group_id();
  auto a = groups_.find(gid);
  if (a == groups_.end()) {
    return Internal("sample " + std::to_string(sample.sample_id()) + " came back for group " +
                    std::to_string(gid) + ", which is not being generated");
  }
  for (int64_t v : sample.versions()) a->second.oldest = std::min(a->second.oldest, v);
  a->second.finished.push_back(std::move(sample));
  if (static_cast<int>(a->second.finished.size()) < a->second.job.group.n()) return Status::Ok();
  ReadyGroup rg;
  rg.samples = std::move(a->second.finished);
  std::sort(rg.samples.begin(), rg.samples.end(),
            [](const v1::Sample& x, const v1::Sample& y) { return x.sample_id() < y.sample_id(); });
  rg.gen_version = OldestVersion(rg.samples, dispatch_version);
  rg.job = std::move(a->second.job);
  rg.admitted = a->second.order;
  groups_.erase(a);
  ready_.push_back(std::move(rg));
  return Status::Ok();
}

Status AsyncScheduler::HandlePart(Result r, int64_t version, int64_t step) {
  gen_.generated_tokens += r.resp.generated_tokens();
  gen_.prefill_tokens += r.resp.prefill_tokens();
  gen_.prefix_shared_tokens += r.resp.prefix_shared_tokens();
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Inflight& in = inflight_.at(r.call);
    for (const auto& smp : r.resp.samples()) {
      const auto it = in.expected.find(smp.sample_id());
      if (it == in.expected.end() || it->second != smp.group_id()) {
        return Internal("rollout worker " + r.worker + " streamed back sample " +
                        std::to_string(smp.sample_id()) + " of group " +
                        std::to_string(smp.group_id()) + ", which it was not generating");
      }
    }
    in.streamed -= r.resp.samples_size();
    for (auto& smp : *r.resp.mutable_samples()) {
      in.expected.erase(smp.sample_id());
      in.resumed.erase(smp.sample_id());
      ids.push_back(smp.sample_id());
      GYRE_RETURN_IF_ERROR(Collect(std::move(smp), in.dispatch_version));
    }
  }
  if (ledger_ != nullptr && !ids.empty()) {
    GYRE_RETURN_IF_ERROR(ledger_->Move(ids, SampleState::kFinished, {step, version, r.worker, ""}));
  }
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
    if (!sent.expected.empty()) {
      return Internal("rollout worker " + r.worker + " ended its generate stream without " +
                      std::to_string(sent.expected.size()) + " of its samples (first: " +
                      std::to_string(sent.expected.begin()->first) + ")");
    }
    return Status::Ok();
  }
  if (r.status.code() == StatusCode::kInvalidArgument) {
    release();
    return r.status.WithContext("generate on " + w->id);
  }
  const std::string why = "generate failed: " + r.status.message();
  // A call made to a process that has since been replaced (the monitor saw it die and the pool
  // restarted it) says nothing about the new one: only its samples go back.
  if (pool_->Incarnation(w->id) == incarnation) {
    GYRE_RETURN_IF_ERROR(pool_->AfterWorkFailure(w, why));
  }
  // The samples it streamed back before failing are kept; the others go back to the queue.
  Inflight sent = release();
  if (sent.expected.empty()) return Status::Ok();
  GYRE_LOG_WARN("re-queueing {} sample(s) from {}", sent.expected.size(), w->id);
  std::vector<uint64_t> ids;
  for (const auto& [id, gid] : sent.expected) ids.push_back(id);
  if (ledger_ != nullptr) {
    GYRE_RETURN_IF_ERROR(ledger_->Move(ids, SampleState::kQueued, {step, version, w->id, why}));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Requeue(Remaining(sent));
  return Status::Ok();
}

bool AsyncScheduler::BatchReady(int64_t version) const {
  const int64_t oldest_allowed = version - k_;  // work generated before this must be trained
  for (const Unit& u : queue_) {
    int64_t v = published_version_;
    if (u.is_resume) {
      for (int64_t t : u.resume.versions()) v = std::min(v, t);
    }
    if (v < oldest_allowed + 1) return false;
  }
  for (const auto& [id, in] : inflight_) {
    if (in.oldest_version < oldest_allowed + 1 && !in.expected.empty()) return false;
  }
  // A group whose samples came from several calls (work stealing, a failed call) is as old as
  // its oldest finished sample.
  for (const auto& [gid, a] : groups_) {
    if (a.oldest < oldest_allowed + 1) return false;
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
      // A call's end waits while a steal from its worker is in flight: the samples it took are
      // still listed as the call's until the steal is applied.
      for (Result& r : results_) {
        (!r.part && preempting_.count(r.worker) > 0 ? deferred_ : results).push_back(std::move(r));
      }
      results_.clear();
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
  gen_wait_s_ = SecondsSince(t0);
  return batch;
}

Status AsyncScheduler::Pause(bool take_running) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = true;
    if (take_running) {
      // Every sample still expected from a worker, one preemption per worker.
      std::map<std::string, v1::PreemptRequest> take;
      for (const auto& [id, in] : inflight_) {
        for (const auto& [sid, gid] : in.expected) take[in.worker].add_sample_ids(sid);
      }
      for (auto& [worker, req] : take) {
        Worker* w = pool_->Get(worker);
        if (w == nullptr || preempting_.count(worker) > 0) continue;
        StartPreempt(w, std::move(req), "taken out for a publish (repack)", Take::kRepack);
      }
    }
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
  if (!inflight_.empty() || !preempting_.empty()) {
    return Internal("a generate call is still in flight at a checkpoint");
  }
  AsyncCarried out;
  out.admitted = admitted_;
  std::map<uint64_t, v1::CarriedGroup> carried;
  for (const auto& [gid, a] : groups_) {
    v1::CarriedGroup& cg = carried[gid];
    cg = CarriedOf(a.job);
    for (const auto& smp : a.finished) *cg.add_finished() = smp;
  }
  for (const Unit& u : queue_) {
    if (u.is_resume && carried.count(u.group_id()) > 0) {
      *carried[u.group_id()].add_unfinished() = u.resume;
    }
  }
  for (const ReadyGroup& rg : ready_) {
    v1::CarriedGroup& cg = carried[rg.job.group.group_id()];
    cg = CarriedOf(rg.job);
    for (const auto& smp : rg.samples) *cg.add_finished() = smp;
  }
  for (auto& [gid, cg] : carried) {
    auto by_id = [](const v1::Sample& a, const v1::Sample& b) {
      return a.sample_id() < b.sample_id();
    };
    std::sort(cg.mutable_finished()->begin(), cg.mutable_finished()->end(), by_id);
    std::sort(cg.mutable_unfinished()->begin(), cg.mutable_unfinished()->end(), by_id);
    out.groups.push_back(std::move(cg));
  }
  return out;
}

void AsyncScheduler::Resume(int64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cfg_.rollout.weight_updates == "between_steps_repack" && !stop_) RepackTails();
    published_version_ = version;
    paused_ = false;
  }
  cv_.notify_all();
}

void AsyncScheduler::RepackTails() {
  if (pool_->AliveRollouts().size() < 2) return;  // nowhere else to pack them
  // A call sent before the previous publish has run for at least a whole step: what it still
  // generates is the long tail. One preemption per worker, for all such calls' samples.
  std::map<std::string, v1::PreemptRequest> take;
  for (const auto& [id, in] : inflight_) {
    if (in.tail || in.dispatch_version >= published_version_) continue;
    for (const auto& [sid, gid] : in.expected) take[in.worker].add_sample_ids(sid);
  }
  for (auto& [worker, req] : take) {
    Worker* w = pool_->Get(worker);
    if (w == nullptr || preempting_.count(worker) > 0 || req.sample_ids_size() == 0) continue;
    StartPreempt(w, std::move(req), "a long tail, repacked onto a tail worker", Take::kTail);
  }
}

AsyncStats AsyncScheduler::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  AsyncStats s;
  s.admitted = admitted_;
  std::set<uint64_t> queued, in_flight;
  for (const Unit& u : queue_) queued.insert(u.group_id());
  for (const auto& [id, in] : inflight_) {
    for (const auto& [sid, gid] : in.expected) in_flight.insert(gid);
  }
  s.queued = static_cast<int64_t>(queued.size());
  s.in_flight = static_cast<int64_t>(in_flight.size());
  s.ready = static_cast<int64_t>(ready_.size());
  s.stolen = stolen_;
  s.repacked = repacked_;
  stolen_ = 0;
  repacked_ = 0;
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
