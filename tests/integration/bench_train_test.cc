// `gyre bench train` at a tiny size, as a real process: the JSON carries the promised fields,
// speedups and throughputs follow from the medians, packing computes fewer tokens than padding
// on the long-tail batch (and the same on the equal one), shared prompts fewer than packing, all
// modes make the same updates, and bad options are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "integration/run_util.h"

namespace gyre {
namespace {

using testing::GyreProcess;

TEST(BenchTrainTest, TinyRunWritesConsistentJson) {
  const std::string dir = testing::MakeTempDir("bench_train");
  const std::string json_path = dir + "/train.json";
  GyreProcess p = GyreProcess::Start(
      {"bench",   "train",  "--vocab",      "64", "--hidden",     "32", "--layers",  "2",
       "--batch", "12",     "--prompt-len", "8",  "--median-len", "3",  "--max-len", "12",
       "--group", "4",      "--steps",      "2",  "--rounds",     "2",  "--threads", "1",
       "--json",  json_path},
      dir);
  ASSERT_TRUE(p.Wait(180)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_NE(p.Output().find("of peak"), std::string::npos) << p.Output();  // the table
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["benchmark"], "train");
  EXPECT_EQ(j["context"]["samples"], 12);
  EXPECT_EQ(j["context"]["group"], 4);
  EXPECT_GT(j["context"]["matmul_peak_gflops"].get<double>(), 0);
  EXPECT_LE(j["context"]["update_disagreement"].get<double>(), 0.01);
  const auto& rows = j["results"];
  ASSERT_EQ(rows.size(), 6u) << j.dump(2);
  for (size_t b = 0; b < 2; ++b) {
    const auto& padded = rows[3 * b];
    const auto& packed = rows[3 * b + 1];
    const auto& shared = rows[3 * b + 2];
    EXPECT_EQ(padded["batch"], b == 0 ? "equal" : "longtail");
    EXPECT_EQ(padded["mode"], "padded");
    EXPECT_EQ(packed["mode"], "packed");
    EXPECT_EQ(shared["mode"], "shared");
    EXPECT_EQ(padded["real_tokens"], packed["real_tokens"]);
    EXPECT_EQ(padded["real_tokens"], shared["real_tokens"]);
    const double base = padded["median_s"];
    for (const auto* r : {&padded, &packed, &shared}) {
      const double med = (*r)["median_s"];
      ASSERT_GT(med, 0);
      EXPECT_NEAR((*r)["speedup"].get<double>(), base / med, 1e-9);
      EXPECT_NEAR((*r)["tokens_per_s"].get<double>(), (*r)["real_tokens"].get<double>() / med,
                  1e-6 * (*r)["tokens_per_s"].get<double>());
      EXPECT_GT((*r)["peak_fraction"].get<double>(), 0);
    }
    EXPECT_GE(packed["computed_tokens"].get<int64_t>(), packed["real_tokens"].get<int64_t>());
    EXPECT_GE(padded["computed_tokens"].get<int64_t>(), padded["real_tokens"].get<int64_t>());
    // Three groups of 4 share their 8-token prompts (auto finds that cheaper at this size).
    EXPECT_LT(shared["computed_tokens"].get<int64_t>(), packed["computed_tokens"].get<int64_t>());
    if (b == 0) {
      EXPECT_EQ(packed["computed_tokens"], padded["computed_tokens"]);
      EXPECT_EQ(padded["computed_tokens"], padded["real_tokens"]);  // nothing to pad
    } else {
      EXPECT_LT(packed["computed_tokens"].get<int64_t>(), padded["computed_tokens"].get<int64_t>());
    }
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(BenchTrainTest, BadOptionsAreUsageErrors) {
  const std::string dir = testing::MakeTempDir("bench_train_bad");
  // Each refusal is one line that names the option and points at the help.
  for (const auto& [args, names] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "train", "--batch", "0"}, "--batch: Value 0 not in range"},
           {{"bench", "train", "--dtype", "float64"}, "--dtype: unknown weight dtype 'float64'"},
           {{"bench", "train", "--hidden", "100"}, "--hidden: Value 100"},
           {{"bench", "train", "--sigma", "11"}, "--sigma: Value 11 not in range 0 to 10"},
           {{"bench", "train", "--sigma", "nan"}, "--sigma: Value nan"},
           {{"bench", "train", "--group", "0"}, "--group: Value 0"},
           {{"bench", "train", "--colour", "blue"}, "--colour"}}) {
    const auto [rc, out] = testing::RunGyre(args, dir, 60);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(out.rfind("gyre bench train: ", 0), 0u) << out;
    EXPECT_NE(out.find(names), std::string::npos) << out;
    EXPECT_NE(out.find("(see gyre bench train --help)\n"), std::string::npos) << out;
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre
