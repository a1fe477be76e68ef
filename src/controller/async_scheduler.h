#pragma once
// AsyncScheduler: asynchronous rollout under a staleness bound (rollout.async, docs/design.md,
// "Staleness"). Generation runs ahead of training: while the trainer works on step v, rollout
// workers already generate groups for later steps. Two rules keep every trained sample's
// staleness (trainer version at use minus the oldest policy version among its tokens) at most
// k = algorithm.max_staleness:
//
//   admission  with B = rollout.prompts_per_step groups per step, after s GRPO steps at most
//              (a + s + 1) * B groups have ever been admitted (AReaL's rule), where a = k / M
//              (integer division) with M = trainer.mini_batches: each GRPO step is M policy
//              versions, so rollout runs a steps ahead (a = k with one mini-batch);
//   batching   the step that uses trainer version v waits until every admitted group generated
//              at version v - k or older is finished, and trains on those first (then on the
//              other finished groups, oldest version first, up to B).
//
// In this mode ("publish to everyone, then continue") a publish waits for the calls in flight,
// so no call spans two versions and the batching rule's clause on groups in flight is implied;
// it matters when workers take new weights between engine steps (rollout.weight_updates:
// between_steps). With k = 0 this is the synchronous loop. Finished work is never thrown away: a
// finished group waits in the ready queue until a batch takes it. Groups go out in chunks of
// rollout.async_chunk_groups from a dispatcher thread, as streaming calls
// (Rollout.GenerateStream): each group joins the ready queue as soon as it finishes, not when its
// chunk does. rollout.dispatch picks the worker: least_loaded sends a chunk to the alive worker
// with the fewest samples outstanding, while that stays within rollout.max_running (a worker runs
// several calls at once, in one batch, so it takes new work beside the long tail of earlier
// ones); idle sends only to workers with no call in flight. In lockstep a publish pauses
// dispatching so that every call after it runs on the new version ("publish to everyone, then
// continue").
//
// Work stealing (rollout.work_stealing): when no new work is queued and a worker has no call in
// flight, it takes over half of the samples outstanding on the most loaded worker (at least 2
// outstanding), oldest first: Rollout.Preempt takes them out of that worker's streams with the
// tokens they have, and they are continued on the idle worker (GenerateRequest.resume), keeping
// their per-token versions. The long tails of the slowest worker so end up on workers whose
// batches are nearly empty, where engine steps are shorter. A group is assembled from whatever
// calls produced its samples; it is ready when all n are back.
//
// Group splitting (rollout.split_groups = S > 0): an admitted group is queued as pieces of at
// most S consecutive samples, each a unit of its own, so one group's samples spread over the
// least loaded workers (Seer); a piece's samples share their prompt's prefill on their worker.
//
// Repacking (Pause(true), rollout.weight_updates: repack): a publish pauses dispatching and
// takes every sample still generating out of its call (Rollout.Preempt, with its tokens and
// per-token versions) instead of waiting for the longest of them; after the publish they are
// sent first, async_chunk_groups per call to the least loaded worker, so the long tails are
// packed onto a few workers and the others take new work at full batch.
//
// Tail repacking without lockstep (rollout.weight_updates: between_steps_repack): publishes do
// not pause generation, but at each (Resume) the samples of every call sent before the previous
// publish, which have been generating for a whole step, are taken out the same way and sent
// again in calls of at most rollout.tail_batch samples, each to a tail worker: one that takes no
// new work while its tail call runs (unless every worker is one), so the long tails decode in
// small batches, where engine steps are shortest, and the other workers keep full batches.
//
// Threads: Admit, NextBatch, Pause, Resume, Checkpoint and Shutdown are for the job thread. The
// dispatcher thread (owned, joined by Shutdown) only starts calls and steals; each call (and
// each steal) runs on its own thread; a call posts its result, a steal re-queues what it took. The
// job thread handles every result (ledger moves, failures, re-queueing), so WorkerPool is used from
// the job thread only, apart from its thread-safe AliveRollouts and Invoke.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controller/rollout_scheduler.h"
#include "controller/sample_ledger.h"
#include "controller/worker_pool.h"

