// `gyre bench dp-step`: the time of one data-parallel optimizer step with the gradient
// all-reduce overlapped with backward (trainer.overlap_grad_reduce: true) against the blocking
// all-reduce after backward (false), in the same run, plus the all-reduce alone for scale, and
// with sharded optimizer state (trainer.shard: optimizer, gradients) and fully sharded parameters
// (trainer.shard: parameters), with the state each rank holds, and tensor parallelism
// (trainer.tensor_parallel: RANKS) over the same global batch.
//
// The ranks are threads of this process, each with its own PolicyTrainer and Gloo group member
// on loopback, so the figures include Gloo's TCP path but not a real network. Rounds alternate
// the modes, each from the same seed on the same synthetic batches, so slow drift of a shared
// host affects both alike; both modes must end each round with identical weights.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "comm/gloo_communicator.h"
#include "common/clock.h"
#include "common/command_line.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "trainer/grad_reducer.h"
#include "trainer/policy_trainer.h"

namespace gyre::bench {

namespace {

constexpr char kDpStepDetails[] =
    "Times data-parallel optimizer steps (PolicyTrainer::Step, policy gradient, on a synthetic\n"
    "batch) on RANKS trainer ranks: threads of this process, each with its own Gloo group member\n"
    "on loopback and its own intra-op threads. These rows, measured in the same run:\n"
    "  allreduce-only  the bucketed gradient all-reduce alone (zero gradients, no forward or\n"
    "                  backward): the communication a step has to hide\n"
    "  blocking        trainer.overlap_grad_reduce: false, every bucket after backward (baseline)\n"
    "  overlapped      trainer.overlap_grad_reduce: true, buckets during the last micro-batch's\n"
    "                  backward\n"
    "  zero1           trainer.shard: optimizer (overlapped): each rank keeps 1/RANKS of the\n"
    "                  AdamW moments, updates that slice and all-gathers the weights\n"
    "  zero2           trainer.shard: gradients: gradients reduce-scattered after backward, each\n"
    "                  rank keeps 1/RANKS of the moments and of the gradients\n"
    "  zero3           trainer.shard: parameters: each rank keeps 1/RANKS of the weights too;\n"
    "                  every decoder layer is all-gathered before its forward and again before\n"
    "                  its backward, its gradient reduce-scattered during the backward\n"
    "  zero3-keep      zero3 with trainer.reshard_after_forward: false: each layer stays\n"
    "                  gathered from its forward to its backward (one all-gather fewer)\n"
    "  tp              trainer.tensor_parallel: RANKS (no data parallelism): each rank holds a\n"
    "                  slice of every layer and of the vocabulary, and all of them compute the\n"
    "                  whole global batch (RANKS x BATCH samples) together, exchanging\n"
    "                  activations in every layer's forward and backward (equal work: the same\n"
    "                  samples and update as the data-parallel rows). Needs a model that splits:\n"
    "                  RANKS dividing the heads (HIDDEN / 64) and the MLP (HIDDEN * 8 / 3);\n"
    "                  otherwise the row is left out with the reason\n"
    "Each round runs the modes in turn (rotating which goes first), each from the same seed:\n"
    "one untimed warm-up step, then STEPS timed steps. Reports the median and minimum seconds\n"
    "per step on rank 0 over all rounds; speedup = blocking median / median; weights_mib,\n"
    "state_mib and grad_mib = the float32 weights, the AdamW moments and the gradients rank 0\n"
    "holds between steps (its largest slice when sharded), measured from its tensors;\n"
    "comm_s = the zero3 rows' and tp's seconds per step inside collectives, of which\n"
    "comm_wait_s the step waited for (the rest was hidden behind compute; tp hides none);\n"
    "max_weight_diff = the largest difference of the final weights from the overlapped row's\n"
    "(sharded rows sum in another order). Blocking\n"
    "and overlapped must end every round with identical weights (checked).\n";

struct DpStepSetup {
  int64_t ranks = 2, vocab = 4096, hidden = 256, layers = 4, batch = 8, seq_len = 64;
  int64_t micro_batches = 1, mini_batches = 1, bucket_mb = 4, steps = 5, rounds = 3, threads = 1;
};

model::ModelSpec DpStepSpec(const DpStepSetup& s) {
  return SyntheticSpec(s.vocab, s.hidden, s.layers, s.seq_len);
}

// Rank `rank`'s batch for step `step`: the same in every mode and round.
std::vector<trainer::TrainSample> Batch(const DpStepSetup& s, int rank, int step) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + rank + 1));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(s.vocab - 1));
  const int64_t prompt = std::max<int64_t>(1, s.seq_len / 4);
  std::vector<trainer::TrainSample> out(static_cast<size_t>(s.batch));
  for (size_t i = 0; i < out.size(); ++i) {
    for (int64_t t = 0; t < prompt; ++t) out[i].prompt.push_back(token(rng));
    for (int64_t t = prompt; t < s.seq_len; ++t) out[i].response.push_back(token(rng));
    out[i].advantage = i % 2 == 0 ? 1.0f : -1.0f;
  }
  return out;
}

