// Fully sharded parameters (trainer.shard: parameters) against unsharded training, with real
// processes: each rank is a sharded_rank process (sharded_rank_main.cc) in a Gloo group over
// loopback, formed through a store this test starts. The same batch and steps as
// dp_trainer_test; the weights after the steps, the step metrics and the sequence KL must agree
// within float32 tolerances scaled to their magnitude.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/gloo_communicator.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "test_paths.h"
#include "testing/tensor_compare.h"

namespace gyre::trainer {
namespace {

struct Result {
  bool ok = false;
  std::vector<int> exit_codes;  // per rank (-1: did not exit normally)
  std::vector<std::string> logs;
  at::Tensor weights;                                     // float32, whole model, flat
  std::map<std::pair<int, std::string>, double> metrics;  // (step, key) of rank 0
  std::map<int, double> kl;                               // sample -> sequence KL (with "kl")
};

// Runs `ranks` sharded_rank processes with `shard` and `flags` (rank r also gets
// rank_flags[r], when given); waits for all of them. A rank that fails is a test failure unless
// `failures_expected`.
Result RunRanks(const std::string& shard, int ranks, const std::vector<std::string>& flags,
                const std::vector<std::vector<std::string>>& rank_flags = {},
                bool failures_expected = false) {
  static int runs = 0;
  const std::string dir = TempDirectory() + "/gyre_sharded_" + std::to_string(::getpid()) + "_" +
                          std::to_string(++runs);
  EXPECT_TRUE(MakeDirs(dir).ok());
  auto store = comm::StoreServer::Start("127.0.0.1");
  EXPECT_TRUE(store.ok()) << store.status().message();
  Result result;
  if (!store.ok()) return result;
  const std::string out = dir + "/weights.bin";
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> argv = {GYRE_SHARDED_RANK,
                                     (*store)->address(),
                                     "g",
                                     std::to_string(r),
                                     std::to_string(ranks),
                                     shard,
                                     out};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (static_cast<size_t>(r) < rank_flags.size()) {
      argv.insert(argv.end(), rank_flags[r].begin(), rank_flags[r].end());
    }
    auto pid = SpawnProcess(argv, dir + "/rank" + std::to_string(r) + ".log");
    EXPECT_TRUE(pid.ok()) << pid.status().message();
    if (pid.ok()) pids.push_back(*pid);
  }
  bool all_ok = pids.size() == static_cast<size_t>(ranks);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  for (size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    while (!PollExit(pids[r], &status)) {
      if (std::chrono::steady_clock::now() > deadline) {
        status = TerminateProcess(pids[r], 1.0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto log = ReadFileToString(dir + "/rank" + std::to_string(r) + ".log");
    result.logs.push_back(log.ok() ? *log : "");
    result.exit_codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      all_ok = false;
      if (!failures_expected) {
        ADD_FAILURE() << shard << " on " << ranks << " ranks: rank " << r << " "
                      << DescribeWaitStatus(status) << "\n"
                      << result.logs.back();
      }
    }
  }
  if (all_ok) {
    auto bytes = ReadFileToString(out);
    EXPECT_TRUE(bytes.ok());
    if (bytes.ok()) {
      const int64_t n = static_cast<int64_t>(bytes->size() / sizeof(float));
      result.weights = at::empty({n}, at::kFloat);
      std::memcpy(result.weights.data_ptr<float>(), bytes->data(), n * sizeof(float));
      std::ifstream m(out + ".metrics");
      int step;
      std::string key;
      double value;
      while (m >> step >> key >> value) result.metrics[{step, key}] = value;
      for (int r = 0; r < ranks; ++r) {
        std::ifstream k(out + ".kl" + std::to_string(r));
        int sample;
        while (k >> sample >> value) result.kl[sample] = value;
      }
      result.ok = true;
    }
  }
  (void)RemoveTree(dir);
  return result;
}

double Metric(const Result& r, int step, const std::string& key) {
  auto it = r.metrics.find({step, key});
  EXPECT_NE(it, r.metrics.end()) << key << " at step " << step;
  return it != r.metrics.end() ? it->second : std::nan("");
}

// The weights, every step's loss, gradient norm and tokens, and the sequence KL of `got` equal
// `want`'s within `tol` (weights) and 1e-4 relative (the rest).
void ExpectSameTraining(const Result& got, const Result& want, const testing::Tolerance& tol,
                        const std::string& what) {
  ASSERT_TRUE(got.ok && want.ok) << what;
  ASSERT_EQ(got.weights.numel(), want.weights.numel()) << what;
  EXPECT_TRUE(testing::AllClose(got.weights, want.weights, tol)) << what;
  for (int step = 0; step < 2; ++step) {
    for (const char* k : {"loss", "grad_norm", "tokens"}) {
      const double w = Metric(want, step, k);
      EXPECT_NEAR(Metric(got, step, k), w, 1e-4 * (1 + std::abs(w)))
          << k << " at step " << step << ": " << what;
    }
  }
  ASSERT_EQ(got.kl.size(), want.kl.size()) << what;
  for (const auto& [sample, w] : want.kl) {
    EXPECT_NEAR(got.kl.at(sample), w, 1e-4 * (1 + std::abs(w)))
        << "sequence KL of sample " << sample << ": " << what;
  }
}

std::vector<std::string> With(std::vector<std::string> flags,
                              const std::vector<std::string>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// Float32 summation in another order than one process: the update's rounding, scaled to the
// weights' magnitude (as dp_trainer_test allows ZeRO-1/2).
const testing::Tolerance kAcrossRanks{1e-5, 1e-6, 1e-5};

TEST(ShardedParametersTest, OneTwoAndFourRanksMatchOneUnshardedProcess) {
  for (const std::string minis : {"1", "3"}) {
    const std::vector<std::string> flags = {"minis=" + minis};
    const Result plain = RunRanks("none", 1, flags);
    ASSERT_TRUE(plain.ok);
    // The steps moved the weights (so that agreeing means something).
    const Result untrained = RunRanks("none", 1, {"steps=0"});
    ASSERT_TRUE(untrained.ok);
    EXPECT_GT((plain.weights - untrained.weights).abs().max().item<float>(), 1e-3);
    for (int ranks : {1, 2, 4}) {
      // Also gathered in ranges of 37 elements (a publish's pieces): ranges that cross from one
      // rank's slice to the next, and the unit's end, give exactly the whole weights' values.
      const Result sharded = RunRanks("parameters", ranks, With(flags, {"ranges=37"}));
      ExpectSameTraining(sharded, plain, kAcrossRanks,
                         "parameters on " + std::to_string(ranks) + " ranks, minis " + minis);
      EXPECT_GT(Metric(sharded, -1, "range_pieces"), 100);
      EXPECT_EQ(Metric(sharded, -1, "range_mismatch"), 0.0) << ranks << " ranks";
    }
  }
}

// Tied embeddings (the LM head gathers the embedding's unit again), q/k norms, attention biases,
// activation checkpointing (the backward recomputes each layer from a unit gathered again), the
// KL term against a reference sharded the same way, and SequenceKl; micro-batches of 3 leave
// the ranks with different numbers of them (empty passes keep the collectives in step).
TEST(ShardedParametersTest, TiedQwen3ShapeWithCheckpointingAndKlMatchesOneProcess) {
  const std::vector<std::string> flags = {"model=qwen3", "kl", "checkpointing", "micro=3",
                                          "minis=2"};
  const Result plain = RunRanks("none", 1, flags);
  ASSERT_TRUE(plain.ok);
  ASSERT_EQ(plain.kl.size(), 11u);
  for (int ranks : {2, 4}) {
    ExpectSameTraining(RunRanks("parameters", ranks, flags), plain, kAcrossRanks,
                       "qwen3 shape on " + std::to_string(ranks) + " ranks");
  }
}

// trainer.reshard_after_forward: false keeps each layer gathered from its forward to its
// backward. The same training as one process, through the hard cases of the gathers (tied
// embeddings, activation checkpointing's recompute, the reference's no-grad forwards, uneven
// micro-batches), with fewer all-gathers than freeing each layer after its forward.
TEST(ShardedParametersTest, LayersKeptGatheredForTheBackwardTrainTheSameWithFewerGathers) {
  const std::vector<std::string> flags = {"model=qwen3", "kl", "checkpointing", "micro=3",
                                          "minis=2"};
  const Result plain = RunRanks("none", 1, flags);
  ASSERT_TRUE(plain.ok);
  std::vector<std::string> keep = flags;
  keep.push_back("keep");
  const Result kept = RunRanks("parameters", 2, keep);
  ExpectSameTraining(kept, plain, kAcrossRanks, "layers kept gathered, 2 ranks");
  const Result freed = RunRanks("parameters", 2, flags);
  ASSERT_TRUE(kept.ok && freed.ok);
  const double kept_gathers = Metric(kept, -1, "gathers");
  const double freed_gathers = Metric(freed, -1, "gathers");
  // Freed, every backward pass gathers each decoder layer again (here 48 gathers against 36: the
  // no-grad forwards of the KL reference and of SequenceKl gather the same either way).
  EXPECT_GT(kept_gathers, 0);
  EXPECT_LT(kept_gathers, freed_gathers) << kept_gathers << " against " << freed_gathers;
}

// Mixed precision (bfloat16 compute, float32 masters): the units are gathered in bfloat16, the
// gradients summed in float32. Against unsharded data parallelism on the same ranks (the same
// micro-batches, so the same bfloat16 roundings). Untied embeddings: with tied ones the unsharded
// trainer adds the lookup's and the LM head's gradients of the one bfloat16 copy in bfloat16, the
// sharded one in float32 (two gathers), which moves the update by about 1e-4.
TEST(ShardedParametersTest, Bfloat16ComputeMatchesUnshardedDataParallel) {
  const std::vector<std::string> flags = {"dtype=bfloat16"};
  const Result plain = RunRanks("none", 2, flags);
  ExpectSameTraining(RunRanks("parameters", 2, flags), plain, kAcrossRanks, "bfloat16, 2 ranks");
}

// A rank that leaves between steps: the others' next step needs its gathers, so it fails within
// the collectives' deadline, with an error that names the sharded step, instead of hanging.
TEST(ShardedParametersTest, ARankThatLeavesFailsTheOthersStepWithoutAHang) {
  const auto t0 = std::chrono::steady_clock::now();
  const Result r =
      RunRanks("parameters", 2, {"timeout=5"}, {{}, {"leave_after=1"}}, /*failures_expected=*/true);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_codes.size(), 2u);
  EXPECT_EQ(r.exit_codes[1], 0);
  EXPECT_EQ(r.exit_codes[0], 1) << r.logs[0];
  EXPECT_NE(r.logs[0].find("step 1: "), std::string::npos) << r.logs[0];
  EXPECT_NE(r.logs[0].find("sharded"), std::string::npos) << r.logs[0];
  EXPECT_LT(took, 60) << r.logs[0];
}

// What a rank holds between steps, from the tensors the trainer keeps (the step metrics): the
// float32 weights, the AdamW moments and the gradients of parameter sharding over 4 ranks, against
// one unsharded process.
TEST(ShardedParametersTest, StateHeldPerRankIsAQuarterOnFourRanks) {
  const Result plain = RunRanks("none", 1, {});
  const Result four = RunRanks("parameters", 4, {});
  ASSERT_TRUE(plain.ok && four.ok);
  for (const char* k : {"weights_mib", "optimizer_state_mib"}) {
    const double whole = Metric(plain, 1, k), quarter = Metric(four, 1, k);
    EXPECT_GT(whole, 0) << k;
    // Each unit is padded to a multiple of 4 elements at most.
    EXPECT_LE(quarter, 0.26 * whole) << k;
    EXPECT_GE(quarter, 0.24 * whole) << k;
  }
}

// Checkpoints move between layouts: a state saved by parameter sharding (gathered unit by unit,
// written by rank 0 in the layout-free format) resumes bit for bit on the same layout, and onto
// one unsharded process and other numbers of sharded ranks within float tolerance; states saved
// by one process and by ZeRO-2 resume onto parameter sharding. Step 0 then a save, a new set of
// processes loads and takes step 1; against the two steps without a break.
TEST(ShardedParametersTest, CheckpointsMoveBetweenLayouts) {
  const std::string root = TempDirectory() + "/gyre_sharded_ckpt_" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(root).ok());
  const std::vector<std::string> flags = {"model=qwen3", "kl", "minis=2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> f = flags;
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  const Result plain = RunRanks("none", 1, flags);
  const Result straight = RunRanks("parameters", 2, flags);
  ASSERT_TRUE(plain.ok && straight.ok);
  // Only the resumed step's metrics exist; the weights and sequence KL after it.
  auto expect_resumed = [&](const Result& got, const Result& want, const testing::Tolerance& tol,
                            const std::string& what) {
    ASSERT_TRUE(got.ok) << what;
    ASSERT_EQ(got.weights.numel(), want.weights.numel()) << what;
    EXPECT_TRUE(testing::AllClose(got.weights, want.weights, tol)) << what;
    for (const char* k : {"loss", "grad_norm", "tokens"}) {
      const double w = Metric(want, 1, k);
      EXPECT_NEAR(Metric(got, 1, k), w, 1e-4 * (1 + std::abs(w))) << k << ": " << what;
    }
    EXPECT_EQ(got.metrics.count({0, "loss"}), 0u) << what;
    ASSERT_EQ(got.kl.size(), want.kl.size()) << what;
    for (const auto& [sample, w] : want.kl) {
      EXPECT_NEAR(got.kl.at(sample), w, 1e-4 * (1 + std::abs(w))) << what;
    }
  };
  const std::string zero3 = root + "/zero3";
  ASSERT_TRUE(RunRanks("parameters", 2, with({"steps=1", "save=" + zero3})).ok);
  ASSERT_TRUE(PathExists(zero3 + "/model.safetensors"));
  ASSERT_TRUE(PathExists(zero3 + "/optimizer.safetensors"));
  ASSERT_TRUE(PathExists(zero3 + "/reference.safetensors"));
  const Result same = RunRanks("parameters", 2, with({"load=" + zero3, "start=1"}));
  ASSERT_TRUE(same.ok);
  EXPECT_TRUE(at::equal(same.weights, straight.weights)) << "same layout: not bit for bit";
  EXPECT_EQ(Metric(same, 1, "loss"), Metric(straight, 1, "loss"));
  expect_resumed(RunRanks("none", 1, with({"load=" + zero3, "start=1"})), plain, kAcrossRanks,
                 "parameters on 2 ranks -> one unsharded process");
  expect_resumed(RunRanks("parameters", 4, with({"load=" + zero3, "start=1"})), plain, kAcrossRanks,
                 "parameters on 2 ranks -> parameters on 4");
  expect_resumed(RunRanks("gradients", 2, with({"load=" + zero3, "start=1"})), plain, kAcrossRanks,
                 "parameters on 2 ranks -> gradients on 2");
  const std::string whole = root + "/whole", zero2 = root + "/zero2";
  ASSERT_TRUE(RunRanks("none", 1, with({"steps=1", "save=" + whole})).ok);
  ASSERT_TRUE(RunRanks("gradients", 3, with({"steps=1", "save=" + zero2})).ok);
  expect_resumed(RunRanks("parameters", 2, with({"load=" + whole, "start=1"})), plain, kAcrossRanks,
                 "one process -> parameters on 2 ranks");
  expect_resumed(RunRanks("parameters", 3, with({"load=" + zero2, "start=1"})), plain, kAcrossRanks,
                 "gradients on 3 ranks -> parameters on 3");
  (void)RemoveTree(root);
}

// Tensor parallelism (trainer.tensor_parallel): T processes hold slices of every layer (heads,
// MLP columns and rows, vocabulary rows) and compute each forward and backward together; the
// gathered weights after the steps, the metrics (log-probs, entropies and accuracies computed over
// the vocabulary slices) and the sequence KL equal one process's.
//
// The weights' tolerance allows 1e-4 absolute, 1% of one step's change (lr 1e-2): AdamW divides
// each element's update by the root of its squared gradient, so an element whose gradient is
// near AdamW's epsilon (1e-8) turns a difference of summation order in the 10th decimal into one
// of up to 1e-4 (one element of 22,400 in the tiny model, T = 2: 6.8e-5; every other one within
// 3.4e-6). The loss and the global gradient norm are still held to 1e-4 relative.
const testing::Tolerance kTensorParallel{1e-5, 1e-4, 1e-5};

TEST(TensorParallelTest, TwoAndFourRanksMatchOneProcess) {
  for (const std::string minis : {"1", "3"}) {
    // 8 query and 4 key/value heads: both split over 4 ranks.
    const std::vector<std::string> flags = {"minis=" + minis, "heads=8/4"};
    const Result plain = RunRanks("none", 1, flags);
    ASSERT_TRUE(plain.ok);
    const Result untrained = RunRanks("none", 1, With(flags, {"steps=0"}));
    ASSERT_TRUE(untrained.ok);
    EXPECT_GT((plain.weights - untrained.weights).abs().max().item<float>(), 1e-3);
    for (int t : {2, 4}) {
      // Also every tensor gathered 3 rows at a time (a publish's pieces): the whole weights.
      const Result split =
          RunRanks("none", t, With(flags, {"tp=" + std::to_string(t), "ranges=3"}));
      ExpectSameTraining(split, plain, kTensorParallel,
                         "T = " + std::to_string(t) + ", minis " + minis);
      EXPECT_GT(Metric(split, -1, "range_pieces"), 100);
      EXPECT_EQ(Metric(split, -1, "range_mismatch"), 0.0) << "T = " << t;
    }
  }
}

// A Qwen3 shape (tied embeddings: the one vocabulary slice is both the lookup and the LM head; q/k
// norms, replicated, used inside each rank's heads; attention biases), activation checkpointing
// (the backward runs each layer's exchanges again), the KL term against a reference holding the
// same slices, SequenceKl, and a vocabulary of 26 that splits unevenly over 4 ranks (7, 7, 7, 5).
TEST(TensorParallelTest, TiedQwen3ShapeWithCheckpointingAndKlMatchesOneProcess) {
  const std::vector<std::string> flags = {"model=qwen3", "kl",        "checkpointing", "micro=3",
                                          "minis=2",     "heads=8/4", "vocab=26"};
  const Result plain = RunRanks("none", 1, flags);
  ASSERT_TRUE(plain.ok);
  ASSERT_EQ(plain.kl.size(), 11u);
  for (int t : {2, 4}) {
    ExpectSameTraining(RunRanks("none", t, With(flags, {"tp=" + std::to_string(t)})), plain,
                       kTensorParallel, "qwen3 shape, T = " + std::to_string(t));
  }
}

// An entropy bonus differentiates the entropies computed over the vocabulary slices: chunked (5
// tokens at a time, the trainer's path for packed micro-batches) and materialised (chunk=0).
TEST(TensorParallelTest, EntropyBonusChunkedAndUnchunkedMatchesOneProcess) {
  const std::vector<std::string> flags = {"model=qwen3", "entropy", "micro=3", "minis=2",
                                          "vocab=26"};
  for (const std::string chunk : {"5", "0"}) {
    const Result plain = RunRanks("none", 1, With(flags, {"chunk=" + chunk}));
    ASSERT_TRUE(plain.ok);
    ExpectSameTraining(RunRanks("none", 2, With(flags, {"tp=2", "chunk=" + chunk})), plain,
                       kTensorParallel, "entropy bonus, chunk " + chunk);
  }
}

// The 2-D layout: 4 processes as 2 data-parallel ranks of 2 tensor-parallel ranks each (each
// data-parallel group all-reduces the gradients of one slice).
TEST(TensorParallelTest, TwoDataParallelTimesTwoTensorParallelMatchesOneProcess) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"minis=3"},
        std::vector<std::string>{"model=qwen3", "kl", "checkpointing", "micro=3", "minis=2"}}) {
    const Result plain = RunRanks("none", 1, flags);
    ASSERT_TRUE(plain.ok);
    ExpectSameTraining(RunRanks("none", 4, With(flags, {"tp=2"})), plain, kTensorParallel,
                       "DP 2 x TP 2, " + flags[0]);
  }
}

// A checkpoint of DP 2 x TP 2 trainers sharded as `shard` (after the first of the two steps)
// resumes bit for bit on the same layout (`straight`: that layout's two steps) and onto one
// process within float tolerance (`plain`: one process's two steps), and a one-process checkpoint
// resumes onto DP 2 x TP 2 sharded as `onto`.
void ExpectTwoByTwoCheckpointsMove(const std::string& shard, const std::string& onto,
                                   const std::vector<std::string>& flags, const Result& straight,
                                   const Result& plain) {
  const std::string root =
      TempDirectory() + "/gyre_tp_" + shard + "_ckpt_" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(root).ok());
  ASSERT_TRUE(straight.ok && plain.ok);
  const std::string saved = root + "/dp2_tp2", whole = root + "/whole";
  ASSERT_TRUE(RunRanks(shard, 4, With(flags, {"tp=2", "steps=1", "save=" + saved})).ok);
  const Result same = RunRanks(shard, 4, With(flags, {"tp=2", "load=" + saved, "start=1"}));
  ASSERT_TRUE(same.ok);
  EXPECT_TRUE(at::equal(same.weights, straight.weights)) << shard << ": not bit for bit";
  const Result one = RunRanks("none", 1, With(flags, {"load=" + saved, "start=1"}));
  ASSERT_TRUE(one.ok);
  EXPECT_TRUE(testing::AllClose(one.weights, plain.weights, kTensorParallel))
      << "DP 2 x TP 2 x " << shard << " -> one process";
  ASSERT_TRUE(RunRanks("none", 1, With(flags, {"steps=1", "save=" + whole})).ok);
  const Result resumed = RunRanks(onto, 4, With(flags, {"tp=2", "load=" + whole, "start=1"}));
  ASSERT_TRUE(resumed.ok);
  EXPECT_TRUE(testing::AllClose(resumed.weights, plain.weights, kTensorParallel))
      << "one process -> DP 2 x TP 2 x " << onto;
  (void)RemoveTree(root);
}

