// AsyncScheduler over fake rollout workers. The property test runs many randomized schedules
// (staleness bound, batch size, chunking, call delays, worker failures and restarts) and checks
// the two promises: no trained sample is staler than algorithm.max_staleness, and the ledger
// accounts for every sample exactly once (each admitted sample is trained once, or still in
// flight when the schedule ends; none is lost or trained twice).

#include "controller/async_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <set>

#include "common/file_util.h"
#include "fakes/fake_job.h"

namespace gyre::controller {
namespace {

using testing::FakeCluster;
using testing::FakeJob;
using testing::FakeJobConfig;

// Draws groups with consecutive ids and records them in the ledger, as the job does.
class Drawer {
 public:
  Drawer(SampleLedger* ledger, int n) : ledger_(ledger), n_(n) {}
  StatusOr<std::vector<GroupJob>> operator()(int64_t count, int64_t step, int64_t version) {
    std::vector<GroupJob> out;
    std::vector<NewSample> queued;
    for (int64_t g = 0; g < count; ++g) {
      GroupJob j;
      const uint64_t gid = next_++;
      j.group.set_group_id(gid);
      j.group.add_prompt_ids(1);
      j.group.set_n(n_);
      j.group.set_first_sample_id(gid * static_cast<uint64_t>(n_));
      j.problem.prompt = "p" + std::to_string(gid);
      for (int i = 0; i < n_; ++i) {
        queued.push_back(
            {gid * static_cast<uint64_t>(n_) + static_cast<uint64_t>(i), gid, j.problem.prompt});
      }
      out.push_back(std::move(j));
    }
    if (ledger_ && !queued.empty()) GYRE_RETURN_IF_ERROR(ledger_->Add(queued, {step, version}));
    return out;
  }
  uint64_t drawn() const { return next_; }

 private:
  SampleLedger* ledger_;
  int n_;
  uint64_t next_ = 0;
};

// A ledger database at `path` is three files with WAL.
void RemoveLedgerFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) (void)RemoveTree(path + suffix);
}

v1::SamplingParams Sampling() {
  v1::SamplingParams s;
  s.set_max_new_tokens(4);
  return s;
}

// One schedule: `steps` GRPO steps at B groups each under staleness bound k; returns the
// largest staleness trained. Failures go through on_generate; `revive` brings dead workers back.
struct Schedule {
  int k = 1, B = 2, n = 2, steps = 6, chunk = 0;
  double max_delay_s = 0.002;
  double stream_delay_s = 0;  // between two streamed groups of one call
  double fail_p = 0;
  // After a step, with this probability: a checkpoint (Pause, Checkpoint), then a new scheduler
  // restored from it, as a resumed job builds one.
  double restart_p = 0;
  // Publish without pausing (rollout.weight_updates: between_steps): calls in flight go on and
  // their later samples carry the new version.
  bool no_pause = false;
  // rollout.dispatch, and the running batch (rollout.max_running) that bounds least_loaded.
  std::string dispatch = "least_loaded";
  int max_running = 256;
  bool steal = true;  // rollout.work_stealing
  int split = 0;      // rollout.split_groups
  // A publish takes the samples still generating out of their calls (weight_updates: repack).
  bool repack = false;
  // With no_pause: each publish moves calls older than a step onto tail workers
  // (weight_updates: between_steps_repack), at most tail_batch samples per call.
  bool tails = false;
  int tail_batch = 32;
  // trainer.publish_every: only every this-many steps publish (and restarts, which publish);
  // in between the workers keep generating with the version they hold.
  int publish_every = 1;
};

int64_t g_restarts = 0;  // scheduler restarts from a checkpoint, over all schedules
int64_t g_stolen = 0;    // samples taken over by idle workers, over all schedules
int64_t g_tails = 0;     // long-tail samples moved onto tail workers, over all schedules

