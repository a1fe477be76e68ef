#include "model/hf_config.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/transformer.h"

namespace gyre::model {
namespace {

const char* kQwen3 = R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
  "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000, "tie_word_embeddings": true, "hidden_act": "silu",
  "attention_bias": false, "rope_scaling": null})";

TEST(HfConfigTest, ReadsQwen3Qwen2AndLlamaFields) {
  auto q3 = ParseHfConfig(kQwen3, "config.json");
  ASSERT_TRUE(q3.ok()) << q3.status();
  EXPECT_EQ(q3->head_dim, 128);  // explicit, not hidden / heads
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_FALSE(q3->attention_bias);
  EXPECT_TRUE(q3->tie_embeddings);
  EXPECT_EQ(q3->rope_theta, 1e6);

  auto q2 = ParseHfConfig(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16})",
                          "q2.json");
  ASSERT_TRUE(q2.ok()) << q2.status();
  EXPECT_TRUE(q2->attention_bias);  // Qwen2 always has q/k/v biases
  EXPECT_EQ(q2->num_kv_heads, 2);   // defaults to num_attention_heads
  EXPECT_EQ(q2->head_dim, 4);

  // transformers 5 spelling: rope_parameters holding rope_theta and the llama3 scaling.
  auto ll = ParseHfConfig(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 16,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
                          "llama.json");
  ASSERT_TRUE(ll.ok()) << ll.status();
  EXPECT_EQ(ll->rope_type, "llama3");
  EXPECT_EQ(ll->rope_theta, 500000.0);
  // Scaling divides the low frequencies by `factor` and leaves the high ones alone.
  at::Tensor scaled = RopeInverseFrequencies(*ll);
  ModelSpec plain = *ll;
  plain.rope_type = "default";
  at::Tensor base = RopeInverseFrequencies(plain);
  EXPECT_FLOAT_EQ(scaled[0].item<float>(), base[0].item<float>());
  EXPECT_NEAR(scaled[-1].item<float>(), base[-1].item<float>() / 8.0f, 1e-12);
}

TEST(HfConfigTest, UnsupportedOrBrokenConfigsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model_type": "mistral"})", "model_type 'mistral' is not supported"},
      {R"({"model_type": "llama", "vocab_size": 10})", "missing field \"hidden_size\""},
      {R"({"model_type": "llama", "vocab_size": "ten"})", "\"vocab_size\" must be an integer"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 3, "num_key_value_heads": 2, "intermediate_size": 4})",
       "not a multiple of num_key_value_heads"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "hidden_act": "gelu"})",
       "hidden_act 'gelu' is not supported"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4,
          "rope_scaling": {"type": "yarn", "factor": 4.0}})",
       "rope_scaling: rope_type 'yarn' is not supported"},
      {R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "use_sliding_window": true})",
       "use_sliding_window: true is not supported"},
      {"{not json", "not valid JSON"},
      // Values that used to be accepted and broke the model later (NaN norms, no positions).
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "rms_norm_eps": 0})",
       "rms_norm_eps must be a positive number (got 0)"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "rms_norm_eps": -1e-6})",
       "rms_norm_eps must be a positive number"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "max_position_embeddings": 0})",
       "max_position_embeddings must be positive (got 0)"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "max_position_embeddings": -5})",
       "max_position_embeddings must be positive"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "rope_scaling": {"rope_type":
          "llama3", "factor": 0, "low_freq_factor": 1, "high_freq_factor": 4,
          "original_max_position_embeddings": 8192}})",
       "rope_scaling: factor must be a positive number (got 0)"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "rope_scaling": {"rope_type":
          "llama3", "factor": -8, "low_freq_factor": 1, "high_freq_factor": 4,
          "original_max_position_embeddings": 8192}})",
       "factor must be a positive number (got -8)"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "rope_scaling": {"rope_type":
          "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
          "original_max_position_embeddings": 0}})",
       "original_max_position_embeddings must be positive"},
      {R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 4, "rope_theta": 0})",
       "rope_theta must be a positive number"},
  };
  for (const auto& [text, expect] : cases) {
    auto r = ParseHfConfig(text, "dir/config.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos);
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status();
  }
}

// A config whose parameters cannot fit in memory (vocab_size 10^12 aborted inside libtorch) is
// refused from the estimate, before anything is allocated, with the sizes named.
TEST(HfConfigTest, ModelsTooLargeForMemoryAreRefusedBeforeAllocating) {
  auto huge = ParseHfConfig(R"({"model_type": "llama", "vocab_size": 1000000000000,
      "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
      "intermediate_size": 16})",
                            "big/config.json");
  ASSERT_TRUE(huge.ok()) << huge.status();  // well-formed: only too big
  // 2 x 10^12 x 64 embedding and lm_head floats, plus the layer.
  EXPECT_GT(EstimateParameterCount(*huge), 1.28e14);
  Status s = CheckModelSize(*huge, "big/config.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const char* needle : {"big/config.json", "vocab_size 1000000000000", "hidden_size 64", "TiB",
                             "more than this machine's"}) {
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  }
  // The estimate is exact for a real shape (checked against the created model's count).
  ModelSpec tiny;
  tiny.vocab_size = 37;
  tiny.hidden_size = 32;
  tiny.num_layers = 2;
  tiny.num_heads = 4;
  tiny.num_kv_heads = 2;
  tiny.head_dim = 8;
  tiny.intermediate_size = 48;
  tiny.tie_embeddings = true;
  const int64_t per_layer = 64 + 1024 + 1024 + 1024 + 3 * 48 * 32;
  EXPECT_EQ(EstimateParameterCount(tiny), 37 * 32 + 2 * per_layer + 32);
  EXPECT_TRUE(CheckModelSize(tiny, "tiny").ok());
  EXPECT_FALSE(CheckModelSize(tiny, "tiny", /*limit_bytes=*/1000).ok());
  // Sizes near INT64_MAX do not overflow the estimate into something small.
  tiny.hidden_size = int64_t{1} << 62;
  EXPECT_FALSE(CheckModelSize(tiny, "tiny").ok());
}

// A job's model.max_seq_len applies to a model directory too, below max_position_embeddings.
TEST(HfConfigTest, JobSequenceLimitMustFitTheModel) {
  ModelSpec s;
  s.max_seq_len = 4096;
  auto limit = EffectiveMaxSeqLen(s, 160, "m/config.json");
  ASSERT_TRUE(limit.ok());
  EXPECT_EQ(*limit, 160);
  limit = EffectiveMaxSeqLen(s, 8192, "m/config.json");
  ASSERT_FALSE(limit.ok());
  EXPECT_NE(limit.status().message().find("exceeds the model's max_position_embeddings 4096"),
            std::string::npos)
      << limit.status();
  EXPECT_EQ(*EffectiveMaxSeqLen(s, 0, "m/config.json"), 4096);
}

}  // namespace
}  // namespace gyre::model