// ZeRO-1 and ZeRO-2 over tensor-parallel slices (DP 2 x TP 2, trainer.shard optimizer or
// gradients: each data-parallel group splits its slice's optimizer state, and the gradient norm
// counts every slice once) train as one process does, and their checkpoints move.
TEST(TensorParallelTest, ShardedOptimizerOverTensorParallelSlicesMatchesOneProcess) {
  // clip=0.05 clips every step, so a wrong gradient norm shows in the weights.
  const std::vector<std::string> flags = {"model=qwen3", "minis=2", "clip=0.05"};
  const Result plain = RunRanks("none", 1, flags);
  ASSERT_TRUE(plain.ok);
  ExpectSameTraining(RunRanks("optimizer", 4, With(flags, {"tp=2"})), plain, kTensorParallel,
                     "DP 2 x TP 2, shard optimizer");
  const Result straight = RunRanks("gradients", 4, With(flags, {"tp=2"}));
  ExpectSameTraining(straight, plain, kTensorParallel, "DP 2 x TP 2, shard gradients");
  ExpectTwoByTwoCheckpointsMove("gradients", "optimizer", flags, straight, plain);
}

// ZeRO-3 over tensor-parallel slices (trainer.shard: parameters with tensor_parallel: each
// data-parallel group splits every unit of its slices and gathers each one only while it
// computes, and the tensor-parallel ranks compute every layer together) trains as one process
// does: TP 2 on 2 data-parallel ranks with the Qwen3 shape, the KL term and activation
// checkpointing, and on one data-parallel rank; its checkpoints move.
TEST(TensorParallelTest, ShardedParametersOfTensorParallelSlicesMatchOneProcess) {
  const std::vector<std::string> flags = {"model=qwen3", "kl",      "checkpointing",
                                          "micro=3",     "minis=2", "clip=0.05"};
  const Result plain = RunRanks("none", 1, flags);
  ASSERT_TRUE(plain.ok);
  // Also every tensor gathered 3 rows at a time from the slices' shards: the whole weights.
  const Result one = RunRanks("parameters", 2, With(flags, {"tp=2", "ranges=3"}));
  ExpectSameTraining(one, plain, kTensorParallel, "parameters, DP 1 x TP 2");
  const Result straight = RunRanks("parameters", 4, With(flags, {"tp=2", "ranges=3"}));
  ExpectSameTraining(straight, plain, kTensorParallel, "parameters, DP 2 x TP 2");
  for (const Result* r : {&one, &straight}) {
    EXPECT_GT(Metric(*r, -1, "range_pieces"), 100);
    EXPECT_EQ(Metric(*r, -1, "range_mismatch"), 0.0);
  }
  ExpectTwoByTwoCheckpointsMove("parameters", "parameters", flags, straight, plain);
}