int64_t RunSchedule(FakeJob& job, const Schedule& sch, std::mt19937_64* rng, int index) {
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = sch.k;
  cfg.rollout.prompts_per_step = sch.B;
  cfg.rollout.async_chunk_groups = sch.chunk;
  cfg.rollout.dispatch = sch.dispatch;
  cfg.rollout.max_running = sch.max_running;
  cfg.rollout.work_stealing = sch.steal;
  cfg.rollout.split_groups = sch.split;
  cfg.rollout.weight_updates = sch.tails      ? "between_steps_repack"
                               : sch.repack   ? "repack"
                               : sch.no_pause ? "between_steps"
                                              : "lockstep";
  cfg.rollout.tail_batch = sch.tail_batch;
  const std::string path = "/dev/shm/gyre_async_ledger_" + std::to_string(::getpid()) + "_" +
                           std::to_string(index) + ".db";
  RemoveLedgerFiles(path);
  auto ledger = SampleLedger::Open(path, true);
  EXPECT_TRUE(ledger.ok()) << ledger.status();
  if (!ledger.ok()) return -1;

  // Every worker is alive and holds the starting version.
  int64_t version = 10;
  std::mutex fail_mu;
  std::set<int> failed;  // workers that failed and did not register again; guarded by fail_mu
  auto revive = [&] {
    for (int i = 0; i < cfg.rollout.workers; ++i) {
      const std::string id = "rollout-" + std::to_string(i);
      if (job.pool->IsDead(id)) {
        (void)FakeCluster::Register(&job.service, v1::WORKER_ROLE_ROLLOUT, i);
        std::lock_guard<std::mutex> lock(fail_mu);
        failed.erase(i);
      }
    }
    Status s = job.pool->Revive(version, [&](Worker* w) {
      w->version = version;
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s;
  };
  for (auto& r : job.cluster.rollout) {
    r->version = version;
    r->stream_group_delay_s = sch.stream_delay_s;
  }
  revive();

  // Calls take a random time; some fail (never the last healthy worker).
  std::uniform_real_distribution<double> u(0, 1);
  std::mt19937_64 call_rng((*rng)());
  for (int i = 0; i < cfg.rollout.workers; ++i) {
    auto fake = job.cluster.rollout[i];
    fake->on_generate = [&, fake, i](const v1::GenerateRequest& req, v1::GenerateResponse* resp) {
      double delay;
      bool fail = false;
      {
        std::lock_guard<std::mutex> lock(fail_mu);
        // A long tail: one call in eight takes up to 20 times longer.
        delay = u(call_rng) * sch.max_delay_s * (u(call_rng) < 0.125 ? 20 : 1);
        if (u(call_rng) < sch.fail_p && !failed.count(i) &&
            static_cast<int>(failed.size()) + 1 < cfg.rollout.workers) {
          failed.insert(i);
          fail = true;
        }
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      if (fail) return Unavailable("Socket closed");
      for (const auto& g : req.groups()) {
        for (auto& s : testing::FakeSamples(g, fake->version.load())) *resp->add_samples() = s;
      }
      return Status::Ok();
    };
  }

  Drawer draw(ledger->get(), sch.n);
  auto async =
      std::make_unique<AsyncScheduler>(cfg, job.pool.get(), ledger->get(), Sampling(), version);
  int64_t worst = 0, trained_groups = 0;
  std::set<uint64_t> trained;
  for (int step = 1; step <= sch.steps; ++step) {
    Status s = async->Admit(step - 1, [&](int64_t count) { return draw(count, step, version); });
    EXPECT_TRUE(s.ok()) << s;
    auto batch = async->NextBatch(version, step);
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) break;
    EXPECT_GE(static_cast<int64_t>(batch->size()), sch.B);
    std::vector<uint64_t> ids;
    for (const auto& rg : *batch) {
      EXPECT_TRUE(trained.insert(rg.job.group.group_id()).second)
          << "group " << rg.job.group.group_id() << " trained twice";
      for (const auto& smp : rg.samples) {
        int64_t oldest = version;
        for (int64_t v : smp.versions()) oldest = std::min(oldest, v);
        worst = std::max(worst, version - oldest);
        ids.push_back(smp.sample_id());
      }
    }
    trained_groups += static_cast<int64_t>(batch->size());
    const AsyncStats st = async->stats();
    g_stolen += st.stolen;
    if (sch.tails) g_tails += st.repacked;
    EXPECT_TRUE((*ledger)->Move(ids, SampleState::kScored, {step, version}).ok());
    EXPECT_TRUE((*ledger)->Move(ids, SampleState::kTrained, {step, version + 1}).ok());
    // The step's update, then publish to everyone (every publish_every steps).
    ++version;
    const bool restart = u(*rng) < sch.restart_p;
    if (step % sch.publish_every != 0 && !restart) {
      if (u(*rng) < 0.3) revive();
      continue;
    }
    if (!sch.no_pause || restart) EXPECT_TRUE(async->Pause(sch.repack).ok());
    for (auto& r : job.cluster.rollout) r->version = version;
    for (Worker* w : job.pool->AliveRollouts()) w->version = version;
    if (restart) {
      // Every admitted, untrained group is in the checkpoint with its finished samples and the
      // unfinished ones taken over from a worker (the rest are generated afresh), and the
      // ledger agrees; the restored scheduler continues with them and the admission count.
      auto carried = async->Checkpoint(version, step);
      EXPECT_TRUE(carried.ok()) << carried.status();
      if (!carried.ok()) break;
      int64_t finished = 0, queued = 0;
      for (const auto& cg : carried->groups) {
        EXPECT_LE(cg.finished_size() + cg.unfinished_size(), sch.n);
        if (!sch.steal && !sch.repack && !sch.tails) EXPECT_EQ(cg.unfinished_size(), 0);
        finished += cg.finished_size();
        queued += sch.n - cg.finished_size();
      }
      auto counts = (*ledger)->Counts();
      EXPECT_TRUE(counts.ok());
      EXPECT_EQ(counts->of(SampleState::kFinished), finished);
      EXPECT_EQ(counts->of(SampleState::kQueued), queued);
      EXPECT_EQ(counts->of(SampleState::kGenerating), 0);
      EXPECT_EQ(carried->admitted, static_cast<int64_t>(draw.drawn()));
      async->Shutdown();
      async = std::make_unique<AsyncScheduler>(cfg, job.pool.get(), ledger->get(), Sampling(),
                                               version, &*carried);
      ++g_restarts;
    }
    async->Resume(version);
    if (u(*rng) < 0.3) revive();  // a launcher brings failed workers back now and then
  }
  async->Shutdown();
  // The ledger accounts for every admitted sample exactly once.
  auto counts = (*ledger)->Counts();
  EXPECT_TRUE(counts.ok());
  const int64_t admitted = static_cast<int64_t>(draw.drawn()) * sch.n;
  EXPECT_EQ(counts->total, admitted);
  EXPECT_EQ(counts->of(SampleState::kTrained), trained_groups * sch.n);
  EXPECT_EQ(counts->of(SampleState::kDropped) + counts->of(SampleState::kFiltered), 0);
  EXPECT_EQ(counts->total, counts->of(SampleState::kTrained) + counts->of(SampleState::kQueued) +
                               counts->of(SampleState::kGenerating) +
                               counts->of(SampleState::kFinished));
  // Admission: never more than (k + steps + 1) * B groups.
  EXPECT_LE(static_cast<int64_t>(draw.drawn()), (sch.k + sch.steps) * sch.B);
  RemoveLedgerFiles(path);
  for (auto& r : job.cluster.rollout) {
    r->on_generate = nullptr;
    r->stream_group_delay_s = 0;
  }
  revive();
  return worst;
}

TEST(AsyncSchedulerTest, SynchronousBoundTrainsEveryAdmittedGroupInItsOwnStep) {
  FakeJob job(FakeJobConfig(2, 1));
  job.death_grace_s = 0;
  ASSERT_TRUE(job.Start().ok());
  std::mt19937_64 rng(1);
  Schedule sch;
  sch.k = 0;
  sch.B = 3;
  EXPECT_EQ(RunSchedule(job, sch, &rng, 0), 0);
}

TEST(AsyncSchedulerTest, RandomSchedulesKeepTheStalenessBoundAndTheLedgerExact) {
  FakeJob job(FakeJobConfig(4, 1));
  job.death_grace_s = 0;
  ASSERT_TRUE(job.Start().ok());
  const char* env = std::getenv("GYRE_ASYNC_SCHEDULES");
  const int schedules = env ? std::atoi(env) : 1000;
  std::mt19937_64 rng(12345);
  std::map<int, int64_t> worst_by_k;
  for (int i = 0; i < schedules; ++i) {
    Schedule sch;
    sch.k = std::vector<int>{0, 1, 2, 4}[rng() % 4];
    sch.B = 1 + static_cast<int>(rng() % 5);
    sch.n = 1 + static_cast<int>(rng() % 3);
    sch.steps = 3 + static_cast<int>(rng() % 6);
    sch.chunk = static_cast<int>(rng() % 4);
    sch.max_delay_s = 0.0002 * static_cast<double>(rng() % 5);
    sch.stream_delay_s = 0.0001 * static_cast<double>(rng() % 3);
    sch.fail_p = (rng() % 3 == 0) ? 0.15 : 0.0;
    sch.restart_p = (rng() % 4 == 0) ? 0.3 : 0.0;
    sch.no_pause = rng() % 2 == 0;
    sch.dispatch = rng() % 3 == 0 ? "idle" : "least_loaded";
    sch.max_running = sch.n * (1 + static_cast<int>(rng() % 8));
    sch.steal = rng() % 3 != 0;
    sch.split = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 2) : 0;
    sch.repack = !sch.no_pause && rng() % 2 == 0;
    sch.tails = sch.no_pause && rng() % 2 == 0;
    sch.tail_batch = 1 + static_cast<int>(rng() % 4);
    // publish_every P needs k >= P (the config's rule with one version per step).
    sch.publish_every =
        sch.k >= 2 && rng() % 3 == 0 ? 2 + static_cast<int>(rng() % (sch.k - 1)) : 1;
    const int64_t worst = RunSchedule(job, sch, &rng, i);
    EXPECT_LE(worst, sch.k) << "schedule " << i << ": k=" << sch.k << " B=" << sch.B
                            << " publish_every=" << sch.publish_every;
    worst_by_k[sch.k] = std::max(worst_by_k[sch.k], worst);
    if (HasFailure()) break;
  }
  // Rollout ran ahead: with k >= 1 some batch trained samples older than the trainer.
  EXPECT_GT(worst_by_k[4] + worst_by_k[2] + worst_by_k[1], 0);
  if (schedules >= 100) {
    EXPECT_GT(g_restarts, 0) << "no schedule restarted from a checkpoint";
    EXPECT_GT(g_stolen, 0) << "no idle worker took samples over";
    EXPECT_GT(g_tails, 0) << "no publish moved long tails onto tail workers";
  }
}

// Streaming: a group joins the ready queue when it finishes, so a batch does not wait for the rest
// of its chunk. One worker gets a chunk of 4 groups, streamed 0.4 s apart; the batch of 1 is
// ready after the first.
TEST(AsyncSchedulerTest, ABatchUsesGroupsStreamedBackBeforeTheirChunkEnds) {
  FakeJob job(FakeJobConfig(1, 1));
  ASSERT_TRUE(job.Start().ok());
  job.cluster.rollout[0]->stream_group_delay_s = 0.4;
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 3;
  cfg.rollout.prompts_per_step = 1;
  cfg.rollout.async_chunk_groups = 4;
  Drawer draw(nullptr, 2);
  AsyncScheduler async(cfg, job.pool.get(), nullptr, Sampling(), 0);
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // 4 groups
  const auto t0 = std::chrono::steady_clock::now();
  auto batch = async.NextBatch(0, 1);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 1u);
  EXPECT_EQ((*batch)[0].job.group.group_id(), 0u);
  EXPECT_LT(waited, 0.35) << "the batch waited for more than the first streamed group";
  EXPECT_EQ(job.cluster.rollout[0]->stream_calls().size(), 1u);
  EXPECT_EQ(job.cluster.rollout[0]->stream_calls()[0].groups_size(), 4);
  async.Shutdown();
}

