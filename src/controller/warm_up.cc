#include "controller/warm_up.h"

#include <algorithm>
#include <cstdio>

#include "common/clock.h"

namespace gyre::controller {

Status WarmUp(JobState* job) {
  const TrainerSection& trainer = job->cfg.trainer;
  const int steps = trainer.warmup_sft_steps;
  if (steps <= 0) return Status::Ok();
  const auto t0 = SteadyClock::now();
  constexpr size_t kWindow = 20;
  const double stop_at = trainer.warmup_stop_token_accuracy;
  std::vector<double> recent_acc;
  for (int step = 1; step <= steps; ++step) {
    GYRE_RETURN_IF_ERROR(job->cluster->pool()->CheckHealth());
    std::vector<v1::Sample> batch;
    for (int i = 0; i < trainer.warmup_sft_batch; ++i) {
      GYRE_ASSIGN_OR_RETURN(v1::Sample s, job->prompts->SftSample(job->problems->Next()));
      batch.push_back(std::move(s));
    }
    TrainOptions sft;
    sft.objective = v1::OBJECTIVE_SFT;
    sft.lr = trainer.warmup_sft_lr;
    GYRE_ASSIGN_OR_RETURN(auto m, Train(job, batch, sft));
    nlohmann::json j = {{"phase", "warmup"}, {"step", step}, {"policy_version", job->version}};
    for (const auto& [k, v] : m) j[k] = v;
    WriteMetrics(job, j);
    recent_acc.push_back(m["token_accuracy"]);
    if (recent_acc.size() > kWindow) recent_acc.erase(recent_acc.begin());
    double mean_acc = 0;
    for (double a : recent_acc) mean_acc += a / static_cast<double>(recent_acc.size());
    const bool reached = stop_at > 0 && recent_acc.size() == kWindow && mean_acc >= stop_at;
    char line[160];
    std::snprintf(line, sizeof(line), "warmup %4d/%d  loss %.4f  token-acc %.3f  %.1f s", step,
                  steps, m["loss"], m["token_accuracy"], SecondsSince(t0));
    if (step % std::max(1, steps / 5) == 0 || step == steps || reached) {
      job->progress->Print(line);
    } else {
      job->progress->StepLine("", line);  // live mode only: the line's summary
    }
    if (reached) {
      std::snprintf(line, sizeof(line),
                    "warmup stops at step %d: token accuracy %.3f (mean of %zu steps) >= %.3f",
                    step, mean_acc, kWindow, stop_at);
      job->progress->Print(line);
      break;
    }
  }
  return Publish(job);
}

}  // namespace gyre::controller
