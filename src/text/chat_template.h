#pragma once
// Chat templates rendered natively: the prompt text that Hugging Face transformers'
// `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...,
// enable_thinking=...)` produces with the model's own Jinja template, byte for byte, without a
// Jinja engine at run time. docs/chat_templates.md lists the formats and how parity is tested.
//
// Scope: plain-text conversations of system, user and assistant messages. Tool calls, tool
// results, tool schemas, multimodal content blocks and separate `reasoning_content` fields are out
// of scope and rejected (rendering them without the template's logic would silently differ from
// HF). Reasoning written inline as `<think>...</think>` in assistant content is supported.
//
// Everything here is a pure function of its arguments and safe to call from any thread.

#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::text {

// One turn of a conversation. `role` is "system", "user" or "assistant"; `content` is UTF-8 text.
struct ChatMessage {
  std::string role;
  std::string content;
};

enum class ChatFormat {
  // Qwen2.5 ChatML. Inserts Qwen's default system prompt ("You are Qwen, created by Alibaba
  // Cloud. You are a helpful assistant.") when the first message is not a system message.
  kQwen25,
  // Qwen3 ChatML: no default system prompt; `<think>` reasoning of assistant turns before the
  // last user query is dropped; ChatOptions::enable_thinking=false pre-fills an empty think block.
  kQwen3,
  // Meta Llama 3 (3.0, e.g. Meta-Llama-3-8B-Instruct) headers. Not the Llama 3.1+ template, which
  // also injects "Cutting Knowledge Date" / "Today Date" lines into the system block.
  kLlama3,
  // SmolLM2 instruct ChatML: as kQwen25 with SmolLM2's default system prompt ("You are a helpful
  // AI assistant named SmolLM, trained by Hugging Face").
  kSmolLm2,
};

// "qwen2.5", "qwen3", "llama3" or "smollm2"; anything else is InvalidArgument listing the
// accepted names.
StatusOr<ChatFormat> ParseChatFormat(const std::string& name);
// The name ParseChatFormat accepts for `format`.
const char* ChatFormatName(ChatFormat format);

struct ChatOptions {
  // Append the header that opens an assistant turn, so generation continues as the assistant.
  bool add_generation_prompt = true;
  // Qwen3 only (ignored by the other formats): when false and add_generation_prompt is set, the
  // prompt ends with an empty `<think>\n\n</think>\n\n` block, which turns reasoning off.
  bool enable_thinking = true;
};

// Renders `messages` as the model's prompt text. Fails with InvalidArgument when `messages` is
// empty or a message has a role other than system/user/assistant (the message names its index).
StatusOr<std::string> RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                 const ChatOptions& options);

// Reads prompt data: either a JSON string (raw text, which becomes one user message) or a
// non-empty JSON array of {"role": ..., "content": ...} objects with string values. Other keys are
// ignored, except those the templates would render and Gyre does not support ("tool_calls",
// "reasoning_content", "thinking", "reasoning"), which are rejected unless null (or, for
// tool_calls, an empty array). Errors name the message index and the field.
StatusOr<std::vector<ChatMessage>> ParseMessagesJson(const std::string& json_text);

}  // namespace gyre::text
