// The Jinja engine's API (jinja.h): parsing and rendering a template, and what transformers
// does around a render (the context, the template's file). The engine itself is in jinja_*.cc
// (jinja_internal.h).

#include "text/jinja.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "text/jinja_internal.h"

namespace gyre::text {

using jinja::Json;

struct ChatTemplate::Impl {
  std::string source;
  jinja::Body body;
};

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string source) {
  auto impl = std::make_shared<Impl>();
  try {
    impl->body = jinja::Parse(jinja::Lex(source));
  } catch (const jinja::JinjaError& e) {
    return InvalidArgument(e.message);
  }
  impl->source = std::move(source);
  return ChatTemplate(std::move(impl));
}

const std::string& ChatTemplate::source() const { return impl_->source; }

StatusOr<std::string> ChatTemplate::Render(const std::string& context_json) const {
  Json context = Json::parse(context_json, nullptr, /*allow_exceptions=*/false);
  if (context.is_discarded() || !context.is_object()) {
    return InvalidArgument("chat template context: expected a JSON object");
  }
  try {
    return jinja::Render(impl_->body, context);
  } catch (const jinja::JinjaError& e) {
    return InvalidArgument(e.message);
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("chat template: ") + e.what());
  }
}

StatusOr<std::string> MakeChatTemplateContext(const std::string& messages_json,
                                              const std::string& tools_json,
                                              bool add_generation_prompt,
                                              const std::string& kwargs_json) {
  Json context = Json::object();
  Json messages = Json::parse(messages_json, nullptr, false);
  if (messages.is_discarded() || !messages.is_array()) {
    return InvalidArgument("chat template context: messages must be a JSON array");
  }
  // transformers drops the keys whose value is None from each message before rendering.
  for (Json& m : messages) {
    if (!m.is_object()) continue;
    Json kept = Json::object();
    for (auto& [k, v] : m.items()) {
      if (!v.is_null()) kept[k] = v;
    }
    m = std::move(kept);
  }
  context["messages"] = std::move(messages);
  if (tools_json.empty()) {
    context["tools"] = nullptr;
  } else {
    Json tools = Json::parse(tools_json, nullptr, false);
    if (tools.is_discarded() || !(tools.is_array() || tools.is_null())) {
      return InvalidArgument("chat template context: tools must be a JSON array");
    }
    context["tools"] = std::move(tools);
  }
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (!kwargs_json.empty()) {
    Json kwargs = Json::parse(kwargs_json, nullptr, false);
    if (kwargs.is_discarded() || !kwargs.is_object()) {
      return InvalidArgument("chat template context: kwargs must be a JSON object");
    }
    for (auto& [k, v] : kwargs.items()) context[k] = v;
  }
  return context.dump();
}

StatusOr<std::string> LoadChatTemplate(const std::string& model_dir) {
  auto read = [](const std::string& path, std::string* out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::stringstream ss;
    ss << in.rdbuf();
    *out = ss.str();
    return true;
  };
  std::string text;
  if (read(model_dir + "/chat_template.jinja", &text)) return text;
  const std::string config_path = model_dir + "/tokenizer_config.json";
  if (!read(config_path, &text)) {
    return NotFound("no chat template in " + model_dir +
                    ": neither chat_template.jinja nor tokenizer_config.json exists");
  }
  const Json config = Json::parse(text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return InvalidArgument(config_path + ": not a JSON object");
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return NotFound(config_path +
                    " has no \"chat_template\" (and there is no chat_template.jinja)");
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const Json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return InvalidArgument(config_path +
                           ": \"chat_template\" is a list without an entry named \"default\"");
  }
  return InvalidArgument(config_path +
                         ": \"chat_template\" must be a string or a list of "
                         "{\"name\", \"template\"} objects");
}

}  // namespace gyre::text
