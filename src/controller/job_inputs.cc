#include "controller/job_inputs.h"

#include <utility>

#include "common/logging.h"
#include "controller/trainer_memory.h"
#include "model/hf_config.h"
#include "text/episode_chat.h"
#include "text/tokenizer.h"

namespace gyre::controller {

Status CheckJobModel(const JobConfig& cfg) {
  model::ModelSpec spec;
  if (!cfg.model.path.empty()) {
    // model.max_seq_len limits every job; with a model directory it must fit the model too.
    GYRE_ASSIGN_OR_RETURN(spec, model::LoadHfConfig(cfg.model.path));
    GYRE_RETURN_IF_ERROR(
        model::EffectiveMaxSeqLen(spec, cfg.model.max_seq_len, cfg.model.path + "/config.json")
            .status());
  } else {
    // The built-in model's vocabulary is the character tokenizer's (as the workers build it).
    spec = model::SpecFromConfig(cfg.model, text::CharTokenizer().vocab_size());
  }
  // trainer.tensor_parallel: the model's heads, MLP and vocabulary must split over the ranks.
  if (Status splits = model::CheckTensorParallel(spec, cfg.trainer.tensor_parallel); !splits.ok()) {
    return splits.WithContext("trainer.tensor_parallel");
  }
  if (Status splits = model::CheckTensorParallel(spec, cfg.rollout.tensor_parallel); !splits.ok()) {
    return splits.WithContext("rollout.tensor_parallel");
  }
  // trainer.memory_limit_gb: a job that cannot fit stops here, before any process starts.
  return CheckTrainerMemory(spec, cfg);
}

Status LoadJobInputs(std::shared_ptr<RewardFn> custom_reward, JobState* job) {
  const JobConfig& cfg = job->cfg;
  GYRE_ASSIGN_OR_RETURN(job->reward, ChooseReward(cfg.reward, std::move(custom_reward)));
  if (cfg.data.chat_template != "none" && cfg.model.path.empty()) {
    return InvalidArgument("data.chat_template: " + cfg.data.chat_template +
                           " needs a model.path whose tokenizer has chat tokens");
  }
  GYRE_RETURN_IF_ERROR(CheckJobModel(cfg));
  GYRE_ASSIGN_OR_RETURN(job->tokenizer, text::MakeTextTokenizer(cfg.model));
  GYRE_ASSIGN_OR_RETURN(ProblemSource src, ProblemSource::Create(cfg.data, cfg.job.seed));
  job->problems = std::make_unique<ProblemSource>(std::move(src));
  job->prompts = std::make_unique<PromptEncoder>(cfg, job->tokenizer.get());
  if (job->prompts->episodes()) {
    // The template is loaded here too (the rollout workers render with it): a bad one fails the
    // job before any process starts, and the warm-up renders its demonstrations with it.
    auto chat =
        text::EpisodeChat::Load(cfg.env.chat_template, cfg.model.path, cfg.env.template_kwargs);
    if (!chat.ok()) return chat.status().WithContext("env.chat_template");
    job->prompts->SetEpisodeChat(chat->AsFunction());
  }
  return job->prompts->CheckAll(*job->problems);
}

Status StartJobServices(JobState* job) {
  const std::string logs = job->run_dir + "/logs";
  if (job->reward == nullptr) {  // reward.type: service
    GYRE_ASSIGN_OR_RETURN(job->reward, StartRewardService(job->cfg.reward, logs + "/reward.log"));
  }
  if (job->prompts->episodes()) {
    GYRE_ASSIGN_OR_RETURN(job->env_service, StartEnvService(job->cfg.env, logs + "/env.log"));
    GYRE_LOG_INFO("environment server '{}' at {}", job->env_service->description().name(),
                  job->env_service->address());
  }
  return Status::Ok();
}

void MakeScorer(JobState* job) {
  const JobConfig& cfg = job->cfg;
  job->scorer =
      std::make_unique<StepScorer>(cfg.algorithm, cfg.rollout.group_size, job->tokenizer.get(),
                                   job->reward.get(), cfg.rollout.max_new_tokens);
  job->scorer->SetFailurePolicy(cfg.reward.on_failure, cfg.reward.retries);
  if (job->env_service) job->scorer->SetEpisodes(cfg.reward.type == "env");
  job->policy = algorithm::MakeSamplingPolicy(cfg, job->reward->correct_threshold());
}

}  // namespace gyre::controller