// rollout.dispatch: least_loaded gives a worker whose call runs long more calls, as long as its
// outstanding samples fit its running batch (max_running); idle gives each worker one call at a
// time. Worker 0's calls take 0.3 s, worker 1's are quick; chunks are one group of 2 samples.
TEST(AsyncSchedulerTest, LeastLoadedDispatchFillsABusyWorkersBatchAndNoMore) {
  for (const std::string dispatch : {"least_loaded", "idle"}) {
    SCOPED_TRACE(dispatch);
    FakeJob job(FakeJobConfig(2, 1));
    ASSERT_TRUE(job.Start().ok());
    job.cluster.rollout[0]->generate_delay_s = 0.3;
    JobConfig cfg = job.cfg;
    cfg.algorithm.max_staleness = 4;
    cfg.rollout.prompts_per_step = 2;
    cfg.rollout.async_chunk_groups = 1;
    cfg.rollout.max_running = 6;  // three chunks
    cfg.rollout.dispatch = dispatch;
    cfg.rollout.work_stealing = false;  // only dispatch moves work here
    Drawer draw(nullptr, 2);
    AsyncScheduler async(cfg, job.pool.get(), nullptr, Sampling(), 0);
    ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // 10 groups
    for (int64_t v = 0; v < 5; ++v) {
      auto batch = async.NextBatch(v, v + 1);
      ASSERT_TRUE(batch.ok()) << batch.status();
      ASSERT_EQ(batch->size(), 2u);
    }
    async.Shutdown();
    const auto& slow = *job.cluster.rollout[0];
    const auto& quick = *job.cluster.rollout[1];
    EXPECT_EQ(slow.stream_calls().size() + quick.stream_calls().size(), 10u);
    if (dispatch == "idle") {
      EXPECT_EQ(slow.max_concurrent_streams(), 1);
      EXPECT_EQ(quick.max_concurrent_streams(), 1);
    } else {
      // The slow worker was given more calls while its first still ran, and never a fourth
      // (6 samples outstanding at most).
      EXPECT_GE(slow.max_concurrent_streams(), 2);
      EXPECT_LE(slow.max_concurrent_streams(), 3);
      EXPECT_GE(quick.stream_calls().size(), 4u);
    }
    AsyncStats st = async.stats();
    for (const auto& [worker, busy] : st.generate.busy_s) {
      EXPECT_GE(busy, 0) << worker;
      EXPECT_LT(busy, 10) << worker << ": calls at once were counted twice";
    }
  }
}

