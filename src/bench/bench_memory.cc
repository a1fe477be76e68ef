// `gyre bench memory`: peak memory of one trainer step per configuration (padded rows, packed
// rows with materialised logits, packed rows with chunked log-probs, and those with activation
// checkpointing), each measured in its own child process so that no configuration inherits
// another's allocations. With --layouts: per-rank memory of data-parallel layouts
// (trainer.shard over N trainer processes) and tensor-parallel ones (DxT), each rank a child
// process.

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
#include "comm/gloo_communicator.h"
#include "common/clock.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "model/tensor_parallel.h"
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
    "configurations run).\n"
    "\n"
    "--layouts SHARD:N,... measures data-parallel layouts instead: trainer.shard SHARD (none,\n"
    "optimizer, gradients, parameters) over N trainer processes (a Gloo group on loopback)\n"
    "sharing one global batch of BATCH samples (each rank BATCH / N of them; the chunked\n"
    "configuration). Per rank: held = the float32 weights, AdamW moments and gradients the\n"
    "trainer keeps between steps (from its tensors); state = resident memory after the\n"
    "warm-up step less what the process held before it made the model (held, plus the\n"
    "runtime's own buffers: Gloo, threads, the allocator's cache); step peak = the peak\n"
    "resident memory of a step above that same start. Reports the largest rank's figures and\n"
    "each against the first layout's.\n"
    "SHARD:DxT is tensor parallelism: D data-parallel ranks of T tensor-parallel ranks each\n"
    "(trainer.tensor_parallel T; D x T processes; SHARD none). The T ranks of one data-parallel\n"
    "rank compute its share of the batch together, each holding a slice of every layer and of\n"
    "the vocabulary. T must divide the heads (HIDDEN / 64) and the MLP's width (--intermediate).\n"
    "Layouts with SHARD parameters or T > 1 run with the allocator setting their trainer workers\n"
    "use: blocks of 1 MiB and more mapped on their own and returned when freed.\n"
    "For example: --intermediate 704 --layouts none:1,parameters:4,none:1x2,none:1x4,none:2x2\n";

// The configurations, in the order they run by default.
const std::vector<std::string>& Configs() {
  static const auto* configs =
      new std::vector<std::string>{"padded", "unchunked", "chunked", "checkpointed"};
  return *configs;
}

struct MemorySetup {
  int64_t vocab = 32768, hidden = 256, layers = 2, batch = 32, prompt_len = 32, median = 64;
  int64_t max_len = 512, chunk = 1024, threads = 1;
  int64_t intermediate = 0;  // 0: HIDDEN * 8 / 3 (SyntheticSpec)
};

model::ModelSpec MemorySpec(const MemorySetup& s) {
  model::ModelSpec spec = SyntheticSpec(s.vocab, s.hidden, s.layers, s.prompt_len + s.max_len);
  if (s.intermediate > 0) spec.intermediate_size = s.intermediate;
  return spec;
}

// --layouts: one trainer rank's part (set on the child's command line).
struct LayoutRank {
  std::string shard;  // trainer.shard
  int rank = 0, ranks = 1;
  int tp = 1;         // tensor-parallel ranks (of the `ranks`): rank r is r % tp of r / tp
  std::string store;  // the group's store, when ranks > 1
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
  return {"--vocab",        std::to_string(s.vocab),
          "--hidden",       std::to_string(s.hidden),
          "--layers",       std::to_string(s.layers),
          "--batch",        std::to_string(s.batch),
          "--prompt-len",   std::to_string(s.prompt_len),
          "--median-len",   std::to_string(s.median),
          "--max-len",      std::to_string(s.max_len),
          "--chunk",        std::to_string(s.chunk),
          "--threads",      std::to_string(s.threads),
          "--intermediate", std::to_string(s.intermediate)};
}

