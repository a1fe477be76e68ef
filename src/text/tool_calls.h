#pragma once
// Tool calls in a model's reply, parsed into actions for an environment (docs/agents.md).
//
// Two formats, the ones the chat templates of the models Gyre runs ask for:
//   - kHermes (Qwen2.5, Qwen3, SmolLM2's tool prompts): each call is a JSON object
//     {"name": ..., "arguments": {...}} between <tool_call> and </tool_call>; text around the
//     calls is the reply's content.
//   - kLlama3 (Llama 3.1+ JSON tool calling): the whole reply is one JSON object
//     {"name": ..., "parameters": {...}}, optionally after <|python_tag|>; a reply that does not
//     start with '{' is plain content.
// A malformed call never fails the parse: it becomes an entry of `errors`, worded for the model
// to read as an observation (which call, what is wrong, the start of its text), and the other
// calls still count. Pure functions, safe from any thread.

#include <string>
#include <string_view>
#include <vector>

#include "gyre/status.h"

namespace gyre::text {

enum class ToolCallFormat { kHermes, kLlama3 };

// "hermes" | "llama3".
StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);

struct ToolCall {
  std::string name;       // non-empty
  std::string arguments;  // a JSON object, compact ("{}" when the call gave none)
};

struct ParsedToolCalls {
  std::string content;              // the reply without its calls, trimmed
  std::vector<ToolCall> calls;      // in order of appearance
  std::vector<std::string> errors;  // one per malformed call
};

ParsedToolCalls ParseToolCalls(std::string_view reply, ToolCallFormat format);

}  // namespace gyre::text
