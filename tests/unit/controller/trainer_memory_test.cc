// What a trainer process needs for a job (trainer.memory_limit_gb), by hand for each layout,
// and the refusal's message.
#include "controller/trainer_memory.h"

#include <gtest/gtest.h>

#include "model/hf_config.h"

namespace gyre::controller {
namespace {

TEST(TrainerMemoryTest, EachLayoutKeepsItsShareOfTheState) {
  const double p = 1e9;
  // Unsharded: 4 + 4 + 8 bytes a parameter; start-up builds the float32 model.
  TrainerMemory m = EstimateTrainerMemory(p, "none", 4, false);
  EXPECT_DOUBLE_EQ(m.state_bytes, 16e9);
  EXPECT_DOUBLE_EQ(m.startup_bytes, 4e9);
  EXPECT_DOUBLE_EQ(m.needed_bytes(), 16e9);
  // ZeRO-1: moments / 4; ZeRO-2: moments and gradients / 4.
  EXPECT_DOUBLE_EQ(EstimateTrainerMemory(p, "optimizer", 4, false).state_bytes, 10e9);
  EXPECT_DOUBLE_EQ(EstimateTrainerMemory(p, "gradients", 4, false).state_bytes, 7e9);
  // ZeRO-3: everything / 4, the KL reference too; start-up holds the whole model and the first
  // slices, which here is more than the state.
  m = EstimateTrainerMemory(p, "parameters", 4, true);
  EXPECT_DOUBLE_EQ(m.state_bytes, 5e9);
  EXPECT_DOUBLE_EQ(m.startup_bytes, 5e9);
  m = EstimateTrainerMemory(p, "parameters", 8, false);
  EXPECT_DOUBLE_EQ(m.state_bytes, 2e9);
  EXPECT_DOUBLE_EQ(m.needed_bytes(), 4.5e9);
  EXPECT_NE(m.breakdown.find("1.00 B parameters x 2 bytes"), std::string::npos) << m.breakdown;
  // Tensor parallel 2 on 4 trainers: everything / 2, and ZeRO-2 splits the slice's moments and
  // gradients over the 2 trainers holding it (16 / 2 = 8 bytes; then 2 + 1 + 2 = 5).
  EXPECT_DOUBLE_EQ(EstimateTrainerMemory(p, "none", 4, false, 2).state_bytes, 8e9);
  EXPECT_DOUBLE_EQ(EstimateTrainerMemory(p, "gradients", 4, false, 2).state_bytes, 5e9);
}

TEST(TrainerMemoryTest, ALimitTooSmallIsRefusedWithWhatWouldFit) {
  model::ModelSpec spec;
  spec.vocab_size = 100;
  spec.hidden_size = 640;
  spec.num_layers = 13;
  spec.num_heads = 10;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.intermediate_size = 3456;
  const double params = model::EstimateParameterCount(spec);
  EXPECT_NEAR(params, 99.1e6, 0.1e6);
  JobConfig cfg;
  cfg.trainer.workers = 1;
  EXPECT_TRUE(CheckTrainerMemory(spec, cfg).ok());  // no limit
  cfg.trainer.memory_limit_gb = 1.45;
  const Status s = CheckTrainerMemory(spec, cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("trainer.memory_limit_gb is 1.45 GiB, but each trainer would need "
                             "about 1.48 GiB with trainer.shard: none over 1 trainer(s): its "
                             "training state between steps is 99.1 M parameters x 16 bytes"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("trainer.shard: parameters over 2 trainers (trainer.workers) needs "
                             "about 0.74 GiB each"),
            std::string::npos)
      << s.message();
  // With tensor parallelism the suggestion keeps it: 2 trainers of TP 2 need 0.74 GiB each
  // (half of every tensor); 4 (DP 2 x TP 2, shard: parameters) start with the whole model, a
  // quarter of it in slices and a half in the TP slice, 7 bytes a parameter.
  cfg.trainer.workers = 2;
  cfg.trainer.tensor_parallel = 2;
  cfg.trainer.memory_limit_gb = 0.7;
  const Status tp = CheckTrainerMemory(spec, cfg);
  EXPECT_NE(tp.message().find("trainer.shard: parameters over 4 trainers (trainer.workers, with "
                              "trainer.tensor_parallel 2) needs about 0.65 GiB each"),
            std::string::npos)
      << tp.message();
  cfg.trainer.tensor_parallel = 1;
  cfg.trainer.memory_limit_gb = 1.45;
  cfg.trainer.shard = "parameters";
  cfg.trainer.workers = 4;
  EXPECT_TRUE(CheckTrainerMemory(spec, cfg).ok());
  // No layout fits when the limit is below the whole model every trainer builds at start-up.
  cfg.trainer.memory_limit_gb = 0.3;
  const Status none = CheckTrainerMemory(spec, cfg);
  EXPECT_NE(none.message().find("No layout fits"), std::string::npos) << none.message();
}

}  // namespace
}  // namespace gyre::controller
