// `gyre bench weight-sync` at a tiny size, as a real process with real receiver processes: the
// JSON carries every field the docs promise, the figures are consistent with each other, and
// bad options are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "integration/run_util.h"
#include "kernels/device_info.h"

namespace gyre {
namespace {

using testing::GyreProcess;

TEST(BenchWeightSyncTest, TinyRunWritesConsistentJson) {
  const std::string dir = testing::MakeTempDir("bench_ws");
  const std::string json_path = dir + "/ws.json";
  GyreProcess p =
      GyreProcess::Start({"bench", "weight-sync", "--size", "3MiB", "--bucket-mb", "1,2",
                          "--receivers", "2", "--reps", "2", "--json", json_path},
                         dir);
  ASSERT_TRUE(p.Wait(120)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_NE(p.Output().find("speedup"), std::string::npos) << p.Output();  // the table
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["benchmark"], "weight-sync");
  EXPECT_EQ(j["context"]["payload_bytes"], 3 << 20);
  EXPECT_EQ(j["context"]["receivers"], 2);
  const auto& rows = j["results"];
  // Baseline, then grpc and gloo for each of the two bucket sizes.
  ASSERT_EQ(rows.size(), 5u) << j.dump(2);
  EXPECT_EQ(rows[0]["transport"], "grpc-naive");
  EXPECT_TRUE(rows[0]["bucket_mb"].is_null());
  const double baseline = rows[0]["seconds"];
  std::vector<std::string> transports;
  for (const auto& r : rows) {
    for (const char* key : {"transport", "bucket_mb", "receivers", "bytes", "seconds",
                            "min_seconds", "gb_per_s", "speedup"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    }
    const double secs = r["seconds"];
    ASSERT_GT(secs, 0);
    EXPECT_LE(r["min_seconds"].get<double>(), secs);
    EXPECT_NEAR(r["gb_per_s"].get<double>(), (3 << 20) / secs / 1e9, 1e-9);
    EXPECT_NEAR(r["speedup"].get<double>(), baseline / secs, 1e-9);
    transports.push_back(r["transport"].get<std::string>() +
                         (r["bucket_mb"].is_null() ? "" : "/" + r["bucket_mb"].dump()));
  }
  EXPECT_EQ(transports,
            (std::vector<std::string>{"grpc-naive", "grpc/1", "gloo/1", "grpc/2", "gloo/2"}));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(BenchWeightSyncTest, CudaIpcWithoutAGpuSaysSo) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "this host has a GPU";
  const std::string dir = testing::MakeTempDir("bench_ws_ipc");
  GyreProcess p = GyreProcess::Start(
      {"bench", "weight-sync", "--size", "1MiB", "--transports", "cuda_ipc"}, dir);
  ASSERT_TRUE(p.Wait(60));
  EXPECT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 1) << p.Output();
  EXPECT_NE(p.Output().find("cuda_ipc needs a CUDA device"), std::string::npos) << p.Output();
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// On a GPU host: a colocated 64 MiB update over CUDA IPC, verified by the receivers' receipts.
TEST(BenchWeightSyncTest, CudaIpcRowOnAGpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::MakeTempDir("bench_ws_ipc_gpu");
  const std::string json_path = dir + "/ws.json";
  GyreProcess p = GyreProcess::Start(
      {"bench", "weight-sync", "--size", "64MiB", "--transports", "cuda_ipc", "--bucket-mb", "16",
       "--receivers", "2", "--reps", "2", "--json", json_path},
      dir);
  ASSERT_TRUE(p.Wait(120)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  bool found = false;
  for (const auto& row : j["results"]) {
    if (row["transport"] == "cuda_ipc") {
      found = true;
      EXPECT_GT(row["seconds"].get<double>(), 0);
    }
  }
  EXPECT_TRUE(found) << j.dump();
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(BenchWeightSyncTest, BadOptionsAreUsageErrors) {
  const std::string dir = testing::MakeTempDir("bench_ws_bad");
  // Each refusal is one line naming the option and pointing at the help.
  for (const auto& [option, value] :
       std::vector<std::pair<std::string, std::string>>{{"--size", "lots"},
                                                        {"--size", "0"},
                                                        {"--transports", "carrier-pigeon"},
                                                        {"--transports", "grpc,grpc"},
                                                        {"--bucket-mb", "0"},
                                                        {"--receivers", "65"}}) {
    const auto [rc, out] = testing::RunGyre({"bench", "weight-sync", option, value}, dir, 30);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(out.rfind("gyre bench weight-sync: " + option + ": ", 0), 0u) << out;
    EXPECT_NE(out.find("(see gyre bench weight-sync --help)\n"), std::string::npos) << out;
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre
