// Multi-turn episodes against a real environment server process (tests/unit/agent/
// test_servers.py, written with the Python SDK): a tiny random model with the character
// tokenizer, a Gyre-written chat template rendered by text::ChatTemplate, the paged engine.

#include "rollout/episode_runner.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/service_supervisor.h"
#include "model/transformer.h"
#include "rollout/rollout_service.h"
#include "test_paths.h"
#include "testing/dependency.h"
#include "testing/tiny_model.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

namespace gyre::rollout {
namespace {

using Clock = std::chrono::steady_clock;

// One line per message, no newlines (the character tokenizer has printable ASCII only).
constexpr char kTemplate[] =
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}U:{{ m.content }}|"
    "{%- elif m.role == 'tool' -%}T:{{ m.content }}|"
    "{%- elif m.role == 'assistant' -%}A:{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}A:{%- endif -%}";

class EpisodeRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(GYRE_SDK_PATH).empty()) {
      GYRE_MISSING_DEPENDENCY(::gyre::testing::kFixGrpc)
          << GYRE_PYTHON << " had no grpcio/grpcio-tools when the build was configured";
    }
    char tmpl[] = "/tmp/gyre-episodes-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    agent::ServiceOptions o;
    o.command = {"/usr/bin/env", std::string("PYTHONPATH=") + GYRE_SDK_PATH,
                 GYRE_PYTHON,    std::string(GYRE_SOURCE_DIR) + "/tests/unit/agent/test_servers.py",
                 "turns",        "--port",
                 "{port}"};
    o.log_path = dir_ + "/env.log";
    o.ready_timeout_s = 30;
    auto sup = agent::ServiceSupervisor::Start(o);
    ASSERT_TRUE(sup.ok()) << sup.status();
    service_ = std::move(*sup);
    model_ = model::Transformer::Create(testing::TinySpec(98, 32, 2, 4, 2, 48, 512), 31, 0.5);
    EngineConfig c;
    c.block_size = 8;
    c.num_blocks = 512;
    c.max_running = 16;
    c.cuda_graphs = false;
    auto e = RolloutEngine::Create(model_.get(), c);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    auto t = text::ChatTemplate::Parse(kTemplate);
    ASSERT_TRUE(t.ok()) << t.status();
    template_ = std::make_unique<text::ChatTemplate>(std::move(*t));
  }
  void TearDown() override {
    service_.reset();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  EpisodeRunner Runner(agent::EnvClient* env, EpisodeOptions o) {
    auto render = [this](const std::string& messages, const std::string& tools,
                         bool gen) -> StatusOr<std::string> {
      GYRE_ASSIGN_OR_RETURN(std::string ctx,
                            text::MakeChatTemplateContext(messages, tools, gen, ""));
      return template_->Render(ctx);
    };
    auto encode = [this](const std::string& text) { return chars_.Encode(text); };
    auto decode = [this](const std::vector<int32_t>& ids) { return chars_.Decode(ids); };
    return EpisodeRunner(engine_.get(), env, render, encode, decode, o);
  }
  static EpisodeOptions Options() {
    EpisodeOptions o;
    o.sampling.temperature = 1.0f;
    o.sampling.max_new_tokens = 400;
    // A turn ends at any digit: a few tokens per turn from a random model.
    for (char c = '0'; c <= '9'; ++c) o.sampling.stop_token_ids.push_back(3 + (c - ' '));
    o.max_turns = 8;
    o.episode_timeout_s = 60;
    return o;
  }
  static std::vector<Episode> Episodes(const std::vector<nlohmann::json>& tasks) {
    std::vector<Episode> eps;
    for (size_t i = 0; i < tasks.size(); ++i) {
      Episode e;
      e.id = 100 + i;
      e.group = i / 2;
      e.seed = 1000 * (i + 1);
      e.task_json = tasks[i].dump();
      eps.push_back(e);
    }
    return eps;
  }

  std::string dir_;
  std::unique_ptr<agent::ServiceSupervisor> service_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<RolloutEngine> engine_;
  std::unique_ptr<text::ChatTemplate> template_;
  text::CharTokenizer chars_;
};

TEST_F(EpisodeRunnerTest, TurnsKeepTheModelsTokensAndInsertTheEnvironmentsWithMaskZero) {
  agent::EnvClient env(service_.get(), agent::EnvTimeouts{});
  // Every token the engine samples, per episode, in order.
  std::map<uint64_t, std::vector<int32_t>> sampled;
  engine_->SetTokenCallback(
      [&](uint64_t id, int32_t, int32_t token) { sampled[id].push_back(token); });
  auto eps = Episodes({{{"prompt", "add 2 and 3"}, {"turns", 3}},
                       {{"prompt", "add 2 and 3"}, {"turns", 3}},
                       {{"prompt", "x"}, {"turns", 1}},
                       {{"prompt", "long one"}, {"turns", 5}}});
  auto got = Runner(&env, Options()).Run(eps);
  ASSERT_TRUE(got.ok()) << got.status();
  int64_t inserted_total = 0, continuations = 0, prompts = 0;
  for (size_t i = 0; i < got->size(); ++i) {
    const Episode& e = (*got)[i];
    const int want_turns = nlohmann::json::parse(e.task_json)["turns"];
    SCOPED_TRACE("episode " + std::to_string(i));
    ASSERT_TRUE(e.terminated) << e.status;
    EXPECT_FALSE(e.truncated);
    EXPECT_EQ(e.status, "");
    ASSERT_EQ(static_cast<int>(e.turns.size()), want_turns);
    EXPECT_NEAR(e.reward, 1.0 + 0.1 * (want_turns - 1), 1e-9);
    // The prompt is the template's rendering of the opening message.
    const std::string task_prompt = nlohmann::json::parse(e.task_json)["prompt"];
    EXPECT_EQ(*chars_.Encode("U:" + task_prompt + "|A:"), e.prompt);
    prompts += static_cast<int64_t>(e.prompt.size());
    // The prefix property, turn by turn: the model's tokens exactly as sampled, then exactly
    // what the template puts between turns for the observation, with loss mask 0.
    ASSERT_EQ(e.loss_mask.size(), e.response.tokens.size());
    std::vector<int32_t> model_tokens;
    int64_t at = 0;
    for (size_t k = 0; k < e.turns.size(); ++k) {
      const TurnRecord& t = e.turns[k];
      EXPECT_EQ(t.begin, at);
      EXPECT_LT(t.begin, t.end);
      for (int64_t p = t.begin; p < t.end; ++p) {
        EXPECT_EQ(e.loss_mask[p], 1.0f);
        model_tokens.push_back(e.response.tokens[p]);
      }
      const std::vector<int32_t> obs(e.response.tokens.begin() + t.end,
                                     e.response.tokens.begin() + t.observation_end);
      if (k + 1 < e.turns.size()) {
        EXPECT_EQ(chars_.Decode(obs), "T:obs" + std::to_string(k) + "|A:");
        ++continuations;
        inserted_total += static_cast<int64_t>(obs.size());
      } else {
        EXPECT_TRUE(obs.empty());
      }
      for (int64_t p = t.end; p < t.observation_end; ++p) {
        EXPECT_EQ(e.loss_mask[p], 0.0f);
        EXPECT_EQ(e.response.logprobs[p], 0.0f);
      }
      at = t.observation_end;
    }
    EXPECT_EQ(at, static_cast<int64_t>(e.response.tokens.size()));
    EXPECT_EQ(model_tokens, sampled[i]) << "the trajectory holds exactly the sampled tokens";
  }
  // Each continuation computed only its new tokens (the turn's last token and the inserted
  // ones); the rest of the context came from the parked KV.
  EXPECT_EQ(engine_->stats().prefill_tokens, prompts + inserted_total + continuations);
  EXPECT_GT(engine_->stats().parked_reused_tokens, 0);
  EXPECT_EQ(engine_->parked_sequences(), 0);
  EXPECT_EQ(engine_->allocator().used_blocks(), 0);
}

