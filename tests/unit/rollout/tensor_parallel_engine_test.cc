// Tensor-parallel generation (rollout.tensor_parallel): each rank has its own Gloo member on
// loopback and its own slices of the model.
//  - VocabParallelSampleRows on 2 and 3 ranks draws what kernels::SampleRowsRef draws from the
//    whole rows: greedy, temperature, top-k, top-p, min-p and their mixtures, ties across rank
//    boundaries, -inf, NaN and +inf logits, a degenerate row.
//  - A 2-rank RolloutEngine (rank 0 leads in this process, rank 1 follows in its own,
//    tp_follower) generates what one whole-model engine generates, greedy and seeded, through
//    prefix sharing with copy-on-write, preemption under a small KV pool and a weight update; a
//    failed swap on the follower fails the update on both.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/tensor_parallel_group.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "kernels/reference/sampling_ref.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"
#include "rollout/rollout_engine.h"
#include "rollout/tensor_parallel_weights.h"
#include "rollout/vocab_parallel_sampling.h"
#include "test_paths.h"
#include "testing/tiny_model.h"
#include "tp_fixture.h"

namespace gyre::rollout {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Runs body(rank, group) on `ranks` threads, each a member of one Gloo group.
void OnRanks(int ranks, const std::string& name,
             const std::function<void(int, model::TensorParallelGroup*)>& body) {
  auto store = comm::StoreServer::Start("127.0.0.1");
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      comm::GlooOptions o;
      o.store_address = (*store)->address();
      o.group = name;
      o.rank = r;
      o.size = ranks;
      o.connect_timeout_s = 30;
      auto c = comm::CreateGlooCommunicator(o);
      ASSERT_TRUE(c.ok()) << c.status();
      comm::CommTensorParallel group(c->get(), 30);
      body(r, &group);
    });
  }
  for (auto& t : threads) t.join();
}

// Rows of logits with what makes sampling hard, and a parameter set for each.
struct Case {
  at::Tensor logits;  // [rows, V]
  std::vector<kernels::SamplingRowParams> params;
};

Case MakeCase(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const std::vector<float> temps = {0.0f, 1.0f, 0.7f, 1.5f, 0.05f};
  const std::vector<int32_t> top_ks = {
      0, 1, 3, 5, static_cast<int32_t>(vocab) - 1, static_cast<int32_t>(vocab) + 4};
  const std::vector<float> top_ps = {1.0f, 0.9f, 0.5f, 0.3f, 0.0f};
  const std::vector<float> min_ps = {0.0f, 0.05f, 0.5f};
  Case c;
  std::vector<float> flat;
  int64_t row = 0;
  for (float t : temps) {
    for (int32_t k : top_ks) {
      for (float p : top_ps) {
        const float m = min_ps[static_cast<size_t>(row) % min_ps.size()];
        std::vector<float> l(static_cast<size_t>(vocab));
        for (float& x : l) x = normal(rng);
        switch (row % 7) {
          case 1:  // ties of the maximum on both sides of a rank boundary
            l[1] = l[vocab / 2] = l[vocab - 1] = 9.0f;
            break;
          case 2:  // masked tokens, a NaN
            for (int64_t i = 0; i < vocab; i += 3) l[static_cast<size_t>(i)] = -kInf;
            l[2] = std::nanf("");
            break;
          case 3:  // +inf
            l[static_cast<size_t>(vocab - 2)] = kInf;
            break;
          case 4:  // coarse logits: many equal probabilities
            for (float& x : l) x = std::round(x);
            break;
          default:
            break;
        }
        if (row == 11) std::fill(l.begin(), l.end(), -kInf);  // degenerate
        flat.insert(flat.end(), l.begin(), l.end());
        c.params.push_back({t, k, p, m, seed * 1000 + static_cast<uint64_t>(row),
                            static_cast<uint64_t>(row % 13)});
        ++row;
      }
    }
  }
  c.logits = at::tensor(flat).view({row, vocab});
  return c;
}

void ExpectSameDraws(const ops::SampleOutput& got, const std::vector<int32_t>& tokens,
                     const std::vector<float>& logprobs, const std::vector<float>& kept,
                     const std::string& where) {
  ASSERT_EQ(got.tokens.size(), tokens.size()) << where;
  for (size_t r = 0; r < tokens.size(); ++r) {
    EXPECT_EQ(got.tokens[r], tokens[r]) << where << " row " << r;
    if (std::isinf(logprobs[r])) {
      EXPECT_EQ(got.logprobs[r], logprobs[r]) << where << " row " << r;
    } else {
      EXPECT_NEAR(got.logprobs[r], logprobs[r], 1e-6 * std::max(1.0f, std::abs(logprobs[r])))
          << where << " row " << r;
    }
    EXPECT_NEAR(got.kept_mass[r], kept[r], 1e-6) << where << " row " << r;
  }
}

// Each rank's slices of `whole` (copies).
model::NamedTensors SlicesOf(const model::NamedTensors& whole, int rank, int size) {
  model::NamedTensors out;
  for (const auto& [name, t] : whole) {
    out.emplace_back(name, model::TensorParallelSliceOf(name, t, rank, size).clone());
  }
  return out;
}

bool SameTensors(const model::NamedTensors& a, const model::NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !at::equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

// The bytes rank `rank` > 0 of `size` receives for a version of `manifest`: of each split tensor
// the part rank 0 scatters (rank 0's slice, the largest), of each replicated one the whole, and
// the control words (the count, 8 per tensor of descriptor, one per tensor, the outcome).
uint64_t SliceBytes(const std::vector<model::TensorEntry>& manifest, int size) {
  uint64_t bytes = 8 + 8 + manifest.size() * (8 * 8 + 8);
  for (const model::TensorEntry& e : manifest) {
    const int d = model::TensorParallelDim(e.name);
    if (d < 0) {
      bytes += e.nbytes;
      continue;
    }
    const auto [begin, end] = model::TensorParallelRange(e.name, e.shape[d], 0, size);
    bytes += e.nbytes / static_cast<uint64_t>(e.shape[d]) * static_cast<uint64_t>(end - begin);
  }
  return bytes;
}

// A version reaches rank 0 in buckets (here 1000 bytes, so tensors straddle them, in float32 and
// bfloat16) and every rank loads its slices of it once the whole version arrived and every rank
// has all of it; rank 1 receives only its slices of the split tensors (the vocabulary of 51 rows
// splits 26 + 25: its part is padded by a row). Otherwise no rank changes anything: a transfer
// that breaks half-way, a manifest that lacks a tensor, a rank whose slice does not fit.
TEST(TensorParallelWeightsTest, EveryRankLoadsItsSlicesOnlyWhenTheWholeVersionArrived) {
  const model::ModelSpec spec = testing::TinyQwen3Spec(51, 64);
  const model::NamedTensors old_whole =
      model::Transformer::Create(spec, 1, 0.02)->NamedParameters();
  const model::NamedTensors new_whole =
      model::Transformer::Create(spec, 2, 0.02)->NamedParameters();
  enum Case { kWhole, kBroken, kLacking, kMisfit };
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    std::vector<model::TensorEntry> manifest;
    const std::vector<uint8_t> payload = model::FlattenParameters(new_whole, &manifest, dtype);
    for (Case c : {kWhole, kBroken, kLacking, kMisfit}) {
      const std::string what = std::string(at::toString(dtype)) + " case " + std::to_string(c);
      OnRanks(2, "weights-" + std::to_string(static_cast<int>(dtype)) + "-" + std::to_string(c),
              [&](int rank, model::TensorParallelGroup* group) {
                model::NamedTensors mine = SlicesOf(old_whole, rank, 2);
                if (c == kMisfit && rank == 1) {  // one row short of its slice
                  mine[1].second = mine[1].second.narrow(0, 0, mine[1].second.size(0) - 1).clone();
                }
                const model::NamedTensors before = SlicesOf(mine, 0, 1);
                Status s;
                if (rank == 0) {
                  SliceSender sender(mine, group);
                  std::vector<model::TensorEntry> m = manifest;
                  if (c == kLacking) m.pop_back();
                  Status transfer = sender.Begin(m, payload.size());
                  const size_t stop = c == kBroken ? payload.size() / 2 : payload.size();
                  for (size_t pos = 0; transfer.ok() && pos < stop; pos += 1000) {
                    transfer =
                        sender.Add(pos, payload.data() + pos, std::min<size_t>(1000, stop - pos));
                  }
                  if (transfer.ok() && c == kBroken) transfer = DataLoss("the stream broke");
                  s = sender.Finish(transfer);
                } else {
                  const uint64_t before_bytes = group->received_bytes();
                  s = ReceiveSlices(mine, group);
                  if (c == kWhole) {
                    const uint64_t got = group->received_bytes() - before_bytes;
                    EXPECT_EQ(got, SliceBytes(manifest, 2)) << what;
                    EXPECT_LT(got, payload.size() * 6 / 10) << what << ": " << payload.size();
                  }
                }
                if (c == kWhole) {
                  EXPECT_TRUE(s.ok()) << what << " rank " << rank << ": " << s;
                  const model::NamedTensors want = SlicesOf(new_whole, rank, 2);
                  for (size_t i = 0; i < mine.size(); ++i) {
                    EXPECT_TRUE(at::equal(mine[i].second, want[i].second.to(dtype).to(at::kFloat)))
                        << what << " rank " << rank << " " << mine[i].first;
                  }
                  return;
                }
                EXPECT_FALSE(s.ok()) << what << " rank " << rank;
                EXPECT_TRUE(SameTensors(mine, before)) << what << ": rank " << rank << " changed";
                if (rank == 0 && c == kBroken) {
                  EXPECT_NE(s.message().find("the stream broke"), std::string::npos) << s;
                }
                if (rank == 0 && c == kLacking) {
                  EXPECT_NE(s.message().find("tensors, the model"), std::string::npos) << s;
                }
                if (rank == 0 && c == kMisfit) {
                  EXPECT_NE(s.message().find("rank(s) 1 did not receive the whole version"),
                            std::string::npos)
                      << s;
                }
                if (rank == 1 && c == kLacking) {
                  EXPECT_NE(s.message().find("rank 0 refused the version"), std::string::npos) << s;
                }
              });
    }
  }
}

TEST(VocabParallelSamplingTest, DrawsWhatTheReferenceDrawsFromWholeRows) {
  for (int ranks : {2, 3}) {
    for (uint64_t seed : {1, 2}) {
      const int64_t vocab = 37;
      const Case c = MakeCase(vocab, seed);
      const int64_t rows = c.logits.size(0);
      std::vector<int32_t> tokens(static_cast<size_t>(rows));
      std::vector<float> logprobs(static_cast<size_t>(rows)), kept(static_cast<size_t>(rows));
      kernels::SampleRowsRef(c.logits.data_ptr<float>(), rows, vocab, c.params.data(),
                             tokens.data(), logprobs.data(), kept.data());
      std::vector<ops::SampleOutput> got(static_cast<size_t>(ranks));
      OnRanks(ranks, "vp-sample", [&](int r, model::TensorParallelGroup* g) {
        const int64_t chunk = (vocab + ranks - 1) / ranks;
        const int64_t begin = r * chunk, end = std::min(vocab, begin + chunk);
        got[r] = VocabParallelSampleRows(c.logits.narrow(1, begin, end - begin), begin, vocab,
                                         c.params, g);
      });
      for (int r = 0; r < ranks; ++r) {
        ExpectSameDraws(got[r], tokens, logprobs, kept,
                        std::to_string(ranks) + " ranks, seed " + std::to_string(seed) + ", rank " +
                            std::to_string(r));
      }
    }
  }
}

// Generates Requests(), updates the weights to `next` (version 2) and generates again.
struct Outcome {
  std::vector<SampleResult> before, after;
  EngineStats stats;
};

void ExpectSameResults(const std::vector<SampleResult>& got, const std::vector<SampleResult>& want,
                       const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string at = where + " sample " + std::to_string(i);
    EXPECT_EQ(got[i].id, want[i].id) << at;
    EXPECT_EQ(got[i].index, want[i].index) << at;
    EXPECT_EQ(got[i].response.tokens, want[i].response.tokens) << at;
    EXPECT_EQ(got[i].response.versions, want[i].response.versions) << at;
    ASSERT_EQ(got[i].response.logprobs.size(), want[i].response.logprobs.size()) << at;
    for (size_t t = 0; t < want[i].response.logprobs.size(); ++t) {
      EXPECT_NEAR(got[i].response.logprobs[t], want[i].response.logprobs[t], 1e-4) << at;
      EXPECT_NEAR(got[i].response.kept_mass[t], want[i].response.kept_mass[t], 1e-5) << at;
    }
  }
}

// Rank 0 of a 2-rank engine in this process, rank 1 a tp_follower process: the store, the
// follower, rank 0's Gloo member and its tensor-parallel group (collective deadline `timeout_s`).
struct TwoRankGroup {
  std::unique_ptr<comm::StoreServer> store;
  pid_t follower = -1;
  std::string log;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::CommTensorParallel> group;

  // A follower still running (a test that failed half-way) is stopped; -1 once reaped.
  ~TwoRankGroup() {
    if (follower > 0) TerminateProcess(follower, 1);
  }

  // Empty on success, else what failed.
  std::string Start(const std::string& name, double timeout_s) {
    auto s = comm::StoreServer::Start("127.0.0.1");
    if (!s.ok()) return s.status().ToString();
    store = std::move(*s);
    log = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid()) + ".log";
    auto pid = SpawnProcess({GYRE_TP_FOLLOWER, store->address(), name, "1", "2"}, log);
    if (!pid.ok()) return pid.status().ToString();
    follower = *pid;
    comm::GlooOptions o;
    o.store_address = store->address();
    o.group = name;
    o.rank = 0;
    o.size = 2;
    o.connect_timeout_s = 60;
    auto c = comm::CreateGlooCommunicator(o);
    if (!c.ok()) return c.status().ToString();
    comm = std::move(*c);
    group = std::make_unique<comm::CommTensorParallel>(comm.get(), timeout_s);
    return "";
  }
};

