#include "text/tool_calls.h"

#include <gtest/gtest.h>

#include <string>

namespace gyre::text {
namespace {

// A reply without calls: no calls, no errors, its trimmed text as the content.
void ExpectPlainText(const std::string& reply, ToolCallFormat format, const std::string& content) {
  ParsedToolCalls p = ParseToolCalls(reply, format);
  EXPECT_TRUE(p.calls.empty()) << reply;
  EXPECT_TRUE(p.errors.empty()) << reply;
  EXPECT_EQ(p.content, content);
}

TEST(ToolCallsTest, HermesCallsAndTheContentAroundThem) {
  const std::string reply =
      "Let me compute that.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
      "{\"expression\": \"12*7\"}}\n</tool_call>\n<tool_call>{\"name\": \"lookup\", "
      "\"arguments\": \"{\\\"key\\\": 3}\"}</tool_call> done";
  ParsedToolCalls p = ParseToolCalls(reply, ToolCallFormat::kHermes);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.calls[0].name, "calculator");
  EXPECT_EQ(p.calls[0].arguments, "{\"expression\":\"12*7\"}");
  // Arguments written as a string that holds the object are read as that object.
  EXPECT_EQ(p.calls[1].name, "lookup");
  EXPECT_EQ(p.calls[1].arguments, "{\"key\":3}");
  EXPECT_EQ(p.content, "Let me compute that.\n\n done");

  ExpectPlainText("  The answer is 84.  ", ToolCallFormat::kHermes, "The answer is 84.");

  ParsedToolCalls no_args =
      ParseToolCalls("<tool_call>{\"name\": \"now\"}</tool_call>", ToolCallFormat::kHermes);
  ASSERT_EQ(no_args.calls.size(), 1u);
  EXPECT_EQ(no_args.calls[0].arguments, "{}");
  EXPECT_EQ(no_args.content, "");
}

// A malformed call is an observation for the model: numbered, saying what is wrong, quoting its
// start; the well-formed calls around it still count.
TEST(ToolCallsTest, MalformedHermesCallsBecomeErrorsAndTheOthersStillCount) {
  const std::string reply =
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": 1+}</tool_call>"
      "<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>"
      "<tool_call>[1, 2]</tool_call>"
      "<tool_call>{\"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>"
      "<tool_call>{\"name\": \"cut\", \"argu";
  ParsedToolCalls p = ParseToolCalls(reply, ToolCallFormat::kHermes);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "ok");
  ASSERT_EQ(p.errors.size(), 5u);
  EXPECT_EQ(p.errors[0].rfind("tool call 1 is not valid JSON (error at byte ", 0), 0u)
      << p.errors[0];
  EXPECT_NE(p.errors[0].find("{\"name\": \"calculator\""), std::string::npos) << p.errors[0];
  EXPECT_EQ(p.errors[1].rfind("tool call 3 must be a JSON object", 0), 0u) << p.errors[1];
  EXPECT_EQ(p.errors[2].rfind("tool call 4 has no \"name\" string", 0), 0u) << p.errors[2];
  EXPECT_EQ(p.errors[3].rfind("tool call 5 (f): \"arguments\" must be a JSON object", 0), 0u)
      << p.errors[3];
  EXPECT_EQ(p.errors[4], "tool call 6 has no closing </tool_call>: {\"name\": \"cut\", \"argu");
  EXPECT_EQ(p.content, "");

  // A number too large for a double is not valid JSON either (found by fuzz_tool_calls).
  ParsedToolCalls huge =
      ParseToolCalls("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1e999}}</tool_call>",
                     ToolCallFormat::kHermes);
  EXPECT_TRUE(huge.calls.empty());
  ASSERT_EQ(huge.errors.size(), 1u);
  EXPECT_EQ(huge.errors[0].rfind("tool call 1 is not valid JSON", 0), 0u) << huge.errors[0];

  // Long bad calls are quoted only in part.
  const std::string junk(500, 'x');
  ParsedToolCalls long_bad =
      ParseToolCalls("<tool_call>" + junk + "</tool_call>", ToolCallFormat::kHermes);
  ASSERT_EQ(long_bad.errors.size(), 1u);
  EXPECT_LT(long_bad.errors[0].size(), 200u);
  EXPECT_EQ(long_bad.errors[0].substr(long_bad.errors[0].size() - 3), "...");
}

TEST(ToolCallsTest, Llama3ReplyThatIsOneJsonObject) {
  ParsedToolCalls p = ParseToolCalls(
      "<|python_tag|>{\"name\": \"calculator\", \"parameters\": {\"expression\": \"2+2\"}}",
      ToolCallFormat::kLlama3);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.calls[0].name, "calculator");
  EXPECT_EQ(p.calls[0].arguments, "{\"expression\":\"2+2\"}");
  EXPECT_EQ(p.content, "");

  ExpectPlainText("The answer is {4}.", ToolCallFormat::kLlama3, "The answer is {4}.");

  ParsedToolCalls bad =
      ParseToolCalls("{\"name\": \"calculator\", \"parameters\": {", ToolCallFormat::kLlama3);
  EXPECT_TRUE(bad.calls.empty());
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_EQ(bad.errors[0].rfind("tool call 1 is not valid JSON", 0), 0u) << bad.errors[0];
}

TEST(ToolCallsTest, FormatNames) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3}) {
    auto back = ParseToolCallFormat(ToolCallFormatName(f));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, f);
  }
  auto bad = ParseToolCallFormat("json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown tool-call format 'json'"), std::string::npos);
}

}  // namespace
}  // namespace gyre::text
