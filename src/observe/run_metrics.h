#pragma once
// RunMetrics: where a job's metric records go (docs/observability.md). Every record is one line
// of metrics.jsonl; its numbers are also TensorBoard scalars (RUN_DIR/tensorboard/<phase>/) and,
// when the job serves /metrics, Prometheus gauges and counters.
//
// TensorBoard layout: one TensorBoard "run" per phase, so each has its own step axis: `grpo`
// (GRPO steps, with the held-out evals at the step they ran after; eval before RL is step 0) and
// `warmup` (supervised warm-up steps). Tags are the record's keys, nested objects joined with
// '/': grpo/mean_reward is tag "mean_reward" in run "grpo", staleness {"0": 12} is
// "staleness/0", eval accuracy is "eval/accuracy".
//
// Thread contract: not thread-safe; the job's thread writes.

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gyre/status.h"
#include "observe/event_file.h"

namespace gyre::observe {

class MetricsEndpoint;

// The TensorBoard run, step and scalars of one metrics record; an empty run means the record has
// no scalars for TensorBoard (summary, resume markers). Strings are left out, booleans are 0/1.
struct RecordScalars {
  std::string run;
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> scalars;
};
RecordScalars ScalarsOf(const nlohmann::json& record);

class RunMetrics {
 public:
  // A new run: `jsonl_path` is truncated. `tensorboard_dir` empty: no event files.
  static StatusOr<std::unique_ptr<RunMetrics>> Create(const std::string& jsonl_path,
                                                      const std::string& tensorboard_dir);
  // A resumed run: metrics.jsonl already holds the records up to the checkpoint, `resume_step`
  // the first GRPO step this process runs; TensorBoard is told to drop what it has from there on.
  static StatusOr<std::unique_ptr<RunMetrics>> Resume(const std::string& jsonl_path,
                                                      const std::string& tensorboard_dir,
                                                      int64_t resume_step);

  // Appends `record` to metrics.jsonl and passes its numbers on; flushes all of them.
  Status Write(const nlohmann::json& record);
  // From now on records also update `endpoint`'s metrics (not owned; outlives this object or
  // is detached with nullptr).
  void SetEndpoint(MetricsEndpoint* endpoint) { endpoint_ = endpoint; }

 private:
  RunMetrics() = default;
  StatusOr<EventFileWriter*> Writer(const std::string& run);
  void Export(const nlohmann::json& record);

  std::ofstream jsonl_;
  std::string jsonl_path_;
  std::string tensorboard_dir_;
  int64_t resume_step_ = -1;  // >= 0: each new grpo event file starts with a session START
  std::map<std::string, EventFileWriter> writers_;
  MetricsEndpoint* endpoint_ = nullptr;
};

}  // namespace gyre::observe