// Samples streamed back stop loading their worker as soon as they arrive, before the job thread
// handles them: while the job is busy elsewhere (training), a worker whose batch holds one group
// gets the next as soon as the previous streams back. Nothing calls NextBatch for 0.5 s here,
// and all five groups are sent meanwhile. Also when a call is larger than the running batch
// (max_running 1, groups of 2): a worker whose calls have all streamed back counts as idle (it
// once counted as busy until the job thread handled the ends, so it idled through train steps).
TEST(AsyncSchedulerTest, StreamedSamplesFreeTheirWorkersRoomBeforeTheJobHandlesThem) {
  for (const int max_running : {2, 1}) {
    SCOPED_TRACE("max_running " + std::to_string(max_running));
    FakeJob job(FakeJobConfig(1, 1));
    ASSERT_TRUE(job.Start().ok());
    JobConfig cfg = job.cfg;
    cfg.algorithm.max_staleness = 4;
    cfg.rollout.prompts_per_step = 1;
    cfg.rollout.async_chunk_groups = 1;
    cfg.rollout.max_running = max_running;
    cfg.rollout.work_stealing = false;
    Drawer draw(nullptr, 2);
    AsyncScheduler async(cfg, job.pool.get(), nullptr, Sampling(), 0);
    ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // 5 groups
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(job.cluster.rollout[0]->stream_calls().size(), 5u);
    for (int64_t v = 0; v < 5; ++v) {
      auto batch = async.NextBatch(v, v + 1);
      ASSERT_TRUE(batch.ok()) << batch.status();
    }
    async.Shutdown();
  }
}