TEST_F(EpisodeRunnerTest, OtherEpisodesDecodeWhileOneWaitsForItsEnvironment) {
  agent::EnvClient env(service_.get(), agent::EnvTimeouts{});
  // When each token was sampled, per episode.
  std::map<uint64_t, std::vector<Clock::time_point>> when;
  engine_->SetTokenCallback(
      [&](uint64_t id, int32_t, int32_t) { when[id].push_back(Clock::now()); });
  auto eps = Episodes({{{"prompt", "slow"}, {"turns", 2}, {"sleep", 3.0}},
                       {{"prompt", "fast"}, {"turns", 6}},
                       {{"prompt", "fast"}, {"turns", 6}}});
  auto got = Runner(&env, Options()).Run(eps);
  ASSERT_TRUE(got.ok()) << got.status();
  for (const Episode& e : *got) EXPECT_TRUE(e.terminated) << e.status;
  // The slow episode's second turn starts after its environment's 3 s step; both fast episodes
  // ran all six turns (five environment steps each) before that.
  const Episode& slow = (*got)[0];
  ASSERT_EQ(slow.turns.size(), 2u);
  const size_t first_turn_tokens = static_cast<size_t>(slow.turns[0].end - slow.turns[0].begin);
  ASSERT_GT(when[0].size(), first_turn_tokens);
  const Clock::time_point resumed = when[0][first_turn_tokens];
  EXPECT_GE(std::chrono::duration<double>(resumed - when[0][first_turn_tokens - 1]).count(), 2.9);
  for (uint64_t id : {1, 2}) {
    EXPECT_EQ((*got)[id].turns.size(), 6u);
    EXPECT_LT(when[id].back(), resumed) << "fast episode " << id << " waited for the slow one";
  }
}

