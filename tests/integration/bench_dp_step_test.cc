// `gyre bench dp-step` at a tiny size, as a real process: the JSON carries the promised fields,
// the speedups follow from the medians, both trainer modes end with the same weights, and bad
// options are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "integration/run_util.h"

namespace gyre {
namespace {

using testing::GyreProcess;

TEST(BenchDpStepTest, TinyRunWritesConsistentJson) {
  const std::string dir = testing::MakeTempDir("bench_dp");
  const std::string json_path = dir + "/dp.json";
  GyreProcess p = GyreProcess::Start(
      {"bench",   "dp-step", "--vocab",   "64", "--hidden",        "32",     "--layers",    "2",
       "--batch", "3",       "--seq-len", "12", "--micro-batches", "2",      "--bucket-mb", "1",
       "--steps", "2",       "--rounds",  "2",  "--json",          json_path},
      dir);
  ASSERT_TRUE(p.Wait(120)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_NE(p.Output().find("speedup"), std::string::npos) << p.Output();  // the table
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["benchmark"], "dp-step");
  EXPECT_EQ(j["context"]["ranks"], 2);
  EXPECT_EQ(j["context"]["micro_batches"], 2);
  EXPECT_EQ(j["context"]["same_weights"], true);
  EXPECT_GE(j["context"]["buckets"].get<int>(), 1);
  const auto& rows = j["results"];
  ASSERT_EQ(rows.size(), 7u) << j.dump(2);  // no tp row: one head does not split
  EXPECT_EQ(rows[0]["mode"], "allreduce-only");
  EXPECT_TRUE(rows[0]["speedup"].is_null());
  EXPECT_EQ(rows[1]["mode"], "blocking");
  EXPECT_EQ(rows[2]["mode"], "overlapped");
  EXPECT_EQ(rows[3]["mode"], "zero1");
  EXPECT_EQ(rows[4]["mode"], "zero2");
  EXPECT_EQ(rows[5]["mode"], "zero3");
  EXPECT_EQ(rows[6]["mode"], "zero3-keep");
  // Two ranks: each sharded row holds half the moments (up to one element of padding), ZeRO-2
  // also half the gradients; the weights agree with the unsharded ones up to rounding.
  const double full_state = rows[2]["state_mib"];
  const double full_grad = rows[2]["grad_mib"];
  ASSERT_GT(full_state, 0);
  EXPECT_NEAR(full_grad * 2, full_state, 1e-9);  // two moments per gradient
  for (int k : {3, 4}) {
    EXPECT_NEAR(rows[k]["state_mib"].get<double>(), full_state / 2, 1e-5) << rows[k].dump();
    EXPECT_LT(rows[k]["max_weight_diff"].get<double>(), 1e-5) << rows[k].dump();
  }
  EXPECT_NEAR(rows[4]["grad_mib"].get<double>(), full_grad / 2, 1e-5) << rows[4].dump();
  // ZeRO-3 also holds half the weights (each parameter unit padded to an even length), and says
  // how long its collectives took and how long the step waited for them.
  const double full_weights = rows[2]["weights_mib"];
  EXPECT_NEAR(full_weights, full_grad, 1e-9);
  EXPECT_NEAR(rows[5]["weights_mib"].get<double>(), full_weights / 2, 1e-4) << rows[5].dump();
  EXPECT_NEAR(rows[5]["state_mib"].get<double>(), full_state / 2, 1e-4) << rows[5].dump();
  EXPECT_LT(rows[5]["max_weight_diff"].get<double>(), 1e-5) << rows[5].dump();
  EXPECT_GT(rows[5]["comm_s"].get<double>(), 0) << rows[5].dump();
  EXPECT_GE(rows[5]["comm_wait_s"].get<double>(), 0) << rows[5].dump();
  // Keeping the layers gathered through the backward holds the same state between steps and
  // trains the same weights.
  for (const char* field : {"weights_mib", "state_mib", "grad_mib"}) {
    EXPECT_EQ(rows[6][field], rows[5][field]) << field;
  }
  EXPECT_LT(rows[6]["max_weight_diff"].get<double>(), 1e-5) << rows[6].dump();
  EXPECT_GT(rows[6]["comm_s"].get<double>(), 0) << rows[6].dump();
  EXPECT_TRUE(rows[2]["comm_s"].is_null());
  const double baseline = rows[1]["median_s"];
  for (const auto& r : rows) {
    EXPECT_EQ(r["steps"], 4) << r.dump();
    const double med = r["median_s"];
    ASSERT_GT(med, 0);
    EXPECT_LE(r["min_s"].get<double>(), med);
    if (!r["speedup"].is_null()) EXPECT_NEAR(r["speedup"].get<double>(), baseline / med, 1e-9);
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(BenchDpStepTest, BadOptionsAreUsageErrors) {
  const std::string dir = testing::MakeTempDir("bench_dp_bad");
  // Each refusal is one line that names the option and points at the help.
  for (const auto& [args, names] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"bench", "dp-step", "--ranks", "1"}, "--ranks: Value 1 not in range 2 to 64"},
           {{"bench", "dp-step", "--batch", "2", "--micro-batches", "3"},
            "--micro-batches exceeds --batch"},
           {{"bench", "dp-step", "--hidden", "100"},
            "--hidden: Value 100 is neither up to 64 nor a multiple of 64"},
           {{"bench", "dp-step", "--colour", "blue"}, "--colour"}}) {
    const auto [rc, out] = testing::RunGyre(args, dir, 30);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(out.rfind("gyre bench dp-step: ", 0), 0u) << out;
    EXPECT_NE(out.find(names), std::string::npos) << out;
    EXPECT_NE(out.find("(see gyre bench dp-step --help)\n"), std::string::npos) << out;
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre
