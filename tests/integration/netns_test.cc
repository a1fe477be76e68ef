// A job across "hosts": one Linux network namespace per host, each with its own address on a
// bridge (veth pairs), made and removed by the test (root; `ip netns`). The controller runs in
// one, the rollout workers and the trainer in others; the weights travel over Gloo and the control
// plane over gRPC between them, and the job trains. Then one rollout host's link goes down
// mid-job: its worker is declared dead within cluster.heartbeat_timeout_s, its work goes to the
// other, the job goes on; when the link is back, the worker started again there registers, is
// caught up and gets work.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::testing {
namespace {

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";

int Sh(const std::string& cmd) { return std::system((cmd + " > /dev/null 2>&1").c_str()); }

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Hosts c (controller), r0, r1 (rollout) and t (trainer) on bridge 10.<net>.0.0/24.
class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ip_ = IpBinary();
    if (::geteuid() != 0) GYRE_MISSING_DEPENDENCY(kFixRoot) << "needs root (ip netns)";
    if (ip_.empty()) GYRE_MISSING_DEPENDENCY(kFixDebian) << "needs iproute2 (ip netns)";
    tag_ = std::to_string(::getpid() % 100000);
    net_ = std::to_string(100 + ::getpid() % 100);
    bridge_ = "gbr" + tag_;
    if (Sh(ip_ + " link add " + bridge_ + " type bridge") != 0) {
      GYRE_MISSING_DEPENDENCY(kFixRoot) << "cannot create a bridge here (no CAP_NET_ADMIN?)";
    }
    ASSERT_EQ(Sh(ip_ + " link set " + bridge_ + " up"), 0);
    const char* hosts[] = {"c", "r0", "r1", "t"};
    for (int i = 0; i < 4; ++i) {
      const std::string ns = Ns(hosts[i]), outer = "gv" + tag_ + hosts[i];
      ASSERT_EQ(Sh(ip_ + " netns add " + ns), 0);
      namespaces_.push_back(ns);
      ASSERT_EQ(Sh(ip_ + " link add " + outer + " type veth peer name eth0 netns " + ns), 0);
      ASSERT_EQ(Sh(ip_ + " link set " + outer + " master " + bridge_ + " up"), 0);
      ASSERT_EQ(Sh(ip_ + " -n " + ns + " addr add " + Addr(i) + "/24 dev eth0"), 0);
      ASSERT_EQ(Sh(ip_ + " -n " + ns + " link set eth0 up"), 0);
      ASSERT_EQ(Sh(ip_ + " -n " + ns + " link set lo up"), 0);
    }
    dir_ = MakeTempDir("netns");
  }
  void TearDown() override {
    for (pid_t p : pids_) ::kill(p, SIGKILL);
    for (pid_t p : pids_) ::waitpid(p, nullptr, 0);
    for (const auto& ns : namespaces_) Sh(ip_ + " netns del " + ns);
    if (!bridge_.empty()) Sh(ip_ + " link del " + bridge_);
    for (const char* h : {"c", "r0", "r1", "t"}) Sh(ip_ + " link del gv" + tag_ + h);
  }

  std::string Ns(const std::string& host) const { return "gyre" + tag_ + host; }
  std::string Addr(int i) const { return "10." + net_ + ".0." + std::to_string(10 + i); }
  // Runs `gyre args...` in `host`'s namespace; output in dir_/<log>.out.
  pid_t Start(const std::string& host, const std::vector<std::string>& args,
              const std::string& log) {
    std::vector<std::string> argv = {ip_, "netns", "exec", Ns(host), GYRE_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    auto pid = SpawnProcess(argv, dir_ + "/" + log + ".out");
    EXPECT_TRUE(pid.ok()) << pid.status();
    pids_.push_back(*pid);
    return *pid;
  }
  std::string Log(const std::string& log) const { return ReadFile(dir_ + "/" + log + ".out"); }
  bool WaitForText(const std::string& log, const std::string& text, double timeout_s) const {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Log(log).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  bool WaitExit(pid_t pid, double timeout_s, int* status) const {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (PollExit(pid, status)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::string ip_, tag_, net_, bridge_, dir_;
  std::vector<std::string> namespaces_;
  std::vector<pid_t> pids_;
};

TEST_F(NetnsTest, AJobAcrossHostsTrainsAndSurvivesALinkGoingDown) {
  constexpr double kHeartbeatTimeout = 3;
  // A weight transfer in flight to the cut-off host is ended when the host is declared dead,
  // not at this deadline (the job's default), which the test would otherwise run into.
  constexpr double kWeightSyncTimeout = 60;
  const std::string controller = Addr(0) + ":7000";
  const pid_t ctl =
      Start("c", {"train", kQuickstart,
                  "--set", "job.output_dir=" + dir_,
                  "--set", "job.name=t",
                  "--set", "trainer.warmup_sft_steps=5",
                  "--set", "trainer.steps=150",
                  "--set", "rollout.prompts_per_step=32",
                  "--set", "data.eval_size=20",
                  "--set", kEveryGroupTrains,
                  "--set", "cluster.mode=external",
                  "--set", "cluster.bind_host=" + Addr(0),
                  "--set", "cluster.controller_port=7000",
                  "--set", "cluster.weight_transport=gloo",
                  "--set", "cluster.heartbeat_interval_s=0.5",
                  "--set", "cluster.heartbeat_timeout_s=" + std::to_string(kHeartbeatTimeout),
                  "--set", "cluster.weight_sync_timeout_s=" + std::to_string(kWeightSyncTimeout)},
            "controller");
  auto worker = [&](const std::string& host, const std::string& role, int index, int addr,
                    const std::string& log) {
    return Start(host,
                 {"worker", "--role", role, "--index", std::to_string(index), "--controller",
                  controller, "--bind-host", Addr(addr)},
                 log);
  };
  worker("t", "trainer", 0, 3, "t0");
  worker("r0", "rollout", 0, 1, "r0");
  const pid_t r1 = worker("r1", "rollout", 1, 2, "r1");
  ASSERT_TRUE(WaitForText("controller", "step    5/150", 180)) << Log("controller");
  const std::string before = Log("controller");
  EXPECT_NE(before.find("rollout-1 registered: pid " + std::to_string(r1) + " at " + Addr(2)),
            std::string::npos)
      << before;

  // r1's link goes down.
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_EQ(Sh(ip_ + " link set gv" + tag_ + "r1 down"), 0);
  ASSERT_TRUE(WaitForText("controller", "rollout-1 declared dead: missed heartbeats", 30))
      << Log("controller");
  const double detected =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  std::printf("rollout-1's link down: declared dead after %.1f s (heartbeat timeout %.0f s)\n",
              detected, kHeartbeatTimeout);
  EXPECT_LE(detected, kHeartbeatTimeout + 2.5);
  ASSERT_TRUE(WaitForText("controller", "continuing with 1 rollout worker(s)", 20))
      << Log("controller");
  const double continued =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  const std::string at_death = Log("controller");
  const bool transfer_ended =
      at_death.find("ending the weight transfer of publish") != std::string::npos;
  std::printf("the job continued with 1 rollout worker %.1f s after the cut (%s)\n", continued,
              transfer_ended ? "a weight transfer to it was in flight and was ended"
                             : "no weight transfer to it was in flight");
  EXPECT_LT(continued, kWeightSyncTimeout / 2);
  // The cut-off worker notices it cannot reach the controller and stops by itself.
  int st = 0;
  ASSERT_TRUE(WaitExit(r1, 30, &st)) << Log("r1");
  // Steps go on without it: one more finishes while the link is still down.
  const std::string at_cut = Log("controller");
  const size_t last = at_cut.rfind("\nstep ");
  ASSERT_NE(last, std::string::npos);
  const int step_at_cut = std::stoi(at_cut.substr(last + 6, 4));
  char next[32];
  std::snprintf(next, sizeof(next), "step %4d/150", step_at_cut + 1);
  ASSERT_TRUE(WaitForText("controller", next, 60)) << Log("controller");

  // The link is back; the launcher starts the worker again on that host.
  ASSERT_EQ(Sh(ip_ + " link set gv" + tag_ + "r1 up"), 0);
  const pid_t again = worker("r1", "rollout", 1, 2, "r1b");
  ASSERT_TRUE(WaitForText(
      "controller", "rollout-1 restarted (pid " + std::to_string(again) + "), caught up", 120))
      << Log("controller") << Log("r1b");
  ASSERT_TRUE(WaitExit(ctl, 300, &st)) << Log("controller");
  const std::string out = Log("controller");
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  EXPECT_NE(out.find("step  150/150"), std::string::npos) << out;
  EXPECT_NE(Log("r1b").find("first generate request"), std::string::npos)
      << "the rejoined worker got no work: " << Log("r1b");
  // Every step trained its whole batch, before, during and after the outage.
  std::istringstream metrics(ReadFile(dir_ + "/t/metrics.jsonl"));
  std::string line;
  int grpo = 0;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") != "grpo") continue;
    ++grpo;
    EXPECT_EQ(j["samples"], 256) << j.dump();
  }
  EXPECT_EQ(grpo, 150);
}

}  // namespace
}  // namespace gyre::testing