TEST_F(EpisodeRunnerTest, LimitsEndEpisodesTruncatedWithTheReason) {
  agent::EnvClient env(service_.get(), agent::EnvTimeouts{});
  EpisodeOptions o = Options();
  o.max_turns = 2;
  auto got = Runner(&env, o).Run(Episodes({{{"prompt", "p"}, {"turns", 5}}}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].truncated);
  EXPECT_EQ((*got)[0].status, "turn limit (max_turns 2)");
  EXPECT_EQ((*got)[0].turns.size(), 2u);

  o = Options();
  o.sampling.stop_token_ids = {2};  // EOS only: the random model runs into the token limit
  o.sampling.max_new_tokens = 12;
  got = Runner(&env, o).Run(Episodes({{{"prompt", "p"}, {"turns", 5}}}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].truncated);
  EXPECT_EQ((*got)[0].status, "token limit (max_new_tokens 12)");

  // The episode's time bounds its environment step too: a 5 s step is cut at 0.5 s.
  o = Options();
  o.episode_timeout_s = 0.5;
  const auto t0 = Clock::now();
  got = Runner(&env, o).Run(Episodes({{{"prompt", "p"}, {"turns", 5}, {"sleep", 5.0}}}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
  EXPECT_TRUE((*got)[0].truncated);
  EXPECT_EQ((*got)[0].status, "episode timeout (0.5 s)");

  // A Reset the environment refuses (no "prompt" in the task) fails only that episode.
  got = Runner(&env, Options()).Run(Episodes({{{"turns", 1}}, {{"prompt", "ok"}, {"turns", 1}}}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].failed);
  EXPECT_NE((*got)[0].status.find("reset failed"), std::string::npos) << (*got)[0].status;
  EXPECT_TRUE((*got)[1].terminated);
}

TEST_F(EpisodeRunnerTest, AKilledEnvironmentTruncatesItsEpisodesAndTheNextRunWorks) {
  agent::EnvClient env(service_.get(), agent::EnvTimeouts{});
  const pid_t pid = service_->pid();
  std::thread killer([pid] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    ::kill(pid, SIGKILL);
  });
  auto got = Runner(&env, Options())
                 .Run(Episodes({{{"prompt", "a"}, {"turns", 4}, {"sleep", 0.6}},
                                {{"prompt", "b"}, {"turns", 4}, {"sleep", 0.6}}}));
  killer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  for (const Episode& e : *got) {
    EXPECT_TRUE(e.truncated);
    EXPECT_NE(e.status.find("environment:"), std::string::npos) << e.status;
    EXPECT_FALSE(e.turns.empty());
  }
  ASSERT_TRUE(service_->AwaitServing().ok());
  EXPECT_EQ(service_->restarts(), 1);
  got = Runner(&env, Options()).Run(Episodes({{{"prompt", "c"}, {"turns", 2}}}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].terminated) << (*got)[0].status;
}

// The rollout worker's side (RolloutService::Generate with env_address): the samples it returns,
// which the controller passes to the trainer unchanged, hold exactly the episodes' prompt,
// tokens, masks and log-probs, as EpisodeRunner on the same weights and seeds produces them.
TEST_F(EpisodeRunnerTest, GenerateReturnsTheEpisodesAsSamplesTokenForToken) {
  auto model = model::Transformer::Create(testing::TinySpec(98, 32, 2, 4, 2, 48, 512), 31, 0.5);
  EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 512;
  c.max_running = 16;
  c.cuda_graphs = false;
  auto made = RolloutService::Create(std::move(model), c, nullptr, nullptr);
  ASSERT_TRUE(made.ok()) << made.status();
  auto render = [this](const std::string& messages, const std::string& tools,
                       bool gen) -> StatusOr<std::string> {
    GYRE_ASSIGN_OR_RETURN(std::string ctx, text::MakeChatTemplateContext(messages, tools, gen, ""));
    return template_->Render(ctx);
  };
  EpisodeSetup setup;
  setup.render = render;
  setup.encode = [this](const std::string& text) { return chars_.Encode(text); };
  setup.decode = [this](const std::vector<int32_t>& ids) { return chars_.Decode(ids); };
  setup.options = Options();
  (*made)->EnableEpisodes(setup);

  v1::GenerateRequest req;
  req.set_env_address(service_->address());
  req.set_min_policy_version(-1);
  const EpisodeOptions o = Options();
  req.mutable_sampling()->set_temperature(o.sampling.temperature);
  req.mutable_sampling()->set_max_new_tokens(o.sampling.max_new_tokens);
  for (int32_t id : o.sampling.stop_token_ids) req.mutable_sampling()->add_stop_token_ids(id);
  const std::vector<nlohmann::json> tasks = {{{"prompt", "p"}, {"turns", 3}},
                                             {{"prompt", "q"}, {"turns", 2}}};
  for (size_t g = 0; g < tasks.size(); ++g) {
    v1::PromptGroup* pg = req.add_groups();
    pg->set_group_id(7 + g);
    pg->set_n(2);
    pg->set_first_sample_id(100 * (g + 1));
    pg->set_seed(5000 * (g + 1));
    pg->set_task_json(tasks[g].dump());
  }
  grpc::ServerContext ctx;
  v1::GenerateResponse resp;
  grpc::Status s = (*made)->Generate(&ctx, &req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.samples_size(), 4);

  std::vector<Episode> want_in;
  for (size_t g = 0; g < tasks.size(); ++g) {
    for (int i = 0; i < 2; ++i) {
      Episode e;
      e.id = 900 + want_in.size();
      e.group = 7 + g;
      e.seed = 5000 * (g + 1) + static_cast<uint64_t>(i);
      e.task_json = tasks[g].dump();
      want_in.push_back(e);
    }
  }
  agent::EnvClient env(service_.get(), agent::EnvTimeouts{});
  auto want = Runner(&env, Options()).Run(want_in);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("sample " + std::to_string(k));
    const v1::Sample& got = resp.samples(k);
    const Episode& e = (*want)[static_cast<size_t>(k)];
    ASSERT_TRUE(e.terminated) << e.status;
    EXPECT_EQ(got.sample_id(), 100 * (k / 2 + 1) + k % 2);
    EXPECT_EQ(got.group_id(), 7u + k / 2);
    EXPECT_EQ(std::vector<int32_t>(got.prompt_ids().begin(), got.prompt_ids().end()), e.prompt);
    EXPECT_EQ(std::vector<int32_t>(got.response_ids().begin(), got.response_ids().end()),
              e.response.tokens);
    EXPECT_EQ(std::vector<float>(got.loss_mask().begin(), got.loss_mask().end()), e.loss_mask);
    // Log-probs agree to float rounding (the two engines batch the episodes differently).
    ASSERT_EQ(got.logprobs_size(), static_cast<int>(e.response.logprobs.size()));
    for (int t = 0; t < got.logprobs_size(); ++t) {
      const float w = e.response.logprobs[static_cast<size_t>(t)];
      EXPECT_NEAR(got.logprobs(t), w, 1e-4f * std::max(1.0f, std::fabs(w))) << "token " << t;
    }
    EXPECT_EQ(got.env_turns(), static_cast<int>(e.turns.size()));
    EXPECT_EQ(got.episode_status(), "");
    EXPECT_EQ(got.finish_reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(got.reward_status(), v1::REWARD_STATUS_OK);
    EXPECT_NEAR(got.reward(), e.reward, 1e-6);
  }
  EXPECT_GT(resp.generated_tokens(), 0);

  // A worker without an environment setup, or a request that mixes in partial rollouts, is
  // refused with the reason.
  v1::GenerateRequest partial = req;
  partial.set_target_finished_groups(1);
  v1::GenerateResponse r2;
  grpc::ServerContext ctx2;
  EXPECT_EQ((*made)->Generate(&ctx2, &partial, &r2).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace gyre::rollout
