// Forward-pass parity with Hugging Face transformers that needs no Python: tiny random models
// written by `gyre init-model` (tests/golden/models/{llama,qwen2,qwen3}: llama3 RoPE scaling and
// an untied lm_head; q/k/v biases and tied embeddings; per-head q/k norms and an explicit
// head_dim) and the float32 log-softmax transformers computed for a fixed id sequence
// (logprobs.golden). tools/make_golden.py regenerates them and documents the file format. The
// weights are large and the norm weights and biases random, so a broken RoPE, RMSNorm or
// attention moves the log-probs far past the tolerance.
//
// tests/integration/hf_parity_test.cc runs transformers live when Python is installed; this test
// keeps the same promise checked everywhere else.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/hf_model.h"
#include "test_paths.h"
#include "testing/tensor_compare.h"

namespace gyre::model {
namespace {

constexpr char kMagic[8] = {'G', 'Y', 'R', 'E', 'L', 'O', 'G', 'P'};
constexpr uint32_t kVersion = 1;

// Measured on the machine that generated the files: Gyre's forward differs from transformers by
// at most 1.9e-6 (llama, whose llama3 inverse frequencies round differently; qwen2 and qwen3 are
// bit-identical) and the paged path by at most 2.4e-6, with 1 or 2 threads. Every reference
// entry is between -10 and -2.6, so 1e-5 + 1e-5 * |ref| allows 3.6e-5 to 1.1e-4: ten times the
// measured error, room for other CPUs' summation orders. A broken RoPE, RMSNorm, q/k norm or GQA
// head mapping moves log-probs by 0.6 to 4.7.
constexpr testing::Tolerance kTolerance{/*rtol=*/1e-5, /*atol=*/1e-5, /*srtol=*/0};

struct Golden {
  std::vector<int64_t> ids;
  at::Tensor log_softmax;  // float32 [T, V]
  nlohmann::json header;
};

std::string GoldenDir(const std::string& name) {
  return std::string(GYRE_SOURCE_DIR) + "/tests/golden/models/" + name;
}

// Reads and checks logprobs.golden (format: tools/make_golden.py).
::testing::AssertionResult ReadGolden(const std::string& path, Golden* golden) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ::testing::AssertionFailure() << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  if (data.size() < 16 || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return ::testing::AssertionFailure() << path << ": not a logprobs golden file (bad magic)";
  }
  uint32_t version = 0, header_len = 0;
  std::memcpy(&version, data.data() + 8, 4);
  std::memcpy(&header_len, data.data() + 12, 4);
  if (version != kVersion) {
    return ::testing::AssertionFailure()
           << path << ": version " << version << ", this test reads version " << kVersion;
  }
  if (data.size() < 16 + static_cast<size_t>(header_len)) {
    return ::testing::AssertionFailure() << path << ": truncated header";
  }
  golden->header = nlohmann::json::parse(data.substr(16, header_len), nullptr, false);
  if (golden->header.is_discarded() || !golden->header.contains("ids")) {
    return ::testing::AssertionFailure() << path << ": header is not the expected JSON";
  }
  golden->ids = golden->header["ids"].get<std::vector<int64_t>>();
  const int64_t T = static_cast<int64_t>(golden->ids.size());
  const int64_t V = golden->header["vocab_size"].get<int64_t>();
  const size_t want_size = 16 + header_len + static_cast<size_t>(T * V) * sizeof(float);
  if (data.size() != want_size) {
    return ::testing::AssertionFailure()
           << path << ": " << data.size() << " bytes, expected " << want_size << " for " << T
           << " x " << V << " float32 values";
  }
  golden->log_softmax = at::empty({T, V}, at::kFloat);
  std::memcpy(golden->log_softmax.data_ptr<float>(), data.data() + 16 + header_len,
              static_cast<size_t>(T * V) * sizeof(float));
  return ::testing::AssertionSuccess();
}

class HfGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ReadGolden(GoldenDir(GetParam()) + "/logprobs.golden", &golden_));
    auto model = LoadHfModel(GoldenDir(GetParam()));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    ASSERT_EQ(model_->spec().vocab_size, golden_.log_softmax.size(1));
  }

  Golden golden_;
  std::unique_ptr<Transformer> model_;
};

