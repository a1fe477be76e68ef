// The Slurm feasibility check of `gyre launch slurm`: sinfo's node list parsed, every task placed
// on a node at once, and a refusal that names the short resource and the options that change it.
#include "controller/slurm_fit.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gyre::controller {
namespace {

std::vector<SlurmNode> Nodes(const std::string& sinfo) {
  auto nodes = ParseSinfoNodes(sinfo);
  EXPECT_TRUE(nodes.ok()) << nodes.status().message();
  return nodes.ok() ? *nodes : std::vector<SlurmNode>{};
}

TEST(SlurmFitTest, ParsesSinfoNodesOnceEachWithTheirGpus) {
  const auto nodes = Nodes(
      "gyre1 4 (null)\ngyre2 8 gpu:a100:2(S:0-1),shard:8\ngyre1 4 (null)\n\ngyre3 16 "
      "gpu:4,gpu:h100:2\n");
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].name, "gyre1");
  EXPECT_EQ(nodes[0].cpus, 4);
  EXPECT_EQ(nodes[0].gpus, 0);
  EXPECT_EQ(nodes[1].gpus, 2);
  EXPECT_EQ(nodes[2].cpus, 16);
  EXPECT_EQ(nodes[2].gpus, 6);
  EXPECT_FALSE(ParseSinfoNodes("gyre1 four (null)\n").ok());
  EXPECT_FALSE(ParseSinfoNodes("gyre1\n").ok());
}

// The new user: the default launch (2 CPUs for each of 4 tasks) on one 2-CPU node.
TEST(SlurmFitTest, TheDefaultLaunchOnOneSmallNodeSaysWhatIsShortAndWhatToChange) {
  SlurmRequest r;
  r.rollout_workers = 2;
  const std::string why = WhyItCannotRun(r, Nodes("node1 2 (null)\n"), "");
  EXPECT_NE(why.find("can never start on the default partition"), std::string::npos) << why;
  EXPECT_NE(why.find("CPUs are short (8 asked at once, 2 in all)"), std::string::npos) << why;
  EXPECT_NE(why.find("--cpus-per-worker"), std::string::npos) << why;
  EXPECT_NE(why.find("--controller-cpus"), std::string::npos) << why;
  EXPECT_NE(why.find("--set rollout.workers=N"), std::string::npos) << why;
  // Four tasks on two CPUs even at one CPU each: tasks must share CPUs.
  EXPECT_NE(why.find("--sbatch=--overcommit"), std::string::npos) << why;
}

TEST(SlurmFitTest, FittingRequestsPass) {
  SlurmRequest r;
  r.controller_cpus = 1;
  r.cpus_per_worker = 1;
  r.rollout_workers = 2;
  const auto three = Nodes("gyre1 4 (null)\ngyre2 4 (null)\ngyre3 4 (null)\n");
  EXPECT_EQ(WhyItCannotRun(r, three, "local"), "");
  r.cpus_per_worker = 4;  // 1 + 3 x 4 = 13 > 12
  EXPECT_NE(WhyItCannotRun(r, three, "local").find("13 asked at once, 12 in all"),
            std::string::npos);
  r.cpus_per_worker = 3;  // 1 + 3 x 3 = 10 <= 12, one worker per node, the controller beside one
  EXPECT_EQ(WhyItCannotRun(r, three, "local"), "");
}

// rollout.tensor_parallel T: a rollout task starts T processes on its node and asks T times the
// CPUs of a worker.
TEST(SlurmFitTest, TensorParallelRolloutTasksAskTheirRanksCpus) {
  SlurmRequest r;
  r.controller_cpus = 1;
  r.cpus_per_worker = 2;
  r.rollout_tensor_parallel = 2;  // 1 + 4 (rollout) + 2 (trainer) = 7 CPUs
  EXPECT_EQ(WhyItCannotRun(r, Nodes("a 4 (null)\nb 3 (null)\n"), ""), "");
  std::string why = WhyItCannotRun(r, Nodes("a 3 (null)\nb 3 (null)\nc 3 (null)\n"), "");
  EXPECT_NE(why.find("no node has 4 CPUs for one rollout worker of 2 tensor-parallel processes: "
                     "lower --cpus-per-worker to at most 1 or rollout.tensor_parallel"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("a rollout worker 2 processes with 4 CPUs (rollout.tensor_parallel)"),
            std::string::npos)
      << why;
  why = WhyItCannotRun(r, Nodes("a 6 (null)\n"), "");
  EXPECT_NE(why.find("CPUs are short (7 asked at once, 6 in all)"), std::string::npos) << why;
}

TEST(SlurmFitTest, TasksThatFitInAllButNotOnTheNodesAreRefused) {
  SlurmRequest r;  // controller 2, 1 + 1 workers of 2: 6 CPUs, three tasks of 2
  const std::string why = WhyItCannotRun(r, Nodes("a 3 (null)\nb 3 (null)\n"), "p");
  EXPECT_NE(why.find("partition 'p'"), std::string::npos) << why;
  EXPECT_NE(why.find("6 asked at once, 6 in all, but not in pieces that hold every task"),
            std::string::npos)
      << why;
  r.cpus_per_worker = 8;
  EXPECT_NE(WhyItCannotRun(r, Nodes("a 4 (null)\n"), "")
                .find("no node has 8 CPUs for one task: lower --cpus-per-worker or "
                      "--controller-cpus to at most 4"),
            std::string::npos);
}

TEST(SlurmFitTest, GpusArePlacedToo) {
  SlurmRequest r;
  r.controller_cpus = 1;
  r.cpus_per_worker = 1;
  r.gpus_per_worker = 1;
  r.rollout_workers = 3;
  r.trainer_workers = 1;
  EXPECT_EQ(WhyItCannotRun(r, Nodes("g1 8 gpu:2\ng2 8 gpu:2\n"), ""), "");
  const std::string short_gpus = WhyItCannotRun(r, Nodes("g1 8 gpu:2\ng2 8 (null)\n"), "");
  EXPECT_NE(short_gpus.find("GPUs are short (4 asked, 2 in all)"), std::string::npos) << short_gpus;
  r.gpus_per_worker = 4;
  EXPECT_NE(WhyItCannotRun(r, Nodes("g1 8 gpu:2\n"), "").find("no node has 4 GPUs"),
            std::string::npos);
}

}  // namespace
}  // namespace gyre::controller
