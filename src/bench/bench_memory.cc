// `gyre bench memory`: peak memory of one trainer step per configuration (padded rows, packed
// rows with materialised logits, packed rows with chunked log-probs, and those with activation
// checkpointing), each measured in its own child process so that no configuration inherits
// another's allocations.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/clock.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "model/transformer.h"
#include "trainer/policy_trainer.h"

extern char** environ;

namespace gyre::bench {

namespace {

constexpr char kMemoryDetails[] =
    "A trainer step is PolicyTrainer::Step, policy gradient: forward, loss, backward, AdamW, on\n"
    "a random model with a large vocabulary. The configurations:\n"
    "  padded     one right-padded row per sample, logits at every position\n"
    "             (trainer.sequence_packing: false)\n"
    "  unchunked  packed rows, logits of the response tokens materialised [tokens, V]\n"
    "             (trainer.logprob_chunk_tokens: 0): the baseline\n"
    "  chunked    packed rows, log-probs CHUNK tokens at a time (the default)\n"
    "  checkpointed  chunked, and each decoder layer recomputed in the backward\n"
    "             (trainer.activation_checkpointing: true)\n"
    "Each configuration runs in a child process: one warm-up step (AdamW allocates its\n"
    "moments), then freed memory is returned to the system (malloc_trim) and the peak resident\n"
    "memory is reset (/proc/self/clear_refs), and one more step is taken. Reports the step's\n"
    "peak above the memory held before it (model, optimizer state, batch), that memory, the\n"
    "step time, and the peak against the unchunked baseline's (when it is among the\n"
    "configurations run).\n";

// The configurations, in the order they run by default.
const std::vector<std::string>& Configs() {
  static const auto* configs =
      new std::vector<std::string>{"padded", "unchunked", "chunked", "checkpointed"};
  return *configs;
}

struct MemorySetup {
  int64_t vocab = 32768, hidden = 256, layers = 2, batch = 32, prompt_len = 32, median = 64;
  int64_t max_len = 512, chunk = 1024, threads = 1;
};

// A field of /proc/self/status in MiB ("VmRSS", "VmHWM"), or -1.
double StatusMiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream rest(line.substr(field.size() + 1));
      double kb = 0;
      rest >> kb;
      return kb / 1024.0;
    }
  }
  return -1;
}

std::vector<std::string> SetupArgs(const MemorySetup& s) {
  return {"--vocab",      std::to_string(s.vocab),      "--hidden",     std::to_string(s.hidden),
          "--layers",     std::to_string(s.layers),     "--batch",      std::to_string(s.batch),
          "--prompt-len", std::to_string(s.prompt_len), "--median-len", std::to_string(s.median),
          "--max-len",    std::to_string(s.max_len),    "--chunk",      std::to_string(s.chunk),
          "--threads",    std::to_string(s.threads)};
}

// The child: builds the model and batch, takes a warm-up step, resets the peak, takes a step,
// and writes {"baseline_mib", "peak_mib", "step_s", "tokens"} to `out_path`.
int RunChild(const MemorySetup& s, const std::string& config, const std::string& out_path) {
  at::set_num_threads(static_cast<int>(s.threads));
  const model::ModelSpec spec =
      SyntheticSpec(s.vocab, s.hidden, s.layers, s.prompt_len + s.max_len);
  trainer::PolicyTrainer t(model::Transformer::Create(spec, 7, 0.02), 1e-4, 0, 0.9, 0.999);
  t.SetSequencePacking(config != "padded");
  const bool checkpointed = config == "checkpointed";
  t.SetLogprobChunkTokens(config == "chunked" || checkpointed ? s.chunk : 0);
  t.SetActivationCheckpointing(checkpointed);
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> length(std::log(static_cast<double>(s.median)), 1.0);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(s.vocab - 1));
  std::vector<trainer::TrainSample> batch(static_cast<size_t>(s.batch));
  int64_t tokens = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = std::clamp<int64_t>(std::llround(length(rng)), 1, s.max_len);
    for (int64_t k = 0; k < s.prompt_len; ++k) batch[i].prompt.push_back(token(rng));
    for (int64_t k = 0; k < n; ++k) batch[i].response.push_back(token(rng));
    batch[i].advantage = i % 2 == 0 ? 1.0f : -1.0f;
    tokens += n;
  }
  trainer::TrainOptions opts;
  opts.micro_batch_size = s.batch;
  auto warm = t.Step(batch, trainer::Objective::kPolicyGradient, 1e-4, opts);
  if (!warm.ok()) {
    std::fprintf(stderr, "gyre bench memory: %s\n", warm.status().ToString().c_str());
    return 1;
  }
  // Freed memory of the warm-up step goes back to the system, so that the step below has to
  // take what it needs again and its peak shows.
  ::malloc_trim(0);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) {
      std::fprintf(stderr,
                   "gyre bench memory: cannot reset the peak resident memory "
                   "(/proc/self/clear_refs); this needs Linux 4.0 or later\n");
      return 1;
    }
  }
  const double baseline = StatusMiB("VmRSS");
  const auto t0 = std::chrono::steady_clock::now();
  auto m = t.Step(batch, trainer::Objective::kPolicyGradient, 1e-4, opts);
  const double step_s = SecondsSince(t0);
  if (!m.ok()) {
    std::fprintf(stderr, "gyre bench memory: %s\n", m.status().ToString().c_str());
    return 1;
  }
  const double peak = StatusMiB("VmHWM");
  nlohmann::json j = {{"baseline_mib", baseline},
                      {"peak_mib", peak - baseline},
                      {"step_s", step_s},
                      {"response_tokens", tokens}};
  Status w = WriteFileAtomic(out_path, j.dump() + "\n");
  if (!w.ok()) {
    std::fprintf(stderr, "gyre bench memory: %s\n", w.ToString().c_str());
    return 1;
  }
  return 0;
}