// Each golden model has the features it is there to cover, and its reference is far from
// uniform (so that it can tell a correct forward from a broken one).
TEST_P(HfGoldenTest, CoversItsArchitecture) {
  const ModelSpec& s = model_->spec();
  if (GetParam() == "llama") {
    EXPECT_EQ(s.rope_type, "llama3");
    EXPECT_FALSE(s.tie_embeddings);
  } else if (GetParam() == "qwen2") {
    EXPECT_TRUE(s.attention_bias);
    EXPECT_TRUE(s.tie_embeddings);
  } else {
    EXPECT_TRUE(s.qk_norm);
    EXPECT_NE(s.head_dim, s.hidden_size / s.num_heads);
  }
  EXPECT_LT(s.num_kv_heads, s.num_heads);  // grouped-query attention
  EXPECT_GE(s.num_layers, 2);
  EXPECT_GE(golden_.ids.size(), 16u);
  // Every row spreads its log-probs over several nats.
  const at::Tensor spread =
      std::get<0>(golden_.log_softmax.max(-1)) - std::get<0>(golden_.log_softmax.min(-1));
  EXPECT_GT(spread.min().item<double>(), 3.0) << golden_.header.dump();
}

// The full causal forward (training, `gyre logprobs`) matches transformers.
TEST_P(HfGoldenTest, ForwardMatchesTransformers) {
  c10::InferenceMode guard;
  at::Tensor logits = model_->Forward(at::tensor(golden_.ids).unsqueeze(0));
  at::Tensor got = at::log_softmax(logits[0].to(at::kFloat), -1);
  auto close = testing::AllClose(got, golden_.log_softmax, kTolerance);
  std::printf("%s forward vs transformers (%s): %s\n", GetParam().c_str(),
              golden_.header["reference"].get<std::string>().c_str(), close.message());
  EXPECT_TRUE(close) << GetParam();
}

// The rollout engine's path matches transformers too: a paged KV cache with a scrambled block
// table, a prefill split into two chunks (the second attending to the cached first), then one
// token at a time.
TEST_P(HfGoldenTest, PagedPrefillAndDecodeMatchTransformers) {
  c10::InferenceMode guard;
  const int64_t T = static_cast<int64_t>(golden_.ids.size());
  const int64_t bs = 4, nblocks = (T + bs - 1) / bs;
  PagedKvCache cache = model_->NewPagedCache(nblocks + 1, bs);
  std::vector<int64_t> table;
  for (int64_t b = 0; b < nblocks; ++b) table.push_back(nblocks - b);  // block 0 unused
  auto slot = [&](int64_t p) { return table[p / bs] * bs + p % bs; };
  auto step = [&](int64_t begin, int64_t end) {  // tokens [begin, end) -> their logits
    PagedBatch b;
    std::vector<int64_t> toks, pos, slots;
    for (int64_t p = begin; p < end; ++p) {
      toks.push_back(golden_.ids[p]);
      pos.push_back(p);
      slots.push_back(slot(p));
      b.logit_rows.push_back(p - begin);
    }
    b.tokens = at::tensor(toks, at::kLong);
    b.positions = at::tensor(pos, at::kLong);
    b.slots = at::tensor(slots, at::kLong);
    b.query_lens = {end - begin};
    b.context_lens = {end};
    b.block_tables = at::tensor(table, at::kLong).view({1, nblocks});
    return model_->ForwardPaged(b, &cache);
  };
  const int64_t first = T / 3, prefill = 2 * T / 3;
  std::vector<at::Tensor> rows = {step(0, first), step(first, prefill)};
  for (int64_t p = prefill; p < T; ++p) rows.push_back(step(p, p + 1));
  at::Tensor got = at::log_softmax(at::cat(rows, 0).to(at::kFloat), -1);
  auto close = testing::AllClose(got, golden_.log_softmax, kTolerance);
  std::printf("%s paged vs transformers: %s\n", GetParam().c_str(), close.message());
  EXPECT_TRUE(close) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfGoldenTest, ::testing::Values("llama", "qwen2", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gyre::model