TEST(TensorParallelEngineTest, TwoRanksGenerateWhatOneEngineGenerates) {
  using namespace tp_fixture;
  const model::ModelSpec spec = Spec();
  ASSERT_TRUE(model::CheckTensorParallel(spec, 2).ok());
  const auto whole = model::Transformer::Create(spec, kFirstSeed, kInitStd);
  const auto next = model::Transformer::Create(spec, kNextSeed, kInitStd);

  Outcome want;
  {
    const auto copy = model::Transformer::FrozenCopy(*whole);
    auto engine = RolloutEngine::Create(copy.get(), TightPool());
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto before = (*engine)->Generate(Requests());
    ASSERT_TRUE(before.ok()) << before.status();
    want.before = *before;
    ASSERT_TRUE(
        (*engine)->UpdateWeights(2, [&] { return CopySlices(*next, copy.get(), 0, 1); }).ok());
    auto after = (*engine)->Generate(Requests());
    ASSERT_TRUE(after.ok()) << after.status();
    want.after = *after;
    want.stats = (*engine)->stats();
  }
  EXPECT_GT(want.stats.preemptions, 0) << "the pool is meant to be too small";
  EXPECT_GT(want.stats.cow_copies, 0) << "groups are meant to copy shared blocks";

  // Rank 1 is a process of its own (tp_follower); rank 0 is this one.
  TwoRankGroup ranks;
  ASSERT_EQ(ranks.Start("tp-engine", 60), "");
  const auto slice = model::Transformer::TensorParallelSlice(*whole, ranks.group.get());
  auto engine = RolloutEngine::Create(slice.get(), TightPool());
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE((*engine)->leads());
  Outcome got;
  auto before = (*engine)->Generate(Requests());
  ASSERT_TRUE(before.ok()) << before.status();
  got.before = *before;
  ASSERT_TRUE(
      (*engine)->UpdateWeights(2, [&] { return CopySlices(*next, slice.get(), 0, 2); }).ok());
  auto after = (*engine)->Generate(Requests());
  ASSERT_TRUE(after.ok()) << after.status();
  got.after = *after;
  got.stats = (*engine)->stats();
  const Status failed_update =
      (*engine)->UpdateWeights(kRefusedVersion, [] { return Status::Ok(); });
  EXPECT_EQ((*engine)->version(), 2) << "a failed update leaves the version";
  EXPECT_TRUE((*engine)->StopFollowers().ok());
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 600 && !(exited = PollExit(ranks.follower, &status)); ++i) ::usleep(100000);
  if (exited) ranks.follower = -1;
  const auto read = ReadFileToString(ranks.log);
  const std::string follower = read.ok() ? *read : "(no log: " + read.status().ToString() + ")";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status) << "\n"
                                                             << follower;
  EXPECT_NE(follower.find("follows rank 0"), std::string::npos) << follower;
  EXPECT_NE(follower.find("follow ended: OK after " + std::to_string(got.stats.steps) + " steps"),
            std::string::npos)
      << follower;
  EXPECT_FALSE(failed_update.ok());
  EXPECT_NE(failed_update.message().find("rank(s) 1"), std::string::npos) << failed_update;
  ExpectSameResults(got.before, want.before, "before the update");
  ExpectSameResults(got.after, want.after, "after the update");
  EXPECT_EQ(got.stats.steps, want.stats.steps);
  EXPECT_EQ(got.stats.preemptions, want.stats.preemptions);
  EXPECT_EQ(got.stats.cow_copies, want.stats.cow_copies);
}

// A follower that dies (SIGKILL) fails rank 0's next step at once, with a clear error, instead
// of leaving it waiting on a collective; rank 0's engine is idle again afterwards.
TEST(TensorParallelEngineTest, AFollowerThatDiesFailsTheNextStepAtOnce) {
  using namespace tp_fixture;
  const auto whole = model::Transformer::Create(Spec(), kFirstSeed, kInitStd);
  TwoRankGroup ranks;
  ASSERT_EQ(ranks.Start("tp-dies", 120), "");  // a deadline the failure must not wait for
  const auto slice = model::Transformer::TensorParallelSlice(*whole, ranks.group.get());
  auto engine = RolloutEngine::Create(slice.get(), TightPool());
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Generate(Requests()).ok());
  ::kill(ranks.follower, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(ranks.follower, &status, 0), ranks.follower);
  ranks.follower = -1;
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);
  const auto t0 = std::chrono::steady_clock::now();
  auto failed = (*engine)->Generate(Requests());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("tensor-parallel step failed"), std::string::npos)
      << failed.status();
  EXPECT_LT(seconds, 30.0) << "the step waited for its collective's deadline";
  EXPECT_TRUE((*engine)->idle());
}

}  // namespace
}  // namespace gyre::rollout
