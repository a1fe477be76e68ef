// Fuzzes chat-message JSON, text::ParseMessagesJson (src/text/chat_template.cc), the reader of
// a dataset's or a request's prompt messages, and renders whatever it accepts with every chat
// format and option (RenderChat). Input: the JSON text.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "fuzz/fuzz_util.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gyre::text;
  auto messages = ParseMessagesJson(gyre::fuzz::AsString(data, size));
  if (!messages.ok()) return 0;
  GYRE_CHECK(!messages->empty()) << "ParseMessagesJson accepted no messages";
  for (ChatFormat format : {ChatFormat::kQwen25, ChatFormat::kQwen3, ChatFormat::kLlama3}) {
    for (bool generation_prompt : {true, false}) {
      for (bool thinking : {true, false}) {
        ChatOptions options;
        options.add_generation_prompt = generation_prompt;
        options.enable_thinking = thinking;
        auto text = RenderChat(format, *messages, options);
        (void)text;
      }
    }
  }
  return 0;
}
