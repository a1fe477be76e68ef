#include "rpc/worker_discovery.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gyre::rpc {
namespace {

// An environment of the test's own.
EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(WorkerDiscoveryTest, FlagsWinOverTheEnvironment) {
  auto p = DiscoverPlacement("10.0.0.1:7000", 3, "10.0.0.9", "",
                             Env({{"GYRE_CONTROLLER", "x:1"}, {"GYRE_WORKER_INDEX", "5"}}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->controller, "10.0.0.1:7000");
  EXPECT_EQ(p->index, 3);
  EXPECT_EQ(p->index_source, "--index");
  EXPECT_EQ(p->advertise_host, "10.0.0.9");
}

TEST(WorkerDiscoveryTest, LaunchersVariablesInOrder) {
  // Kubernetes Indexed Job.
  auto k8s = DiscoverPlacement("", -1, "127.0.0.1", "",
                               Env({{"GYRE_CONTROLLER", "gyre-controller:7000"},
                                    {"JOB_COMPLETION_INDEX", "2"},
                                    {"SLURM_PROCID", "9"}}));
  ASSERT_TRUE(k8s.ok()) << k8s.status();
  EXPECT_EQ(k8s->controller, "gyre-controller:7000");
  EXPECT_EQ(k8s->index, 2);
  EXPECT_EQ(k8s->index_source, "JOB_COMPLETION_INDEX");
  // An srun task.
  auto slurm = DiscoverPlacement("c:1", -1, "127.0.0.1", "", Env({{"SLURM_PROCID", "7"}}));
  ASSERT_TRUE(slurm.ok());
  EXPECT_EQ(slurm->index, 7);
  EXPECT_EQ(slurm->index_source, "SLURM_PROCID");
  // Gyre's own variable first.
  auto own = DiscoverPlacement("c:1", -1, "127.0.0.1", "",
                               Env({{"GYRE_WORKER_INDEX", "1"}, {"SLURM_PROCID", "7"}}));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->index, 1);
  auto none = DiscoverPlacement("c:1", -1, "127.0.0.1", "", Env({}));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->index, 0);
  EXPECT_EQ(none->index_source, "default");
}

TEST(WorkerDiscoveryTest, AWildcardBindAdvertisesARoutableAddress) {
  auto given =
      DiscoverPlacement("c:1", 0, "0.0.0.0", "", Env({{"GYRE_ADVERTISE_HOST", "10.1.2.3"}}));
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(given->advertise_host, "10.1.2.3");
  const std::string primary = PrimaryHostAddress();
  auto found = DiscoverPlacement("c:1", 0, "0.0.0.0", "", Env({}));
  if (primary.empty()) {
    ASSERT_FALSE(found.ok());
    EXPECT_NE(found.status().message().find("--advertise-host"), std::string::npos);
  } else {
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(found->advertise_host, primary);
    EXPECT_NE(primary.rfind("127.", 0), 0u) << primary;
  }
}

TEST(WorkerDiscoveryTest, BadValuesAreClearErrors) {
  auto no_controller = DiscoverPlacement("", 0, "127.0.0.1", "", Env({}));
  ASSERT_FALSE(no_controller.ok());
  EXPECT_NE(no_controller.status().message().find("$GYRE_CONTROLLER"), std::string::npos);
  auto bad = DiscoverPlacement("c:1", -1, "127.0.0.1", "", Env({{"SLURM_PROCID", "x1"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "$SLURM_PROCID = 'x1' is not a worker index (0 to 4095)");
  EXPECT_FALSE(ParseWorkerIndex("-1", "--index").ok());
  EXPECT_FALSE(ParseWorkerIndex("4096", "--index").ok());
  EXPECT_EQ(*ParseWorkerIndex("4095", "--index"), 4095);
}

}  // namespace
}  // namespace gyre::rpc
