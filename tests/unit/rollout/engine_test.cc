#include "rollout/engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "testing/tiny_model.h"

namespace gyre::rollout {
namespace {

model::ModelSpec Spec() { return testing::TinySpec(30, 32, 2, 4, 2, 48, 40); }

GenerationRequest Req(std::vector<int32_t> prompt, uint64_t seed, float temperature, int max_new) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.seed = seed;
  r.temperature = temperature;
  r.max_new_tokens = max_new;
  return r;
}

// Greedy decoding through the engine equals argmax over repeated full forwards.
TEST(EngineTest, GreedyMatchesFullForwardReferenceInAnyBatch) {
  auto model = model::Transformer::Create(Spec(), 11, 0.3);
  const std::vector<int32_t> prompt = {3, 7, 1, 22, 9};
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  std::vector<int32_t> want;
  {
    c10::InferenceMode guard;
    for (int i = 0; i < 8; ++i) {
      at::Tensor logits = model->Forward(at::tensor(seq).unsqueeze(0));
      const int64_t next = logits[0][static_cast<int64_t>(seq.size()) - 1].argmax().item<int64_t>();
      want.push_back(static_cast<int32_t>(next));
      seq.push_back(next);
    }
  }
  Engine alone(model.get(), 8);
  auto a = alone.Generate({Req(prompt, 0, 0.0f, 8)});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)[0].tokens, want);
  // Same request inside a batch with longer and shorter prompts (left padding differs).
  auto b = alone.Generate({Req({1, 2, 3, 4, 5, 6, 7, 8, 9}, 1, 1.0f, 3), Req(prompt, 0, 0.0f, 8),
                           Req({4}, 2, 0.7f, 8)});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[1].tokens, want);
}

// A sampled sequence depends only on (seed, position): alone or batched, same tokens.
TEST(EngineTest, SampledTokensDoNotDependOnBatchComposition) {
  auto model = model::Transformer::Create(Spec(), 12, 0.5);
  Engine engine(model.get(), 64);
  auto target = Req({5, 6, 7}, 4242, 1.0f, 10);
  auto alone = engine.Generate({target});
  std::vector<GenerationRequest> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back(Req({static_cast<int32_t>(i + 3), 2, 9, 1}, i, 1.0f, 6));
  batch.insert(batch.begin() + 4, target);
  auto batched = engine.Generate(batch);
  ASSERT_TRUE(alone.ok() && batched.ok());
  EXPECT_EQ((*alone)[0].tokens, (*batched)[4].tokens);
  for (size_t t = 0; t < (*alone)[0].tokens.size(); ++t) {
    // Another batch width reorders the matmuls: rounding relative to the log-prob's size.
    EXPECT_NEAR((*alone)[0].logprobs[t], (*batched)[4].logprobs[t],
                1e-5 + 1e-5 * std::fabs((*alone)[0].logprobs[t]));
  }
}

// The reported log-prob is log softmax(logits / T)[token] over the full vocabulary.
TEST(EngineTest, LogprobsMatchTheTemperedFullVocabularyDistribution) {
  auto model = model::Transformer::Create(Spec(), 13, 0.5);
  Engine engine(model.get(), 4);
  auto r = Req({8, 3, 14}, 7, 0.8f, 5);
  r.top_k = 5;  // truncation must not change the reported log-prob
  auto out = engine.Generate({r});
  ASSERT_TRUE(out.ok());
  std::vector<int64_t> seq = {8, 3, 14};
  c10::InferenceMode guard;
  for (size_t t = 0; t < (*out)[0].tokens.size(); ++t) {
    at::Tensor logits =
        model->Forward(at::tensor(seq).unsqueeze(0))[0][static_cast<int64_t>(seq.size()) - 1];
    const int32_t tok = (*out)[0].tokens[t];
    const float want = at::log_softmax(logits / 0.8, -1)[tok].item<float>();
    EXPECT_NEAR((*out)[0].logprobs[t], want, 1e-5 + 1e-5 * std::fabs(want)) << "position " << t;
    EXPECT_GT((*out)[0].kept_mass[t], 0.0f);
    EXPECT_LE((*out)[0].kept_mass[t], 1.0f + 1e-6f);
    seq.push_back(tok);
  }
}

TEST(EngineTest, StopTokensAndLengthLimitsSetTheFinishReason) {
  auto model = model::Transformer::Create(Spec(), 14, 0.3);
  Engine engine(model.get(), 4);
  auto greedy = engine.Generate({Req({1, 2, 3}, 0, 0.0f, 6)});
  ASSERT_TRUE(greedy.ok());
  const int32_t first = (*greedy)[0].tokens[0];
  auto r = Req({1, 2, 3}, 0, 0.0f, 6);
  r.stop_token_ids = {first};
  auto stopped = engine.Generate({r});
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ((*stopped)[0].finish, Finish::kStop);
  EXPECT_EQ((*stopped)[0].tokens, std::vector<int32_t>{first});
  EXPECT_EQ((*greedy)[0].tokens.size(), 6u);
}

TEST(EngineTest, BadRequestsAreRejectedBeforeAnyWork) {
  auto model = model::Transformer::Create(Spec(), 15, 0.3);
  Engine engine(model.get(), 4);
  auto too_long = engine.Generate({Req(std::vector<int32_t>(35, 1), 0, 0.0f, 10)});
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("exceeds max_seq_len 40"), std::string::npos);
  auto bad_id = engine.Generate({Req({1, 30}, 0, 0.0f, 2)});
  EXPECT_NE(bad_id.status().message().find("token id 30 outside the vocabulary"),
            std::string::npos);
  EXPECT_FALSE(engine.Generate({Req({}, 0, 0.0f, 2)}).ok());
}

}  // namespace
}  // namespace gyre::rollout
