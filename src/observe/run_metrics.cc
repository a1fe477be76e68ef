#include "observe/run_metrics.h"

#include <cmath>

#include "common/file_util.h"
#include "observe/metrics_endpoint.h"

namespace gyre::observe {

namespace {

void Flatten(const std::string& prefix, const nlohmann::json& v,
             std::vector<std::pair<std::string, double>>* out) {
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) Flatten(prefix.empty() ? k : prefix + "/" + k, x, out);
  } else if (v.is_number()) {
    out->emplace_back(prefix, v.get<double>());
  } else if (v.is_boolean()) {
    out->emplace_back(prefix, v.get<bool>() ? 1.0 : 0.0);
  }
}

}  // namespace

RecordScalars ScalarsOf(const nlohmann::json& record) {
  RecordScalars r;
  const auto phase_it = record.find("phase");
  const std::string phase =
      phase_it != record.end() && phase_it->is_string() ? phase_it->get<std::string>() : "";
  if (phase != "grpo" && phase != "warmup" && phase != "eval") return r;
  r.run = phase == "warmup" ? "warmup" : "grpo";
  const auto step_it = record.find("step");
  if (step_it != record.end() && step_it->is_number()) {
    const double d = step_it->get<double>();
    r.step = std::isfinite(d) && std::abs(d) < 9e18 ? static_cast<int64_t>(d) : 0;
  }
  const std::string prefix = phase == "eval" ? "eval" : "";
  for (const auto& [k, v] : record.items()) {
    if (k == "phase" || k == "step" || k == "tag") continue;
    Flatten(prefix.empty() ? k : prefix + "/" + k, v, &r.scalars);
  }
  return r;
}

StatusOr<std::unique_ptr<RunMetrics>> RunMetrics::Create(const std::string& jsonl_path,
                                                         const std::string& tensorboard_dir) {
  std::unique_ptr<RunMetrics> m(new RunMetrics());
  m->jsonl_path_ = jsonl_path;
  m->tensorboard_dir_ = tensorboard_dir;
  if (!tensorboard_dir.empty() && PathExists(tensorboard_dir)) {
    // A new run replaces an earlier one's record, event files included.
    GYRE_RETURN_IF_ERROR(RemoveTree(tensorboard_dir));
  }
  m->jsonl_.open(jsonl_path, std::ios::trunc);
  if (!m->jsonl_) return Unavailable("cannot write " + jsonl_path);
  return m;
}

StatusOr<std::unique_ptr<RunMetrics>> RunMetrics::Resume(const std::string& jsonl_path,
                                                         const std::string& tensorboard_dir,
                                                         int64_t resume_step) {
  std::unique_ptr<RunMetrics> m(new RunMetrics());
  m->jsonl_path_ = jsonl_path;
  m->tensorboard_dir_ = tensorboard_dir;
  m->resume_step_ = resume_step;
  m->jsonl_.open(jsonl_path, std::ios::app);
  if (!m->jsonl_) return Unavailable("cannot write " + jsonl_path);
  if (!tensorboard_dir.empty()) GYRE_RETURN_IF_ERROR(m->Writer("grpo").status());
  return m;
}

StatusOr<EventFileWriter*> RunMetrics::Writer(const std::string& run) {
  auto it = writers_.find(run);
  if (it != writers_.end()) return &it->second;
  GYRE_ASSIGN_OR_RETURN(EventFileWriter w, EventFileWriter::Open(tensorboard_dir_ + "/" + run));
  if (run == "grpo" && resume_step_ >= 0) {
    GYRE_RETURN_IF_ERROR(w.AddSessionStart(
        resume_step_, "resumed: steps from " + std::to_string(resume_step_) + " run again"));
  }
  return &writers_.emplace(run, std::move(w)).first->second;
}

Status RunMetrics::Write(const nlohmann::json& record) {
  jsonl_ << record.dump() << "\n";
  jsonl_.flush();
  if (!jsonl_) return Unavailable("cannot write " + jsonl_path_);
  if (!tensorboard_dir_.empty()) {
    RecordScalars s = ScalarsOf(record);
    if (!s.run.empty() && !s.scalars.empty()) {
      GYRE_ASSIGN_OR_RETURN(EventFileWriter * w, Writer(s.run));
      GYRE_RETURN_IF_ERROR(w->AddScalars(s.step, s.scalars));
      GYRE_RETURN_IF_ERROR(w->Flush());
    }
  }
  if (endpoint_ != nullptr) Export(record);
  return Status::Ok();
}

void RunMetrics::Export(const nlohmann::json& record) {
  MetricsEndpoint& ep = *endpoint_;
  const std::string phase = record.value("phase", "");
  auto num = [&](const char* key) { return record.value(key, 0.0); };
  auto has = [&](const char* key) { return record.contains(key) && record[key].is_number(); };
  if (phase == "grpo") {
    ep.Set("gyre_step", "The last finished GRPO step.", num("step"));
    ep.Set("gyre_policy_version", "The trainer's policy version.", num("policy_version"));
    ep.Set("gyre_mean_reward", "Mean reward of the last step's scored samples.",
           num("mean_reward"));
    ep.Set("gyre_accuracy", "Fraction of the last step's samples judged correct.", num("accuracy"));
    ep.Set("gyre_tokens_per_second", "Generated tokens per second in the last step.",
           num("tokens_per_s"));
    ep.Set("gyre_step_seconds", "Wall time of the last GRPO step.", num("step_time_s"));
    ep.Set("gyre_phase_seconds", "Wall time of each phase of the last GRPO step.",
           num("generate_s"), {{"phase", "generate"}});
    ep.Set("gyre_phase_seconds", "", num("train_s"), {{"phase", "train"}});
    ep.Set("gyre_weight_sync_seconds", "Seconds the last step spent publishing weights.",
           num("publish_s"));
    ep.Add("gyre_generated_tokens_total", "Tokens generated by GRPO steps.",
           num("generated_tokens"));
    ep.Add("gyre_trained_samples_total", "Samples trained on by GRPO steps.", num("samples"));
    ep.Add("gyre_reward_errors_total", "Samples whose reward could not be computed.",
           num("reward_errors"));
    ep.Add("gyre_stale_dropped_total", "Samples dropped as too stale.", num("stale_dropped"));
    if (has("loss")) ep.Set("gyre_loss", "The last step's training loss.", num("loss"));
    if (has("rollout_idle_fraction")) {
      ep.Set("gyre_rollout_idle_fraction",
             "Mean idle fraction of the rollout workers within generation.",
             num("rollout_idle_fraction"));
    }
    for (const char* q : {"queued_groups", "in_flight_groups", "ready_groups"}) {
      if (has(q)) {
        std::string name = q;
        name.resize(name.size() - 7);  // the queue's name without "_groups"
        ep.Set("gyre_queue_groups", "Prompt groups in each asynchronous queue.", num(q),
               {{"queue", name}});
      }
    }
  } else if (phase == "eval") {
    ep.Set("gyre_eval_accuracy", "Held-out greedy accuracy of the last evaluation.",
           num("accuracy"));
  } else if (phase == "warmup") {
    ep.Set("gyre_warmup_step", "The last supervised warm-up step.", num("step"));
    if (has("loss")) ep.Set("gyre_warmup_loss", "The last warm-up step's loss.", num("loss"));
  }
}

}  // namespace gyre::observe