// The child: builds the model and batch, takes a warm-up step, resets the peak, takes a step,
// and writes {"baseline_mib", "peak_mib", "step_s", "tokens"} to `out_path`.
// With `layout` (--layouts), the trainer is rank layout->rank of a group of layout->ranks with
// trainer.shard layout->shard, and trains on its share of the batch.
int RunChild(const MemorySetup& s, const std::string& config, const std::string& out_path,
             const LayoutRank* layout = nullptr) {
  at::set_num_threads(static_cast<int>(s.threads));
  if (layout != nullptr && (layout->shard == "parameters" || layout->tp > 1)) {
    // As a trainer worker of these layouts runs (runtime/worker.cc): tensors of 1 MiB and more
    // are mapped on their own and unmapped when freed.
    ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  }
  const double start_rss = StatusMiB("VmRSS");  // the runtime alone, before the model
  const model::ModelSpec spec = MemorySpec(s);
  trainer::PolicyTrainer t(model::Transformer::Create(spec, 7, 0.02), 1e-4, 0, 0.9, 0.999);
  std::unique_ptr<comm::Communicator> group, tp_group;
  // This rank's data-parallel rank and group size (tensor parallel: its T ranks share both).
  const int tp = layout != nullptr ? layout->tp : 1;
  const int dp_rank = layout != nullptr ? layout->rank / tp : 0;
  const int dp_ranks = layout != nullptr ? layout->ranks / tp : 1;
  if (layout != nullptr) {
    Status set = Status::Ok();
    auto join = [&](const std::string& name, int member, int size) {
      comm::GlooOptions o;
      o.store_address = layout->store;
      o.group = name;
      o.rank = member;
      o.size = size;
      return comm::CreateGlooCommunicator(o);
    };
    if (tp > 1) {
      auto g = join("bench-memory-tp" + std::to_string(dp_rank), layout->rank % tp, tp);
      set = g.status();
      if (g.ok()) {
        tp_group = std::move(*g);
        set = t.SetTensorParallel(tp_group.get(), 600);
      }
    }
    StatusOr<trainer::Shard> shard = trainer::ParseShard(layout->shard);
    if (set.ok()) set = shard.ok() ? t.SetSharding(*shard) : shard.status();
    if (set.ok() && dp_ranks > 1) {
      auto g = join(tp > 1 ? "bench-memory-dp" + std::to_string(layout->rank % tp) : "bench-memory",
                    dp_rank, dp_ranks);
      set = g.status();
      if (g.ok()) {
        group = std::move(*g);
        trainer::DataParallelOptions dp;
        dp.timeout_s = 600;
        set = t.SetDataParallel(group.get(), dp);
      }
    }
    if (!set.ok()) {
      std::fprintf(stderr, "gyre bench memory: %s\n", set.ToString().c_str());
      return 1;
    }
  }
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
  if (dp_ranks > 1) {
    // This data-parallel rank's share: every dp_ranks-th sample.
    std::vector<trainer::TrainSample> mine;
    for (size_t i = static_cast<size_t>(dp_rank); i < batch.size();
         i += static_cast<size_t>(dp_ranks)) {
      mine.push_back(batch[i]);
    }
    batch = std::move(mine);
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
  nlohmann::json j = {
      {"baseline_mib", baseline},
      {"peak_mib", peak - baseline},
      {"step_s", step_s},
      {"response_tokens", tokens},
      // --layouts: against the process before it made the model.
      {"state_mib", baseline - start_rss},
      // The trainer's own tensors kept between steps (its step metrics).
      {"held_mib", m->at("weights_mib") + m->at("optimizer_state_mib") + m->at("gradient_mib")},
      {"step_peak_mib", peak - start_rss}};
  Status w = WriteFileAtomic(out_path, j.dump() + "\n");
  if (!w.ok()) {
    std::fprintf(stderr, "gyre bench memory: %s\n", w.ToString().c_str());
    return 1;
  }
  return 0;
}

// Starts this binary as `gyre bench memory` with the setup's options and `extra`.
StatusOr<pid_t> StartChild(const MemorySetup& s, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"gyre", "bench", "memory"};
  for (const std::string& a : SetupArgs(s)) args.push_back(a);
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
      rc != 0) {
    return Internal("cannot start the child process: " + std::string(std::strerror(rc)));
  }
  return pid;
}

// Waits for child `pid` (named `what` in errors) and returns the JSON it wrote to `out_path`.
StatusOr<nlohmann::json> FinishChild(pid_t pid, const std::string& what,
                                     const std::string& out_path) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Internal("the " + what + " child process failed (see its message above)");
  }
  GYRE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(out_path));
  return nlohmann::json::parse(text);
}

// Runs this binary as a child for `config`; returns its JSON or an error.
StatusOr<nlohmann::json> Spawn(const MemorySetup& s, const std::string& config,
                               const std::string& dir) {
  const std::string out_path = dir + "/" + config + ".json";
  GYRE_ASSIGN_OR_RETURN(pid_t pid, StartChild(s, {"--child", config, "--child-out", out_path}));
  return FinishChild(pid, config, out_path);
}

