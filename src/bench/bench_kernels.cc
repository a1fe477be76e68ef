// gyre bench kernels: Gyre's sampling, advantage, policy-loss and token log-prob paths against
// the obvious libtorch implementation of each, in the same run, timed by Google Benchmark.
//
// On a CUDA device the Gyre side is the CUDA kernels (through src/ops, as the engine and the
// trainer call them) and times are CUDA-event times; on a CPU-only host it is the CPU references
// and times are wall-clock. Either way the baseline runs on the same device, on the same inputs.

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "kernels/device_info.h"
#include "kernels/reference/advantages_ref.h"
#include "ops/ops.h"

#if GYRE_BENCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "kernels/advantages.cuh"
#endif

namespace gyre::bench {
namespace {

constexpr char kKernelsDetails[] =
    "The Gyre side is the CUDA kernels on a GPU and the CPU references otherwise; the\n"
    "baseline runs on the same device, on the same inputs:\n"
    "  sampling        top-p 0.9 at T 0.8     vs softmax + sort + cumsum + multinomial\n"
    "  advantages      GRPO over groups of 8, broadcast to tokens   vs torch mean/std ops\n"
    "  policy_loss     clipped loss, stats and d loss / d logp      vs torch ops + autograd\n"
    "  token_logprobs  fused log-softmax + gather, forward+backward vs log_softmax + gather\n"
    "Reported: time per call, speedup (baseline time / gyre time), achieved GB/s of the\n"
    "minimum memory traffic, and its fraction of the device's peak bandwidth (GPU).\n"
    "On a GPU the peak memory of token_logprobs at --tokens rows is also reported.\n";

struct KernelsOptions {
  std::string device = "auto";
  std::vector<int64_t> batches;
  int64_t vocab = 151936;
  int64_t tokens = 8192;
  int64_t response_len = 1024;
  std::string dtype;
  double min_time = 0.2;
  std::vector<std::string> only;
  std::string json;
};

// Collects mean seconds per iteration by benchmark name.
class CollectingReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) {
        errors[run.run_name.function_name] = run.error_message;
        continue;
      }
      if (run.iterations > 0) {
        seconds[run.run_name.function_name] =
            run.real_accumulated_time / static_cast<double>(run.iterations);
      }
      std::fprintf(stderr, "  measured %s\n", run.run_name.function_name.c_str());
    }
  }
  std::map<std::string, double> seconds;
  std::map<std::string, std::string> errors;
};

struct Case {
  std::string kernel;
  int64_t batch;
  double bytes;  // minimum memory traffic of one call
  std::function<void()> gyre;
  std::function<void()> baseline;
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gyre bench kernels: %s\n", msg.c_str());
  return 2;
}

// --- the cases ----------------------------------------------------------------------------------

std::vector<kernels::SamplingRowParams> TopPParams(int64_t B, uint64_t step) {
  std::vector<kernels::SamplingRowParams> p(B);
  for (int64_t r = 0; r < B; ++r) p[r] = {0.8f, 0, 0.9f, 0.f, static_cast<uint64_t>(r), step};
  return p;
}

Case SamplingCase(const at::Tensor& logits) {
  const int64_t B = logits.size(0);
  auto params = TopPParams(B, 0);
  Case c{"sampling", B, static_cast<double>(logits.numel() * logits.element_size()), nullptr,
         nullptr};
  c.gyre = [logits, params] {
    auto r = ops::SampleRows(logits, params);
    if (!r.ok()) throw std::runtime_error(r.status().message());
    benchmark::DoNotOptimize(r->tokens.data());
  };
  c.baseline = [logits] {
    at::Tensor probs = at::softmax(logits.to(at::kFloat) / 0.8, -1);
    auto [sorted, index] = probs.sort(-1, /*descending=*/true);
    at::Tensor before = sorted.cumsum(-1) - sorted;
    at::Tensor kept = sorted.masked_fill(before > 0.9, 0.0);
    at::Tensor tokens = index.gather(-1, at::multinomial(kept, 1)).cpu();
    benchmark::DoNotOptimize(tokens.data_ptr());
  };
  return c;
}