struct RankRun {
  std::vector<double> step_s;  // timed steps
  at::Tensor weights;          // at the end (trainer modes)
  // Held after the last step (trainer modes).
  double weights_mib = 0, state_mib = 0, grad_mib = 0;
  // zero3: seconds per timed step inside collectives, and waited for.
  double comm_s = 0, comm_wait_s = 0;
};

enum class DpMode {
  kAllReduceOnly,
  kBlocking,
  kOverlapped,
  kZero1,
  kZero2,
  kZero3,
  kZero3Keep,
  kTp
};
const char* ModeName(DpMode m) {
  switch (m) {
    case DpMode::kAllReduceOnly:
      return "allreduce-only";
    case DpMode::kBlocking:
      return "blocking";
    case DpMode::kOverlapped:
      return "overlapped";
    case DpMode::kZero1:
      return "zero1";
    case DpMode::kZero2:
      return "zero2";
    case DpMode::kZero3:
      return "zero3";
    case DpMode::kZero3Keep:
      return "zero3-keep";
    case DpMode::kTp:
      return "tp";
  }
  return "?";
}

// One rank of one round in one mode.
StatusOr<RankRun> RunRank(const DpStepSetup& s, DpMode mode, const std::string& store,
                          const std::string& group, int rank) {
  at::set_num_threads(static_cast<int>(s.threads));
  comm::GlooOptions o;
  o.store_address = store;
  o.group = group;
  o.rank = rank;
  o.size = static_cast<int>(s.ranks);
  GYRE_ASSIGN_OR_RETURN(auto comm, comm::CreateGlooCommunicator(o));
  trainer::PolicyTrainer t(model::Transformer::Create(DpStepSpec(s), 7, 0.02), 1e-4, 0.0, 0.9,
                           0.999);
  RankRun out;
  if (mode == DpMode::kAllReduceOnly) {
    // Tensors with the model's parameter sizes; gradients zero (no backward).
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    for (const auto& [n, p] : t.model().NamedParameters()) {
      params.push_back(at::zeros_like(p).requires_grad_());
      names.push_back(n);
    }
    trainer::GradReducer reducer(params, names, comm.get(), s.bucket_mb << 20, 600, false);
    for (int64_t i = 0; i <= s.steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      GYRE_RETURN_IF_ERROR(reducer.Finish());
      if (i > 0) out.step_s.push_back(SecondsSince(t0));
    }
    return out;
  }
  trainer::DataParallelOptions dp;
  dp.bucket_bytes = s.bucket_mb << 20;
  dp.timeout_s = 600;
  dp.overlap_grad_reduce = mode != DpMode::kBlocking;
  dp.reshard_after_forward = mode != DpMode::kZero3Keep;
  GYRE_RETURN_IF_ERROR(t.SetSharding(mode == DpMode::kZero1   ? trainer::Shard::kOptimizer
                                     : mode == DpMode::kZero2 ? trainer::Shard::kGradients
                                     : mode == DpMode::kZero3 || mode == DpMode::kZero3Keep
                                         ? trainer::Shard::kParameters
                                         : trainer::Shard::kNone));
  const bool tp = mode == DpMode::kTp;
  if (tp) {
    GYRE_RETURN_IF_ERROR(t.SetTensorParallel(comm.get(), 600));
  } else {
    GYRE_RETURN_IF_ERROR(t.SetDataParallel(comm.get(), dp));
  }
  trainer::TrainOptions opts;
  opts.micro_batch_size = (s.batch + s.micro_batches - 1) / s.micro_batches;
  opts.mini_batches = s.mini_batches;
  if (tp) opts.micro_batch_size *= s.ranks;  // the same micro-batches as the ranks' together
  double comm0 = 0, wait0 = 0;
  for (int64_t i = 0; i <= s.steps; ++i) {
    std::vector<trainer::TrainSample> batch;
    for (int r = tp ? 0 : rank; r < (tp ? s.ranks : rank + 1); ++r) {  // tp: every rank's
      for (auto& x : Batch(s, r, static_cast<int>(i))) batch.push_back(std::move(x));
    }
    if (i == 1) {  // after the warm-up step
      comm0 = t.collective_seconds();
      wait0 = t.collective_wait_seconds();
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto m = t.Step(batch, trainer::Objective::kPolicyGradient, 1e-4, opts);
    if (!m.ok()) return m.status();
    if (i > 0) out.step_s.push_back(SecondsSince(t0));
    out.weights_mib = m->at("weights_mib");
    out.state_mib = m->at("optimizer_state_mib");
    out.grad_mib = m->at("gradient_mib");
  }
  out.comm_s = (t.collective_seconds() - comm0) / static_cast<double>(s.steps);
  out.comm_wait_s = (t.collective_wait_seconds() - wait0) / static_cast<double>(s.steps);
  // Every rank takes part (zero3 gathers the weights from all of them).
  GYRE_ASSIGN_OR_RETURN(const model::NamedTensors weights, t.FullWeights());
  std::vector<at::Tensor> parts;
  for (const auto& [n, p] : weights) parts.push_back(p.detach().flatten());
  out.weights = at::cat(parts);
  return out;
}

}  // namespace