// A stream that fails midway keeps the groups it delivered; only the others are generated again,
// on the surviving worker, and the ledger shows which went back to the queue and why.
TEST(AsyncSchedulerTest, AFailedStreamKeepsTheGroupsItDelivered) {
  FakeJob job(FakeJobConfig(2, 1));
  job.death_grace_s = 0;
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->stream_fail_after = 1;
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 0;
  cfg.rollout.prompts_per_step = 2;
  cfg.rollout.async_chunk_groups = 2;
  cfg.rollout.work_stealing = false;  // the idle worker would take group 0 over
  const std::string path = ::testing::TempDir() + "gyre_async_stream_fail.db";
  RemoveLedgerFiles(path);
  auto ledger = SampleLedger::Open(path, true);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  Drawer draw(ledger->get(), 2);
  AsyncScheduler async(cfg, job.pool.get(), ledger->get(), Sampling(), 0);
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // groups 0, 1
  auto batch = async.NextBatch(0, 1);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 2u);
  // Group 0 (samples 0, 1) came back from the failed stream and was never queued again; group 1
  // (samples 2, 3) was, with the failure as the reason.
  auto first = (*ledger)->History(0);
  ASSERT_TRUE(first.ok());
  int requeued = 0;
  for (const auto& e : *first) requeued += e.to == SampleState::kQueued;
  EXPECT_EQ(requeued, 1) << "only its admission";
  auto second = (*ledger)->History(2);
  ASSERT_TRUE(second.ok());
  requeued = 0;
  std::string why;
  for (const auto& e : *second) {
    if (e.to != SampleState::kQueued) continue;
    ++requeued;
    why = e.context.reason;
  }
  EXPECT_EQ(requeued, 2);
  EXPECT_EQ(why, "generate failed: Socket closed");
  int calls = 0;
  for (auto& r : job.cluster.rollout) calls += static_cast<int>(r->stream_calls().size());
  EXPECT_EQ(calls, 2);
  async.Shutdown();
  RemoveLedgerFiles(path);
}