Case AdvantagesCase(int64_t B, int64_t L, const at::TensorOptions& opt) {
  constexpr int64_t kGroup = 8;
  const int64_t S = B * kGroup;
  at::Tensor rewards = (at::rand({S}) > 0.5).to(at::kFloat).to(opt.device());
  at::Tensor mask = (at::rand({S, L}) > 0.1).to(at::kFloat).to(opt.device());
  std::vector<int32_t> offsets(B + 1);
  for (int64_t g = 0; g <= B; ++g) offsets[g] = static_cast<int32_t>(g * kGroup);
  at::Tensor d_offsets = at::from_blob(offsets.data(), {B + 1}, at::kInt).clone().to(opt.device());
  at::Tensor adv = at::empty({S}, opt.dtype(at::kFloat));
  at::Tensor out = at::empty({S, L}, opt.dtype(at::kFloat));
  Case c{"advantages", B, static_cast<double>(S * 4 * 2 + S * L * 4 * 2), nullptr, nullptr};
  c.gyre = [=] {
#if GYRE_BENCH_CUDA
    if (rewards.is_cuda()) {
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
      kernels::LaunchGroupAdvantages(rewards.data_ptr<float>(), d_offsets.data_ptr<int32_t>(),
                                     static_cast<int32_t>(B), kernels::AdvantageKind::kGrpo, 1e-6f,
                                     adv.data_ptr<float>(), nullptr, static_cast<int32_t>(S),
                                     stream);
      kernels::LaunchBroadcastToTokens(adv.data_ptr<float>(), mask.data_ptr<float>(), S, L,
                                       out.data_ptr<float>(), stream);
      return;
    }
#endif
    kernels::GroupAdvantagesRef(rewards.data_ptr<float>(), d_offsets.data_ptr<int32_t>(),
                                static_cast<int32_t>(B), kernels::AdvantageKind::kGrpo, 1e-6f,
                                adv.data_ptr<float>(), nullptr);
    kernels::BroadcastToTokensRef(adv.data_ptr<float>(), mask.data_ptr<float>(), S, L,
                                  out.data_ptr<float>());
  };
  c.baseline = [=] {
    at::Tensor r = rewards.view({B, kGroup});
    at::Tensor a = (r - r.mean(1, true)) / (r.std(1, true, true) + 1e-6);
    at::Tensor o = a.view({S, 1}) * mask;
    benchmark::DoNotOptimize(o.data_ptr());
  };
  return c;
}

Case PolicyLossCase(int64_t B, int64_t L, const at::TensorOptions& opt) {
  const int64_t S = B;
  at::Tensor logp = (at::randn({S, L}) * 0.1 - 1).to(opt.device());
  at::Tensor old = (logp + at::randn({S, L}, opt) * 0.05).contiguous();
  at::Tensor adv = at::randn({S, L}, opt);
  at::Tensor mask = (at::rand({S, L}, opt) > 0.1).to(at::kFloat);
  kernels::PolicyLossParams params;
  Case c{"policy_loss", B, static_cast<double>(S * L * 4 * 5), nullptr, nullptr};
  c.gyre = [=] {
    auto r = ops::PolicyLoss(logp, old, at::Tensor(), at::Tensor(), adv, mask, params);
    if (!r.ok()) throw std::runtime_error(r.status().message());
    benchmark::DoNotOptimize(r->stats.loss);
  };
  c.baseline = [=] {
    at::Tensor lp = logp.detach().requires_grad_(true);
    at::Tensor ratio = at::exp(lp - old);
    at::Tensor clipped = at::clamp(ratio, 1 - params.clip_eps_low, 1 + params.clip_eps_high);
    at::Tensor pg = at::maximum(-adv * ratio, -adv * clipped);
    pg = at::where(adv < 0, at::minimum(pg, -adv * params.dual_clip_c), pg);
    at::Tensor loss = (pg * mask).sum() / mask.sum().clamp_min(1);
    loss.backward();
    at::Tensor clip_frac = (((ratio - clipped).abs() > 0).to(at::kFloat) * mask).sum();
    benchmark::DoNotOptimize(clip_frac.item<float>() + loss.item<float>());
  };
  return c;
}

Case TokenLogprobsCase(const at::Tensor& logits) {
  const int64_t N = logits.size(0), V = logits.size(1);
  at::Tensor targets = at::randint(0, V, {N}, logits.options().dtype(at::kLong));
  at::Tensor g = at::ones({N}, logits.options().dtype(at::kFloat));
  Case c{"token_logprobs", N, 3.0 * static_cast<double>(logits.numel() * logits.element_size()),
         nullptr, nullptr};
  c.gyre = [=] {
    at::Tensor l = logits.detach().requires_grad_(true);
    ops::TokenLogprobs(l, targets, 1.0).backward(g);
    benchmark::DoNotOptimize(l.grad().data_ptr());
  };
  c.baseline = [=] {
    at::Tensor l = logits.detach().requires_grad_(true);
    at::log_softmax(l.to(at::kFloat), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).backward(g);
    benchmark::DoNotOptimize(l.grad().data_ptr());
  };
  return c;
}

// --- running ------------------------------------------------------------------------------------