// Runs this binary as a child for `config`; returns its JSON or an error.
StatusOr<nlohmann::json> Spawn(const MemorySetup& s, const std::string& config,
                               const std::string& dir) {
  const std::string out_path = dir + "/" + config + ".json";
  std::vector<std::string> args = {"gyre", "bench", "memory"};
  for (const std::string& a : SetupArgs(s)) args.push_back(a);
  args.insert(args.end(), {"--child", config, "--child-out", out_path});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
      rc != 0) {
    return Internal("cannot start the child process: " + std::string(std::strerror(rc)));
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Internal("the " + config + " child process failed (see its message above)");
  }
  GYRE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(out_path));
  return nlohmann::json::parse(text);
}

}  // namespace

int RunBenchMemory(const std::vector<std::string>& args) {
  MemorySetup s;
  std::string json_path, child, child_out;
  std::vector<std::string> configs = Configs();
  auto app = NewCommand("gyre bench memory",
                        "Peak memory of one trainer step per configuration, each in its own "
                        "child process.",
                        kMemoryDetails);
  app->add_option("--vocab", s.vocab, "vocabulary size")->check(CLI::Range(2, 1 << 22));
  app->add_option("--hidden", s.hidden, "hidden size, up to 64 or a multiple of 64 (heads of 64)")
      ->check(CLI::Range(1, 1 << 16))
      ->check(HiddenSize());
  app->add_option("--layers", s.layers, "decoder layers")->check(CLI::Range(1, 1024));
  app->add_option("--batch", s.batch, "samples per step")->check(CLI::Range(1, 1 << 16));
  app->add_option("--prompt-len", s.prompt_len, "prompt tokens")->check(CLI::Range(1, 1 << 16));
  app->add_option("--median-len", s.median, "median response length (lognormal, sigma 1)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--max-len", s.max_len, "response length cap")->check(CLI::Range(1, 1 << 16));
  app->add_option("--chunk", s.chunk, "tokens per log-prob chunk (chunked, checkpointed)")
      ->check(CLI::Range(1, 1 << 24));
  app->add_option("--threads", s.threads, "intra-op CPU threads")->check(CLI::Range(1, 1024));
  AddListOption(app.get(), "--configs", &configs, Configs(),
                "the configurations to run, in this order");
  app->add_option("--json", json_path, "also write the figures as JSON")->type_name("FILE");
  // A child process for one configuration, started by this command with these options.
  app->add_option("--child", child)->group("");
  app->add_option("--child-out", child_out)->group("");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  // (Checked here: CLI11 leaves a hidden option's name out of its messages.)
  if (!child.empty() && std::find(Configs().begin(), Configs().end(), child) == Configs().end()) {
    return CommandLineError(*app, "--child: " + child + " is not a configuration");
  }
  if (!child.empty()) return RunChild(s, child, child_out);

  char tmpl[] = "/tmp/gyre_bench_memory_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "gyre bench memory: cannot create a temporary directory\n");
    return 1;
  }
  const std::string dir = tmpl;
  BenchReport report("memory");
  report.SetKeys({"config"});
  report.SetMetric("peak_mib", false);
  report.SetMetric("step_s", false);
  report.SetContext("device", "cpu");
  report.SetContext("vocab", s.vocab);
  report.SetContext("hidden", s.hidden);
  report.SetContext("layers", s.layers);
  report.SetContext("samples", s.batch);
  report.SetContext("prompt_len", s.prompt_len);
  report.SetContext("chunk_tokens", s.chunk);
  report.SetContext("threads", s.threads);
  std::vector<nlohmann::json> rows;
  for (const std::string& config : configs) {
    std::fprintf(stderr, "bench memory: %s\n", config.c_str());
    auto r = Spawn(s, config, dir);
    if (!r.ok()) {
      std::fprintf(stderr, "gyre bench memory: %s\n", r.status().ToString().c_str());
      (void)RemoveTree(dir);
      return 1;
    }
    (*r)["config"] = config;
    rows.push_back(*r);
  }
  (void)RemoveTree(dir);
  double base = 0;  // the unchunked baseline's peak, when it ran
  for (const auto& r : rows) {
    if (r["config"] == "unchunked") base = r["peak_mib"].get<double>();
  }
  report.SetContext("response_tokens", rows[0]["response_tokens"]);
  for (auto& r : rows) {
    if (base > 0) r["vs_unchunked"] = r["peak_mib"].get<double>() / base;
    report.AddRow(r);
  }
  std::vector<BenchColumn> columns = {{"config", "config"}, {"peak_mib", "step peak MiB", 1}};
  if (base > 0) columns.push_back({"vs_unchunked", "vs unchunked", 3});
  columns.push_back({"baseline_mib", "held before MiB", 1});
  columns.push_back({"step_s", "step s", 3});
  report.PrintTable(columns);
  if (!report.WriteJsonIfAsked(json_path, "memory")) return 1;
  return 0;
}

}  // namespace gyre::bench