// --layouts: "SHARD:N" or "SHARD:DxT", parsed and checked against the model.
struct Layout {
  std::string shard;
  int ranks = 1;  // processes (D x T)
  int tp = 1;
};
StatusOr<Layout> ParseLayout(const std::string& text, const model::ModelSpec& spec) {
  const size_t colon = text.find(':');
  Layout l;
  l.shard = text.substr(0, colon);
  if (!trainer::ParseShard(l.shard).ok() || colon == std::string::npos) {
    return InvalidArgument("--layouts: '" + text +
                           "' is not SHARD:N or SHARD:DxT with SHARD one of none, optimizer, "
                           "gradients, parameters (e.g. parameters:4, none:2x2)");
  }
  auto number = [&](const std::string& n, const char* what) -> StatusOr<int> {
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || v < 1 || v > 64) {
      return InvalidArgument("--layouts: '" + text + "': " + what +
                             " must be a whole number from 1 to 64");
    }
    return static_cast<int>(v);
  };
  const std::string rest = text.substr(colon + 1);
  const size_t x = rest.find('x');
  GYRE_ASSIGN_OR_RETURN(const int d, number(rest.substr(0, x), "N (or D)"));
  if (x != std::string::npos) {
    GYRE_ASSIGN_OR_RETURN(l.tp, number(rest.substr(x + 1), "T"));
    if (Status fits = model::CheckTensorParallel(spec, l.tp); !fits.ok()) {
      return InvalidArgument("--layouts: '" + text + "': " + fits.message() +
                             " (see --hidden and --intermediate)");
    }
  }
  l.ranks = d * l.tp;
  if (l.ranks > 64) return InvalidArgument("--layouts: '" + text + "': more than 64 processes");
  return l;
}

// One layout: N rank processes; their JSONs, rank by rank.
StatusOr<std::vector<nlohmann::json>> RunLayout(const MemorySetup& s, const std::string& shard,
                                                int ranks, int tp, const std::string& dir) {
  std::unique_ptr<comm::StoreServer> store;
  if (ranks > 1) {
    GYRE_ASSIGN_OR_RETURN(store, comm::StoreServer::Start("127.0.0.1"));
  }
  const std::string name = shard + ":" + std::to_string(ranks / tp) + "x" + std::to_string(tp);
  std::vector<std::pair<pid_t, std::string>> children;
  Status started = Status::Ok();
  for (int r = 0; r < ranks && started.ok(); ++r) {
    const std::string out = dir + "/" + shard + "-" + std::to_string(ranks) + "-" +
                            std::to_string(tp) + "-" + std::to_string(r) + ".json";
    std::vector<std::string> extra = {"--child",        "chunked",
                                      "--child-out",    out,
                                      "--child-layout", shard,
                                      "--child-rank",   std::to_string(r),
                                      "--child-ranks",  std::to_string(ranks),
                                      "--child-tp",     std::to_string(tp)};
    if (store) extra.insert(extra.end(), {"--child-store", store->address()});
    auto pid = StartChild(s, extra);
    if (pid.ok()) {
      children.emplace_back(*pid, out);
    } else {
      started = pid.status();
    }
  }
  std::vector<nlohmann::json> out;
  Status finished = started;
  for (const auto& [pid, path] : children) {  // every child is reaped
    auto j = FinishChild(pid, name, path);
    if (j.ok()) {
      out.push_back(*j);
    } else if (finished.ok()) {
      finished = j.status();
    }
  }
  GYRE_RETURN_IF_ERROR(finished);
  return out;
}

// The report of either table: rows keyed by `key`, lower is better for `metrics`, the model's
// shape in the context.
BenchReport MemoryReport(const MemorySetup& s, const std::string& key,
                         const std::vector<std::string>& metrics) {
  BenchReport report("memory");
  report.SetKeys({key});
  for (const std::string& m : metrics) report.SetMetric(m, false);
  report.SetContext("device", "cpu");
  report.SetContext("vocab", s.vocab);
  report.SetContext("hidden", s.hidden);
  report.SetContext("layers", s.layers);
  return report;
}

