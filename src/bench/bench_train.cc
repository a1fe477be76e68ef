// `gyre bench train`: the trainer's policy-gradient step with sequence packing against the eager
// padded baseline (one right-padded row per sample, logits at every position) on the same model
// and batches in the same run, on an equal-length and a long-tail batch, with the achieved
// FLOP/s as a fraction of a matmul peak measured at start.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "common/clock.h"
#include "common/command_line.h"
#include "model/hf_model.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "trainer/policy_trainer.h"

namespace gyre::bench {

namespace {

constexpr char kTrainDetails[] =
    "The trainer's policy-gradient step (PolicyTrainer::Step: forward, loss, backward, AdamW)\n"
    "runs three ways on the same model and batches, in the same run:\n"
    "  padded   one right-padded row per sample, logits at every position (the eager padded\n"
    "           libtorch baseline: trainer.sequence_packing: false)\n"
    "  packed   samples packed end to end into rows as wide as the longest, block-diagonal\n"
    "           causal attention, the LM head on response positions only\n"
    "           (trainer.prompt_sharing: off)\n"
    "  shared   packed, and the samples of a group (same prompt) share one copy of the prompt\n"
    "           when that is estimated cheaper (trainer.prompt_sharing: auto; the default)\n"
    "on two batches with the same number of response tokens, in groups of GROUP samples with\n"
    "the same prompt (as GRPO batches are):\n"
    "  equal     every response as long as the long-tail batch's mean\n"
    "  longtail  lognormal response lengths (as in gyre bench rollout)\n"
    "Rounds rotate which mode goes first; each mode starts every round from the same weights\n"
    "and takes one untimed warm-up step, then STEPS timed steps. Reports the median step time,\n"
    "tokens/s (the samples' input tokens, prompt + response - 1 each, per second), the\n"
    "positions the model computed (padding included, as the trainer reports them), speedup =\n"
    "padded median / median, and achieved FLOP/s: 6 x (parameters of the layers) x positions\n"
    "computed that are not padding + 6 x (LM head parameters) x response tokens per step\n"
    "(attention scores excluded), also as a fraction of the peak: the best of square matmuls in\n"
    "the compute dtype on the same threads, measured at start. Every mode must make the padded\n"
    "baseline's update up to float32 reordering: the mean difference of their weights at the\n"
    "end of a round must stay under 1% of the mean distance the weights moved (checked).\n";

struct TrainSetup {
  std::string model_dir, dtype = "float32";
  int64_t vocab = 4096, hidden = 256, layers = 4, batch = 64, group = 8, prompt_len = 32;
  int64_t max_len = 512;
  int64_t micro = 0, steps = 3, rounds = 2, threads = 0, seed = 1;
  double median = 48, sigma = 1.0;
};

model::ModelSpec TrainSpec(const TrainSetup& s) {
  return SyntheticSpec(s.vocab, s.hidden, s.layers, s.prompt_len + s.max_len);
}

// A batch of `lengths.size()` samples with random tokens below `vocab` and alternating
// advantages; groups of s.group consecutive samples have the same prompt.
std::vector<trainer::TrainSample> MakeBatch(const TrainSetup& s, int64_t vocab,
                                            const std::vector<int64_t>& lengths, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<trainer::TrainSample> out(lengths.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (i % static_cast<size_t>(s.group) != 0) {
      out[i].prompt = out[i - 1].prompt;
    } else {
      for (int64_t t = 0; t < s.prompt_len; ++t) out[i].prompt.push_back(token(rng));
    }
    for (int64_t t = 0; t < lengths[i]; ++t) out[i].response.push_back(token(rng));
    out[i].advantage = i % 2 == 0 ? 1.0f : -1.0f;
  }
  return out;
}

at::Tensor TrainWeights(const trainer::PolicyTrainer& t) {
  std::vector<at::Tensor> parts;
  for (const auto& [n, p] : t.model().NamedParameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts);
}

}  // namespace

int RunBenchTrain(const std::vector<std::string>& args) {
  TrainSetup s;
  std::string json_path;
  auto app = NewCommand(
      "gyre bench train",
      "The trainer's step with sequence packing vs padded rows, on equal and long-tail lengths.",
      kTrainDetails);
  app->add_option("--model", s.model_dir, "Hugging Face model directory (default: a random model)")
      ->type_name("DIR");
  app->add_option("--vocab", s.vocab, "vocabulary size of the random model")
      ->check(CLI::Range(2, 1 << 20));
  app->add_option("--hidden", s.hidden,
                  "hidden size of the random model: up to 64 or a multiple of 64")
      ->check(CLI::Range(1, 1 << 16))
      ->check(HiddenSize());
  app->add_option("--layers", s.layers, "decoder layers of the random model")
      ->check(CLI::Range(1, 1024));
  app->add_option("--batch", s.batch, "samples per step")->check(CLI::Range(1, 1 << 16));
  app->add_option("--group", s.group, "samples per prompt (consecutive samples share it)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--prompt-len", s.prompt_len, "prompt tokens")->check(CLI::Range(1, 1 << 16));
  app->add_option("--median-len", s.median, "median response length of the long-tail batch")
      ->check(RealRange(1, 1 << 16));
  app->add_option("--sigma", s.sigma, "lognormal sigma of the long-tail lengths")
      ->check(RealRange(0, 10));
  app->add_option("--max-len", s.max_len, "response length cap")->check(CLI::Range(1, 1 << 16));
  app->add_option("--micro-batch", s.micro, "samples per micro-batch; 0 = the whole batch")
      ->check(CLI::Range(0, 1 << 16));
  app->add_option("--dtype", s.dtype, "compute dtype: float32, bfloat16, float16")
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            const StatusOr<at::ScalarType> dtype = model::ParseWeightDtype(name);
            return dtype.ok() ? "" : dtype.status().message();
          },
          ""));
  app->add_option("--steps", s.steps, "timed steps per mode and round")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--rounds", s.rounds, "rounds")->check(CLI::Range(1, 1 << 20));
  app->add_option("--threads", s.threads, "intra-op CPU threads; 0 = every core")
      ->check(CLI::Range(0, 1024));
  app->add_option("--seed", s.seed, "workload seed")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  app->add_option("--json", json_path, "also write the figures as JSON")->type_name("FILE");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const int threads = s.threads > 0
                          ? static_cast<int>(s.threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  const at::ScalarType dtype = *model::ParseWeightDtype(s.dtype);

  // One model; each mode trains a fresh copy of its weights.
  std::unique_ptr<model::Transformer> base;
  if (!s.model_dir.empty()) {
    std::fprintf(stderr, "bench train: loading %s\n", s.model_dir.c_str());
    auto loaded = model::LoadHfModel(s.model_dir);
    if (!loaded.ok()) {
      std::fprintf(stderr, "gyre bench train: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    base = std::move(*loaded);
  } else {
    base = model::Transformer::Create(TrainSpec(s), 7, 0.02);
  }
  const model::ModelSpec spec = base->spec();
  if (s.prompt_len + s.max_len > spec.max_seq_len) {
    return CommandLineError(*app, "--prompt-len " + std::to_string(s.prompt_len) + " + --max-len " +
                                      std::to_string(s.max_len) +
                                      " exceeds the model's max_seq_len " +
                                      std::to_string(spec.max_seq_len));
  }
  std::vector<at::Tensor> start_weights;
  for (const auto& [n, p] : base->NamedParameters()) start_weights.push_back(p.detach().clone());
  auto fresh = [&]() {
    auto m = model::Transformer::Create(spec, 7, -1.0);
    auto params = m->NamedParameters();
    at::NoGradGuard ng;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(start_weights[i]);
    return m;
  };

  // The batches: lognormal lengths, and the same total at the mean length for every sample.
  std::mt19937_64 rng(static_cast<uint64_t>(s.seed));
  std::lognormal_distribution<double> length(std::log(s.median), s.sigma);
  std::vector<int64_t> tail;
  int64_t total = 0;
  for (int64_t i = 0; i < s.batch; ++i) {
    tail.push_back(std::clamp<int64_t>(std::llround(length(rng)), 1, s.max_len));
    total += tail.back();
  }
  const int64_t mean = std::max<int64_t>(1, (total + s.batch / 2) / s.batch);
  struct Workload {
    const char* name;
    std::vector<int64_t> lengths;
  };
  const std::vector<Workload> workloads = {{"equal", std::vector<int64_t>(s.batch, mean)},
                                           {"longtail", tail}};

  std::fprintf(stderr, "bench train: measuring the matmul peak (%s, %d threads)\n", s.dtype.c_str(),
               threads);
  const double peak = MatmulPeakFlops(s.dtype);
  // Parameters of the layers (every matmul a token passes through, norms aside) and of the LM
  // head (the tied embedding counts once, as the head).
  const int64_t head_params = spec.vocab_size * spec.hidden_size;
  const int64_t layer_params = base->NumParameters() - head_params -
                               (spec.tie_embeddings ? 0 : spec.vocab_size * spec.hidden_size);

  BenchReport report("train");
  report.SetKeys({"batch", "mode"});
  report.SetMetric("median_s", false);
  report.SetMetric("tokens_per_s", true);
  report.SetMetric("speedup", true);
  report.SetContext("device", "cpu");
  report.SetContext("threads", threads);
  report.SetContext("dtype", s.dtype);
  report.SetContext("model", s.model_dir.empty() ? "random" : s.model_dir);
  report.SetContext("parameters", base->NumParameters());
  report.SetContext("samples", s.batch);
  report.SetContext("group", s.group);
  report.SetContext("prompt_len", s.prompt_len);
  report.SetContext("longtail_lengths",
                    "lognormal(median " + std::to_string(static_cast<int64_t>(s.median)) +
                        ", sigma " + std::to_string(s.sigma).substr(0, 4) + "), max " +
                        std::to_string(*std::max_element(tail.begin(), tail.end())) + ", mean " +
                        std::to_string(mean));
  report.SetContext("micro_batch", s.micro);
  report.SetContext("timed_steps", s.steps * s.rounds);
  report.SetContext("matmul_peak_gflops", peak / 1e9);
  bool same_weights = true;
  double worst_diff = 0;
  for (const Workload& w : workloads) {
    const auto batch = MakeBatch(s, std::min<int64_t>(spec.vocab_size, 1 << 20), w.lengths,
                                 static_cast<uint64_t>(s.seed) * 7919u + 17u);
    int64_t input_tokens = 0, response_tokens = 0;
    for (const auto& x : batch) {
      input_tokens += static_cast<int64_t>(x.prompt.size() + x.response.size()) - 1;
      response_tokens += static_cast<int64_t>(x.response.size());
    }
    constexpr int kModes = 3;
    constexpr const char* kNames[kModes] = {"padded", "packed", "shared"};
    std::vector<double> times[kModes];
    double computed[kModes] = {0, 0, 0}, useful[kModes] = {0, 0, 0};  // per step
    for (int64_t round = 0; round < s.rounds; ++round) {
      at::Tensor weights[kModes];
      for (int k = 0; k < kModes; ++k) {
        const int mode = static_cast<int>((k + round) % kModes);
        trainer::PolicyTrainer t(fresh(), 1e-4, 0, 0.9, 0.999);
        t.SetComputeDtype(dtype);
        t.SetSequencePacking(mode != 0);
        t.SetPromptSharing(mode == 2 ? trainer::PromptSharing::kAuto
                                     : trainer::PromptSharing::kOff);
        trainer::TrainOptions opts;
        opts.micro_batch_size = s.micro > 0 ? s.micro : s.batch;
        for (int64_t i = 0; i <= s.steps; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          auto m = t.Step(batch, trainer::Objective::kPolicyGradient, 1e-4, opts);
          if (!m.ok()) {
            std::fprintf(stderr, "gyre bench train: %s\n", m.status().ToString().c_str());
            return 1;
          }
          if (i > 0) times[mode].push_back(SecondsSince(t0));
          computed[mode] = (*m)["computed_tokens"];
          useful[mode] = (*m)["computed_tokens"] - (*m)["pad_tokens"];
        }
        weights[mode] = TrainWeights(t);
        std::fprintf(stderr, "bench train: %s round %lld %s: median %.4f s\n", w.name,
                     static_cast<long long>(round), kNames[mode], Median(times[mode]));
      }
      // The same updates up to float32 reordering (AdamW's first steps are about lr * sign(g),
      // so a weight whose tiny gradient flips sign may differ by 2 lr: compare means).
      const at::Tensor start = at::cat([&] {
        std::vector<at::Tensor> parts;
        for (const at::Tensor& p : start_weights) parts.push_back(p.flatten());
        return parts;
      }());
      const double moved = (weights[0] - start).abs().mean().item<double>();
      for (int mode = 1; mode < kModes; ++mode) {
        const double diff = (weights[0] - weights[mode]).abs().mean().item<double>() / moved;
        worst_diff = std::max(worst_diff, diff);
        same_weights = same_weights && moved > 0 && diff <= 0.01;
      }
    }
    const double padded = Median(times[0]);
    for (int mode = 0; mode < kModes; ++mode) {
      const double med = Median(times[mode]);
      const double flops =
          6.0 * static_cast<double>(layer_params) * useful[mode] +
          6.0 * static_cast<double>(head_params) * static_cast<double>(response_tokens);
      report.AddRow({{"batch", w.name},
                     {"mode", kNames[mode]},
                     {"median_s", med},
                     {"tokens_per_s", static_cast<double>(input_tokens) / med},
                     {"computed_tokens", static_cast<int64_t>(computed[mode])},
                     {"real_tokens", input_tokens},
                     {"speedup", padded / med},
                     {"gflops", flops / med / 1e9},
                     {"peak_fraction", peak > 0 ? flops / med / peak : 0.0}});
    }
  }
  report.SetContext("update_disagreement", worst_diff);
  report.PrintTable({{"batch", "batch"},
                     {"mode", "mode"},
                     {"median_s", "median s", 4},
                     {"tokens_per_s", "tokens/s", 0},
                     {"real_tokens", "real tokens"},
                     {"computed_tokens", "computed"},
                     {"speedup", "speedup", 2},
                     {"gflops", "GFLOP/s", 2},
                     {"peak_fraction", "of peak", 3}});
  if (!report.WriteJsonIfAsked(json_path, "train")) return 1;
  if (!same_weights) {
    std::fprintf(stderr,
                 "gyre bench train: the modes made different updates (mean weight difference "
                 "%g of the mean update)\n",
                 worst_diff);
    return 1;
  }
  return 0;
}

}  // namespace gyre::bench
