// Each Render* function below is a transcription of the corresponding Jinja chat template for the
// subset Gyre supports (no tools): the Jinja source is in the model's tokenizer_config.json under
// "chat_template". Where the templates call Python string methods (split, strip, lstrip,
// startswith) the helpers here reproduce Python's semantics exactly, because a single stray
// newline changes the tokens the policy is trained on. tests/unit/chat checks the output against
// transformers with the real templates.

#include "text/chat_template.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "common/strings.h"

namespace gyre::text {
namespace {

using json = nlohmann::json;

constexpr char kQwenDefaultSystem[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr char kSmolLmDefaultSystem[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

Status CheckMessages(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return InvalidArgument("chat: no messages to render");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return InvalidArgument("chat: message " + std::to_string(i) + " has role '" + role +
                             "'; expected system, user or assistant (tool messages and tool "
                             "calls are not supported)");
    }
  }
  return Status::Ok();
}

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n').
std::string_view LStripNewlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view RStripNewlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view StripNewlines(std::string_view s) { return RStripNewlines(LStripNewlines(s)); }

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}
bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Python's str.isspace() for one code point; Jinja's `trim` filter is str.strip(), which strips
// these: Unicode White_Space plus the ASCII information separators U+001C..U+001F.
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's str.strip() with no argument (Jinja's `trim`), on UTF-8 text.
std::string_view PythonStrip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    // Bytes that are not UTF-8 are never whitespace, so trimming stops there, as Python would
    // never see such bytes in a str at all.
    const Utf8Char c = DecodeUtf8(s, begin);
    if (c.status != Utf8Char::kValid || !IsPythonSpace(c.code_point)) break;
    begin += c.length;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the first byte of the last code point (at most 4 bytes back).
    size_t start = end - 1;
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    const Utf8Char c = DecodeUtf8(s, start);
    if (c.status != Utf8Char::kValid || c.length != end - start || !IsPythonSpace(c.code_point)) {
      break;
    }
    end = start;
  }
  return s.substr(begin, end - begin);
}

void AppendTurn(std::string* out, std::string_view role, std::string_view content) {
  out->append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
}

// ChatML with a default system prompt when the first message is not a system message (Qwen2.5,
// SmolLM2): every turn is rendered the same way, a later system message in place.
std::string RenderChatMlWithDefault(const std::vector<ChatMessage>& messages,
                                    const ChatOptions& options, const char* default_system) {
  std::string out;
  if (messages[0].role != "system") AppendTurn(&out, "system", default_system);
  for (const ChatMessage& m : messages) AppendTurn(&out, m.role, m.content);
  if (options.add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

std::string RenderQwen3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  std::string out;
  if (messages[0].role == "system") AppendTurn(&out, "system", messages[0].content);

  // The last "real" user query: the template walks backwards to the last user message that is
  // not a wrapped tool response. Reasoning is kept only for assistant turns after it (the
  // current, possibly multi-step, answer); earlier turns keep just their final answer.
  size_t last_query_index = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& content = messages[i].content;
    if (messages[i].role == "user" &&
        !(StartsWith(content, "<tool_response>") && EndsWith(content, "</tool_response>"))) {
      last_query_index = i;
      break;
    }
  }

  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "user" || (message.role == "system" && i != 0)) {
      AppendTurn(&out, message.role, message.content);
      continue;
    }
    if (message.role != "assistant") continue;  // the leading system message, emitted above

    // Split "<think>reasoning</think>answer" as the template does with Python's str.split:
    // the answer follows the last "</think>", the reasoning lies between the last "<think>" before
    // the first "</think>" and that "</think>".
    std::string_view content = message.content;
    std::string_view reasoning;
    const size_t first_close = content.find(kThinkClose);
    if (first_close != std::string_view::npos) {
      const std::string_view full = message.content;
      const size_t last_close = full.rfind(kThinkClose);
      content = LStripNewlines(full.substr(last_close + kThinkClose.size()));
      std::string_view before = RStripNewlines(full.substr(0, first_close));
      const size_t open = before.rfind(kThinkOpen);
      if (open != std::string_view::npos) before = before.substr(open + kThinkOpen.size());
      reasoning = LStripNewlines(before);
    }

    out.append("<|im_start|>assistant\n");
    const bool is_last = i + 1 == messages.size();
    if (i > last_query_index && (is_last || !reasoning.empty())) {
      out.append("<think>\n")
          .append(StripNewlines(reasoning))
          .append("\n</think>\n\n")
          .append(LStripNewlines(content));
    } else {
      out.append(content);
    }
    out.append("<|im_end|>\n");
  }

  if (options.add_generation_prompt) {
    out.append("<|im_start|>assistant\n");
    if (!options.enable_thinking) out.append("<think>\n\n</think>\n\n");
  }
  return out;
}

