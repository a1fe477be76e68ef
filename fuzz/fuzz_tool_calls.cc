// Fuzzes text::ParseToolCalls (src/text/tool_calls.cc), which reads tool calls out of a model's
// reply: any text, in both formats. Every accepted call has a name and object arguments.
// Input: the reply text.

#include <cstddef>
#include <cstdint>

#include "common/check.h"
#include "fuzz/fuzz_util.h"
#include "text/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gyre::text;
  const std::string reply = gyre::fuzz::AsString(data, size);
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3}) {
    ParsedToolCalls p = ParseToolCalls(reply, format);
    for (const ToolCall& c : p.calls) {
      GYRE_CHECK(!c.name.empty()) << "a call without a name";
      GYRE_CHECK(c.arguments.size() >= 2 && c.arguments.front() == '{' && c.arguments.back() == '}')
          << "arguments are not an object: " << c.arguments;
    }
    GYRE_CHECK(p.content.size() <= reply.size()) << "content longer than the reply";
  }
  return 0;
}
