// The Jinja renderer (text/jinja.h) against what jinja2 and transformers rendered, stored in
// jinja_golden.json by tools/make_jinja_golden.py: Gyre-written templates per construct, and the
// real Qwen2.5, Qwen3 and SmolLM2 chat templates over a corpus with tools, tool calls, tool
// responses and reasoning. Every render must be byte-identical. The Qwen templates are the
// committed fixtures tests/fixtures/chat_templates/*.jinja (SmolLM2's is stored in the golden), so
// nothing here depends on files outside the repository. Also proves the hand-written RenderChat
// formats identical to the real templates, and checks error reporting.

#include "text/jinja.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_paths.h"
#include "testing/text_format.h"
#include "text/chat_template.h"

namespace gyre::text {
namespace {

using testing::Visible;

using Json = nlohmann::ordered_json;

const Json& Golden() {
  static const Json golden = [] {
    const std::string path = std::string(GYRE_SOURCE_DIR) + "/tests/unit/chat/jinja_golden.json";
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  }();
  return golden;
}

StatusOr<std::string> RenderText(const std::string& source, const std::string& context) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(context);
}

TEST(JinjaGoldenTest, FileIsValid) {
  const Json& g = Golden();
  ASSERT_FALSE(g.is_discarded()) << "jinja_golden.json is missing or not valid JSON";
  EXPECT_EQ(g.value("magic", ""), "gyre-golden");
  EXPECT_EQ(g.value("kind", ""), "jinja");
  EXPECT_EQ(g.value("version", 0), 1);
}

// Each Gyre-written construct template renders what jinja2 rendered, or fails where it failed.
TEST(JinjaGoldenTest, ConstructsMatchJinja2) {
  const Json& g = Golden();
  ASSERT_FALSE(g.is_discarded());
  int identical = 0, total = 0;
  for (const Json& c : g["constructs"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name + " (reference: " + g["reference"].get<std::string>() + ")");
    ++total;
    auto got = RenderText(c["template"].get<std::string>(), c["context"].dump());
    if (c.contains("error")) {
      EXPECT_FALSE(got.ok()) << "jinja2 raised " << c["error"] << "; Gyre rendered: " << *got;
      if (!got.ok()) ++identical;
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Visible(*got), Visible(c["text"].get<std::string>()));
    if (*got == c["text"].get<std::string>()) ++identical;
  }
  printf("jinja constructs: %d/%d as jinja2\n", identical, total);
  EXPECT_EQ(identical, total);
  EXPECT_GE(total, 60);
}

struct RealTemplate {
  std::string name;
  std::string source;
};

// The template of a golden entry: stored in it, or in the fixture file it names.
RealTemplate LoadReal(const Json& entry) {
  RealTemplate t;
  t.name = entry["name"].get<std::string>();
  if (entry.contains("template")) {
    t.source = entry["template"].get<std::string>();
    return t;
  }
  const std::string path =
      std::string(GYRE_SOURCE_DIR) + "/" + entry["template_file"].get<std::string>();
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << t.name << ": cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  t.source = ss.str();
  return t;
}

std::string ContextFor(const Json& conversation, const Json& render, const Json& special) {
  Json kwargs = special;
  for (const auto& [k, v] : render["kwargs"].items()) kwargs[k] = v;
  const Json& tools = conversation["tools"];
  auto ctx =
      MakeChatTemplateContext(conversation["messages"].dump(), tools.is_null() ? "" : tools.dump(),
                              render["add_generation_prompt"].get<bool>(), kwargs.dump());
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  return ctx.ok() ? *ctx : "{}";
}

// The real templates over the whole corpus: every render byte-identical to apply_chat_template.
TEST(JinjaGoldenTest, RealTemplatesMatchTransformers) {
  const Json& g = Golden();
  ASSERT_FALSE(g.is_discarded());
  int identical = 0, total = 0;
  for (const Json& entry : g["templates"]) {
    const RealTemplate t = LoadReal(entry);
    ASSERT_FALSE(t.source.empty()) << t.name;
    auto tmpl = ChatTemplate::Parse(t.source);
    ASSERT_TRUE(tmpl.ok()) << t.name << ": " << tmpl.status();
    int ok_here = 0, here = 0;
    for (const Json& r : entry["renders"]) {
      const std::string conv = r["conversation"].get<std::string>();
      SCOPED_TRACE(t.name + " / " + conv + " add_generation_prompt=" +
                   r["add_generation_prompt"].dump() + " kwargs=" + r["kwargs"].dump());
      ++total;
      ++here;
      auto got = tmpl->Render(ContextFor(g["conversations"][conv], r, entry["special_tokens"]));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(Visible(*got), Visible(r["text"].get<std::string>()));
      if (*got == r["text"].get<std::string>()) {
        ++identical;
        ++ok_here;
      }
    }
    printf("jinja %s: %d/%d byte-identical to transformers\n", t.name.c_str(), ok_here, here);
  }
  printf("jinja real templates: %d/%d byte-identical to transformers\n", identical, total);
  EXPECT_EQ(identical, total);
  EXPECT_EQ(g["templates"].size(), 3u) << "qwen2.5, qwen3 and smollm2";
  EXPECT_GE(total, 150);
}

// The hand-written fast paths (RenderChat) agree with the real templates rendered by the Jinja
// engine on every conversation they support (plain system/user/assistant text).
TEST(JinjaGoldenTest, HandWrittenFormatsEqualRealTemplates) {
  const Json& g = Golden();
  ASSERT_FALSE(g.is_discarded());
  int identical = 0, total = 0;
  for (const Json& entry : g["templates"]) {
    const RealTemplate t = LoadReal(entry);
    ASSERT_FALSE(t.source.empty()) << t.name;
    auto format = ParseChatFormat(t.name);
    ASSERT_TRUE(format.ok()) << format.status();
    auto tmpl = ChatTemplate::Parse(t.source);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    for (const Json& r : entry["renders"]) {
      const Json& conv = g["conversations"][r["conversation"].get<std::string>()];
      if (!conv["tools"].is_null()) continue;
      std::vector<ChatMessage> messages;
      bool plain = true;
      for (const Json& m : conv["messages"]) {
        const std::string role = m["role"].get<std::string>();
        plain = plain && m.size() == 2 && m["content"].is_string() &&
                (role == "system" || role == "user" || role == "assistant");
        if (plain) messages.push_back({role, m["content"].get<std::string>()});
      }
      if (!plain) continue;
      SCOPED_TRACE(t.name + " / " + r["conversation"].get<std::string>());
      ChatOptions options;
      options.add_generation_prompt = r["add_generation_prompt"].get<bool>();
      options.enable_thinking = r["kwargs"].value("enable_thinking", true);
      auto fast = RenderChat(*format, messages, options);
      ASSERT_TRUE(fast.ok()) << fast.status();
      auto jinja = tmpl->Render(ContextFor(conv, r, entry["special_tokens"]));
      ASSERT_TRUE(jinja.ok()) << jinja.status();
      ++total;
      EXPECT_EQ(Visible(*fast), Visible(*jinja));
      if (*fast == *jinja) ++identical;
    }
  }
  printf("hand-written formats: %d/%d identical to the Jinja render of the real template\n",
         identical, total);
  EXPECT_GE(total, 20);
  EXPECT_EQ(identical, total);
}

// ---- errors

std::string ErrorOf(const std::string& source, const std::string& context = "{}") {
  auto got = RenderText(source, context);
  EXPECT_FALSE(got.ok()) << "rendered: " << (got.ok() ? *got : "");
  return got.ok() ? "" : got.status().message();
}

TEST(JinjaErrorTest, UnsupportedTagNamesTheLine) {
  const std::string msg =
      ErrorOf("line one\n{% if true %}\n  {% include 'x.jinja' %}\n{% endif %}");
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported tag 'include'"), std::string::npos) << msg;
  EXPECT_NE(ErrorOf("\n\n{% raw %}x{% endraw %}").find("line 3"), std::string::npos);
}

TEST(JinjaErrorTest, UnsupportedFilterAndTestNameTheLine) {
  std::string msg = ErrorOf("a\n{{ x | wordcount }}", R"({"x": "a b"})");
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported filter 'wordcount'"), std::string::npos) << msg;
  msg = ErrorOf("\n\n\n{{ x is escaped }}", R"({"x": 1})");
  EXPECT_NE(msg.find("line 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported test 'escaped'"), std::string::npos) << msg;
  msg = ErrorOf("{{ 'a'.zfill(3) }}");
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
}

TEST(JinjaErrorTest, RaiseExceptionMessageSurfaces) {
  const std::string msg = ErrorOf(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must "
      "alternate user/assistant/user/assistant/...') }}{% endif %}",
      R"({"messages": [{"role": "assistant", "content": "x"}]})");
  EXPECT_NE(msg.find("Conversation roles must alternate user/assistant/user/assistant/..."),
            std::string::npos)
      << msg;
}

TEST(JinjaErrorTest, MalformedTemplatesFailClearly) {
  std::string msg = ErrorOf("a\n{% for x in y %}\n{{ x }}");
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'for' is never closed"), std::string::npos) << msg;
  msg = ErrorOf("{% if x %}a{% endfor %}");
  EXPECT_NE(msg.find("unexpected 'endfor'"), std::string::npos) << msg;
  msg = ErrorOf("ok\n{{ x ");
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never closed"), std::string::npos) << msg;
  msg = ErrorOf("{# comment");
  EXPECT_NE(msg.find("never closed"), std::string::npos) << msg;
  msg = ErrorOf("{{ 'abc }}");
  EXPECT_NE(msg.find("string literal is never closed"), std::string::npos) << msg;
  msg = ErrorOf("{{ 1 + }}");
  EXPECT_NE(msg.find("line 1, column"), std::string::npos) << msg;
  msg = ErrorOf("{{ a b }}");
  EXPECT_NE(msg.find("expected the end of the tag"), std::string::npos) << msg;
  msg = ErrorOf("{% for x in [1] recursive %}{% endfor %}");
  EXPECT_NE(msg.find("recursive"), std::string::npos) << msg;
}

TEST(JinjaErrorTest, LimitsStopRunawayTemplates) {
  EXPECT_NE(ErrorOf("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}"
                    "{% endfor %}")
                .find("loop iterations"),
            std::string::npos);
  EXPECT_NE(ErrorOf("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("64"),
            std::string::npos);
  EXPECT_NE(ErrorOf("{{ 'x' * 100000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(ErrorOf("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("too deeply"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(300, '{') + "% if x %}").find("line 1"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_NE(ErrorOf(chain + " }}").find("too deeply"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 150; ++i) blocks += "{% if true %}";
  blocks += "{{ f() }}";
  for (int i = 0; i < 150; ++i) blocks += "{% endif %}";
  EXPECT_NE(ErrorOf("{% macro f() %}" + blocks + "{% endmacro %}{{ f() }}").find("too deeply"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf("{% set ns = namespace(x=[]) %}\n{% for i in range(1000) %}{% set ns.x = [ns.x] "
              "%}{% endfor %}{{ ns.x }}")
          .find("line 2: value nested more than 512 deep"),
      std::string::npos);
  EXPECT_NE(ErrorOf("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

TEST(JinjaErrorTest, ContextMustBeAnObject) {
  auto tmpl = ChatTemplate::Parse("x");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_FALSE(tmpl->Render("[1]").ok());
  EXPECT_FALSE(tmpl->Render("not json").ok());
}

// ---- LoadChatTemplate

class LoadChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gyre_jinja_load_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(LoadChatTemplateTest, ReadsStringForm) {
  Write("tokenizer_config.json", R"({"chat_template": "{{ messages[0].content }}"})");
  auto t = LoadChatTemplate(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "{{ messages[0].content }}");
}

TEST_F(LoadChatTemplateTest, ListFormSelectsDefault) {
  Write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  auto t = LoadChatTemplate(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "D");
  Write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_FALSE(LoadChatTemplate(dir_.string()).ok());
}

TEST_F(LoadChatTemplateTest, JinjaFileWins) {
  Write("tokenizer_config.json", R"({"chat_template": "from config"})");
  Write("chat_template.jinja", "from file");
  auto t = LoadChatTemplate(dir_.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "from file");
}

TEST_F(LoadChatTemplateTest, MissingOrMalformed) {
  auto t = LoadChatTemplate(dir_.string());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  Write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_EQ(LoadChatTemplate(dir_.string()).status().code(), StatusCode::kNotFound);
  Write("tokenizer_config.json", "{not json");
  EXPECT_EQ(LoadChatTemplate(dir_.string()).status().code(), StatusCode::kInvalidArgument);
  Write("tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_EQ(LoadChatTemplate(dir_.string()).status().code(), StatusCode::kInvalidArgument);
}

TEST(MakeChatTemplateContextTest, BuildsWhatTransformersPasses) {
  auto ctx = MakeChatTemplateContext(R"([{"role": "user", "content": "hi", "tool_calls": null}])",
                                     "", true, R"({"enable_thinking": false})");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto got = RenderText(
      "{{ messages[0].tool_calls is defined }} {{ tools is none }} {{ add_generation_prompt }} "
      "{{ enable_thinking }}",
      *ctx);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "False True True False");
  EXPECT_FALSE(MakeChatTemplateContext("{}", "", true, "").ok());
  EXPECT_FALSE(MakeChatTemplateContext("[]", "{", true, "").ok());
  EXPECT_FALSE(MakeChatTemplateContext("[]", "", true, "[]").ok());
}

}  // namespace
}  // namespace gyre::text
