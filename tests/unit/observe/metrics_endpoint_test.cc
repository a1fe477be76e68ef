#include "observe/metrics_endpoint.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/file_util.h"
#include "testing/dependency.h"
#include "testing/http_get.h"

namespace gyre::observe {
namespace {

using gyre::testing::HttpGet;

TEST(MetricsEndpointTest, ServesMetricsAndHealthOverHttp) {
  bool healthy = true;
  auto ep = MetricsEndpoint::Start("127.0.0.1:0", [&] {
    return nlohmann::json{{"status", healthy ? "ok" : "degraded"}, {"step", 7}};
  });
  ASSERT_TRUE(ep.ok()) << ep.status();
  const std::string address = (*ep)->address();
  EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  EXPECT_NE(address, "127.0.0.1:0");
  (*ep)->Set("gyre_mean_reward", "Mean reward.", 0.625);
  (*ep)->Add("gyre_generated_tokens_total", "Tokens.", 100);
  (*ep)->Add("gyre_generated_tokens_total", "Tokens.", 28);
  int refreshes = 0;
  (*ep)->SetRefresh([&](MetricsEndpoint* e) {
    ++refreshes;
    e->Set("gyre_workers", "Workers.", 2, {{"role", "rollout"}, {"state", "ready"}});
  });
  const auto metrics = HttpGet(address, "/metrics");
  ASSERT_EQ(metrics.code, 200);
  EXPECT_NE(metrics.body.find("# TYPE gyre_mean_reward gauge"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("gyre_mean_reward 0.625"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("gyre_generated_tokens_total 128"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("gyre_workers{role=\"rollout\",state=\"ready\"} 2"),
            std::string::npos)
      << metrics.body;
  EXPECT_EQ(refreshes, 1);
  auto health = HttpGet(address, "/health");
  ASSERT_EQ(health.code, 200);
  EXPECT_EQ(nlohmann::json::parse(health.body)["step"], 7);
  healthy = false;
  health = HttpGet(address, "/health");
  EXPECT_EQ(health.code, 503);
  EXPECT_EQ(nlohmann::json::parse(health.body)["status"], "degraded");
  EXPECT_EQ(HttpGet(address, "/nothing").code, 404);
  ep->reset();
  EXPECT_EQ(HttpGet(address, "/metrics").code, 0);  // stopped: nothing listens
}

TEST(MetricsEndpointTest, BadAddressesAndBusyPortsAreClearErrors) {
  for (const char* bad : {"9400", "127.0.0.1:", ":9400", "127.0.0.1:99999", "host:port"}) {
    auto ep = MetricsEndpoint::Start(bad, nullptr);
    ASSERT_FALSE(ep.ok()) << bad;
    EXPECT_NE(ep.status().message().find("HOST:PORT"), std::string::npos) << ep.status();
  }
  auto first = MetricsEndpoint::Start("127.0.0.1:0", nullptr);
  ASSERT_TRUE(first.ok());
  auto second = MetricsEndpoint::Start((*first)->address(), nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cannot serve /metrics on " + (*first)->address()),
            std::string::npos)
      << second.status();
}

// Prometheus' own checker accepts a scrape (Debian `prometheus` ships promtool).
TEST(MetricsEndpointTest, PromtoolAcceptsAScrape) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GYRE_MISSING_DEPENDENCY(::gyre::testing::kFixDebian)
        << "promtool (Debian package prometheus) is not installed";
  }
  auto ep = MetricsEndpoint::Start("127.0.0.1:0", nullptr);
  ASSERT_TRUE(ep.ok());
  (*ep)->Set("gyre_step", "The last finished GRPO step.", 12);
  (*ep)->Set("gyre_phase_seconds", "Wall time of each phase.", 1.5, {{"phase", "generate"}});
  (*ep)->Set("gyre_phase_seconds", "", 0.5, {{"phase", "train"}});
  (*ep)->Add("gyre_generated_tokens_total", "Tokens generated.", 4096);
  const auto scrape = HttpGet((*ep)->address(), "/metrics");
  ASSERT_EQ(scrape.code, 200);
  const std::string path = ::testing::TempDir() + "/scrape_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << scrape.body;
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[1024];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out << "\n" << scrape.body;
  EXPECT_EQ(out, "") << scrape.body;  // no lint warnings either
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gyre::observe
