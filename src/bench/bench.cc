#include "bench/bench.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>
#include <utility>

#include "common/file_util.h"

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

namespace {

constexpr char kBenchUsage[] =
    "usage: gyre bench SUBCOMMAND [options] [--json FILE]\n"
    "\n"
    "Benchmarks print a table on stdout; --json FILE also writes the figures as JSON.\n"
    "Every figure is measured in the same run as its baseline, and `speedup` is\n"
    "baseline time / gyre time.\n"
    "\n"
    "subcommands:\n"
    "  kernels       sampling, advantages, policy loss and token log-probs against their\n"
    "                libtorch baselines (CUDA kernels on a GPU, CPU references otherwise)\n"
    "  weight-sync   weight publishing per transport and bucket size vs one gRPC message\n"
    "  rollout       continuous batching + prefix sharing vs static batching (long-tail lengths)\n"
    "  train         the trainer's step with sequence packing vs padded rows, on equal-length\n"
    "                and long-tail batches, with the achieved fraction of the matmul peak\n"
    "  memory        peak memory of a trainer step: padded, packed with materialised logits,\n"
    "                packed with log-probs in chunks of tokens\n"
    "  dp-step       data-parallel step time, gradient all-reduce overlapped with backward vs\n"
    "                after it\n"
    "  e2e           whole GRPO jobs, synchronous vs asynchronous (k = 1, 2, 4), with real or\n"
    "                simulated workers (--simulate: many nodes on one machine)\n"
    "  compare A.json B.json [--threshold R]\n"
    "                the metrics of B (a later run) that are worse than A's by more than R\n"
    "                (relative, default 0.10); exit status 1 when there are any\n"
    "  docs [--check] FILE.md...\n"
    "                regenerates the benchmark tables in Markdown files from result files\n"
    "                (the reference results are in bench/baselines/)\n"
    "\n"
    "`gyre bench SUBCOMMAND --help` lists a subcommand's options.\n";

}  // namespace

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

int RunBench(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kBenchUsage, stderr);
    return 2;
  }
  const std::string& sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::fputs(kBenchUsage, stdout);
    return 0;
  }
  SetBenchCommandLine(std::vector<std::string>(args.begin(), args.end()));
  if (sub == "compare") return RunBenchCompare(rest);
  if (sub == "docs") return RunBenchDocs(rest);
  if (sub == "kernels") return RunBenchKernels(rest);
  if (sub == "weight-sync") return RunBenchWeightSync(rest);
  if (sub == "rollout") return RunBenchRollout(rest);
  if (sub == "dp-step") return RunBenchDpStep(rest);
  if (sub == "train") return RunBenchTrain(rest);
  if (sub == "memory") return RunBenchMemory(rest);
  if (sub == "e2e") return RunBenchE2e(rest);
  std::fprintf(stderr, "gyre bench: unknown subcommand '%s'\n\n%s", sub.c_str(), kBenchUsage);
  return 2;
}

bool ParseInt(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& s, double lo, double hi, double* out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int BenchOptionValue(const char* bench, const char* usage, const std::vector<std::string>& args,
                     size_t* i) {
  const std::string& a = args[*i];
  if (a == "--help" || a == "-h") {
    std::fputs(usage, stdout);
    return 0;
  }
  if (*i + 1 >= args.size()) {
    std::fprintf(stderr, "gyre bench %s: unknown argument or missing value: '%s'\n\n%s", bench,
                 a.c_str(), usage);
    return 2;
  }
  ++*i;
  return -1;
}

}  // namespace gyre::bench