void Register(const std::string& name, std::function<void()> fn, bool cuda, double min_time) {
  auto* b = benchmark::RegisterBenchmark(name.c_str(), [fn, cuda](benchmark::State& state) {
    try {
      fn();  // warm-up: allocator, kernels' first launch
#if GYRE_BENCH_CUDA
      if (cuda) {
        cudaEvent_t start, stop;
        cudaEventCreate(&start);
        cudaEventCreate(&stop);
        const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
        for (auto _ : state) {
          cudaEventRecord(start, stream);
          fn();
          cudaEventRecord(stop, stream);
          cudaEventSynchronize(stop);
          float ms = 0;
          cudaEventElapsedTime(&ms, start, stop);
          state.SetIterationTime(ms / 1e3);
        }
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        return;
      }
#endif
      for (auto _ : state) fn();
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  });
  b->MinTime(min_time)->Unit(benchmark::kMicrosecond);
  if (cuda) b->UseManualTime();
}

#if GYRE_BENCH_CUDA
// Peak bytes the caching allocator held above what was allocated before `fn` ran.
double PeakExtraBytes(const std::function<void()>& fn) {
  cudaDeviceSynchronize();
  const int device = c10::cuda::current_device();
  auto* alloc = c10::cuda::CUDACachingAllocator::get();
  const auto before = alloc->getDeviceStats(device).allocated_bytes[0].current;
  alloc->resetPeakStats(device);
  fn();
  cudaDeviceSynchronize();
  const auto peak = alloc->getDeviceStats(device).allocated_bytes[0].peak;
  return static_cast<double>(peak - before);
}
#endif

bool Wanted(const KernelsOptions& o, const std::string& kernel) {
  if (o.only.empty()) return true;
  for (const auto& k : o.only) {
    if (k == kernel) return true;
  }
  return false;
}

}  // namespace

int RunBenchKernels(const std::vector<std::string>& args) {
  KernelsOptions o;
  auto app =
      NewCommand("gyre bench kernels",
                 "Times Gyre's kernel paths against their libtorch baselines in the same run.",
                 kKernelsDetails);
  app->add_option("--device", o.device, "where to run (auto: cuda when a device is usable)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  app->add_option("--batch", o.batches,
                  "rows per call (default: 1,64,256,1024 on a GPU, 1,64 on a CPU)")
      ->delimiter(',')
      ->check(Positive())
      ->default_str("");
  app->add_option("--vocab", o.vocab, "vocabulary size (151936: Qwen2.5)")->check(Positive());
  app->add_option("--tokens", o.tokens, "rows for the token_logprobs peak-memory figure (GPU)")
      ->check(Positive());
  app->add_option("--response-len", o.response_len,
                  "tokens per sequence for advantages and policy_loss")
      ->check(Positive());
  app->add_option("--dtype", o.dtype, "logits dtype (default: bf16 on a GPU, fp32 on a CPU)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app->add_option("--min-time", o.min_time, "minimum seconds per measurement")->check(Positive());
  AddListOption(app.get(), "--only", &o.only,
                {"sampling", "advantages", "policy_loss", "token_logprobs"},
                "run only these kernels, comma-separated (default: all)");
  app->add_option("--json", o.json, "also write the figures as JSON")->type_name("FILE");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const bool have_gpu = kernels::CudaDeviceCount() > 0;
  bool cuda;
  if (o.device == "auto") {
    cuda = have_gpu;
  } else if (o.device == "cuda") {
    if (!have_gpu) return Fail("--device cuda: no usable CUDA device on this host");
    cuda = true;
  } else {
    cuda = false;
  }
#if !GYRE_BENCH_CUDA
  if (cuda) {
    if (o.device == "cuda") return Fail("this build has no CUDA kernels or no CUDA libtorch");
    cuda = false;
  }
#endif
  if (o.batches.empty()) {
    o.batches = cuda ? std::vector<int64_t>{1, 64, 256, 1024} : std::vector<int64_t>{1, 64};
  }
  if (o.dtype.empty()) o.dtype = cuda ? "bf16" : "fp32";

  const at::TensorOptions opt =
      at::TensorOptions().device(cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));
  const at::ScalarType logits_dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const double peak_gbs = PeakBandwidthGBs(cuda);
  at::manual_seed(0);

  std::vector<Case> cases;
  for (int64_t B : o.batches) {
    std::fprintf(stderr, "preparing inputs for batch %lld\n", static_cast<long long>(B));
    at::Tensor logits;
    if (Wanted(o, "sampling") || Wanted(o, "token_logprobs")) {
      logits = (at::randn({B, o.vocab}, opt) * 3).to(logits_dtype);
    }
    if (Wanted(o, "sampling")) cases.push_back(SamplingCase(logits));
    if (Wanted(o, "advantages")) cases.push_back(AdvantagesCase(B, o.response_len, opt));
    if (Wanted(o, "policy_loss")) cases.push_back(PolicyLossCase(B, o.response_len, opt));
    if (Wanted(o, "token_logprobs")) cases.push_back(TokenLogprobsCase(logits));
  }
  for (const Case& c : cases) {
    const std::string key = c.kernel + "/B=" + std::to_string(c.batch);
    Register(key + "/gyre", c.gyre, cuda, o.min_time);
    Register(key + "/baseline", c.baseline, cuda, o.min_time);
  }
  std::fprintf(stderr, "running %zu measurements on %s\n", cases.size() * 2, cuda ? "cuda" : "cpu");
  int argc = 1;
  char arg0[] = "gyre";
  char* argv[] = {arg0, nullptr};
  benchmark::Initialize(&argc, argv);
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::ClearRegisteredBenchmarks();

  BenchReport report("kernels");
  report.SetKeys({"kernel", "batch"});
  report.SetMetric("gyre_us", false);
  report.SetMetric("speedup", true);
  report.SetContext("device", cuda ? "cuda" : "cpu");
  if (cuda) report.SetContext("peak_bandwidth_gbs", peak_gbs);
  report.SetContext("vocab", o.vocab);
  report.SetContext("logits_dtype", o.dtype);
  report.SetContext("response_len", o.response_len);
  report.SetContext("gyre_side", cuda ? "CUDA kernels via src/ops" : "CPU references via src/ops");
  int failures = 0;
  for (const Case& c : cases) {
    const std::string key = c.kernel + "/B=" + std::to_string(c.batch);
    for (const char* side : {"/gyre", "/baseline"}) {
      auto e = reporter.errors.find(key + side);
      if (e != reporter.errors.end()) {
        std::fprintf(stderr, "gyre bench kernels: %s%s failed: %s\n", key.c_str(), side,
                     e->second.c_str());
        ++failures;
      }
    }
    auto g = reporter.seconds.find(key + "/gyre");
    auto b = reporter.seconds.find(key + "/baseline");
    if (g == reporter.seconds.end() || b == reporter.seconds.end()) continue;
    nlohmann::json row = {{"kernel", c.kernel},
                          {"batch", c.batch},
                          {"gyre_us", g->second * 1e6},
                          {"baseline_us", b->second * 1e6},
                          {"speedup", b->second / g->second},
                          {"gbs", c.bytes / g->second / 1e9}};
    if (peak_gbs > 0) row["bandwidth_fraction"] = c.bytes / g->second / 1e9 / peak_gbs;
    report.AddRow(row);
  }
#if GYRE_BENCH_CUDA
  if (cuda && Wanted(o, "token_logprobs")) {
    std::fprintf(stderr, "measuring token_logprobs peak memory at %lld rows\n",
                 static_cast<long long>(o.tokens));
    at::Tensor logits = (at::randn({o.tokens, o.vocab}, opt) * 3).to(logits_dtype);
    Case c = TokenLogprobsCase(logits);
    const double gyre_peak = PeakExtraBytes(c.gyre);
    const double base_peak = PeakExtraBytes(c.baseline);
    report.AddRow({{"kernel", "token_logprobs_peak_memory"},
                   {"batch", o.tokens},
                   {"gyre_peak_mb", gyre_peak / 1e6},
                   {"baseline_peak_mb", base_peak / 1e6},
                   {"memory_ratio", gyre_peak / base_peak}});
  }
#endif
  std::vector<BenchColumn> columns = {{"kernel", "kernel", 0},   {"batch", "B", 0},
                                      {"gyre_us", "gyre us", 1}, {"baseline_us", "baseline us", 1},
                                      {"speedup", "speedup", 2}, {"gbs", "GB/s", 2}};
  if (peak_gbs > 0) columns.push_back({"bandwidth_fraction", "of peak", 2});
  if (cuda) {
    columns.push_back({"gyre_peak_mb", "gyre peak MB", 0});
    columns.push_back({"baseline_peak_mb", "baseline peak MB", 0});
    columns.push_back({"memory_ratio", "memory ratio", 3});
  }
  report.PrintTable(columns);
  if (!o.json.empty()) {
    if (Status s = report.WriteJson(o.json); !s.ok()) {
      std::fprintf(stderr, "gyre bench kernels: %s\n", s.message().c_str());
      return 1;
    }
  }
  return failures == 0 ? 0 : 1;
}

double PeakBandwidthGBs(bool cuda) {
#if GYRE_BENCH_CUDA
  if (cuda) {
    int device = 0, clock_khz = 0, bus_bits = 0;
    cudaGetDevice(&device);
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess &&
        clock_khz > 0 && bus_bits > 0) {
      return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;  // double data rate
    }
  }
#endif
  (void)cuda;
  return 0;
}

}  // namespace gyre::bench
