// `gyre bench rollout`: the rollout engine on a synthetic long-tail workload, continuous
// batching (with and without group prefix sharing) against static batching in the same run.

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/clock.h"
#include "common/command_line.h"
#include "kernels/device_info.h"
#include "model/hf_config.h"
#include "model/hf_model.h"
#include "rollout/rollout_engine.h"
#include "runtime/worker.h"

namespace gyre::bench {

namespace {

constexpr char kRolloutDetails[] =
    "Generates one batch of prompt groups several ways with the paged engine, on the same\n"
    "model and workload, with the same sampling (ops::SampleRows) and seeds:\n"
    "  static             static scheduling: samples are admitted only into an empty batch;\n"
    "                     finished samples leave it, but nothing joins until all have\n"
    "                     finished (the baseline)\n"
    "  continuous         continuous batching, no prefix sharing\n"
    "  continuous+prefix  continuous batching with group prefix sharing (the default)\n"
    "  continuous+prefix/aten  (CPU, float32) the same through the forward's general path of\n"
    "                     ATen ops instead of its fused CPU kernels (model/cpu_decode.h)\n"
    "Response lengths follow a long-tail (lognormal) distribution: sample i of the workload\n"
    "stops after exactly its drawn length. Reports generated tokens/s, the time to finish the\n"
    "group batch, KV-cache utilisation (positions of live samples over the KV pool) and the\n"
    "share of time spent with the batch under half full (lost to the longest sequences);\n"
    "`speedup` is tokens/s over static's in the same run. On the CPU each row also reports\n"
    "matmul_ceiling_fraction: tokens/s over the ceiling that the matmuls allow, the best\n"
    "FLOP/s of square float matmuls on the same threads (measured at start) over 2 x the\n"
    "parameters each token passes through (every layer and the LM head; attention scores\n"
    "excluded). On a GPU each row reports hbm_roofline_fraction instead: the least memory\n"
    "traffic the generation needs (the weights once per engine step, every sampled token's\n"
    "context keys and values once), over its time, over the device's peak bandwidth.\n";

struct Mode {
  const char* name;
  rollout::Scheduling scheduling;
  bool prefix_sharing;
  bool aten_forward = false;  // the forward's general ATen path instead of the fused CPU kernels
};

struct Measured {
  double seconds = 0;
  int64_t generated = 0;
  double kv_util_mean = 0;
  double kv_util_peak = 0;
  double tail_share = 0;
  rollout::EngineStats stats;
  std::vector<rollout::SampleResult> results;
};

StatusOr<Measured> RunMode(const model::Transformer& model, const rollout::EngineConfig& base,
                           const Mode& mode, const std::vector<rollout::Request>& requests) {
  rollout::EngineConfig config = base;
  config.scheduling = mode.scheduling;
  config.prefix_sharing = mode.prefix_sharing;
  GYRE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create(&model, config));
  GYRE_RETURN_IF_ERROR(engine->Add(requests));
  Measured m;
  double tail_s = 0, util_sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (!engine->idle()) {
    const auto ts = std::chrono::steady_clock::now();
    const int64_t slots = engine->running_slots();
    GYRE_ASSIGN_OR_RETURN(auto done, engine->Step());
    const double dt = SecondsSince(ts);
    // A step counts as lost to the tail when the batch it ran was under half full.
    if (2 * std::max(slots, engine->running_slots()) < config.max_running) tail_s += dt;
    util_sum += static_cast<double>(engine->allocator().used_blocks()) /
                static_cast<double>(config.num_blocks);
    for (auto& r : done) m.results.push_back(std::move(r));
  }
  m.seconds = SecondsSince(t0);
  m.stats = engine->stats();
  m.generated = m.stats.generated_tokens;
  m.kv_util_mean = m.stats.steps ? util_sum / static_cast<double>(m.stats.steps) : 0.0;
  m.kv_util_peak = static_cast<double>(engine->allocator().peak_used_blocks()) /
                   static_cast<double>(config.num_blocks);
  m.tail_share = m.seconds > 0 ? tail_s / m.seconds : 0.0;
  std::sort(m.results.begin(), m.results.end(),
            [](const rollout::SampleResult& a, const rollout::SampleResult& b) {
              return a.id != b.id ? a.id < b.id : a.index < b.index;
            });
  return m;
}

}  // namespace

