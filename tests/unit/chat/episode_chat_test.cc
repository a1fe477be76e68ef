// text/episode_chat.h: a demonstration cut where an episode cuts it, and the text between turns,
// with the tiny model's template (configs/templates/tiny_tools.jinja) and a ChatML-style one
// whose end-of-turn text the model's stop token writes.

#include "text/episode_chat.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace gyre::text {
namespace {

using nlohmann::json;

const json kDemo =
    json::array({{{"role", "user"}, {"content", "622*12"}},
                 {{"role", "assistant"},
                  {"content",
                   "<tool_call>{\"name\":\"calculate\",\"arguments\":{\"expression\":\"622*12\"}}"
                   "</tool_call>"}},
                 {{"role", "tool"}, {"name", "calculate"}, {"content", "7464"}},
                 {{"role", "assistant"}, {"content", "7464"}}});

EpisodeChat Tiny() {
  auto chat = EpisodeChat::Load(
      std::string(GYRE_SOURCE_DIR) + "/configs/templates/tiny_tools.jinja", "", "");
  EXPECT_TRUE(chat.ok()) << chat.status();
  return *chat;
}

TEST(EpisodeChatTest, ADemonstrationIsCutIntoPromptModelTurnsAndTheTextBetween) {
  auto demo = RenderDemonstration(Tiny().AsFunction(), kDemo.dump(), "", "");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ(demo->prompt, "Q:622*12|A:");
  ASSERT_EQ(demo->pieces.size(), 3u);
  EXPECT_TRUE(demo->pieces[0].model);
  EXPECT_EQ(demo->pieces[0].text, kDemo[1]["content"].get<std::string>());
  EXPECT_FALSE(demo->pieces[1].model);
  EXPECT_EQ(demo->pieces[1].text, "|R:7464|A:");
  EXPECT_TRUE(demo->pieces[2].model);
  EXPECT_EQ(demo->pieces[2].text, "7464");
  // The pieces put together are the template's rendering of the whole conversation, less the
  // separator after the last turn (the stop token ends it).
  auto whole = Tiny().Render(kDemo.dump(), "", false);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::string joined = demo->prompt;
  for (const auto& p : demo->pieces) joined += p.text;
  EXPECT_EQ(joined + "|", *whole);
}

TEST(EpisodeChatTest, TheEndOfTurnTextTheStopTokenWroteIsNotInsertedAgain) {
  const std::string chatml =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const std::string path = ::testing::TempDir() + "/chatml.jinja";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(chatml.c_str(), f);
  std::fclose(f);
  auto chat = EpisodeChat::Load(path, "", "");
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto demo = RenderDemonstration(chat->AsFunction(), kDemo.dump(), "", "<|im_end|>");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ(demo->prompt, "<|im_start|>user\n622*12<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_EQ(demo->pieces.size(), 3u);
  EXPECT_EQ(demo->pieces[1].text, "\n<|im_start|>tool\n7464<|im_end|>\n<|im_start|>assistant\n");
}

TEST(EpisodeChatTest, BadInputIsAClearError) {
  const ChatRenderFn render = Tiny().AsFunction();
  auto no_assistant = RenderDemonstration(render, R"([{"role":"user","content":"x"}])", "", "");
  ASSERT_FALSE(no_assistant.ok());
  EXPECT_NE(no_assistant.status().message().find("needs an assistant message"), std::string::npos);
  auto first = RenderDemonstration(render, R"([{"role":"assistant","content":"x"}])", "", "");
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.status().message().find("starts with the environment's messages"),
            std::string::npos);
  auto calls = RenderDemonstration(
      render, R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[]}])", "", "");
  ASSERT_FALSE(calls.ok());
  EXPECT_NE(calls.status().message().find("message 1"), std::string::npos) << calls.status();
  auto role =
      RenderDemonstration(render,
                          R"([{"role":"user","content":"x"},{"role":"assistant","content":"a"},)"
                          R"({"role":"robot","content":"?"},{"role":"assistant","content":"b"}])",
                          "", "");
  ASSERT_FALSE(role.ok());
  EXPECT_NE(role.status().message().find("unknown role robot"), std::string::npos) << role.status();
  auto builtin = EpisodeChat::Load("", "", "");
  ASSERT_FALSE(builtin.ok());
  EXPECT_NE(builtin.status().message().find("env.chat_template"), std::string::npos);
  auto missing = EpisodeChat::Load("/nonexistent/t.jinja", "", "");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/t.jinja"), std::string::npos);
  auto kwargs = EpisodeChat::Load(
      std::string(GYRE_SOURCE_DIR) + "/configs/templates/tiny_tools.jinja", "", "[1]");
  ASSERT_FALSE(kwargs.ok());
  EXPECT_NE(kwargs.status().message().find("JSON object"), std::string::npos);
}

}  // namespace
}  // namespace gyre::text
