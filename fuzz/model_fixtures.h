#pragma once
// Fixtures for the targets that need a model (safetensors, trainer state, rollout and trainer
// RPCs) and for the seed generator: one very small decoder, so a generation or a training step
// takes well under a millisecond and seeds stay a few KB. Links libtorch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gyre/config.h"
#include "model/model_spec.h"
#include "model/transformer.h"
#include "rollout/rollout_engine.h"
#include "testing/tiny_model.h"
#include "trainer/policy_trainer.h"

namespace gyre::fuzz {

// 16 tokens, hidden 8, one layer, 2 query heads sharing 1 KV head, 24 positions.
inline model::ModelSpec FuzzSpec() { return testing::TinySpec(16, 8, 1, 2, 1, 16, 24); }

inline std::unique_ptr<model::Transformer> MakeFuzzModel(uint64_t seed = 5) {
  return model::Transformer::Create(FuzzSpec(), seed, 0.1);
}

// A rollout engine for FuzzSpec(): 32 blocks of 4 positions, up to 8 running sequences.
inline rollout::EngineConfig FuzzEngineConfig() {
  rollout::EngineConfig c;
  c.block_size = 4;
  c.num_blocks = 32;
  c.max_running = 8;
  c.max_step_tokens = 64;
  return c;
}

// Token ids as text for stop strings: id k is the letter 'a' + k.
inline rollout::RolloutEngine::Decoder FuzzDecoder() {
  return [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>('a' + (id % 26 + 26) % 26);
    return s;
  };
}

// The trainer settings TrainerService reads from its job config.
inline JobConfig FuzzTrainerJobConfig() {
  JobConfig c;
  c.trainer.micro_batch_size = 4;
  c.trainer.mini_batches = 1;
  c.cluster.bind_host = "127.0.0.1";
  return c;
}

// A small batch over FuzzSpec()'s vocabulary: prompts of 3 tokens, responses of 2 to 4.
inline std::vector<trainer::TrainSample> FuzzBatch(int k) {
  std::vector<trainer::TrainSample> b;
  for (int i = 0; i < 4; ++i) {
    trainer::TrainSample s;
    s.prompt = {1, static_cast<int32_t>(3 + (i + k) % 7), 5};
    s.response.assign(2 + i % 3, static_cast<int32_t>(7 + (i * k) % 8));
    s.rollout_logprobs.assign(s.response.size(), -1.0f);
    s.advantage = (i % 2 == 0 ? 1.0f : -0.5f) * static_cast<float>(1 + i + k);
    b.push_back(s);
  }
  return b;
}

// A trainer after one supervised and one policy-gradient step (so AdamW has moments to save).
inline std::unique_ptr<trainer::PolicyTrainer> MakeFuzzTrainer() {
  auto t = std::make_unique<trainer::PolicyTrainer>(MakeFuzzModel(3), 1e-2, 0.01, 0.9, 0.999);
  trainer::TrainOptions o;
  o.micro_batch_size = 2;
  for (int k = 0; k < 2; ++k) {
    auto m =
        t->Step(FuzzBatch(k),
                k == 0 ? trainer::Objective::kSft : trainer::Objective::kPolicyGradient, 1e-2, o);
    GYRE_CHECK(m.ok()) << m.status();
  }
  return t;
}

}  // namespace gyre::fuzz
