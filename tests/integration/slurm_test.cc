// `gyre launch slurm` against a real Slurm cluster on this machine (tools/slurm-local.sh: munged,
// slurmctld and three slurmd nodes, started and stopped by the test): the quickstart submitted
// as a heterogeneous job trains and learns; scancel stops the controller and every worker; a
// worker whose process dies is reported like a local worker's death and the job goes on. Skips
// when Slurm is not installed or the test is not root (fails under CI=true).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::testing {
namespace {

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";
const std::string kTool = std::string(GYRE_SOURCE_DIR) + "/tools/slurm-local.sh";

class SlurmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("slurm"));
    int rc = 0;
    const std::string out = RunShell(kTool + " start " + *dir_ + "/cluster 3", &rc);
    if (rc != 0) {
      skip_ = new std::string(rc == 77 ? out : "tools/slurm-local.sh failed: " + out);
      return;
    }
    ::setenv("SLURM_CONF", (*dir_ + "/cluster/slurm.conf").c_str(), 1);
  }
  static void TearDownTestSuite() {
    RunShell(kTool + " stop " + *dir_ + "/cluster");
    (void)RemoveTree(*dir_);
  }
  void SetUp() override {
    if (skip_ != nullptr) {
      if (skip_->find("slurm-local:") == 0 && skip_->find("failed") == std::string::npos) {
        GYRE_MISSING_DEPENDENCY(skip_->find("root") != std::string::npos ? kFixRoot : kFixDebian)
            << *skip_;
      }
      FAIL() << *skip_;
    }
  }

  // Submits `gyre launch slurm` with `sets`; returns the Slurm job id.
  static std::string Launch(const std::string& name, const std::vector<std::string>& sets) {
    std::string cmd = std::string(GYRE_BINARY) + " launch slurm " + kQuickstart +
                      " --cpus-per-worker 1 --controller-cpus 1 --set job.output_dir=" + *dir_ +
                      "/runs --set job.name=" + name;
    for (const auto& s : sets) cmd += " --set " + s;
    int rc = 0;
    const std::string out = RunShell(cmd, &rc);
    EXPECT_EQ(rc, 0) << out;
    const std::string key = "submitted Slurm job ";
    const size_t at = out.find(key);
    if (at == std::string::npos) return "";
    return out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  }
  static bool Gone(const std::string& id, double timeout_s) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (RunShell("squeue -h -j " + id).find(id) == std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return false;
  }
  static std::string Output(const std::string& name, const std::string& id) {
    return ReadFile(*dir_ + "/runs/" + name + "/slurm/slurm-" + id + ".out");
  }
  static bool WaitFor(const std::string& name, const std::string& id, const std::string& text,
                      double timeout_s) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Output(name, id).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }
  // Processes of run `name` still alive: its controller (whose command line names the run's
  // job file) and the workers that registered with it (by pid).
  static std::string Survivors(const std::string& name, const std::string& id) {
    std::string alive = RunShell("pgrep -af '" + *dir_ + "/runs/" + name +
                                 "/slurm/job.yaml' | grep -v pgrep || true");
    const std::string out = Output(name, id);
    const std::regex re("(rollout|trainer)-[0-9]+ registered: pid ([0-9]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
         ++it) {
      if (ProcessAlive(std::stoi((*it)[2]))) alive += (*it)[0].str() + " is alive\n";
    }
    return alive;
  }

  static std::string* dir_;
  static std::string* skip_;
};

std::string* SlurmTest::dir_ = nullptr;
std::string* SlurmTest::skip_ = nullptr;

TEST_F(SlurmTest, TheQuickstartSubmittedWithGyreLaunchTrainsAndLearns) {
  const std::string id = Launch("quickstart", {});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(Gone(id, 900)) << Output("quickstart", id);
  const std::string out = Output("quickstart", id);
  EXPECT_NE(out.find("running in Slurm job " + id), std::string::npos) << out;
  EXPECT_NE(out.find("gyre launch: controller at"), std::string::npos) << out;
  EXPECT_NE(out.find("rollout-1 registered"), std::string::npos) << out;
  const auto summary = nlohmann::json::parse(ReadFile(*dir_ + "/runs/quickstart/summary.json"));
  const double before = summary["accuracy_before_rl"], after = summary["accuracy_after_rl"];
  std::printf("slurm quickstart (job %s): held-out accuracy %.3f -> %.3f (%+.1f points)\n",
              id.c_str(), before, after, 100 * (after - before));
  EXPECT_GE(after - before, 0.15) << out;  // the quickstart's promise (quickstart_test.cc)
  EXPECT_EQ(summary["slurm_job_id"], id);
  // Three components: the controller's and one step per worker group, on Slurm's nodes.
  const std::string sbatch = ReadFile(*dir_ + "/runs/quickstart/slurm/job.sbatch");
  EXPECT_NE(sbatch.find("#SBATCH hetjob"), std::string::npos);
  EXPECT_TRUE(Survivors("quickstart", id).empty()) << Survivors("quickstart", id);
}

// A job that could never start (more CPUs at once than the three 4-CPU nodes have) is not
// submitted: the error names the short resource and the options that change it.
TEST_F(SlurmTest, AJobThatCanNeverStartIsRefusedBeforeSubmitting) {
  const std::string cmd = std::string(GYRE_BINARY) + " launch slurm " + kQuickstart +
                          " --set job.output_dir=" + *dir_ +
                          "/runs --set job.name=toobig --set rollout.workers=8";
  int rc = 0;
  const std::string out = RunShell(cmd, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("gyre launch: not submitted: this job can never start on the default "
                     "partition"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("CPUs are short (20 asked at once, 12 in all)"), std::string::npos) << out;
  EXPECT_NE(out.find("--cpus-per-worker"), std::string::npos) << out;
  EXPECT_EQ(RunShell("squeue -h -n gyre-toobig"), "");
}

TEST_F(SlurmTest, ScancelStopsTheControllerAndEveryWorker) {
  const std::string id =
      Launch("cancelled", {"trainer.steps=100000", "trainer.warmup_sft_steps=5"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor("cancelled", id, "step    2/100000", 300)) << Output("cancelled", id);
  RunShell("scancel " + id);
  ASSERT_TRUE(Gone(id, 60)) << Output("cancelled", id);
  const std::string out = Output("cancelled", id);
  EXPECT_NE(out.find("interrupted by SIGTERM"), std::string::npos) << out;
  EXPECT_TRUE(Survivors("cancelled", id).empty()) << Survivors("cancelled", id) << "\n" << out;
}

TEST_F(SlurmTest, AWorkerThatDiesIsReportedAndTheJobGoesOn) {
  const std::string id = Launch(
      "worker_death", {"trainer.steps=40", "trainer.warmup_sft_steps=5",
                       "cluster.heartbeat_timeout_s=3", "algorithm.filter_zero_variance=false"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitFor("worker_death", id, "step    2/40", 300)) << Output("worker_death", id);
  // rollout-1's pid, as it registered.
  const std::string out = Output("worker_death", id);
  const std::regex re("rollout-1 registered: pid ([0-9]+)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, re)) << out;
  ASSERT_EQ(::kill(std::stoi(m[1]), SIGKILL), 0);
  ASSERT_TRUE(Gone(id, 600)) << Output("worker_death", id);
  const std::string done = Output("worker_death", id);
  EXPECT_NE(done.find("worker rollout-1 died"), std::string::npos) << done;
  EXPECT_NE(done.find("continuing with 1 rollout worker(s)"), std::string::npos) << done;
  EXPECT_NE(done.find("step   40/40"), std::string::npos) << done;
  EXPECT_NE(done.find("done: held-out accuracy"), std::string::npos) << done;
}

}  // namespace
}  // namespace gyre::testing
