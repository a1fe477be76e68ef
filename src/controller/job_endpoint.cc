#include "controller/job_endpoint.h"

#include <map>
#include <utility>

#include "common/logging.h"

namespace gyre::controller {

namespace {

const char* WorkerState(const WorkerInfo& w) {
  return !w.alive ? "dead" : w.ready ? "ready" : "starting";
}

}  // namespace

Status StartJobEndpoint(JobState* job) {
  ControllerService* service = job->cluster->service();
  auto health = [job, service]() -> nlohmann::json {
    nlohmann::json workers = nlohmann::json::object();
    bool all_alive = true;
    for (const WorkerInfo& w : service->Snapshot()) {
      workers[w.id] = WorkerState(w);
      all_alive = all_alive && w.alive;
    }
    return {{"status", all_alive ? "ok" : "degraded"}, {"job", job->cfg.job.name},
            {"step", job->last_step.load()},           {"steps", job->cfg.trainer.steps},
            {"slurm_job_id", job->slurm_job_id},       {"workers", workers}};
  };
  GYRE_ASSIGN_OR_RETURN(job->endpoint,
                        observe::MetricsEndpoint::Start(job->cfg.metrics.endpoint, health));
  job->endpoint->SetRefresh([job, service](observe::MetricsEndpoint* ep) {
    std::map<std::pair<std::string, std::string>, int> states;
    for (const char* role : {"rollout", "trainer"}) {
      for (const char* state : {"starting", "ready", "dead"}) states[{role, state}] = 0;
    }
    for (const WorkerInfo& w : service->Snapshot()) {
      const char* role = w.role == v1::WORKER_ROLE_TRAINER ? "trainer" : "rollout";
      ++states[{role, WorkerState(w)}];
    }
    for (const auto& [key, n] : states) {
      ep->Set("gyre_workers", "Workers of each role in each state.", n,
              {{"role", key.first}, {"state", key.second}});
    }
    ep->Set("gyre_steps_planned", "trainer.steps of the job.", job->cfg.trainer.steps);
  });
  if (job->metrics) job->metrics->SetEndpoint(job->endpoint.get());
  GYRE_LOG_INFO("serving /metrics and /health on http://{}", job->endpoint->address());
  return Status::Ok();
}

}  // namespace gyre::controller