// Meta-Llama-3-8B-Instruct's template: BOS, then for each message a role header, the content with
// surrounding whitespace trimmed (Jinja `trim`), and <|eot_id|>. No default system prompt.
std::string RenderLlama3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& message : messages) {
    out.append("<|start_header_id|>")
        .append(message.role)
        .append("<|end_header_id|>\n\n")
        .append(PythonStrip(message.content))
        .append("<|eot_id|>");
  }
  if (options.add_generation_prompt) {
    out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
  return out;
}

// Fields that the Qwen templates would render (or transformers would alias into one that they
// render) and that Gyre does not implement: accepting them silently would change the prompt.
Status CheckUnsupportedField(const json& message, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "]";
  if (message.contains("tool_calls")) {
    const json& calls = message["tool_calls"];
    if (!calls.is_null() && !(calls.is_array() && calls.empty())) {
      return InvalidArgument(where +
                             ".tool_calls: tool calls are not supported by Gyre chat "
                             "templates");
    }
  }
  for (const char* field : {"reasoning_content", "thinking", "reasoning"}) {
    if (message.contains(field) && !message[field].is_null()) {
      return InvalidArgument(where + "." + field +
                             ": a separate reasoning field is not supported; write the reasoning "
                             "inline as <think>...</think> in content");
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ChatFormat> ParseChatFormat(const std::string& name) {
  if (name == "qwen2.5") return ChatFormat::kQwen25;
  if (name == "qwen3") return ChatFormat::kQwen3;
  if (name == "llama3") return ChatFormat::kLlama3;
  if (name == "smollm2") return ChatFormat::kSmolLm2;
  return InvalidArgument("unknown chat format '" + name +
                         "'; expected qwen2.5, qwen3, llama3 or smollm2");
}

const char* ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kQwen25:
      return "qwen2.5";
    case ChatFormat::kQwen3:
      return "qwen3";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kSmolLm2:
      return "smollm2";
  }
  return "unknown";
}

StatusOr<std::string> RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                 const ChatOptions& options) {
  GYRE_RETURN_IF_ERROR(CheckMessages(messages));
  switch (format) {
    case ChatFormat::kQwen25:
      return RenderChatMlWithDefault(messages, options, kQwenDefaultSystem);
    case ChatFormat::kSmolLm2:
      return RenderChatMlWithDefault(messages, options, kSmolLmDefaultSystem);
    case ChatFormat::kQwen3:
      return RenderQwen3(messages, options);
    case ChatFormat::kLlama3:
      return RenderLlama3(messages, options);
  }
  return InvalidArgument("chat: unknown ChatFormat value " +
                         std::to_string(static_cast<int>(format)));
}

StatusOr<std::vector<ChatMessage>> ParseMessagesJson(const std::string& json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("chat messages: invalid JSON: ") + e.what());
  }
  if (doc.is_string()) return std::vector<ChatMessage>{{"user", doc.get<std::string>()}};
  if (!doc.is_array()) {
    return InvalidArgument(std::string("chat messages: expected a JSON string (raw text) or an "
                                       "array of {\"role\", \"content\"} objects, got ") +
                           doc.type_name());
  }
  if (doc.empty()) return InvalidArgument("chat messages: the array is empty");

  std::vector<ChatMessage> messages;
  messages.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& m = doc[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) {
      return InvalidArgument(where + ": expected an object with \"role\" and \"content\", got " +
                             m.type_name());
    }
    ChatMessage message;
    for (const char* field : {"role", "content"}) {
      if (!m.contains(field)) return InvalidArgument(where + "." + field + ": missing");
      if (!m[field].is_string()) {
        return InvalidArgument(where + "." + field + ": expected a string, got " +
                               m[field].type_name() +
                               (std::string(field) == "content"
                                    ? " (content blocks and null content are not supported)"
                                    : ""));
      }
    }
    message.role = m["role"].get<std::string>();
    message.content = m["content"].get<std::string>();
    if (message.role != "system" && message.role != "user" && message.role != "assistant") {
      return InvalidArgument(where + ".role: unknown role '" + message.role +
                             "'; expected system, user or assistant (tool messages and tool "
                             "calls are not supported)");
    }
    GYRE_RETURN_IF_ERROR(CheckUnsupportedField(m, i));
    messages.push_back(std::move(message));
  }
  return messages;
}

}  // namespace gyre::text
