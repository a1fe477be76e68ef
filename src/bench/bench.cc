#include "bench/bench.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>
#include <utility>

#include "common/file_util.h"
#include "common/strings.h"

namespace gyre::bench {

double MatmulPeakFlops(const std::string& dtype_name) {
  const at::ScalarType dtype = dtype_name == "bfloat16"  ? at::kBFloat16
                               : dtype_name == "float16" ? at::kHalf
                                                         : at::kFloat;
  double best = 0;
  for (int64_t n : {512, 1024, 2048}) {
    const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
    at::mm(a, b);  // warm-up
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor c = at::mm(a, b);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
    }
  }
  return best;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string FormatBenchCell(const nlohmann::json& v, int decimals) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, d);
    return buf;
  }
  return v.dump();
}

model::ModelSpec SyntheticSpec(int64_t vocab, int64_t hidden, int64_t layers, int64_t max_seq_len) {
  model::ModelSpec spec;
  spec.vocab_size = vocab;
  spec.hidden_size = hidden;
  spec.num_layers = layers;
  spec.num_heads = std::max<int64_t>(1, hidden / 64);
  spec.num_kv_heads = spec.num_heads;
  spec.head_dim = hidden / spec.num_heads;
  spec.intermediate_size = hidden * 8 / 3;
  spec.max_seq_len = max_seq_len;
  return spec;
}

BenchReport::BenchReport(std::string benchmark) : benchmark_(std::move(benchmark)) {}

void BenchReport::SetContext(const std::string& key, nlohmann::json value) {
  context_[key] = std::move(value);
}

void BenchReport::AddRow(nlohmann::json row) { rows_.push_back(std::move(row)); }

void BenchReport::SetKeys(std::vector<std::string> keys) { keys_ = std::move(keys); }

void BenchReport::SetMetric(const std::string& field, bool higher_is_better) {
  metrics_[field] = higher_is_better ? "higher" : "lower";
}

namespace {
std::vector<std::string>& CommandLine() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void SetBenchCommandLine(std::vector<std::string> args) { CommandLine() = std::move(args); }

nlohmann::json BenchHost() {
  nlohmann::json h = nlohmann::json::object();
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  h["hostname"] = name;
  std::string model, flags;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + value() + " ";
  }
  h["cpu"] = model;
  h["cpus"] = std::thread::hardware_concurrency();
  nlohmann::json simd = nlohmann::json::array();
  for (const char* f : {"avx2", "avx512f", "avx512_bf16", "amx_tile"}) {
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) simd.push_back(f);
  }
  h["simd"] = simd;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal:", 0) == 0) {
      h["memory_gib"] = std::round(std::atof(line.c_str() + 9) / (1 << 20) * 10) / 10;
    }
  }
  return h;
}

nlohmann::json BenchReport::ToJson() const {
  nlohmann::json columns = nlohmann::json::array();
  for (const auto& c : columns_) {
    columns.push_back({{"key", c.key}, {"header", c.header}, {"decimals", c.decimals}});
  }
  char created[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {{"schema", "gyre-bench/1"},
          {"benchmark", benchmark_},
          {"gyre_version", GYRE_VERSION},
          {"created", created},
          {"host", BenchHost()},
          {"options", CommandLine()},
          {"keys", keys_},
          {"metrics", metrics_},
          {"context", context_},
          {"columns", columns},
          {"results", rows_}};
}

void BenchReport::PrintTable(const std::vector<BenchColumn>& columns, std::FILE* out) {
  columns_ = columns;
  std::fprintf(out, "%s\n", benchmark_.c_str());
  for (const auto& [key, value] : context_.items()) {
    std::fprintf(out, "  %s: %s\n", key.c_str(), FormatBenchCell(value, 3).c_str());
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) width[c] = columns[c].header.size();
  for (const auto& row : rows_) {
    std::vector<std::string> line;
    for (size_t c = 0; c < columns.size(); ++c) {
      const auto it = row.find(columns[c].key);
      line.push_back(it == row.end() ? "-" : FormatBenchCell(*it, columns[c].decimals));
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    std::string s;
    for (size_t c = 0; c < line.size(); ++c) {
      if (c > 0) s += "  ";
      // Text left-aligned in the first column, everything else right-aligned.
      const std::string pad(width[c] - line[c].size(), ' ');
      s += c == 0 ? line[c] + pad : pad + line[c];
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::fprintf(out, "%s\n", s.c_str());
  };
  std::vector<std::string> header;
  for (const auto& col : columns) header.push_back(col.header);
  print_line(header);
  std::vector<std::string> rule;
  for (size_t c = 0; c < columns.size(); ++c) rule.push_back(std::string(width[c], '-'));
  print_line(rule);
  for (const auto& line : cells) print_line(line);
  std::fflush(out);
}

Status BenchReport::WriteJson(const std::string& path) const {
  return WriteFileAtomic(path, ToJson().dump(2) + "\n");
}

bool BenchReport::WriteJsonIfAsked(const std::string& path, const char* name) const {
  if (path.empty()) return true;
  const Status written = WriteJson(path);
  if (!written.ok()) {
    std::fprintf(stderr, "gyre bench %s: %s\n", name, written.ToString().c_str());
  }
  return written.ok();
}

namespace {

// `text` as a finite number.
bool ParseFinite(const std::string& text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return !text.empty() && *end == '\0' && std::isfinite(*out);
}

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (ParseFinite(text, &v) && v > 0) return "";
        return "Value " + text + " is not a positive number";
      },
      "POSITIVE");
}

CLI::Validator RealRange(double lo, double hi) {
  const std::string range = FormatNumber(lo) + " to " + FormatNumber(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double v = 0;
        if (ParseFinite(text, &v) && v >= lo && v <= hi) return "";
        return "Value " + text + " not in range " + range;
      },
      "FLOAT in [" + FormatNumber(lo) + " - " + FormatNumber(hi) + "]");
}

