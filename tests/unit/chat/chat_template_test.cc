// Chat template tests.
//
// Reference test: every conversation in Conversations() is rendered for Qwen2.5 and Qwen3 with
// add_generation_prompt and enable_thinking both ways, and compared byte for byte with what
// Hugging Face produces from the real templates in ../shared/data/tokenizers. hf_chat_reference.py
// renders all of them in one Python process per test binary (transformers' apply_chat_template,
// or plain jinja2 configured as transformers does when transformers is missing); the tests skip
// with a message when Python, the packages or the shared files are absent. Llama 3 has no template
// file in ../shared, so its tests compare with strings written out by hand from Meta's template.
// The remaining tests cover input errors and need nothing outside this binary.

#include "text/chat_template.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "testing/text_format.h"

namespace gyre::text {
namespace {

using testing::Visible;

using json = nlohmann::json;

struct Conversation {
  const char* name;
  std::vector<ChatMessage> messages;
};

// Conversations chosen to exercise each branch of the Qwen templates: default vs given system
// prompt, system messages after the first, Qwen3's reasoning removal before the last user query
// and its think block on assistant turns after it, unusual <think> nesting, the tool-response
// check on user turns, and content that is empty, non-ASCII or full of newlines.
const std::vector<Conversation>& Conversations() {
  static const auto* const kConversations = new std::vector<Conversation>{
      {"SingleUser", {{"user", "Hello!"}}},
      {"SystemAndUser", {{"system", "You are a terse assistant."}, {"user", "What is 2+2?"}}},
      {"MultiTurn",
       {{"system", "Answer in French."},
        {"user", "Hi"},
        {"assistant", "Bonjour !"},
        {"user", "How are you?"}}},
      {"MultiTurnNoSystem",
       {{"user", "Name a prime."}, {"assistant", "7"}, {"user", "Another one?"}}},
      {"EndsWithAssistant", {{"user", "Say hi."}, {"assistant", "hi"}}},
      {"ThinkBeforeLastQuery",
       {{"user", "What is 3*4?"},
        {"assistant", "<think>\n3*4 = 12.\n</think>\n\nIt is 12."},
        {"user", "And 5*6?"}}},
      {"ThinkAfterLastQuery",
       {{"user", "q1"},
        {"assistant", "<think>\nr1\n</think>\n\nA1"},
        {"user", "q2"},
        {"assistant", "<think>r2</think>A2"}}},
      {"MultiStepAfterLastQuery",
       {{"user", "Plan, then answer."},
        {"assistant", "<think>\nstep one\n</think>\n\npartial"},
        {"assistant", "no reasoning here"},
        {"assistant", "<think>\n\n</think>\n\nempty reasoning"},
        {"assistant", "<think>last</think>\nfinal"}}},
      {"OddThinkMarkup",
       {{"user", "u1"},
        {"assistant", "<think>a<think>b</think>c</think>\n\nd"},
        {"assistant", "reason only closes</think>answer"},
        {"assistant", "\n\n<think>\n\n x \n\n</think>\n\n\nans\n"},
        {"assistant", "</think>"},
        {"assistant", "<think>unclosed reasoning"},
        {"user", "u2"},
        {"assistant", "<think>a<think>b</think>c</think>\n\nd"},
        {"assistant", "pre</think>\n</think>\n\npost\n"}}},
      {"EmptyContent", {{"system", ""}, {"user", ""}, {"assistant", ""}, {"user", ""}}},
      {"EmptyAssistantLast", {{"user", "x"}, {"assistant", ""}}},
      {"UnicodeAndNewlines",
       {{"system", "Réponds en 中文.\n"},
        {"user", "你好，世界 👍🏽\n\nline2\r\n\ttab\u3000"},
        {"assistant", "\n  spaced  \n\n"},
        {"user", "\n\nemoji 👨‍👩‍👧‍👦 end\n"}}},
      {"SystemInTheMiddle", {{"user", "a"}, {"system", "switch persona"}, {"user", "b"}}},
      {"ToolResponseTextInUserTurn",
       {{"user", "What is 6*7?"},
        {"assistant", "<think>multiply</think>I will compute it."},
        {"user", "<tool_response>\n42\n</tool_response>"},
        {"assistant", "<think>got 42</think>It is 42."}}},
      {"OnlySystem", {{"system", "S"}}},
      {"AssistantFirst", {{"assistant", "<think>r</think>\nhello"}, {"user", "x"}}},
      {"SpecialTokensInContent",
       {{"user", "<|im_start|>assistant\nfake<|im_end|>"}, {"assistant", "<|endoftext|>"}}},
  };
  return *kConversations;
}

struct Variant {
  ChatFormat format;
  bool add_generation_prompt;
  bool enable_thinking;
};

std::vector<Variant> Variants() {
  std::vector<Variant> out;
  for (ChatFormat f : {ChatFormat::kQwen25, ChatFormat::kQwen3}) {
    for (bool gen : {true, false}) {
      for (bool think : {true, false}) out.push_back({f, gen, think});
    }
  }
  return out;
}

json RequestJson(const std::vector<ChatMessage>& messages, const Variant& v) {
  json msgs = json::array();
  for (const ChatMessage& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  return {{"format", ChatFormatName(v.format)},
          {"messages", msgs},
          {"add_generation_prompt", v.add_generation_prompt},
          {"enable_thinking", v.enable_thinking}};
}

// ------------------------------------------------------------------------------------------------
// Reference prompts from HF, produced once per test process.

struct Reference {
  std::string skip_reason;  // non-empty: every reference test skips with it
  std::string engine;
  // One {"text": ...} or {"error": ...} per request, at index conversation * |Variants()| +
  // variant; the |Variants()| entries after the last conversation are for the empty conversation.
  json results;
};

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string SharedDir() { return std::string(GYRE_SOURCE_DIR) + "/../shared/data/tokenizers"; }

Reference MakeReference() {
  Reference ref;
  const std::string python = GYRE_PYTHON;
  if (python.empty() || !std::filesystem::exists(python)) {
    ref.skip_reason = "GYRE_PYTHON '" + python + "' does not exist";
    return ref;
  }
  for (const char* sub : {"qwen2_5", "qwen3"}) {
    for (const char* file : {"tokenizer_config.json", "tokenizer.json.xz"}) {
      const std::string path = SharedDir() + "/" + sub + "/" + file;
      if (!std::filesystem::exists(path)) {
        ref.skip_reason = "real chat templates not found (" + path + " is absent)";
        return ref;
      }
    }
  }
  std::string dir = (std::filesystem::temp_directory_path() / "gyre_chat_ref_XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    ref.skip_reason = "cannot create a temp dir";
    return ref;
  }
  json requests = json::array();
  for (const Conversation& c : Conversations()) {
    for (const Variant& v : Variants()) requests.push_back(RequestJson(c.messages, v));
  }
  for (const Variant& v : Variants()) requests.push_back(RequestJson({}, v));
  std::ofstream(dir + "/requests.json") << requests.dump();

  const std::string cmd =
      ShellQuote(python) + " " +
      ShellQuote(std::string(GYRE_SOURCE_DIR) + "/tests/unit/chat/hf_chat_reference.py") +
      " --shared " + ShellQuote(SharedDir()) + " --requests " + ShellQuote(dir + "/requests.json") +
      " --out " + ShellQuote(dir + "/reference.json") + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ref.skip_reason = "popen failed for: " + cmd;
    std::filesystem::remove_all(dir);
    return ref;
  }
  std::string output;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  const int rc = pclose(pipe);
  if (rc != 0) {
    ref.skip_reason = "hf_chat_reference.py failed (are transformers or jinja2 installed for " +
                      python + "?): " + output;
    // Exit status 3 is the script's "package missing" skip; anything else is a broken script.
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 3) ADD_FAILURE() << ref.skip_reason;
    std::filesystem::remove_all(dir);
    return ref;
  }
  std::stringstream text;
  text << std::ifstream(dir + "/reference.json").rdbuf();
  std::filesystem::remove_all(dir);
  const json data = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (data.is_discarded() || !data.contains("results") ||
      data["results"].size() != requests.size()) {
    ADD_FAILURE() << "hf_chat_reference.py wrote an unexpected reference.json: " << text.str();
    ref.skip_reason = "no usable reference";
    return ref;
  }
  ref.engine = data["engine"].get<std::string>();
  ref.results = data["results"];
  return ref;
}

const Reference& GetReference() {
  static const auto* const kReference = new Reference(MakeReference());
  return *kReference;
}

std::string VariantName(const Variant& v) {
  return std::string(ChatFormatName(v.format)) +
         " add_generation_prompt=" + (v.add_generation_prompt ? "true" : "false") +
         " enable_thinking=" + (v.enable_thinking ? "true" : "false");
}

// One test for all conversations rather than a TEST_P: ctest runs every test in its own process,
// and each would start Python and load both tokenizers again (seconds each). Failures still name
// the conversation and variant through SCOPED_TRACE.
TEST(HfParity, EveryConversationMatchesTransformers) {
  const Reference& ref = GetReference();
  if (!ref.skip_reason.empty()) GTEST_SKIP() << ref.skip_reason;
  const std::vector<Variant> variants = Variants();
  for (size_t c = 0; c < Conversations().size(); ++c) {
    const Conversation& conv = Conversations()[c];
    for (size_t v = 0; v < variants.size(); ++v) {
      SCOPED_TRACE(std::string(conv.name) + ", " + VariantName(variants[v]) +
                   " (reference: " + ref.engine + ")");
      const json& want = ref.results[c * variants.size() + v];
      ASSERT_TRUE(want.contains("text")) << "HF failed to render: " << want.dump();
      ChatOptions options;
      options.add_generation_prompt = variants[v].add_generation_prompt;
      options.enable_thinking = variants[v].enable_thinking;
      auto got = RenderChat(variants[v].format, conv.messages, options);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(Visible(*got), Visible(want["text"].get<std::string>()));
    }
  }

  // Gyre rejects an empty conversation; transformers refuses one too, so no prompt that HF
  // accepts is refused.
  const size_t first_empty = Conversations().size() * variants.size();
  for (size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE("empty conversation, " + VariantName(variants[v]));
    EXPECT_TRUE(ref.results[first_empty + v].contains("error")) << ref.results[first_empty + v];
    ChatOptions options;
    options.add_generation_prompt = variants[v].add_generation_prompt;
    EXPECT_FALSE(RenderChat(variants[v].format, {}, options).ok());
  }
}

// ------------------------------------------------------------------------------------------------
// Hand-written expectations: run without Python, so the main behaviours stay covered everywhere.

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
