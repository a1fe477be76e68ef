#include "text/tool_calls.h"

#include <nlohmann/json.hpp>

namespace gyre::text {
namespace {

using nlohmann::json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr size_t kQuoteChars = 120;  // how much of a bad call an error message repeats

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string Quote(std::string_view text) {
  std::string out(text.substr(0, kQuoteChars));
  if (text.size() > kQuoteChars) out += "...";
  return out;
}

// One call's JSON text -> a ToolCall, or the reason it is not one. The arguments may be under
// "arguments" (Hermes) or "parameters" (Llama 3); either is accepted in both formats.
bool ParseCall(std::string_view text, int number, ToolCall* call, std::string* error) {
  const std::string prefix = "tool call " + std::to_string(number) + " ";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    *error =
        prefix + "is not valid JSON (error at byte " + std::to_string(e.byte) + "): " + Quote(text);
    return false;
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    *error = prefix + "is not valid JSON (" + e.what() + "): " + Quote(text);
    return false;
  }
  if (!j.is_object()) {
    *error = prefix + "must be a JSON object with \"name\" and \"arguments\": " + Quote(text);
    return false;
  }
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    *error = prefix + "has no \"name\" string: " + Quote(text);
    return false;
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  json value = json::object();
  if (args != j.end()) {
    value = *args;
    // Some models write the arguments as a JSON string holding the object.
    if (value.is_string()) {
      try {
        json inner = json::parse(value.get<std::string>());
        if (inner.is_object()) value = std::move(inner);
      } catch (const json::exception&) {
        // Not JSON inside: the string stays a string, rejected below.
      }
    }
    if (value.is_null()) value = json::object();
  }
  if (!value.is_object()) {
    *error = prefix + "(" + name->get<std::string>() +
             "): \"arguments\" must be a JSON object: " + Quote(text);
    return false;
  }
  call->name = name->get<std::string>();
  call->arguments = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

void AddCall(std::string_view text, ParsedToolCalls* out) {
  const int number = static_cast<int>(out->calls.size() + out->errors.size()) + 1;
  ToolCall call;
  std::string error;
  if (ParseCall(Trim(text), number, &call, &error)) {
    out->calls.push_back(std::move(call));
  } else {
    out->errors.push_back(std::move(error));
  }
}

ParsedToolCalls ParseHermes(std::string_view reply) {
  ParsedToolCalls out;
  std::string content;
  size_t pos = 0;
  while (pos < reply.size()) {
    const size_t open = reply.find(kOpen, pos);
    if (open == std::string_view::npos) {
      content.append(reply.substr(pos));
      break;
    }
    content.append(reply.substr(pos, open - pos));
    const size_t body = open + kOpen.size();
    const size_t close = reply.find(kClose, body);
    if (close == std::string_view::npos) {
      const int number = static_cast<int>(out.calls.size() + out.errors.size()) + 1;
      out.errors.push_back("tool call " + std::to_string(number) + " has no closing " +
                           std::string(kClose) + ": " + Quote(Trim(reply.substr(body))));
      break;
    }
    AddCall(reply.substr(body, close - body), &out);
    pos = close + kClose.size();
  }
  out.content = std::string(Trim(content));
  return out;
}

ParsedToolCalls ParseLlama3(std::string_view reply) {
  ParsedToolCalls out;
  std::string_view text = Trim(reply);
  if (text.substr(0, kPythonTag.size()) == kPythonTag) text = Trim(text.substr(kPythonTag.size()));
  if (text.empty() || text.front() != '{') {
    out.content = std::string(text);
    return out;
  }
  AddCall(text, &out);
  return out;
}

}  // namespace

StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3") return ToolCallFormat::kLlama3;
  return InvalidArgument("unknown tool-call format '" + std::string(name) +
                         "' (hermes: <tool_call>{json}</tool_call> as Qwen and SmolLM2 write "
                         "them; llama3: a reply that is one JSON object)");
}

const char* ToolCallFormatName(ToolCallFormat format) {
  return format == ToolCallFormat::kHermes ? "hermes" : "llama3";
}

ParsedToolCalls ParseToolCalls(std::string_view reply, ToolCallFormat format) {
  return format == ToolCallFormat::kHermes ? ParseHermes(reply) : ParseLlama3(reply);
}

}  // namespace gyre::text