int RunBenchDpStep(const std::vector<std::string>& args) {
  DpStepSetup s;
  std::string json_path;
  auto app = NewCommand(
      "gyre bench dp-step",
      "Data-parallel step time, gradient all-reduce overlapped with backward vs after it.",
      kDpStepDetails);
  app->add_option("--ranks", s.ranks, "data-parallel ranks")->check(CLI::Range(2, 64));
  app->add_option("--vocab", s.vocab, "vocabulary size")->check(CLI::Range(2, 1 << 20));
  app->add_option("--hidden", s.hidden, "hidden size, up to 64 or a multiple of 64 (heads of 64)")
      ->check(CLI::Range(1, 1 << 16))
      ->check(HiddenSize());
  app->add_option("--layers", s.layers, "decoder layers")->check(CLI::Range(1, 1024));
  app->add_option("--batch", s.batch, "samples per rank per step")->check(CLI::Range(1, 1 << 16));
  app->add_option("--seq-len", s.seq_len, "prompt + response tokens per sample")
      ->check(CLI::Range(2, 1 << 16));
  app->add_option("--micro-batches", s.micro_batches,
                  "micro-batches per step; only the last one's backward overlaps")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--mini-batches", s.mini_batches,
                  "optimizer steps per batch (trainer.mini_batches)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--bucket-mb", s.bucket_mb,
                  "gradient bucket size in MiB (trainer.grad_bucket_mb)")
      ->check(CLI::Range(1, 4096));
  app->add_option("--steps", s.steps, "timed steps per mode and round")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--rounds", s.rounds, "rounds")->check(CLI::Range(1, 1 << 20));
  app->add_option("--threads", s.threads, "intra-op CPU threads per rank")
      ->check(CLI::Range(1, 1024));
  app->add_option("--json", json_path, "also write the figures as JSON")->type_name("FILE");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  if (s.micro_batches > s.batch) return CommandLineError(*app, "--micro-batches exceeds --batch");
  auto store = comm::StoreServer::Start("127.0.0.1");
  if (!store.ok()) {
    std::fprintf(stderr, "gyre bench dp-step: %s\n", store.status().ToString().c_str());
    return 1;
  }
  std::vector<DpMode> modes = {DpMode::kAllReduceOnly, DpMode::kBlocking, DpMode::kOverlapped,
                               DpMode::kZero1,         DpMode::kZero2,    DpMode::kZero3,
                               DpMode::kZero3Keep};
  if (Status splits = model::CheckTensorParallel(DpStepSpec(s), static_cast<int>(s.ranks));
      splits.ok()) {
    modes.push_back(DpMode::kTp);
  } else {
    std::fprintf(stderr, "bench dp-step: the tp row is left out: %s\n", splits.message().c_str());
  }
  std::vector<std::vector<double>> times(modes.size());
  std::vector<double> weights_mib(modes.size()), state_mib(modes.size()), grad_mib(modes.size()),
      weight_diff(modes.size()), comm_s(modes.size()), comm_wait_s(modes.size());
  bool same_weights = true;
  for (int64_t round = 0; round < s.rounds; ++round) {
    // The all-reduce alone first; the trainer modes in an order rotated each round.
    std::vector<size_t> order = {0};
    for (size_t k = 0; k + 1 < modes.size(); ++k) {
      order.push_back(1 + (k + static_cast<size_t>(round)) % (modes.size() - 1));
    }
    std::vector<at::Tensor> weights(modes.size());
    for (size_t k : order) {
      const std::string group = "bench-dp-" + std::to_string(round) + "-" + ModeName(modes[k]);
      std::vector<std::future<StatusOr<RankRun>>> ranks;
      for (int r = 0; r < s.ranks; ++r) {
        ranks.push_back(std::async(std::launch::async, RunRank, std::cref(s), modes[k],
                                   (*store)->address(), group, r));
      }
      for (int r = 0; r < s.ranks; ++r) {
        auto run = ranks[r].get();
        if (!run.ok()) {
          std::fprintf(stderr, "gyre bench dp-step: %s, rank %d: %s\n", ModeName(modes[k]), r,
                       run.status().ToString().c_str());
          return 1;
        }
        if (r > 0) continue;
        times[k].insert(times[k].end(), run->step_s.begin(), run->step_s.end());
        weights[k] = run->weights;
        weights_mib[k] = run->weights_mib;
        state_mib[k] = run->state_mib;
        grad_mib[k] = run->grad_mib;
        // Averaged over the rounds.
        comm_s[k] += run->comm_s / static_cast<double>(s.rounds);
        comm_wait_s[k] += run->comm_wait_s / static_cast<double>(s.rounds);
      }
      std::fprintf(stderr, "bench dp-step: round %lld %s: median %.4f s\n",
                   static_cast<long long>(round), ModeName(modes[k]), Median(times[k]));
    }
    same_weights = same_weights && at::equal(weights[1], weights[2]);
    for (size_t k = 3; k < modes.size(); ++k) {
      weight_diff[k] =
          std::max(weight_diff[k], (weights[k] - weights[2]).abs().max().item<double>());
    }
  }
  int64_t params = 0, buckets = 0;
  {
    auto model = model::Transformer::Create(DpStepSpec(s), 7, 0.02);
    std::vector<int64_t> numels;
    for (const auto& [n, p] : model->NamedParameters()) numels.push_back(p.numel());
    params = model->NumParameters();
    buckets = static_cast<int64_t>(trainer::PlanGradBuckets(numels, s.bucket_mb << 20).size());
  }
  BenchReport report("dp-step");
  report.SetKeys({"mode"});
  report.SetMetric("median_s", false);
  report.SetMetric("speedup", true);
  report.SetContext("device", "cpu");
  report.SetContext("ranks", s.ranks);
  report.SetContext("host_cores", static_cast<int64_t>(std::thread::hardware_concurrency()));
  report.SetContext("threads_per_rank", s.threads);
  report.SetContext("parameters", params);
  report.SetContext("gradient_bytes", params * 4);
  report.SetContext("bucket_mb", s.bucket_mb);
  report.SetContext("buckets", buckets);
  report.SetContext("samples_per_rank", s.batch);
  report.SetContext("seq_len", s.seq_len);
  report.SetContext("micro_batches", s.micro_batches);
  report.SetContext("mini_batches", s.mini_batches);
  report.SetContext("timed_steps", s.steps * s.rounds);
  report.SetContext("same_weights", same_weights);
  const double base = Median(times[1]);
  for (size_t k = 0; k < modes.size(); ++k) {
    const double med = Median(times[k]);
    const bool trainer_mode = modes[k] != DpMode::kAllReduceOnly;
    const bool zero3 =
        modes[k] == DpMode::kZero3 || modes[k] == DpMode::kZero3Keep || modes[k] == DpMode::kTp;
    report.AddRow(
        {{"mode", ModeName(modes[k])},
         {"median_s", med},
         {"min_s", *std::min_element(times[k].begin(), times[k].end())},
         {"speedup",
          modes[k] == DpMode::kAllReduceOnly ? nlohmann::json() : nlohmann::json(base / med)},
         {"weights_mib", trainer_mode ? nlohmann::json(weights_mib[k]) : nlohmann::json()},
         {"state_mib",
          modes[k] == DpMode::kAllReduceOnly ? nlohmann::json() : nlohmann::json(state_mib[k])},
         {"grad_mib",
          modes[k] == DpMode::kAllReduceOnly ? nlohmann::json() : nlohmann::json(grad_mib[k])},
         {"comm_s", zero3 ? nlohmann::json(comm_s[k]) : nlohmann::json()},
         {"comm_wait_s", zero3 ? nlohmann::json(comm_wait_s[k]) : nlohmann::json()},
         {"max_weight_diff", k >= 3 ? nlohmann::json(weight_diff[k]) : nlohmann::json()},
         {"steps", static_cast<int64_t>(times[k].size())}});
  }
  report.PrintTable({{"mode", "mode"},
                     {"median_s", "median s", 4},
                     {"min_s", "min s", 4},
                     {"speedup", "speedup", 3},
                     {"weights_mib", "weights MiB", 2},
                     {"state_mib", "state MiB", 2},
                     {"grad_mib", "grad MiB", 2},
                     {"comm_s", "comm s", 4},
                     {"comm_wait_s", "comm wait s", 4},
                     {"max_weight_diff", "max w diff", 2},
                     {"steps", "steps"}});
  if (!report.WriteJsonIfAsked(json_path, "dp-step")) return 1;
  if (!same_weights) {
    std::fprintf(stderr,
                 "gyre bench dp-step: blocking and overlapped ended with different "
                 "weights\n");
    return 1;
  }
  return 0;
}

}  // namespace gyre::bench
