// `gyre bench kernels` end to end: a real run at small sizes writes a table and JSON with every
// kernel measured beside its baseline; bad options are usage errors that run nothing.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "integration/run_util.h"

namespace gyre::testing {
namespace {

TEST(BenchKernelsTest, WritesTableAndJsonForEveryKernel) {
  const std::string dir = MakeTempDir("bench_kernels");
  const std::string json = dir + "/kernels.json";
  auto p = GyreProcess::Start({"bench", "kernels", "--device", "cpu", "--vocab", "1031", "--batch",
                               "1,3", "--response-len", "64", "--min-time", "0.01", "--json", json},
                              dir);
  ASSERT_TRUE(p.Wait(120));
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  EXPECT_NE(p.Output().find("speedup"), std::string::npos);
  const auto doc = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(doc["benchmark"], "kernels");
  EXPECT_EQ(doc["context"]["device"], "cpu");
  EXPECT_EQ(doc["context"]["vocab"], 1031);
  std::set<std::string> seen;
  for (const auto& row : doc["results"]) {
    seen.insert(row["kernel"].get<std::string>() + "/" + std::to_string(row["batch"].get<int>()));
    EXPECT_GT(row["gyre_us"].get<double>(), 0) << row;
    EXPECT_GT(row["baseline_us"].get<double>(), 0) << row;
    EXPECT_NEAR(row["speedup"].get<double>(),
                row["baseline_us"].get<double>() / row["gyre_us"].get<double>(), 1e-9);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"sampling/1", "sampling/3", "advantages/1", "advantages/3",
                                         "policy_loss/1", "policy_loss/3", "token_logprobs/1",
                                         "token_logprobs/3"}));
}

TEST(BenchKernelsTest, BadOptionsAreUsageErrors) {
  const std::string dir = MakeTempDir("bench_kernels_bad");
  // Each refusal is one line that names the option and points at the help.
  for (const auto& [args, names] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "kernels", "--batch", "0"}, "--batch: Value 0 is not a positive number"},
           {{"bench", "kernels", "--only", "sorting"}, "--only: sorting not in"},
           {{"bench", "kernels", "--dtype", "fp8"}, "--dtype: fp8 not in"},
           {{"bench", "kernels", "--vocab"}, "--vocab"}}) {
    const auto [rc, out] = RunGyre(args, dir, 60);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(out.rfind("gyre bench kernels: ", 0), 0u) << out;
    EXPECT_NE(out.find(names), std::string::npos) << out;
    EXPECT_NE(out.find("(see gyre bench kernels --help)\n"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace gyre::testing
