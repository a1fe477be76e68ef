// Fuzzes the Jinja chat-template renderer (src/text/jinja.h): the input is template source,
// parsed and, when it parses, rendered with a fixed context shaped like transformers' (messages
// with reasoning, tool calls and tool responses, tool schemas, generation prompt, thinking off).
// Neither step may crash, hang or exhaust memory: failures are Status values, and the renderer's
// limits (nesting depth, loop iterations, output size, value size) bound the work.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "fuzz/fuzz_util.h"
#include "text/jinja.h"

namespace {

constexpr char kContext[] = R"({
  "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Zürich? <tool_response>x</tool_response>"},
    {"role": "assistant", "content": "<think>\nneed a tool\n</think>\n\n",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                     "arguments": {"city": "Zürich", "days": [1, 2.5, true, null]}}},
                    {"id": "c2", "function": {"name": "noop", "arguments": "{\"a\": 1}"}}]},
    {"role": "tool", "name": "get_weather", "content": "{\"temp\": -3}"},
    {"role": "assistant", "content": "Cold.", "reasoning_content": "it is -3"},
    {"role": "user", "content": ""}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "°C",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}}],
  "documents": null,
  "add_generation_prompt": true,
  "enable_thinking": false,
  "bos_token": "<s>",
  "eos_token": "</s>",
  "n": 3
})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gyre::text::ChatTemplate;
  auto tmpl = ChatTemplate::Parse(gyre::fuzz::AsString(data, size));
  if (!tmpl.ok()) {
    GYRE_CHECK(!tmpl.status().message().empty()) << "Parse failed without a message";
    return 0;
  }
  auto text = tmpl->Render(kContext);
  if (!text.ok()) {
    GYRE_CHECK(!text.status().message().empty()) << "Render failed without a message";
  } else {
    GYRE_CHECK(text->size() <= (16u << 20)) << "Render passed its output limit";
  }
  return 0;
}
