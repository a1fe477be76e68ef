#include "controller/trainer_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/strings.h"
#include "model/hf_config.h"

namespace gyre::controller {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

bool HasReference(const JobConfig& cfg) {
  return cfg.algorithm.kl != "none" && cfg.algorithm.kl_coef > 0;
}

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / kGiB);
  return buf;
}

// 4.92e8 -> "0.49 B", 9.9e7 -> "99.1 M".
std::string Count(double n) {
  char buf[32];
  if (n >= 1e8) {
    std::snprintf(buf, sizeof(buf), "%.2f B", n / 1e9);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f M", n / 1e6);
  }
  return buf;
}

}  // namespace

TrainerMemory EstimateTrainerMemory(double parameters, const std::string& shard, int trainers,
                                    bool reference, int tensor_parallel) {
  const double t = tensor_parallel > 1 ? tensor_parallel : 1;
  // The data-parallel ranks the layout shards over: every trainer, or with tensor parallelism
  // the trainers holding the same slice.
  const double n = std::max(1.0, std::floor((trainers > 0 ? trainers : 1) / t));
  // Bytes per parameter: float32 weights, gradients and the two AdamW moments, each whole or
  // sliced over the n ranks by the layout (sharded_adamw.h, parameter_shards.h).
  double weights = 4, gradients = 4, moments = 8, ref = reference ? 4 : 0;
  if (shard == "optimizer") {
    moments /= n;
  } else if (shard == "gradients") {
    moments /= n;
    gradients /= n;
  } else if (shard == "parameters") {
    weights /= n;
    gradients /= n;
    moments /= n;
    ref /= n;
  }
  // Tensor parallel: each trainer holds its slices (the norms, whole on every rank, are left out).
  weights /= t;
  gradients /= t;
  moments /= t;
  ref /= t;
  TrainerMemory m;
  m.parameters = parameters;
  m.state_bytes = parameters * (weights + gradients + moments + ref);
  m.startup_bytes = parameters * 4 + (shard == "parameters" ? parameters * 4 / (n * t) : 0) +
                    (t > 1 ? parameters * 4 / t : 0);
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%s parameters x %.3g bytes (float32 weights %.3g, gradients %.3g, AdamW moments "
                "%.3g",
                Count(parameters).c_str(), weights + gradients + moments + ref, weights, gradients,
                moments);
  m.breakdown = buf;
  if (reference) {
    std::snprintf(buf, sizeof(buf), ", KL reference %.3g", ref);
    m.breakdown += buf;
  }
  m.breakdown += ")";
  return m;
}

Status CheckTrainerMemory(const model::ModelSpec& spec, const JobConfig& cfg) {
  const double limit = cfg.trainer.memory_limit_gb * kGiB;
  if (limit <= 0) return Status::Ok();
  const double params = model::EstimateParameterCount(spec);
  const int n = cfg.trainer.workers;
  const TrainerMemory m = EstimateTrainerMemory(params, cfg.trainer.shard, n, HasReference(cfg),
                                                cfg.trainer.tensor_parallel);
  if (m.needed_bytes() <= limit) return Status::Ok();
  std::string message =
      "trainer.memory_limit_gb is " + Gib(limit) + ", but each trainer would need about " +
      Gib(m.needed_bytes()) + " with trainer.shard: " + cfg.trainer.shard + " over " +
      std::to_string(n) + " trainer(s)" +
      (cfg.trainer.tensor_parallel > 1
           ? " (tensor_parallel " + std::to_string(cfg.trainer.tensor_parallel) + ")"
           : std::string()) +
      ": " +
      (m.state_bytes >= m.startup_bytes
           ? "its training state between steps is " + m.breakdown
           : "it builds the whole float32 model (" + Gib(params * 4) + ") when it starts") +
      ". Nothing was started.";
  // The least number of trainers with shard: parameters that fits, if any does (start-up keeps
  // a whole model, so some models fit no layout), with the job's tensor parallelism (doubling a
  // multiple of it keeps one).
  const int tp = std::max(1, cfg.trainer.tensor_parallel);
  for (int t = std::max(tp, n); t <= 4096; t *= 2) {
    const TrainerMemory p = EstimateTrainerMemory(params, "parameters", t, HasReference(cfg), tp);
    if (p.needed_bytes() <= limit) {
      message +=
          " trainer.shard: parameters over " + std::to_string(t) + " trainers (trainer.workers" +
          (tp > 1 ? ", with trainer.tensor_parallel " + std::to_string(tp) : "") +
          ") needs about " + Gib(p.needed_bytes()) + " each; or raise trainer.memory_limit_gb.";
      return InvalidArgument(message);
    }
  }
  return InvalidArgument(message + " No layout fits: every trainer builds the whole float32 " +
                         "model (" + Gib(params * 4) + ") when it starts; raise " +
                         "trainer.memory_limit_gb.");
}

}  // namespace gyre::controller
