#pragma once
// A renderer for the Jinja subset that Hugging Face chat templates use, so a model's own
// `chat_template` renders natively, byte for byte as transformers' `apply_chat_template(...,
// tokenize=False)` does (same environment: trim_blocks, lstrip_blocks, loop controls, HF's
// `tojson`, `raise_exception`, `strftime_now`, `namespace`). docs/chat_templates.md lists what is
// supported; any other construct fails at Parse or Render with the template line named, never
// renders differently.
//
// Values are JSON (insertion-ordered objects, like Python dicts). A ChatTemplate is immutable
// after Parse; Render is const and safe to call from several threads at once.

#include <memory>
#include <string>

#include "gyre/status.h"

namespace gyre::text {

class ChatTemplate {
 public:
  // Parses Jinja source. Fails with InvalidArgument naming the line (and column) of a syntax
  // error, an unclosed block or an unsupported tag.
  static StatusOr<ChatTemplate> Parse(std::string source);

  // Renders with `context_json`, a JSON object whose keys become template variables, as
  // transformers passes them: "messages" (array of {"role", "content", "tool_calls",
  // "reasoning_content", "name", ...}), "tools" (array of JSON schemas, or null), and
  // "add_generation_prompt", plus any extra kwargs ("enable_thinking", "bos_token", ...).
  // Fails with InvalidArgument when the context is not a JSON object, when the template calls
  // raise_exception (the message is the template's), on a Python/Jinja runtime error (naming the
  // line), or when a limit is passed (output or a string over 16 MiB, 1M loop iterations, deep
  // nesting, a work budget; docs/chat_templates.md lists them).
  StatusOr<std::string> Render(const std::string& context_json) const;

  // The source Parse was given.
  const std::string& source() const;

  struct Impl;

 private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Builds the context transformers' apply_chat_template passes to the template: `messages_json` (a
// JSON array), `tools_json` (a JSON array, or "" for none: the template sees `tools` as None),
// add_generation_prompt, and the members of `kwargs_json` (a JSON object or "", e.g.
// {"enable_thinking": false, "bos_token": "<s>"}). Returns the context as JSON text for Render.
StatusOr<std::string> MakeChatTemplateContext(const std::string& messages_json,
                                              const std::string& tools_json,
                                              bool add_generation_prompt,
                                              const std::string& kwargs_json);

// Reads a model directory's chat template as transformers does: `chat_template.jinja` when present,
// else "chat_template" in `tokenizer_config.json`, either a string or a list of {"name",
// "template"} entries (the one named "default" is used). NotFound when neither file has one;
// InvalidArgument when tokenizer_config.json is not valid JSON or the field has another shape.
StatusOr<std::string> LoadChatTemplate(const std::string& model_dir);

}  // namespace gyre::text