// Checkpoints of tensor-parallel trainers: written from the slices (gathered unit by unit, rank 0
// writes the layout-free format), resumed bit for bit on the same layout, and onto one process,
// DP 2 x TP 2 and parameter sharding within float tolerance; a one-process checkpoint resumes onto
// T = 2.
TEST(TensorParallelTest, CheckpointsMoveBetweenLayouts) {
  const std::string root = TempDirectory() + "/gyre_tp_ckpt_" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(root).ok());
  const std::vector<std::string> flags = {"model=qwen3", "kl", "minis=2"};
  const Result plain = RunRanks("none", 1, flags);
  const Result straight = RunRanks("none", 2, With(flags, {"tp=2"}));
  ASSERT_TRUE(plain.ok && straight.ok);
  const std::string tp2 = root + "/tp2", whole = root + "/whole";
  ASSERT_TRUE(RunRanks("none", 2, With(flags, {"tp=2", "steps=1", "save=" + tp2})).ok);
  ASSERT_TRUE(PathExists(tp2 + "/model.safetensors"));
  ASSERT_TRUE(PathExists(tp2 + "/reference.safetensors"));
  const Result same = RunRanks("none", 2, With(flags, {"tp=2", "load=" + tp2, "start=1"}));
  ASSERT_TRUE(same.ok);
  EXPECT_TRUE(at::equal(same.weights, straight.weights)) << "same layout: not bit for bit";
  auto expect_resumed = [&](const Result& got, const std::string& what) {
    ASSERT_TRUE(got.ok) << what;
    ASSERT_EQ(got.weights.numel(), plain.weights.numel()) << what;
    EXPECT_TRUE(testing::AllClose(got.weights, plain.weights, kTensorParallel)) << what;
    for (const char* k : {"loss", "grad_norm", "tokens"}) {
      const double w = Metric(plain, 1, k);
      EXPECT_NEAR(Metric(got, 1, k), w, 1e-4 * (1 + std::abs(w))) << k << ": " << what;
    }
    ASSERT_EQ(got.kl.size(), plain.kl.size()) << what;
    for (const auto& [sample, w] : plain.kl) {
      EXPECT_NEAR(got.kl.at(sample), w, 1e-4 * (1 + std::abs(w))) << what;
    }
  };
  expect_resumed(RunRanks("none", 1, With(flags, {"load=" + tp2, "start=1"})),
                 "TP 2 -> one process");
  expect_resumed(RunRanks("none", 4, With(flags, {"tp=2", "load=" + tp2, "start=1"})),
                 "TP 2 -> DP 2 x TP 2");
  expect_resumed(RunRanks("parameters", 2, With(flags, {"load=" + tp2, "start=1"})),
                 "TP 2 -> parameters on 2");
  ASSERT_TRUE(RunRanks("none", 1, With(flags, {"steps=1", "save=" + whole})).ok);
  expect_resumed(RunRanks("none", 2, With(flags, {"tp=2", "load=" + whole, "start=1"})),
                 "one process -> TP 2");
  (void)RemoveTree(root);
}

// A layout the model cannot take is refused with the field, the value and the rule.
TEST(TensorParallelTest, AModelThatDoesNotSplitIsRefused) {
  const Result r = RunRanks("none", 4, {"tp=4"}, {}, /*failures_expected=*/true);
  ASSERT_EQ(r.exit_codes.size(), 4u);
  for (int code : r.exit_codes) EXPECT_EQ(code, 1);
  EXPECT_NE(r.logs[0].find("tensor_parallel 4 does not divide model.num_kv_heads 2"),
            std::string::npos)
      << r.logs[0];
}

}  // namespace
}  // namespace gyre::trainer
