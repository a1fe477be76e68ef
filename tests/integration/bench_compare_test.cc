// Benchmark results in one schema, compared between runs: two real `gyre bench kernels` runs
// write gyre-bench/1 JSON (version, host, options, keys, metrics, figures beside their
// baselines); `gyre bench compare` matches their rows and passes them within a threshold, and
// flags a figure made worse; mismatched or foreign files are usage errors.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "integration/run_util.h"

namespace gyre::testing {
namespace {

TEST(BenchCompareTest, OneSchemaAndRegressionsBeyondTheThreshold) {
  const std::string dir = MakeTempDir("bench_compare");
  const std::vector<std::string> run = {"bench",          "kernels", "--device",   "cpu",
                                        "--vocab",        "1031",    "--batch",    "1,3",
                                        "--response-len", "64",      "--min-time", "0.01"};
  for (const char* name : {"a", "b"}) {
    auto args = run;
    args.insert(args.end(), {"--json", dir + "/" + name + ".json"});
    auto [rc, out] = RunGyre(args, dir);
    ASSERT_EQ(rc, 0) << out;
  }
  const auto a = nlohmann::json::parse(ReadFile(dir + "/a.json"));
  EXPECT_EQ(a["schema"], "gyre-bench/1");
  EXPECT_EQ(a["benchmark"], "kernels");
  EXPECT_FALSE(a["gyre_version"].get<std::string>().empty());
  EXPECT_FALSE(a["host"]["cpu"].get<std::string>().empty()) << a["host"].dump();
  EXPECT_GT(a["host"]["cpus"].get<int>(), 0);
  EXPECT_EQ(a["options"][0], "kernels");
  EXPECT_EQ(a["keys"], nlohmann::json::array({"kernel", "batch"}));
  EXPECT_EQ(a["metrics"]["speedup"], "higher");
  EXPECT_EQ(a["metrics"]["gyre_us"], "lower");
  // Two runs of the same build: every row and metric is matched (their verdicts depend on the
  // machine's noise, so only that the comparison ran is checked here).
  auto [rc, out] = RunGyre({"bench", "compare", dir + "/a.json", dir + "/b.json"}, dir);
  EXPECT_TRUE(rc == 0 || rc == 1) << out;
  EXPECT_NE(out.find("16 comparison(s)"), std::string::npos) << out;
  // A later run equal to A except that the sampling kernel at batch 3 got 3x slower: exactly
  // its two metrics are regressions (+200% time, -67% speedup), the rest is within noise.
  auto b = nlohmann::json::parse(ReadFile(dir + "/a.json"));
  for (auto& row : b["results"]) {
    if (row["kernel"] == "sampling" && row["batch"] == 3) {
      row["gyre_us"] = row["gyre_us"].get<double>() * 3;
      row["speedup"] = row["speedup"].get<double>() / 3;
    }
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/slower.json", b.dump()).ok());
  std::tie(rc, out) = RunGyre(
      {"bench", "compare", dir + "/a.json", dir + "/slower.json", "--threshold", "0.5"}, dir);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("kernel=sampling batch=3"), std::string::npos) << out;
  EXPECT_NE(out.find("+200.0%  REGRESSION"), std::string::npos) << out;
  EXPECT_NE(out.find("-66.7%  REGRESSION"), std::string::npos) << out;
  EXPECT_NE(out.find("16 comparison(s), 2 regression(s)"), std::string::npos) << out;
  // The same file against itself: nothing.
  std::tie(rc, out) = RunGyre({"bench", "compare", dir + "/a.json", dir + "/a.json"}, dir);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("16 comparison(s), 0 regression(s)"), std::string::npos) << out;
  // Different benchmarks, and files that are not results.
  auto other = nlohmann::json::parse(ReadFile(dir + "/a.json"));
  other["benchmark"] = "train";
  ASSERT_TRUE(WriteFileAtomic(dir + "/train.json", other.dump()).ok());
  std::tie(rc, out) = RunGyre({"bench", "compare", dir + "/a.json", dir + "/train.json"}, dir);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("compare like with like"), std::string::npos) << out;
  // Rows that the keys do not tell apart (e2e once keyed its rows by mode and k only, and its
  // lockstep and between_steps runs were matched with each other).
  auto twice = nlohmann::json::parse(ReadFile(dir + "/a.json"));
  twice["results"].push_back(twice["results"][0]);
  ASSERT_TRUE(WriteFileAtomic(dir + "/twice.json", twice.dump()).ok());
  std::tie(rc, out) = RunGyre({"bench", "compare", dir + "/a.json", dir + "/twice.json"}, dir);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("twice.json has two rows with kernel=sampling batch=1"), std::string::npos)
      << out;
  ASSERT_TRUE(WriteFileAtomic(dir + "/old.json", "{\"benchmark\": \"kernels\"}").ok());
  std::tie(rc, out) = RunGyre({"bench", "compare", dir + "/a.json", dir + "/old.json"}, dir);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("is not a gyre bench result"), std::string::npos) << out;
  // Usage errors: one line naming what is wrong.
  std::tie(rc, out) = RunGyre({"bench", "compare", dir + "/a.json"}, dir);
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(out, "gyre bench compare: B.json is required (see gyre bench compare --help)\n");
  std::tie(rc, out) =
      RunGyre({"bench", "compare", dir + "/a.json", dir + "/a.json", "--threshold", "-1"}, dir);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("gyre bench compare: --threshold: Value -1 not in range 0 to 100"),
            std::string::npos)
      << out;
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::testing