namespace gyre::controller {

// A finished group, ready for a batch.
struct ReadyGroup {
  GroupJob job;
  std::vector<v1::Sample> samples;  // n, in sample order
  int64_t gen_version = 0;          // the oldest policy version among its tokens
  uint64_t admitted = 0;            // admission order
};

// What a checkpoint keeps of the scheduler (Checkpoint): every admitted group not yet trained,
// with its finished samples and the unfinished ones taken over from a worker (to resume); its
// other samples are generated afresh. And the admission count.
struct AsyncCarried {
  std::vector<v1::CarriedGroup> groups;  // by group id
  int64_t admitted = 0;
};

struct AsyncStats {
  int64_t admitted = 0;    // groups ever admitted
  int64_t queued = 0;      // groups with samples admitted, not yet sent to a worker
  int64_t in_flight = 0;   // groups with samples sent, not yet back
  int64_t ready = 0;       // back and finished, not yet in a batch
  int64_t stolen = 0;      // samples taken over from a busy worker since the last stats()
  int64_t repacked = 0;    // samples taken out of calls for a publish since the last stats()
  double wait_s = 0;       // the last NextBatch's wait
  GenerateStats generate;  // engine counters since the last stats(); busy_s: time each
                           // worker had at least one call in flight
};

class AsyncScheduler {
 public:
  // `pool` (not owned) must outlive the scheduler; `ledger` may be null. The workers hold
  // policy `version` (published); the scheduler starts dispatching at once, first from
  // `restore` (a checkpoint's Checkpoint(), nullable): its never-sent groups go to the queue
  // and its finished ones to the ready queue, with the admission count it had.
  AsyncScheduler(const JobConfig& cfg, WorkerPool* pool, SampleLedger* ledger,
                 v1::SamplingParams sampling, int64_t version,
                 const AsyncCarried* restore = nullptr);
  ~AsyncScheduler();
  AsyncScheduler(const AsyncScheduler&) = delete;
  AsyncScheduler& operator=(const AsyncScheduler&) = delete;

  // Admits as many groups as the admission rule allows after `steps_done` GRPO steps, drawn by
  // `draw(count)` (on the job thread; it records them in the ledger as queued).
  Status Admit(int64_t steps_done,
               const std::function<StatusOr<std::vector<GroupJob>>(int64_t count)>& draw);

  // Blocks until the batch of the step that uses trainer version `version` is complete (see
  // the batching rule) and returns it; `step` and `version` label the ledger's moves.
  StatusOr<std::vector<ReadyGroup>> NextBatch(int64_t version, int64_t step);

  // Around a publish (or an evaluation): Pause stops dispatching and waits for the calls in
  // flight to end (their results wait for NextBatch); with `take_running` it first takes the
  // samples still generating out of them, to be continued after Resume (repacking). Resume
  // dispatches again, with calls that need at least policy `version`. Pause fails when the job
  // must end meanwhile.
  Status Pause(bool take_running = false);
  void Resume(int64_t version);

  // For a checkpoint, between Pause and Resume: applies every result posted meanwhile (ledger
  // moves and re-queueing labelled with `version` and `step`), so no group is in flight, and
  // returns the admitted groups not yet trained.
  StatusOr<AsyncCarried> Checkpoint(int64_t version, int64_t step);

  // Stops dispatching, cancels the calls in flight and joins every thread. Idempotent.
  void Shutdown();

  AsyncStats stats();

 private:
  // A piece of work for a worker: fresh samples of a group (`piece`: the group's prompt, with
  // first_sample_id, seed and n narrowed to a contiguous run of its samples), or one unfinished
  // sample to continue (`resume`).
  struct Unit {
    v1::PromptGroup piece;
    bool is_resume = false;
    bool tail = false;  // a long tail taken out at a publish (between_steps_repack)
    v1::Sample resume;
    uint64_t order = 0;  // its group's admission order
    int64_t samples() const { return is_resume ? 1 : piece.n(); }
    uint64_t group_id() const { return is_resume ? resume.group_id() : piece.group_id(); }
  };
  // An admitted group not yet ready: its finished samples so far.
  struct Assembling {
    GroupJob job;
    uint64_t order = 0;
    std::vector<v1::Sample> finished;
    // The oldest token version among `finished` (a bound on the group's generation version,
    // which the batching rule must respect before the group is complete).
    int64_t oldest = std::numeric_limits<int64_t>::max();
  };
  struct Inflight {
    std::string worker;
    bool tail = false;  // long tails (between_steps_repack): its worker takes no new work
    std::map<uint64_t, uint64_t> expected;   // sample id -> group id, not yet streamed back
    std::map<uint64_t, v1::Sample> resumed;  // sample id -> its state when sent (resumes)
    int64_t dispatch_version = 0;
    int64_t oldest_version = 0;  // the oldest token version it may still produce samples with
    int64_t incarnation = 0;     // WorkerPool::Incarnation of the worker when sent
    // Samples streamed back and posted, not yet handled by the job thread: they no longer load
    // the worker, so the dispatcher gives it new work while the job thread is busy training.
    int64_t streamed = 0;
    int64_t load() const { return static_cast<int64_t>(expected.size()) - streamed; }
  };
  // What a call posts for the job thread: each streamed part (finished samples), then its end.
  struct Result {
    uint64_t call = 0;
    std::string worker;
    bool part = false;  // a streamed part; otherwise the call's end
    Status status;      // the end's
    v1::GenerateResponse resp;
  };
  // The time a worker has had calls in flight, for busy_s (under mu_).
  struct Busy {
    int calls = 0;
    std::chrono::steady_clock::time_point since;  // of the current stretch, or of stats()
    double seconds = 0;                           // since the last stats()
  };
  // The worker the dispatcher sends the next chunk to (under mu_), or null: by
  // rollout.dispatch, among `alive`; a `tail` chunk (long tails) preferably to one that runs no
  // tail call yet, other chunks never to one that does.
  Worker* PickWorker(const std::vector<Worker*>& alive, int64_t chunk_samples, bool tail) const;
  // Samples each worker with calls in flight still has to stream back (under mu_).
  std::map<std::string, int64_t> Loads() const;
  void CallStarted(const std::string& worker);  // under mu_
  void CallEnded(const std::string& worker);    // under mu_
  void DispatchLoop();
  // Under mu_: starts a steal when work stealing is on, nothing is queued, a worker is idle and
  // another has at least 2 samples outstanding. Returns whether it started one.
  bool MaybeSteal();
  // Why samples are taken out of their calls: an idle worker steals them, a publish takes every
  // running one (repack), or a publish takes the long tails (between_steps_repack).
  enum class Take { kSteal, kRepack, kTail };
  // Under mu_: asks worker `w` (on a thread of its own) to give up the samples of `req`; those
  // it hands back return to the queue (ledger: queued, `why`) to be continued elsewhere. Until
  // that is applied, the ends of `w`'s calls are held back (deferred_).
  void StartPreempt(Worker* w, v1::PreemptRequest req, const std::string& why, Take take);
  // Under mu_, at a publish (between_steps_repack): takes the samples of every call sent before
  // the previous publish out, to be sent again as tail calls.
  void RepackTails();
  // Under mu_: the still-expected samples of `in` as units to send again (contiguous fresh runs
  // and resumes).
  std::vector<Unit> Remaining(const Inflight& in) const;
  // Under mu_: puts `units` back at the front of the queue, in admission order.
  void Requeue(std::vector<Unit> units);
  // Under mu_: a finished sample joins its group; a complete group moves to the ready queue.
  Status Collect(v1::Sample sample, int64_t dispatch_version);
  // Job thread: applies one call's result. Error = the job must end.
  Status Handle(Result r, int64_t version, int64_t step);
  // A streamed part: its samples leave the worker's in-flight set for their groups.
  Status HandlePart(Result r, int64_t version, int64_t step);
  // Whether the batch for `version` can be formed (under mu_).
  bool BatchReady(int64_t version) const;

  const JobConfig cfg_;
  WorkerPool* pool_;
  SampleLedger* ledger_;
  const v1::SamplingParams sampling_;
  const int64_t per_step_;  // B
  const int64_t k_;
  const int64_t ahead_;  // GRPO steps rollout may run ahead: k / trainer.mini_batches

  std::mutex mu_;
  std::condition_variable cv_;             // results posted, publish state, shutdown
  std::deque<Unit> queue_;                 // admitted work not sent, in admission order
  std::map<uint64_t, Inflight> inflight_;  // by call id
  uint64_t next_call_ = 0;
  std::map<std::string, Busy> busy_;
  std::map<uint64_t, Assembling> groups_;  // admitted, not ready yet: by group id
  std::vector<Result> results_;            // posted by calls, handled by the job
  std::vector<ReadyGroup> ready_;
  std::set<std::string> preempting_;  // workers a preemption in flight takes samples from
  // After a steal that took nothing (the samples had not started, or had just finished), the
  // next waits until then.
  std::chrono::steady_clock::time_point steal_backoff_until_;
  std::vector<Result> deferred_;   // their calls' ends, held back until the preemption is applied
  int64_t stolen_ = 0;             // samples taken over since the last stats()
  int64_t repacked_ = 0;           // samples taken out for a publish since the last stats()
  int64_t published_version_ = 0;  // what new calls require
  bool paused_ = false;
  bool stop_ = false;
  int running_ = 0;  // calls started whose result is not posted yet
  Status fatal_;     // a ledger write that failed on the dispatcher thread
  double gen_wait_s_ = 0;
  int64_t admitted_ = 0;
  GenerateStats gen_;
  std::vector<std::future<void>> calls_;  // dispatcher thread only, until Shutdown
  std::map<uint64_t, std::shared_ptr<rpc::Cancellation>> cancels_;  // calls in flight
  std::thread dispatcher_;
};

}  // namespace gyre::controller
