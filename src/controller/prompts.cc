#include "controller/prompts.h"

#include <nlohmann/json.hpp>
#include <string>

#include "common/hash.h"
#include "text/chat_template.h"

namespace gyre::controller {

StatusOr<std::vector<int32_t>> PromptEncoder::Encode(const Problem& problem) const {
  std::string prompt = problem.prompt;
  if (cfg_.data.chat_template != "none") {
    GYRE_ASSIGN_OR_RETURN(auto format, text::ParseChatFormat(cfg_.data.chat_template));
    text::ChatOptions opts;
    opts.enable_thinking = false;
    std::vector<text::ChatMessage> messages = {{"user", problem.prompt}};
    if (problem.is_messages) {
      GYRE_ASSIGN_OR_RETURN(messages, text::ParseMessagesJson(problem.prompt));
    }
    GYRE_ASSIGN_OR_RETURN(prompt, text::RenderChat(format, messages, opts));
  } else if (problem.is_messages) {
    return InvalidArgument("a prompt given as a list of messages needs data.chat_template");
  }
  GYRE_ASSIGN_OR_RETURN(auto ids, tokenizer_->Encode(prompt));
  if (auto bos = tokenizer_->bos_id()) ids.insert(ids.begin(), *bos);
  return ids;
}

Status PromptEncoder::CheckAll(const ProblemSource& problems) const {
  // An episode's prompt is the environment's opening, known only once it has reset; the engine
  // refuses one that does not fit, and the episode fails with that reason.
  if (episodes()) return Status::Ok();
  auto check = [&](const Problem& p, const char* kind) -> Status {
    const std::string where =
        p.where.empty() ? std::string(kind) + " prompt '" + p.prompt + "'" : p.where;
    auto ids = Encode(p);
    if (!ids.ok()) return InvalidArgument(where + ": " + ids.status().message());
    const int64_t need = static_cast<int64_t>(ids->size()) + cfg_.rollout.max_new_tokens;
    if (need > cfg_.model.max_seq_len) {
      return InvalidArgument(where + ": the prompt's " + std::to_string(ids->size()) +
                             " tokens plus rollout.max_new_tokens " +
                             std::to_string(cfg_.rollout.max_new_tokens) +
                             " exceed model.max_seq_len " + std::to_string(cfg_.model.max_seq_len));
    }
    return Status::Ok();
  };
  for (const auto& p : problems.eval_set()) GYRE_RETURN_IF_ERROR(check(p, "eval"));
  for (const auto& p : problems.LongestPrompts())
    GYRE_RETURN_IF_ERROR(check(p, "longest training"));
  for (const auto& p : problems.train_set()) GYRE_RETURN_IF_ERROR(check(p, "training"));
  return Status::Ok();
}

std::vector<NewSample> QueuedSamples(const std::vector<GroupJob>& jobs) {
  std::vector<NewSample> queued;
  for (const GroupJob& j : jobs) {
    for (int i = 0; i < j.group.n(); ++i) {
      queued.push_back({j.group.first_sample_id() + static_cast<uint64_t>(i), j.group.group_id(),
                        j.problem.where.empty() ? j.problem.prompt : j.problem.where});
    }
  }
  return queued;
}

StatusOr<GroupJob> PromptEncoder::Group(const Problem& problem, uint64_t group_id, int n,
                                        uint64_t first_sample_id, uint64_t seed) const {
  GroupJob j;
  j.problem = problem;
  j.group.set_group_id(group_id);
  if (episodes()) {
    j.group.set_task_json(TaskJson(problem));
  } else {
    GYRE_ASSIGN_OR_RETURN(auto ids, Encode(problem));
    j.group.mutable_prompt_ids()->Add(ids.begin(), ids.end());
  }
  j.group.set_n(n);
  j.group.set_first_sample_id(first_sample_id);
  j.group.set_seed(seed);
  return j;
}

StatusOr<GroupJob> PromptEncoder::TrainingGroup(const Problem& problem, uint64_t group_id) const {
  return TrainingGroup(problem, group_id, cfg_.rollout.group_size);
}

StatusOr<GroupJob> PromptEncoder::TrainingGroup(const Problem& problem, uint64_t group_id,
                                                int n) const {
  const int g = cfg_.rollout.group_size;
  if (n < 1 || n > g) {
    return InvalidArgument("a training group holds 1 to rollout.group_size (" + std::to_string(g) +
                           ") samples, not " + std::to_string(n));
  }
  return Group(problem, group_id, n, group_id * static_cast<uint64_t>(g),
               SplitMix64(cfg_.job.seed ^ SplitMix64(group_id)));
}

StatusOr<GroupJob> PromptEncoder::EvalGroup(const Problem& problem, uint64_t group_id) const {
  return Group(problem, group_id, 1, 0, 0);
}

StatusOr<v1::Sample> PromptEncoder::DemonstrationSample(const Problem& problem) const {
  const std::string where = problem.where.empty() ? "a generated problem" : problem.where;
  const nlohmann::json record =
      problem.record.empty() ? nlohmann::json() : nlohmann::json::parse(problem.record);
  if (!record.is_object() || !record.contains("demonstration")) {
    return InvalidArgument(where +
                           ": the supervised warm-up of an environment job needs a "
                           "\"demonstration\" (a list of chat messages) in every record (or set "
                           "trainer.warmup_sft_steps: 0)");
  }
  if (!episode_render_) return FailedPrecondition("the environment's chat template is not loaded");
  std::string tools;
  if (record.contains("tools")) tools = record["tools"].dump();
  auto demo = text::RenderDemonstration(episode_render_, record["demonstration"].dump(), tools,
                                        cfg_.env.end_of_turn_text);
  if (!demo.ok()) return InvalidArgument(where + ": " + demo.status().message());
  GYRE_ASSIGN_OR_RETURN(auto prompt, tokenizer_->Encode(demo->prompt));
  if (auto bos = tokenizer_->bos_id()) prompt.insert(prompt.begin(), *bos);
  v1::Sample s;
  s.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  for (const text::DemoPiece& piece : demo->pieces) {
    auto ids = tokenizer_->Encode(piece.text);
    if (!ids.ok()) return InvalidArgument(where + ": " + ids.status().message());
    if (piece.model) ids->push_back(tokenizer_->stop_ids().front());
    for (int32_t id : *ids) {
      s.add_response_ids(id);
      s.add_loss_mask(piece.model ? 1.0f : 0.0f);
    }
  }
  const int64_t len = s.prompt_ids_size() + s.response_ids_size();
  if (len > cfg_.model.max_seq_len) {
    return InvalidArgument(where + ": the demonstration takes " + std::to_string(len) +
                           " tokens, more than model.max_seq_len " +
                           std::to_string(cfg_.model.max_seq_len));
  }
  return s;
}

StatusOr<v1::Sample> PromptEncoder::SftSample(const Problem& problem) const {
  if (episodes()) return DemonstrationSample(problem);
  if (problem.answer.empty()) {
    return InvalidArgument("supervised warm-up needs answers; prompt '" + problem.prompt +
                           "' has none (set trainer.warmup_sft_steps: 0)");
  }
  GYRE_ASSIGN_OR_RETURN(auto prompt, Encode(problem));
  GYRE_ASSIGN_OR_RETURN(auto answer, tokenizer_->Encode(problem.answer));
  answer.push_back(tokenizer_->stop_ids().front());
  v1::Sample s;
  s.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  s.mutable_response_ids()->Add(answer.begin(), answer.end());
  return s;
}

v1::SamplingParams PromptEncoder::Training() const {
  const auto& sc = cfg_.rollout.sampling;
  v1::SamplingParams sampling = Greedy();
  sampling.set_temperature(static_cast<float>(sc.temperature));
  sampling.set_top_k(sc.top_k);
  sampling.set_top_p(static_cast<float>(sc.top_p));
  sampling.set_min_p(static_cast<float>(sc.min_p));
  return sampling;
}

v1::SamplingParams PromptEncoder::Greedy() const {
  v1::SamplingParams sampling;
  sampling.set_temperature(0.0f);
  sampling.set_top_p(1.0f);
  sampling.set_max_new_tokens(cfg_.rollout.max_new_tokens);
  for (int32_t id : tokenizer_->stop_ids()) sampling.add_stop_token_ids(id);
  for (const std::string& stop : cfg_.rollout.stop_strings) sampling.add_stop_strings(stop);
  return sampling;
}

}  // namespace gyre::controller