int RunBenchRollout(const std::vector<std::string>& args) {
  std::string dir, json_path;
  int64_t groups = 32, group_size = 8, prompt_len = 32, max_new = 256, max_running = 64;
  int64_t block_size = 16, max_step_tokens = 512, kv_mb = 0, seed = 1, threads = 1;
  double median = 24, sigma = 1.0, temperature = 1.0;
  std::string device_name = "cpu";
  int64_t cuda_graphs = 1;
  auto app = NewCommand(
      "gyre bench rollout",
      "The rollout engine on a long-tail workload: continuous batching vs static batching.",
      kRolloutDetails);
  app->add_option("--model", dir, "Hugging Face model directory (gyre init-model writes one)")
      ->type_name("DIR")
      ->required();
  app->add_option("--groups", groups, "prompt groups")->check(CLI::Range(1, 1 << 20));
  app->add_option("--group-size", group_size, "samples per prompt")->check(CLI::Range(1, 4096));
  app->add_option("--prompt-len", prompt_len, "prompt tokens")->check(CLI::Range(1, 1 << 20));
  app->add_option("--median-len", median, "median response length")->check(RealRange(1, 1e6));
  app->add_option("--sigma", sigma, "lognormal sigma of response lengths")->check(RealRange(0, 10));
  app->add_option("--max-new-tokens", max_new, "response length cap")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--max-running", max_running, "sequences in the running batch")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--block-size", block_size, "KV block size in positions")
      ->check(CLI::Range(1, 4096));
  app->add_option("--max-step-tokens", max_step_tokens,
                  "tokens per forward (decodes + prefill chunks)")
      ->check(CLI::Range(1, 1 << 24));
  app->add_option("--kv-cache-mb", kv_mb,
                  "KV cache in MiB; 0 = enough for --max-running full samples")
      ->check(CLI::Range(0, 1 << 24));
  app->add_option("--temperature", temperature, "sampling temperature")->check(RealRange(0, 100));
  app->add_option("--seed", seed, "workload seed")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
  app->add_option("--threads", threads, "intra-op CPU threads")->check(CLI::Range(1, 1024));
  app->add_option("--device", device_name, "cpu or cuda (GPU 0)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app->add_option("--cuda-graphs", cuda_graphs, "on a GPU, replay decode steps as CUDA graphs")
      ->check(CLI::Range(0, 1));
  app->add_option("--json", json_path, "also write the figures as JSON")->type_name("FILE");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  at::set_num_threads(static_cast<int>(threads));
  runtime::TuneAllocatorForRepeatedSteps();  // as the rollout workers run the engine
  std::fprintf(stderr, "bench rollout: loading %s\n", dir.c_str());
  auto model = model::LoadHfModel(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "gyre bench rollout: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const bool cuda = device_name == "cuda";
  if (cuda) {
    if (kernels::CudaDeviceCount() == 0) {
      std::fprintf(stderr, "gyre bench rollout: --device cuda, but no CUDA device is usable\n");
      return 1;
    }
    (*model)->To(at::Device(at::kCUDA, 0));
  }
  const auto& spec = (*model)->spec();
  if (prompt_len + max_new > spec.max_seq_len) {
    return CommandLineError(*app, "--prompt-len " + std::to_string(prompt_len) +
                                      " + --max-new-tokens " + std::to_string(max_new) +
                                      " exceeds the model's max_seq_len " +
                                      std::to_string(spec.max_seq_len));
  }

  // The workload: random prompts, lognormal response lengths (one per sample).
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::uniform_int_distribution<int32_t> token(
      0, static_cast<int32_t>(std::min<int64_t>(spec.vocab_size, 256) - 1));
  std::lognormal_distribution<double> length(std::log(median), sigma);
  std::vector<rollout::Request> requests;
  std::vector<int32_t> lengths;
  for (int64_t g = 0; g < groups; ++g) {
    rollout::Request r;
    r.id = static_cast<uint64_t>(g);
    r.group = static_cast<uint64_t>(g);
    for (int64_t t = 0; t < prompt_len; ++t) r.prompt.push_back(token(rng));
    r.n = static_cast<int32_t>(group_size);
    r.seed = static_cast<uint64_t>(seed) * 1000003u + static_cast<uint64_t>(g) * 4096u;
    r.sampling.temperature = static_cast<float>(temperature);
    r.sampling.max_new_tokens = static_cast<int32_t>(max_new);
    for (int64_t i = 0; i < group_size; ++i) {
      const double l = std::round(length(rng));
      const int32_t len = static_cast<int32_t>(std::clamp<double>(l, 1, max_new));
      r.sample_max_new_tokens.push_back(len);
      lengths.push_back(len);
    }
    requests.push_back(std::move(r));
  }
  std::vector<int32_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  double mean_len = 0;
  for (int32_t l : lengths) mean_len += l / static_cast<double>(lengths.size());

  rollout::EngineConfig config;
  config.block_size = block_size;
  config.max_running = max_running;
  config.max_step_tokens = max_step_tokens;
  config.cuda_graphs = cuda_graphs != 0;
  config.cuda_graph_max_batch = max_running;
  const int64_t full = (prompt_len + max_new + block_size - 1) / block_size;
  if (kv_mb > 0) {
    auto blocks = rollout::BlocksForBudget(**model, kv_mb << 20, block_size);
    if (!blocks.ok()) {
      std::fprintf(stderr, "gyre bench rollout: %s\n", blocks.status().ToString().c_str());
      return 2;
    }
    config.num_blocks = *blocks;
  } else {
    config.num_blocks = max_running * full;
  }
  if (config.num_blocks < full) {
    std::fprintf(stderr,
                 "gyre bench rollout: the KV cache (%lld blocks) cannot hold one full-length "
                 "sample (%lld blocks)\n",
                 static_cast<long long>(config.num_blocks), static_cast<long long>(full));
    return 2;
  }

  // Warm-up (allocator, thread pool) on a slice of the workload, not measured.
  {
    std::vector<rollout::Request> warm(requests.begin(),
                                       requests.begin() + std::min<int64_t>(2, groups));
    for (auto& r : warm) {
      for (auto& l : r.sample_max_new_tokens) l = std::min<int32_t>(l, 4);
    }
    auto w = RunMode(**model, config, {"warmup", rollout::Scheduling::kContinuous, true}, warm);
    if (!w.ok()) {
      std::fprintf(stderr, "gyre bench rollout: %s\n", w.status().ToString().c_str());
      return 1;
    }
  }

  std::vector<Mode> modes = {
      {"static", rollout::Scheduling::kStatic, false},
      {"continuous", rollout::Scheduling::kContinuous, false},
      {"continuous+prefix", rollout::Scheduling::kContinuous, true},
  };
  // On the CPU in float32 the forward runs the fused kernels (model/cpu_decode.h); the same
  // mode through the general path of ATen ops is their baseline.
  if (!cuda && (*model)->dtype() == at::kFloat) {
    modes.push_back({"continuous+prefix/aten", rollout::Scheduling::kContinuous, true, true});
  }
  BenchReport report("rollout");
  report.SetKeys({"mode"});
  report.SetMetric("tokens_per_s", true);
  report.SetMetric("batch_time_s", false);
  report.SetMetric("speedup", true);
  report.SetContext("model", dir);
  report.SetContext("device", cuda ? "cuda:0" : "cpu");
  report.SetContext("cuda_graphs", cuda && cuda_graphs != 0);
  const double peak_gbs = PeakBandwidthGBs(cuda);
  if (cuda) report.SetContext("peak_bandwidth_gb_s", peak_gbs);
  // CPU: the decode ceiling the matmuls allow. A generated token passes through every matmul
  // parameter once (2 FLOP each): the layers and the LM head, not the input embedding lookup
  // (with tied embeddings the embedding is the LM head and counts once).
  double ceiling_tps = 0;
  const int64_t matmul_params =
      (*model)->NumParameters() - (spec.tie_embeddings ? 0 : spec.vocab_size * spec.hidden_size);
  if (!cuda) {
    std::fprintf(stderr, "bench rollout: measuring the matmul peak (%lld threads)\n",
                 static_cast<long long>(threads));
    const at::ScalarType type = (*model)->dtype();
    const double peak = MatmulPeakFlops(type == at::kBFloat16 ? "bfloat16"
                                        : type == at::kHalf   ? "float16"
                                                              : "float32");
    ceiling_tps = peak / (2.0 * static_cast<double>(matmul_params));
    report.SetContext("matmul_peak_gflops", peak / 1e9);
    report.SetContext("matmul_params", matmul_params);
    report.SetContext("ceiling_tokens_per_s", ceiling_tps);
  }
  report.SetContext("parameters", (*model)->NumParameters());
  report.SetContext("threads", threads);
  report.SetContext("groups", groups);
  report.SetContext("group_size", group_size);
  report.SetContext("prompt_len", prompt_len);
  report.SetContext("response_len_distribution", "lognormal(median " + std::to_string(median) +
                                                     ", sigma " + std::to_string(sigma) +
                                                     "), capped at " + std::to_string(max_new));
  report.SetContext("response_len_mean", mean_len);
  report.SetContext("response_len_median", sorted[sorted.size() / 2]);
  report.SetContext("response_len_max", sorted.back());
  report.SetContext("max_running", max_running);
  report.SetContext("block_size", block_size);
  report.SetContext("kv_blocks", config.num_blocks);
  report.SetContext("kv_cache_bytes", config.num_blocks * block_size * (*model)->KvBytesPerToken());
  std::vector<Measured> measured;
  for (const Mode& mode : modes) {
    std::fprintf(stderr, "bench rollout: %s ...\n", mode.name);
    (*model)->SetFeatureMajorDecode(!mode.aten_forward);
    auto m = RunMode(**model, config, mode, requests);
    if (!m.ok()) {
      std::fprintf(stderr, "gyre bench rollout: %s: %s\n", mode.name,
                   m.status().ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "bench rollout: %s: %lld tokens in %.2f s\n", mode.name,
                 static_cast<long long>(m->generated), m->seconds);
    measured.push_back(std::move(*m));
  }
  const Measured& base = measured[0];
  double param_bytes = 0;
  for (const auto& [name, t] : (*model)->NamedParameters()) {
    param_bytes += static_cast<double>(t.numel() * t.element_size());
  }
  const double kv_per_token = static_cast<double>((*model)->KvBytesPerToken());
  const double base_tps = static_cast<double>(base.generated) / base.seconds;
  for (size_t k = 0; k < modes.size(); ++k) {
    const Measured& m = measured[k];
    const double tps = static_cast<double>(m.generated) / m.seconds;
    // Same seeds, same lengths: the samples should agree token for token with the baseline.
    int64_t same = 0;
    for (size_t i = 0; i < m.results.size() && i < base.results.size(); ++i) {
      same += m.results[i].response.tokens == base.results[i].response.tokens;
    }
    // Least memory traffic: the weights once per engine step, and each sampled token's context
    // (prompt plus the response so far) once, in keys and values.
    double traffic = static_cast<double>(m.stats.steps) * param_bytes;
    for (const auto& r : m.results) {
      const double len = static_cast<double>(r.response.tokens.size());
      traffic += kv_per_token * (len * static_cast<double>(prompt_len) + len * (len + 1) / 2);
    }
    const nlohmann::json roofline =
        peak_gbs > 0 ? nlohmann::json(traffic / m.seconds / (peak_gbs * 1e9)) : nlohmann::json();
    const nlohmann::json ceiling =
        ceiling_tps > 0 ? nlohmann::json(tps / ceiling_tps) : nlohmann::json();
    report.AddRow({{"mode", modes[k].name},
                   {"hbm_roofline_fraction", roofline},
                   {"matmul_ceiling_fraction", ceiling},
                   {"graph_steps", m.stats.graph_steps},
                   {"tokens_per_s", tps},
                   {"batch_time_s", m.seconds},
                   {"speedup", tps / base_tps},
                   {"batch_time_speedup", base.seconds / m.seconds},
                   {"kv_util_mean", m.kv_util_mean},
                   {"kv_util_peak", m.kv_util_peak},
                   {"tail_time_share", m.tail_share},
                   {"generated_tokens", m.generated},
                   {"prefill_tokens", m.stats.prefill_tokens},
                   {"prefix_shared_tokens", m.stats.prefix_shared_tokens},
                   {"steps", m.stats.steps},
                   {"preemptions", m.stats.preemptions},
                   {"cow_copies", m.stats.cow_copies},
                   {"forward_s", m.stats.forward_seconds},
                   {"sample_s", m.stats.sample_seconds},
                   {"samples_same_as_static", same},
                   {"samples", static_cast<int64_t>(m.results.size())}});
  }
  report.PrintTable({{"mode", "mode"},
                     {"tokens_per_s", "tokens/s", 1},
                     {"speedup", "speedup", 2},
                     {"batch_time_s", "batch s", 2},
                     {"kv_util_mean", "kv util", 3},
                     {"kv_util_peak", "kv peak", 3},
                     {"tail_time_share", "tail share", 3},
                     {"prefill_tokens", "prefill tok"},
                     {"steps", "steps"},
                     {"preemptions", "preempt"},
                     {"matmul_ceiling_fraction", "of ceiling", 3},
                     {"hbm_roofline_fraction", "roofline", 3}});
  if (!report.WriteJsonIfAsked(json_path, "rollout")) return 1;
  return 0;
}

}  // namespace gyre::bench