CLI::Validator HiddenSize() {
  // No description: the option's help says it.
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (ParseFinite(text, &v) && (v <= 64 || std::fmod(v, 64) == 0)) return "";
        return "Value " + text + " is neither up to 64 nor a multiple of 64";
      },
      "");
}

CLI::Option* AddListOption(CLI::App* app, const std::string& name, std::vector<std::string>* items,
                           const std::vector<std::string>& allowed, const std::string& help) {
  std::string defaults;
  for (const std::string& item : *items) defaults += (defaults.empty() ? "" : ",") + item;
  return app
      ->add_option_function<std::vector<std::string>>(
          name,
          [name, items](const std::vector<std::string>& given) {
            for (auto it = given.begin(); it != given.end(); ++it) {
              if (std::find(given.begin(), it, *it) != it) {
                throw CLI::ValidationError(name, *it + " is listed twice");
              }
            }
            *items = given;
          },
          help)
      ->delimiter(',')
      ->check(CLI::IsMember(allowed))
      ->default_str(defaults);
}

void AddCostOptions(CLI::App* app, sim::CostModel* cost, const std::string& group) {
  for (const sim::CostOption& o : sim::kCostOptions) {
    CLI::Option* option =
        o.field == nullptr
            ? app->add_option(o.flag, cost->max_running, o.help)
                  ->check(CLI::Range(static_cast<int64_t>(o.lo), static_cast<int64_t>(o.hi)))
            : app->add_option(o.flag, cost->*o.field, o.help)->check(RealRange(o.lo, o.hi));
    option->group(group);
  }
}

namespace {

// The subcommands of `gyre bench`, in the order its help lists them.
struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

constexpr Subcommand kSubcommands[] = {
    {"kernels", "sampling, advantages, policy loss, token log-probs vs libtorch", RunBenchKernels},
    {"weight-sync", "weight publishing per transport and bucket size vs one gRPC message",
     RunBenchWeightSync},
    {"rollout", "continuous batching + prefix sharing vs static batching", RunBenchRollout},
    {"train", "the trainer's step, sequence packing vs padded rows", RunBenchTrain},
    {"memory", "peak memory of a trainer step: padded, packed, chunked log-probs", RunBenchMemory},
    {"dp-step", "data-parallel step, all-reduce overlapped with backward vs after it",
     RunBenchDpStep},
    {"e2e", "whole GRPO jobs, synchronous vs asynchronous, real or simulated workers", RunBenchE2e},
    {"compare", "the metrics of a later result worse than a reference's (exit 1)", RunBenchCompare},
    {"docs", "regenerates the benchmark tables of Markdown files from results", RunBenchDocs},
};

constexpr char kBenchDetails[] =
    "Benchmarks print a table on stdout; --json FILE also writes the figures as JSON\n"
    "(docs/benchmarks.md). Every figure is measured in the same run as its baseline, and\n"
    "`speedup` is baseline time / gyre time. The reference results are in bench/baselines/.\n"
    "`gyre bench SUBCOMMAND --help` lists a subcommand's options.\n";

// The subcommand called `name`, or null.
const Subcommand* FindSubcommand(const std::string& name) {
  for (const Subcommand& sub : kSubcommands) {
    if (name == sub.name) return &sub;
  }
  return nullptr;
}

}  // namespace

int RunBench(const std::vector<std::string>& args) {
  auto app = NewCommand("gyre bench", "Benchmarks against same-run baselines.", kBenchDetails);
  app->require_subcommand(1);
  for (const Subcommand& sub : kSubcommands) {
    // Named here for the help and the dispatch; each subcommand parses its own arguments.
    CLI::App* listed = app->add_subcommand(sub.name, sub.summary);
    listed->prefix_command();
    listed->set_help_flag();
  }
  if (!args.empty() && args[0] == "help") return ParseCommandLine(*app, {"--help"});
  if (!args.empty() && !StartsWith(args[0], "-") && FindSubcommand(args[0]) == nullptr) {
    return CommandLineError(*app, "unknown subcommand '" + args[0] + "'");
  }
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const CLI::App* chosen = app->get_subcommands().front();
  SetBenchCommandLine(args);
  return FindSubcommand(chosen->get_name())->run(chosen->remaining());
}

}  // namespace gyre::bench