// Work stealing: worker 0's call runs long while worker 1 is idle and nothing is queued, so
// worker 1 takes over half of worker 0's outstanding samples (the oldest first) with the token
// they had, and continues them; each time it is idle again it takes half of what is left, until
// one sample is. Groups are assembled from both workers; the taken samples keep worker 0's first
// token and version; the ledger shows each move and its reason, and counts each sample once.
TEST(AsyncSchedulerTest, AnIdleWorkerTakesOverHalfOfTheBusiestWorkersSamples) {
  FakeJob job(FakeJobConfig(2, 1));
  ASSERT_TRUE(job.Start().ok());
  auto& slow = *job.cluster.rollout[0];
  auto& quick = *job.cluster.rollout[1];
  slow.generate_delay_s = 0.5;
  slow.version = 3;
  quick.version = 4;  // marks the tokens worker 1 generates
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 0;
  cfg.rollout.prompts_per_step = 2;
  cfg.rollout.async_chunk_groups = 2;  // both groups go to one worker
  cfg.rollout.work_stealing = true;
  const std::string path = ::testing::TempDir() + "gyre_async_steal.db";
  RemoveLedgerFiles(path);
  auto ledger = SampleLedger::Open(path, true);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  Drawer draw(ledger->get(), 4);
  AsyncScheduler async(cfg, job.pool.get(), ledger->get(), Sampling(), 3);
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 3); }).ok());  // groups 0, 1
  auto batch = async.NextBatch(3, 1);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 2u);
  const AsyncStats st = async.stats();
  async.Shutdown();

  ASSERT_EQ(slow.stream_calls().size(), 1u);
  std::vector<std::vector<uint64_t>> asked;
  // (A steal that came before the stream had started took nothing and was asked again.)
  for (const auto& p : slow.preempt_calls()) {
    std::vector<uint64_t> ids(p.sample_ids().begin(), p.sample_ids().end());
    if (asked.empty() || asked.back() != ids) asked.push_back(std::move(ids));
  }
  EXPECT_EQ(asked, (std::vector<std::vector<uint64_t>>{{0, 1, 2, 3}, {4, 5}, {6}}));
  EXPECT_EQ(st.stolen, 7);
  int resumed = 0;
  for (const auto& c : quick.stream_calls()) {
    EXPECT_EQ(c.groups_size(), 0);
    resumed += c.resume_size();
  }
  EXPECT_EQ(resumed, 7);
  // Taken samples go out together: the first steal's four in one call.
  ASSERT_FALSE(quick.stream_calls().empty());
  EXPECT_EQ(quick.stream_calls()[0].resume_size(), 4);
  for (const auto& rg : *batch) {
    ASSERT_EQ(rg.samples.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      const v1::Sample& smp = rg.samples[static_cast<size_t>(i)];
      EXPECT_EQ(smp.sample_id(), rg.job.group.first_sample_id() + static_cast<uint64_t>(i));
      ASSERT_EQ(smp.versions_size(), testing::kFakeResponseLen);
      // One token from worker 0 at version 3, then worker 1's at version 4; sample 7 stayed.
      EXPECT_EQ(smp.versions(0), 3);
      EXPECT_EQ(smp.versions(1), smp.sample_id() == 7 ? 3 : 4) << smp.sample_id();
    }
  }
  EXPECT_EQ((*batch)[0].gen_version, 3);
  EXPECT_EQ((*batch)[1].gen_version, 3);
  auto history = (*ledger)->History(1);
  ASSERT_TRUE(history.ok());
  std::vector<std::string> path_of_1;
  for (const auto& e : *history) {
    path_of_1.push_back(std::string(SampleStateName(e.to)) + "@" + e.context.worker + ":" +
                        e.context.reason);
  }
  EXPECT_EQ(path_of_1, (std::vector<std::string>{"queued@:", "generating@rollout-0:",
                                                 "queued@rollout-0:taken over by an idle worker",
                                                 "generating@rollout-1:", "finished@rollout-1:"}));
  auto counts = (*ledger)->Counts();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->of(SampleState::kFinished), 8);
  EXPECT_EQ(counts->total, 8);
  RemoveLedgerFiles(path);
}

// With trainer.mini_batches = M each GRPO step is M policy versions, so the admission rule lets
// rollout run k / M steps ahead: k = 3, M = 2 admits one step ahead, as k = 1 with M = 1 does.
TEST(AsyncSchedulerTest, AdmissionCountsGrpoStepsAsMiniBatchVersions) {
  FakeJob job(FakeJobConfig(1, 1));
  ASSERT_TRUE(job.Start().ok());
  for (const auto& [k, m] : std::vector<std::pair<int, int>>{{3, 2}, {1, 1}, {4, 2}}) {
    JobConfig cfg = job.cfg;
    cfg.algorithm.max_staleness = k;
    cfg.trainer.mini_batches = m;
    cfg.rollout.prompts_per_step = 2;
    Drawer draw(nullptr, 1);
    AsyncScheduler async(cfg, job.pool.get(), nullptr, Sampling(), 0);
    ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());
    EXPECT_EQ(async.stats().admitted, 2 * (k / m + 1)) << "k=" << k << " M=" << m;
    ASSERT_TRUE(async.Admit(1, [&](int64_t c) { return draw(c, 2, 0); }).ok());
    EXPECT_EQ(async.stats().admitted, 2 * (k / m + 2)) << "k=" << k << " M=" << m;
    async.Shutdown();
  }
}

// rollout.split_groups: a group of 8 goes out in pieces of 3, 3 and 2 samples, each to the least
// loaded worker (so three different ones), with its own first sample id and seed; the group is
// assembled from the three calls and is ready when all 8 are back.
TEST(AsyncSchedulerTest, SplitGroupsSpreadOneGroupsSamplesOverTheWorkers) {
  FakeJob job(FakeJobConfig(4, 1));
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->generate_delay_s = 0.1;
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 0;
  cfg.rollout.prompts_per_step = 1;
  cfg.rollout.async_chunk_groups = 1;
  cfg.rollout.split_groups = 3;
  cfg.rollout.work_stealing = false;
  Drawer draw(nullptr, 8);
  AsyncScheduler async(cfg, job.pool.get(), nullptr, Sampling(), 0);
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // group 0
  auto batch = async.NextBatch(0, 1);
  ASSERT_TRUE(batch.ok()) << batch.status();
  async.Shutdown();
  ASSERT_EQ(batch->size(), 1u);
  ASSERT_EQ((*batch)[0].samples.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ((*batch)[0].samples[i].sample_id(), i);
  std::vector<std::string> pieces;  // "worker:first+n@seed"
  for (int w = 0; w < 4; ++w) {
    for (const auto& c : job.cluster.rollout[w]->stream_calls()) {
      ASSERT_EQ(c.groups_size(), 1);
      const v1::PromptGroup& g = c.groups(0);
      EXPECT_EQ(g.group_id(), 0u);
      pieces.push_back(std::to_string(w) + ":" + std::to_string(g.first_sample_id()) + "+" +
                       std::to_string(g.n()) + "@" + std::to_string(g.seed()));
    }
  }
  std::sort(pieces.begin(), pieces.end());
  EXPECT_EQ(pieces, (std::vector<std::string>{"0:0+3@0", "1:3+3@3", "2:6+2@6"}));
}

// rollout.weight_updates: repack. Each worker runs a call of two groups that would take 5 s; a
// publish's Pause(true) takes their samples out (with the token each has, at version 0) instead
// of waiting, and after Resume the eight go out first, together, in one call to one worker,
// where they finish at version 1. The ledger records the move and its reason.
TEST(AsyncSchedulerTest, RepackingTakesRunningSamplesOutForAPublishAndSendsThemTogether) {
  FakeJob job(FakeJobConfig(2, 1));
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->generate_delay_s = 5;
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 1;
  cfg.rollout.prompts_per_step = 2;
  cfg.rollout.async_chunk_groups = 2;
  cfg.rollout.work_stealing = false;
  const std::string path = ::testing::TempDir() + "gyre_async_repack.db";
  RemoveLedgerFiles(path);
  auto ledger = SampleLedger::Open(path, true);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  Drawer draw(ledger->get(), 2);
  AsyncScheduler async(cfg, job.pool.get(), ledger->get(), Sampling(), 0);
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // groups 0-3
  const auto started = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (job.cluster.rollout[0]->stream_calls().size() +
                 job.cluster.rollout[1]->stream_calls().size() <
             2 &&
         std::chrono::steady_clock::now() < started) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // their samples are running
  for (auto& r : job.cluster.rollout) {
    r->generate_delay_s = 0;
    r->version = 1;  // the published version
  }
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(async.Pause(true).ok());
  const double paused_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(paused_s, 2.0) << "the pause waited for the calls instead of taking their samples";
  async.Resume(1);
  auto batch = async.NextBatch(1, 1);
  ASSERT_TRUE(batch.ok()) << batch.status();
  async.Shutdown();
  // All four groups were generated at version 0 in part, so the step at version 1 (k = 1)
  // trains them all.
  ASSERT_EQ(batch->size(), 4u);
  for (const auto& rg : *batch) {
    EXPECT_EQ(rg.gen_version, 0);
    for (const auto& smp : rg.samples) {
      ASSERT_EQ(smp.versions_size(), testing::kFakeResponseLen);
      EXPECT_EQ(smp.versions(0), 0);
      EXPECT_EQ(smp.versions(1), 1);
    }
  }
  std::vector<std::vector<uint64_t>> asked;
  for (int w = 0; w < 2; ++w) {
    for (const auto& p : job.cluster.rollout[w]->preempt_calls()) {
      asked.emplace_back(p.sample_ids().begin(), p.sample_ids().end());
    }
  }
  std::sort(asked.begin(), asked.end());
  EXPECT_EQ(asked, (std::vector<std::vector<uint64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  int resume_calls = 0, resumed = 0;
  for (int w = 0; w < 2; ++w) {
    for (const auto& c : job.cluster.rollout[w]->stream_calls()) {
      if (c.resume_size() == 0) continue;
      ++resume_calls;
      resumed += c.resume_size();
      EXPECT_EQ(c.groups_size(), 0);
      EXPECT_EQ(c.min_policy_version(), 1);
    }
  }
  EXPECT_EQ(resume_calls, 1);
  EXPECT_EQ(resumed, 8);
  const AsyncStats st = async.stats();
  EXPECT_EQ(st.repacked, 8);
  EXPECT_EQ(st.stolen, 0);
  auto history = (*ledger)->History(5);
  ASSERT_TRUE(history.ok());
  std::vector<std::string> moves;
  for (const auto& e : *history) {
    moves.push_back(std::string(SampleStateName(e.to)) + ":" + e.context.reason);
  }
  EXPECT_EQ(moves, (std::vector<std::string>{
                       "queued:", "generating:", "queued:taken out for a publish (repack)",
                       "generating:", "finished:"}));
  RemoveLedgerFiles(path);
}

// rollout.weight_updates: between_steps_repack. Publishes do not pause generation; at the second
// one, the calls sent before the first (still generating: the long tails) are taken out and sent
// again in calls of at most tail_batch samples, to two tail workers (the third stays for new
// work), and new groups then go only to the worker that runs no tail call.
TEST(AsyncSchedulerTest, TailRepackingMovesCallsOlderThanAStepOntoTailWorkers) {
  FakeJob job(FakeJobConfig(3, 1));
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->generate_delay_s = 30;
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 2;
  cfg.rollout.prompts_per_step = 1;
  cfg.rollout.async_chunk_groups = 1;
  cfg.rollout.work_stealing = false;
  cfg.rollout.weight_updates = "between_steps_repack";
  cfg.rollout.tail_batch = 4;
  const std::string path = ::testing::TempDir() + "gyre_async_tails.db";
  RemoveLedgerFiles(path);
  auto ledger = SampleLedger::Open(path, true);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  Drawer draw(ledger->get(), 2);
  AsyncScheduler async(cfg, job.pool.get(), ledger->get(), Sampling(), 0);
  auto calls = [&](int w) { return job.cluster.rollout[w]->stream_calls(); };
  auto wait_for = [&](const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done();
  };
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());  // groups 0-2
  ASSERT_TRUE(wait_for([&] { return calls(0).size() + calls(1).size() + calls(2).size() == 3; }));
  for (int w = 0; w < 3; ++w) ASSERT_EQ(calls(w).size(), 1u) << "least loaded: one call each";

  // The first publish: every call was sent at the version before it, none is a tail yet.
  async.Resume(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(job.cluster.rollout[w]->preempt_calls().empty());

  // The second publish: all three calls have outlived a step.
  async.Resume(2);
  auto resumed = [&](int w) {
    int n = 0;
    for (const auto& c : calls(w)) n += c.resume_size();
    return n;
  };
  ASSERT_TRUE(wait_for([&] { return resumed(0) + resumed(1) + resumed(2) == 6; }));
  std::set<int> tail_workers;
  for (int w = 0; w < 3; ++w) {
    const auto preempts = job.cluster.rollout[w]->preempt_calls();
    ASSERT_EQ(preempts.size(), 1u) << "rollout-" << w;
    const std::vector<uint64_t> asked(preempts[0].sample_ids().begin(),
                                      preempts[0].sample_ids().end());
    const uint64_t g = calls(w)[0].groups(0).group_id();
    EXPECT_EQ(asked, (std::vector<uint64_t>{2 * g, 2 * g + 1})) << "rollout-" << w;
    for (const auto& c : calls(w)) {
      if (c.resume_size() == 0) continue;
      tail_workers.insert(w);
      EXPECT_LE(c.resume_size(), 4) << "a tail call holds at most tail_batch samples";
      EXPECT_EQ(c.groups_size(), 0);
      EXPECT_EQ(c.min_policy_version(), 2);
    }
  }
  ASSERT_EQ(tail_workers.size(), 2u) << "one worker stays free of tails for new work";
  int fresh_worker = 0;
  while (tail_workers.count(fresh_worker) > 0) ++fresh_worker;

  // New groups go to the worker without a tail call only, however loaded it gets.
  ASSERT_TRUE(async.Admit(2, [&](int64_t c) { return draw(c, 3, 2); }).ok());  // groups 3-4
  ASSERT_TRUE(wait_for([&] { return calls(fresh_worker).size() == 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int w : tail_workers) {
    const auto cs = calls(w);
    for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(cs[i].groups_size(), i == 0 ? 1 : 0);
  }
  EXPECT_EQ(async.stats().repacked, 6);
  async.Shutdown();
  auto history = (*ledger)->History(0);
  ASSERT_TRUE(history.ok());
  std::vector<std::string> moves;
  for (const auto& e : *history) {
    moves.push_back(std::string(SampleStateName(e.to)) + ":" + e.context.reason);
  }
  ASSERT_GE(moves.size(), 4u);
  moves.resize(4);
  EXPECT_EQ(moves, (std::vector<std::string>{
                       "queued:", "generating:", "queued:a long tail, repacked onto a tail worker",
                       "generating:"}));
  RemoveLedgerFiles(path);
}

TEST(AsyncSchedulerTest, ABadRequestEndsTheJobNamingTheWorker) {
  FakeJob job(FakeJobConfig(1, 1));
  ASSERT_TRUE(job.Start().ok());
  job.cluster.rollout[0]->on_generate = [](const v1::GenerateRequest&, v1::GenerateResponse*) {
    return InvalidArgument("prompt too long");
  };
  JobConfig cfg = job.cfg;
  cfg.algorithm.max_staleness = 1;
  cfg.rollout.prompts_per_step = 1;
  Drawer draw(nullptr, 1);
  AsyncScheduler async(cfg, job.pool.get(), nullptr, Sampling(), 0);
  ASSERT_TRUE(async.Admit(0, [&](int64_t c) { return draw(c, 1, 0); }).ok());
  auto batch = async.NextBatch(0, 1);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().message(), "generate on rollout-0: prompt too long");
}

}  // namespace
}  // namespace gyre::controller