int RunLayouts(const MemorySetup& s, const std::vector<std::string>& layouts,
               const std::string& json_path, const std::string& dir) {
  BenchReport report = MemoryReport(s, "layout", {"state_mib", "step_peak_mib"});
  int64_t params = 0;
  for (const model::ParameterUnit& u : model::ParameterUnits(MemorySpec(s))) {
    params += u.numel();
  }
  report.SetContext("parameters", params);
  report.SetContext("global_samples", s.batch);
  report.SetContext("threads_per_rank", s.threads);
  double base_held = 0, base_state = 0, base_peak = 0;
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto layout = ParseLayout(layouts[i], MemorySpec(s));
    if (!layout.ok()) {
      std::fprintf(stderr, "gyre bench memory: %s\n", layout.status().message().c_str());
      return 2;
    }
    const std::string& shard = layout->shard;
    const int ranks = layout->ranks, tp = layout->tp;
    std::fprintf(stderr, "bench memory: layout %s over %d trainer process(es)\n",
                 layouts[i].c_str(), ranks);
    auto runs = RunLayout(s, shard, ranks, tp, dir);
    if (!runs.ok()) {
      std::fprintf(stderr, "gyre bench memory: %s\n", runs.status().ToString().c_str());
      return 1;
    }
    double held = 0, state = 0, peak = 0, step_s = 0;
    for (const auto& r : *runs) {  // the largest rank
      held = std::max(held, r["held_mib"].get<double>());
      state = std::max(state, r["state_mib"].get<double>());
      peak = std::max(peak, r["step_peak_mib"].get<double>());
      step_s = std::max(step_s, r["step_s"].get<double>());
    }
    if (i == 0) {
      base_held = held;
      base_state = state;
      base_peak = peak;
    }
    report.AddRow({{"layout", layouts[i]},
                   {"shard", shard},
                   {"ranks", ranks},
                   {"tensor_parallel", tp},
                   {"held_mib", held},
                   {"held_vs_first", held / base_held},
                   {"state_mib", state},
                   {"step_peak_mib", peak},
                   {"state_vs_first", state / base_state},
                   {"peak_vs_first", peak / base_peak},
                   {"step_s", step_s}});
  }
  report.PrintTable({{"layout", "layout"},
                     {"held_mib", "held MiB", 1},
                     {"held_vs_first", "held vs first", 3},
                     {"state_mib", "state MiB", 1},
                     {"state_vs_first", "state vs first", 3},
                     {"step_peak_mib", "step peak MiB", 1},
                     {"peak_vs_first", "peak vs first", 3},
                     {"step_s", "step s", 3}});
  return report.WriteJsonIfAsked(json_path, "memory") ? 0 : 1;
}

}  // namespace

int RunBenchMemory(const std::vector<std::string>& args) {
  MemorySetup s;
  std::string json_path, child, child_out;
  std::vector<std::string> configs = Configs();
  std::vector<std::string> layouts;
  LayoutRank child_layout;
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
  app->add_option("--intermediate", s.intermediate,
                  "the MLP's width (0: HIDDEN * 8 / 3); tensor parallelism needs one it divides")
      ->check(CLI::Range(0, 1 << 20));
  AddListOption(app.get(), "--configs", &configs, Configs(),
                "the configurations to run, in this order");
  app->add_option("--layouts", layouts,
                  "measure these layouts instead of the configurations: SHARD:N "
                  "(trainer.shard over N trainer processes) or SHARD:DxT (D data-parallel "
                  "ranks of T tensor-parallel ranks), e.g. "
                  "none:1,optimizer:4,parameters:4,none:1x4; the first is the baseline")
      ->delimiter(',')
      ->type_name("LIST");
  app->add_option("--json", json_path, "also write the figures as JSON")->type_name("FILE");
  // A child process for one configuration, started by this command with these options.
  app->add_option("--child", child)->group("");
  app->add_option("--child-out", child_out)->group("");
  app->add_option("--child-layout", child_layout.shard)->group("");
  app->add_option("--child-rank", child_layout.rank)->group("");
  app->add_option("--child-ranks", child_layout.ranks)->group("");
  app->add_option("--child-tp", child_layout.tp)->group("");
  app->add_option("--child-store", child_layout.store)->group("");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  // (Checked here: CLI11 leaves a hidden option's name out of its messages.)
  if (!child.empty() && std::find(Configs().begin(), Configs().end(), child) == Configs().end()) {
    return CommandLineError(*app, "--child: " + child + " is not a configuration");
  }
  if (!child.empty()) {
    return RunChild(s, child, child_out, child_layout.shard.empty() ? nullptr : &child_layout);
  }
  for (const std::string& l : layouts) {
    if (auto parsed = ParseLayout(l, MemorySpec(s)); !parsed.ok()) {
      return CommandLineError(*app, parsed.status().message());
    }
  }

  char tmpl[] = "/tmp/gyre_bench_memory_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "gyre bench memory: cannot create a temporary directory\n");
    return 1;
  }
  const std::string dir = tmpl;
  if (!layouts.empty()) {
    const int rc = RunLayouts(s, layouts, json_path, dir);
    (void)RemoveTree(dir);
    return rc;
  }
  BenchReport report = MemoryReport(s, "config", {"peak_mib", "step_s"});
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
