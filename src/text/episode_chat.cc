#include "text/episode_chat.h"

#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace gyre::text {

using nlohmann::json;

StatusOr<EpisodeChat> EpisodeChat::Load(const std::string& template_path,
                                        const std::string& model_dir,
                                        const std::string& kwargs_json) {
  std::string source;
  if (!template_path.empty()) {
    GYRE_ASSIGN_OR_RETURN(source, ReadFileToString(template_path));
  } else if (!model_dir.empty()) {
    auto loaded = LoadChatTemplate(model_dir);
    if (!loaded.ok()) {
      return loaded.status().WithContext(
          "the model's chat template (set env.chat_template to a Jinja file instead)");
    }
    source = std::move(*loaded);
  } else {
    return InvalidArgument(
        "env.chat_template: the built-in model has no chat template; name a Jinja file (e.g. "
        "configs/templates/tiny_tools.jinja)");
  }
  if (!kwargs_json.empty()) {
    const json k = json::parse(kwargs_json, nullptr, false);
    if (k.is_discarded() || !k.is_object()) {
      return InvalidArgument("chat template variables must be a JSON object, not '" + kwargs_json +
                             "'");
    }
  }
  auto parsed = ChatTemplate::Parse(std::move(source));
  if (!parsed.ok()) {
    return parsed.status().WithContext(template_path.empty() ? model_dir + "'s chat template"
                                                             : template_path);
  }
  return EpisodeChat(std::move(*parsed), kwargs_json);
}

StatusOr<std::string> EpisodeChat::Render(const std::string& messages_json,
                                          const std::string& tools_json,
                                          bool add_generation_prompt) const {
  GYRE_ASSIGN_OR_RETURN(
      std::string context,
      MakeChatTemplateContext(messages_json, tools_json, add_generation_prompt, kwargs_));
  return template_.Render(context);
}

ChatRenderFn EpisodeChat::AsFunction() const {
  EpisodeChat self = *this;
  return
      [self](const std::string& m, const std::string& t, bool g) { return self.Render(m, t, g); };
}

StatusOr<std::string> TextBetweenTurns(const ChatRenderFn& render,
                                       const std::string& conversation_json,
                                       const std::string& observation_json,
                                       const std::string& tools_json, const std::string& sentinel,
                                       const std::string& end_of_turn_text) {
  json after = json::parse(conversation_json, nullptr, false);
  const json observation = json::parse(observation_json, nullptr, false);
  if (!after.is_array() || !observation.is_array()) {
    return InvalidArgument("the conversation and the observation must be JSON arrays");
  }
  for (const json& m : observation) after.push_back(m);
  auto c1 = render(conversation_json, tools_json, false);
  if (!c1.ok()) return c1.status();
  auto c2 = render(after.dump(), tools_json, true);
  if (!c2.ok()) return c2.status();
  const size_t at = c1->rfind(sentinel);
  if (at == std::string::npos || c2->compare(0, c1->size(), *c1) != 0) {
    return FailedPrecondition(
        "the chat template does not render the observation as a continuation of the "
        "conversation (a rendering with it does not start with the rendering without it)");
  }
  std::string tail = c1->substr(at + sentinel.size());  // the template's end of a turn
  if (!end_of_turn_text.empty() &&
      tail.compare(0, end_of_turn_text.size(), end_of_turn_text) == 0) {
    tail.erase(0, end_of_turn_text.size());
  }
  return tail + c2->substr(c1->size());
}

StatusOr<RenderedDemo> RenderDemonstration(const ChatRenderFn& render,
                                           const std::string& messages_json,
                                           const std::string& tools_json,
                                           const std::string& end_of_turn_text) {
  const json messages = json::parse(messages_json, nullptr, false);
  if (!messages.is_array())
    return InvalidArgument("a demonstration must be a JSON array of messages");
  std::vector<size_t> turns;  // indices of assistant messages
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return InvalidArgument("demonstration message " + std::to_string(i) +
                             " is not an object with a string \"role\"");
    }
    if (m["role"] == "assistant") {
      if (!m.contains("content") || !m["content"].is_string()) {
        return InvalidArgument("demonstration message " + std::to_string(i) +
                               ": an assistant message needs its text in \"content\" (tool "
                               "calls written out as the model writes them)");
      }
      turns.push_back(i);
    }
  }
  if (turns.empty()) return InvalidArgument("a demonstration needs an assistant message");
  if (turns.front() == 0) {
    return InvalidArgument(
        "a demonstration starts with the environment's messages, not an "
        "assistant message");
  }
  const std::string sentinel = "GYREDEMOTURN7f3a9c";
  RenderedDemo out;
  json conversation(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(turns[0]));
  GYRE_ASSIGN_OR_RETURN(out.prompt, render(conversation.dump(), tools_json, true));
  for (size_t k = 0; k < turns.size(); ++k) {
    const std::string content = messages[turns[k]]["content"].get<std::string>();
    if (content.find(sentinel) != std::string::npos) {
      return InvalidArgument("demonstration message " + std::to_string(turns[k]) +
                             " contains the renderer's sentinel");
    }
    out.pieces.push_back({content, true});
    if (k + 1 == turns.size()) break;
    conversation.push_back({{"role", "assistant"}, {"content", sentinel}});
    json observation(messages.begin() + static_cast<std::ptrdiff_t>(turns[k] + 1),
                     messages.begin() + static_cast<std::ptrdiff_t>(turns[k + 1]));
    auto between = TextBetweenTurns(render, conversation.dump(), observation.dump(), tools_json,
                                    sentinel, end_of_turn_text);
    if (!between.ok()) {
      return between.status().WithContext("after demonstration message " +
                                          std::to_string(turns[k]));
    }
    out.pieces.push_back({std::move(*between), false});
    for (const json& m : observation) conversation.push_back(m);
  }
  return out;
}

}  // namespace gyre::text
