#pragma once
// `gyre bench SUBCOMMAND`: every benchmark prints a readable table on stdout and, with
// `--json FILE`, writes the same figures as JSON in one schema (docs/benchmarks.md):
//   {"schema": "gyre-bench/1", "benchmark": NAME, "gyre_version", "created", "host": {...},
//    "options": [argv], "keys": [row identity fields], "metrics": {field: "higher"|"lower"},
//    "context": {...}, "results": [{column: value, ...}, ...]}
// Rows hold Gyre's figures and their same-run baselines side by side. `gyre bench compare`
// matches rows of two such files by their keys and reports the metrics that got worse.
// Each subcommand lives in its own bench_*.cc and fills a BenchReport.

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "gyre/status.h"
#include "model/model_spec.h"
#include "sim/cost_model.h"

namespace gyre::bench {

// One table column: the JSON key of the row field, the header shown, and the number of
// decimals used for a floating-point value (JSON keeps full precision).
struct BenchColumn {
  std::string key;
  std::string header;
  int decimals = 3;
};

class BenchReport {
 public:
  explicit BenchReport(std::string benchmark);

  // Run-wide facts (device, model, sizes): printed above the table and kept in "context".
  void SetContext(const std::string& key, nlohmann::json value);
  // A row: an object whose keys include the columns' keys (extra keys go to JSON only).
  void AddRow(nlohmann::json row);
  // The fields that identify a row (e.g. kernel and batch), for comparisons between runs.
  void SetKeys(std::vector<std::string> keys);
  // A figure that comparisons check, and which way is better.
  void SetMetric(const std::string& field, bool higher_is_better);

  const nlohmann::json& rows() const { return rows_; }
  nlohmann::json ToJson() const;

  // Aligned text table of `columns`; a missing field prints "-". The columns are also kept in
  // the JSON ("columns"), so `gyre bench docs` renders the same table from the file.
  void PrintTable(const std::vector<BenchColumn>& columns, std::FILE* out = stdout);
  // Writes ToJson() to `path` (atomically: temporary file, then rename).
  Status WriteJson(const std::string& path) const;
  // --json FILE of `gyre bench NAME`: nothing for an empty path; otherwise WriteJson, and on
  // failure one line "gyre bench NAME: why" on stderr and false (the command then exits 1).
  bool WriteJsonIfAsked(const std::string& path, const char* name) const;

 private:
  std::string benchmark_;
  std::vector<std::string> keys_;
  nlohmann::json metrics_ = nlohmann::json::object();
  nlohmann::json context_ = nlohmann::json::object();
  nlohmann::json rows_ = nlohmann::json::array();
  std::vector<BenchColumn> columns_;
};

// The median of `values` (the mean of the middle two for an even count); `values` not empty.
double Median(std::vector<double> values);

// A table cell: integers as they are, floats with `decimals` decimals, booleans yes/no, null
// and non-finite numbers "-".
std::string FormatBenchCell(const nlohmann::json& value, int decimals);

// Command-line helpers shared by the subcommands, whose options are declared on a CLI::App
// (common/command_line.h). Each validator refuses a value in CLI11's words, naming the option:
// "--reps: Value 0 is not a positive number".
//
// Positive: a number above 0 (an integer option's type refuses fractions).
CLI::Validator Positive();
// RealRange: a number in [lo, hi]; CLI::Range for floating point, except that NaN is refused.
CLI::Validator RealRange(double lo, double hi);
// HiddenSize: the hidden size of a synthetic model (SyntheticSpec): up to 64 (one head) or a
// multiple of 64 (heads of 64).
CLI::Validator HiddenSize();
// Declares `name`, a comma-separated list of items from `allowed`, none twice, stored in
// *items (whose value is the default). Repeating the option adds to the list.
CLI::Option* AddListOption(CLI::App* app, const std::string& name, std::vector<std::string>* items,
                           const std::vector<std::string>& allowed, const std::string& help);
// Declares the cost model's options (sim::kCostOptions), stored in *cost (whose values are the
// defaults), in the help section `group`.
void AddCostOptions(CLI::App* app, sim::CostModel* cost, const std::string& group);

// The random models of the training benchmarks: a Llama-layout decoder with heads of 64 (one
// head when hidden <= 64), as many key/value heads, and an MLP of 8/3 x hidden.
model::ModelSpec SyntheticSpec(int64_t vocab, int64_t hidden, int64_t layers, int64_t max_seq_len);

// The command line of the running subcommand ("gyre bench NAME ..."), kept in the JSON.
void SetBenchCommandLine(std::vector<std::string> args);
// This machine, as the JSON records it: host name, CPU model and count, memory, SIMD flags.
nlohmann::json BenchHost();

// gyre bench compare A.json B.json [--threshold R]: 0 when no metric of B is worse than A's by
// more than R (relative, default 0.10), 1 when some are, 2 on bad input.
int RunBenchCompare(const std::vector<std::string>& args);

// gyre bench docs [--check] FILE.md...: regenerates the tables between
// <!-- gyre-bench: RESULT.json --> and <!-- /gyre-bench --> from the result files
// (bench_docs.cc). 0 done / up to date, 1 stale blocks with --check, 2 bad input.
int RunBenchDocs(const std::vector<std::string>& args);

// The subcommands; each takes the arguments after its name and returns an exit status
// (0 ok, 1 failure, 2 usage error).
int RunBenchKernels(const std::vector<std::string>& args);

// The best FLOP/s of square matmuls (512, 1024, 2048) in `dtype` ("float32", "bfloat16" or
// "float16") on the CPU, on this process's intra-op threads: the compute ceiling the CPU
// benchmarks report fractions of.
double MatmulPeakFlops(const std::string& dtype);

// Peak memory bandwidth of the current CUDA device in GB/s (memory clock x bus width x 2);
// 0 on the CPU or in a build without CUDA (bench_kernels.cc).
double PeakBandwidthGBs(bool cuda);

// gyre bench weight-sync: weight transports against one unbucketed gRPC message
// (bench_weight_sync.cc).
int RunBenchWeightSync(const std::vector<std::string>& args);

// gyre bench rollout: continuous batching vs static batching on a long-tail workload.
int RunBenchRollout(const std::vector<std::string>& args);

// gyre bench dp-step: data-parallel step time, gradient all-reduce overlapped with backward vs
// after it (bench_dp_step.cc).
int RunBenchDpStep(const std::vector<std::string>& args);
// gyre bench train: the trainer step with sequence packing vs padded rows (bench_train.cc).
int RunBenchTrain(const std::vector<std::string>& args);
// gyre bench memory: peak memory of a trainer step per configuration (bench_memory.cc).
int RunBenchMemory(const std::vector<std::string>& args);
int RunBenchE2e(const std::vector<std::string>& args);
// `gyre sim-workers` (sim_workers.cc): simulated workers for `bench e2e --simulate`.
int RunSimWorkers(const std::vector<std::string>& args);

// gyre bench SUBCOMMAND ...: dispatch and help.
int RunBench(const std::vector<std::string>& args);

}  // namespace gyre::bench
