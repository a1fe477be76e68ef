// `gyre bench memory` at a small size, as a real process: each configuration runs in its own
// child, the JSON carries the promised fields, and computing log-probs in chunks of tokens takes
// a step less memory than materialising the [tokens, vocabulary] logits, which takes less than
// padded rows; activation checkpointing takes a step of a deep model less memory than keeping
// every layer's activations. Bad options are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "integration/run_util.h"

namespace gyre {
namespace {

using testing::GyreProcess;

TEST(BenchMemoryTest, ChunkedLogprobsTakeLessMemoryThanMaterialisedLogits) {
  const std::string dir = testing::MakeTempDir("bench_memory");
  const std::string json_path = dir + "/memory.json";
  // 32 samples of about 64 response tokens over a 16384-token vocabulary: the logits of one
  // step are about 2,000 x 16,384 floats (128 MiB), a chunk of 256 tokens 16 MiB.
  GyreProcess p =
      GyreProcess::Start({"bench", "memory", "--vocab", "16384", "--hidden", "64", "--layers", "1",
                          "--batch", "32", "--chunk", "256", "--json", json_path},
                         dir);
  ASSERT_TRUE(p.Wait(300)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_NE(p.Output().find("vs unchunked"), std::string::npos) << p.Output();  // the table
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["benchmark"], "memory");
  EXPECT_EQ(j["context"]["chunk_tokens"], 256);
  const auto& rows = j["results"];
  ASSERT_EQ(rows.size(), 4u) << j.dump(2);
  EXPECT_EQ(rows[0]["config"], "padded");
  EXPECT_EQ(rows[1]["config"], "unchunked");
  EXPECT_EQ(rows[2]["config"], "chunked");
  EXPECT_EQ(rows[3]["config"], "checkpointed");
  for (const auto& r : rows) {
    EXPECT_GT(r["baseline_mib"].get<double>(), 0) << r.dump();
    EXPECT_GT(r["step_s"].get<double>(), 0) << r.dump();
    EXPECT_NEAR(r["vs_unchunked"].get<double>(),
                r["peak_mib"].get<double>() / rows[1]["peak_mib"].get<double>(), 1e-9);
  }
  const double padded = rows[0]["peak_mib"], unchunked = rows[1]["peak_mib"];
  const double chunked = rows[2]["peak_mib"];
  // The unchunked step holds several [tokens, V] float32 tensors (logits, log-softmax, their
  // gradients): hundreds of MiB; chunked at most a few chunks' worth of them.
  EXPECT_GT(unchunked, 200) << j.dump(2);
  EXPECT_LT(chunked, 0.5 * unchunked) << j.dump(2);
  EXPECT_GE(padded, unchunked) << j.dump(2);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// --layouts: each layout is N trainer processes; split parameters on 2 ranks hold half the
// tensors of one unsharded process (up to a unit's padding), and the resident state follows.
TEST(BenchMemoryTest, LayoutsMeasureEachRankOfAGroup) {
  const std::string dir = testing::MakeTempDir("bench_memory_layouts");
  const std::string json_path = dir + "/layouts.json";
  GyreProcess p =
      GyreProcess::Start({"bench", "memory", "--vocab", "4096", "--hidden", "256", "--layers", "4",
                          "--batch", "4", "--max-len", "32", "--median-len", "16", "--layouts",
                          "none:1,gradients:2,parameters:2", "--json", json_path},
                         dir);
  ASSERT_TRUE(p.Wait(300)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_NE(p.Output().find("held vs first"), std::string::npos) << p.Output();
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  const auto& rows = j["results"];
  ASSERT_EQ(rows.size(), 3u) << j.dump(2);
  EXPECT_EQ(rows[2]["layout"], "parameters:2");
  EXPECT_EQ(rows[2]["ranks"], 2);
  for (const auto& r : rows) {
    EXPECT_GT(r["state_mib"].get<double>(), 0) << r.dump();
    EXPECT_GE(r["step_peak_mib"].get<double>(), r["state_mib"].get<double>()) << r.dump();
  }
  // Weights, moments and gradients: 16 bytes a parameter unsharded; ZeRO-2 keeps the weights
  // (4) and halves the rest (6); split parameters halve everything (8).
  EXPECT_NEAR(rows[1]["held_vs_first"].get<double>(), 10.0 / 16, 0.01) << j.dump(2);
  EXPECT_NEAR(rows[2]["held_vs_first"].get<double>(), 0.5, 0.01) << j.dump(2);
  EXPECT_LT(rows[2]["state_mib"].get<double>(), 0.75 * rows[0]["state_mib"].get<double>())
      << j.dump(2);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// 6 layers over a small vocabulary, so the decoder layers' activations dominate a step: about
// 4,500 tokens x (hidden 128 x 8 + intermediate 341 x 4) floats per layer. Measured: 481 MiB
// keeping them, 214 MiB checkpointed (0.44x), at 1.30 and 1.50 s per step.
TEST(BenchMemoryTest, ActivationCheckpointingTakesLessMemory) {
  const std::string dir = testing::MakeTempDir("bench_memory_ckpt");
  const std::string json_path = dir + "/memory.json";
  GyreProcess p = GyreProcess::Start(
      {"bench", "memory", "--vocab", "1024", "--hidden", "128", "--layers", "6", "--batch", "32",
       "--configs", "chunked,checkpointed", "--json", json_path},
      dir);
  ASSERT_TRUE(p.Wait(300)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_EQ(p.Output().find("vs unchunked"), std::string::npos) << "no unchunked baseline ran";
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  const auto& rows = j["results"];
  ASSERT_EQ(rows.size(), 2u) << j.dump(2);
  EXPECT_EQ(rows[0]["config"], "chunked");
  EXPECT_EQ(rows[1]["config"], "checkpointed");
  const double kept = rows[0]["peak_mib"], checkpointed = rows[1]["peak_mib"];
  EXPECT_GT(kept, 150) << j.dump(2);
  EXPECT_LT(checkpointed, 0.7 * kept) << j.dump(2);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(BenchMemoryTest, BadOptionsAreUsageErrors) {
  const std::string dir = testing::MakeTempDir("bench_memory_bad");
  // Each refusal is one line that names the option and points at the help.
  for (const auto& [args, names] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "memory", "--chunk", "0"}, "--chunk: Value 0 not in range"},
           {{"bench", "memory", "--hidden", "100"}, "--hidden: Value 100"},
           {{"bench", "memory", "--child", "sideways"}, "--child: sideways is not a configuration"},
           {{"bench", "memory", "--configs", "chunked,chunked"},
            "--configs: chunked is listed twice"},
           {{"bench", "memory", "--configs", "chunked,fast"}, "--configs: fast not in"},
           {{"bench", "memory", "--configs", ""}, "--configs"},
           {{"bench", "memory", "--layouts", "parameters"},
            "--layouts: 'parameters' is not SHARD:N"},
           {{"bench", "memory", "--layouts", "zero3:2"}, "--layouts: 'zero3:2' is not SHARD:N"},
           {{"bench", "memory", "--layouts", "none:0"},
            "N (or D) must be a whole number from 1 to 64"},
           {{"bench", "memory", "--layouts", "none:1x0"}, "T must be a whole number from 1 to 64"},
           {{"bench", "memory", "--layouts", "none:1x4"},
            "tensor_parallel 4 does not divide model.intermediate_size 682"},
           {{"bench", "memory", "--colour", "blue"}, "--colour"}}) {
    const auto [rc, out] = testing::RunGyre(args, dir, 60);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(out.rfind("gyre bench memory: ", 0), 0u) << out;
    EXPECT_NE(out.find(names), std::string::npos) << out;
    EXPECT_NE(out.find("(see gyre bench memory --help)\n"), std::string::npos) << out;
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre
