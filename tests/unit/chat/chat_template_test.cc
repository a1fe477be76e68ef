// Chat template tests: hand-written expectations for each format, and input errors. The
// comparison with what Hugging Face transformers renders from the real Qwen2.5 and Qwen3 templates
// is chat_golden_test.cc (a golden file; no Python at test time). Llama 3 has no template in the
// repository, so its tests compare with strings written out by hand from Meta's template.

#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gyre::text {
namespace {

// ------------------------------------------------------------------------------------------------
// Hand-written expectations.

std::string Render(ChatFormat format, const std::vector<ChatMessage>& messages, bool gen = true,
                   bool think = true) {
  ChatOptions options;
  options.add_generation_prompt = gen;
  options.enable_thinking = think;
  auto out = RenderChat(format, messages, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::string();
}

TEST(Qwen25, InsertsDefaultSystemPrompt) {
  EXPECT_EQ(Render(ChatFormat::kQwen25, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Qwen25, KeepsGivenSystemPromptAndHistoryVerbatim) {
  EXPECT_EQ(Render(ChatFormat::kQwen25,
                   {{"system", "S"}, {"user", "U"}, {"assistant", "<think>r</think>A"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>r</think>A<|im_end|>\n");
}

TEST(Qwen3, ThinkingOffPrefillsEmptyThinkBlock) {
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Hi"}}, true, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Hi"}}, true, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // Without a generation prompt there is nothing to pre-fill.
  EXPECT_EQ(Render(ChatFormat::kQwen3, {{"user", "Hi"}}, false, false),
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(Qwen3, DropsReasoningBeforeLastQueryAndKeepsItAfter) {
  EXPECT_EQ(Render(ChatFormat::kQwen3,
                   {{"system", "S"},
                    {"user", "q1"},
                    {"assistant", "<think>\nr1\n</think>\n\nA1"},
                    {"user", "q2"},
                    {"assistant", "<think>r2</think>A2"}},
                   false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n");
}

TEST(Llama3, SingleUserTurnWithGenerationPrompt) {
  EXPECT_EQ(Render(ChatFormat::kLlama3, {{"user", "Hello!"}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Llama3, MultiTurnWithoutGenerationPromptHasNoDefaultSystemOrDates) {
  EXPECT_EQ(
      Render(ChatFormat::kLlama3,
             {{"system", "You are terse."},
              {"user", "2+2?"},
              {"assistant", "4"},
              {"user", "3+3?"},
              {"assistant", "6"}},
             false),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\n3+3?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n6<|eot_id|>");
}

// Meta's template pipes content through Jinja's `trim` (Python str.strip()): leading and trailing
// Unicode whitespace goes, inner whitespace and think markup stay; the BOS comes only once.
TEST(Llama3, TrimsContentLikeJinjaTrim) {
  EXPECT_EQ(Render(ChatFormat::kLlama3,
                   {{"user", " \t\n\u3000\u00a0Hi  there\n\n\u2029"},
                    {"assistant", "\n<think>r</think>\n A \n"},
                    {"user", "   "},
                    {"user", "\x1c\xe2\x80\x8bzero-width space is not whitespace\xe2\x80\x8b"}},
                   true, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi  there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n<think>r</think>\n A<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n\xe2\x80\x8bzero-width space is not "
            "whitespace\xe2\x80\x8b<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Llama3, IgnoresEnableThinking) {
  EXPECT_EQ(Render(ChatFormat::kLlama3, {{"user", "x"}}, true, false),
            Render(ChatFormat::kLlama3, {{"user", "x"}}, true, true));
}

// ------------------------------------------------------------------------------------------------
// Formats and errors.

// SmolLM2-135M-Instruct's template (its GGUF file's tokenizer.chat_template): ChatML with SmolLM's
// default system prompt unless the first message is a system message.
TEST(SmolLm2, InsertsDefaultSystemPromptOnce) {
  EXPECT_EQ(Render(ChatFormat::kSmolLm2, {{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(
      Render(ChatFormat::kSmolLm2, {{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, false),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
      "<|im_start|>assistant\nA<|im_end|>\n");
}

TEST(ChatFormatTest, ParsesNamesAndRoundTrips) {
  for (ChatFormat f :
       {ChatFormat::kQwen25, ChatFormat::kQwen3, ChatFormat::kLlama3, ChatFormat::kSmolLm2}) {
    auto parsed = ParseChatFormat(ChatFormatName(f));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, f);
  }
  auto bad = ParseChatFormat("llama3.1");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'llama3.1'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("qwen2.5, qwen3, llama3 or smollm2"), std::string::npos);
}

TEST(RenderChatTest, RejectsUnknownRoleNamingItAndItsIndex) {
  for (ChatFormat f : {ChatFormat::kQwen25, ChatFormat::kQwen3, ChatFormat::kLlama3}) {
    auto out = RenderChat(f, {{"user", "q"}, {"tool", "42"}}, ChatOptions());
    ASSERT_FALSE(out.ok()) << ChatFormatName(f);
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find("message 1"), std::string::npos) << out.status();
    EXPECT_NE(out.status().message().find("'tool'"), std::string::npos) << out.status();
  }
}

TEST(RenderChatTest, RejectsEmptyConversation) {
  auto out = RenderChat(ChatFormat::kLlama3, {}, ChatOptions());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("no messages"), std::string::npos) << out.status();
}

TEST(ParseMessagesJsonTest, RawStringBecomesOneUserMessage) {
  auto msgs = ParseMessagesJson(R"("What is 2+2?\nThink step by step. 你好")");
  ASSERT_TRUE(msgs.ok()) << msgs.status();
  ASSERT_EQ(msgs->size(), 1u);
  EXPECT_EQ((*msgs)[0].role, "user");
  EXPECT_EQ((*msgs)[0].content, "What is 2+2?\nThink step by step. 你好");
}

TEST(ParseMessagesJsonTest, ArrayOfMessages) {
  auto msgs = ParseMessagesJson(R"([
      {"role": "system", "content": "S"},
      {"role": "user", "content": "", "name": "alice", "tool_calls": null},
      {"role": "assistant", "content": "<think>r</think>A", "tool_calls": [],
       "reasoning_content": null}])");
  ASSERT_TRUE(msgs.ok()) << msgs.status();
  ASSERT_EQ(msgs->size(), 3u);
  EXPECT_EQ((*msgs)[0].role, "system");
  EXPECT_EQ((*msgs)[0].content, "S");
  EXPECT_EQ((*msgs)[1].role, "user");
  EXPECT_EQ((*msgs)[1].content, "");
  EXPECT_EQ((*msgs)[2].role, "assistant");
  EXPECT_EQ((*msgs)[2].content, "<think>r</think>A");
}

struct BadJsonCase {
  const char* name;
  const char* json_text;
  std::vector<const char*> message_parts;  // each must appear in the error message
};

class ParseMessagesJsonErrorTest : public ::testing::TestWithParam<BadJsonCase> {};

TEST_P(ParseMessagesJsonErrorTest, FailsWithAClearMessage) {
  auto msgs = ParseMessagesJson(GetParam().json_text);
  ASSERT_FALSE(msgs.ok());
  EXPECT_EQ(msgs.status().code(), StatusCode::kInvalidArgument);
  for (const char* part : GetParam().message_parts) {
    EXPECT_NE(msgs.status().message().find(part), std::string::npos)
        << "'" << part << "' not in: " << msgs.status();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParseMessagesJsonErrorTest,
    ::testing::Values(
        BadJsonCase{"Truncated", R"([{"role": "user", "content": "hi"})", {"invalid JSON"}},
        BadJsonCase{"Empty", "", {"invalid JSON"}},
        BadJsonCase{"Number", "42", {"expected a JSON string", "number"}},
        BadJsonCase{"Object", R"({"role": "user", "content": "hi"})", {"array", "object"}},
        BadJsonCase{"EmptyArray", "[]", {"empty"}},
        BadJsonCase{"ElementNotObject",
                    R"([{"role": "user", "content": "a"}, "b"])",
                    {"messages[1]", "expected an object"}},
        BadJsonCase{"MissingRole", R"([{"content": "hi"}])", {"messages[0].role", "missing"}},
        BadJsonCase{"MissingContent",
                    R"([{"role": "user", "content": "a"}, {"role": "assistant"}])",
                    {"messages[1].content", "missing"}},
        BadJsonCase{"NumberContent",
                    R"([{"role": "user", "content": 7}])",
                    {"messages[0].content", "expected a string", "number"}},
        BadJsonCase{"NullContent",
                    R"([{"role": "assistant", "content": null}])",
                    {"messages[0].content", "null"}},
        BadJsonCase{"ContentBlocks",
                    R"([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])",
                    {"messages[0].content", "array"}},
        BadJsonCase{"NonStringRole",
                    R"([{"role": 1, "content": "hi"}])",
                    {"messages[0].role", "expected a string"}},
        BadJsonCase{"UnknownRole",
                    R"([{"role": "user", "content": "a"}, {"role": "tool", "content": "4"}])",
                    {"messages[1].role", "'tool'"}},
        BadJsonCase{"ToolCalls",
                    R"([{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}])",
                    {"messages[0].tool_calls", "not supported"}},
        BadJsonCase{"ReasoningContent",
                    R"([{"role": "assistant", "content": "A", "reasoning_content": "r"}])",
                    {"messages[0].reasoning_content", "<think>"}},
        BadJsonCase{"InvalidUtf8", "\"\xff\"", {"invalid JSON"}}),
    [](const ::testing::TestParamInfo<BadJsonCase>& info) { return info.param.name; });

}  // namespace
}  // namespace gyre::text
