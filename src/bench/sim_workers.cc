// `gyre sim-workers`: many simulated workers (src/sim/sim_workers.h) in one process, each with its
// own gRPC server and its own session with the controller (registration and heartbeats), as if
// each were a node of a cluster. For `gyre bench e2e --simulate`, and for trying a controller
// configuration at a scale this machine cannot run for real.

#include "sim/sim_workers.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "rpc/rpc_util.h"
#include "rpc/worker_session.h"

namespace gyre::bench {
namespace {

std::atomic<int> g_sim_signal{0};
void OnSimSignal(int sig) { g_sim_signal.store(sig); }

constexpr char kSimWorkersDetails[] =
    "The workers register with the controller as rollout-0..N-1 and trainer-0..M-1 (the job\n"
    "runs with cluster.mode: external). They hold no model: each request costs the time the\n"
    "cost model says (docs/algorithms.md, \"Measuring: gyre bench e2e\"). Exits when the\n"
    "controller stops them.\n";

struct SimWorker {
  std::unique_ptr<rpc::WorkerSession> session;
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
};

}  // namespace

int RunSimWorkers(const std::vector<std::string>& args) {
  std::string controller, bind_host = "127.0.0.1";
  int64_t rollouts = 1, trainers = 1;
  double register_timeout = 60;
  sim::CostModel cost;
  auto app = NewCommand(
      "gyre sim-workers",
      "Serves N simulated rollout and M simulated trainer workers, each its own gRPC server.",
      kSimWorkersDetails);
  app->add_option("--controller", controller, "the job's controller")
      ->type_name("HOST:PORT")
      ->required();
  app->add_option("--rollout", rollouts, "simulated rollout workers (N)")
      ->check(CLI::Range(0, 100000));
  app->add_option("--trainer", trainers, "simulated trainer workers (M)")
      ->check(CLI::Range(0, 10000));
  app->add_option("--bind-host", bind_host, "address the workers listen on")->type_name("HOST");
  app->add_option("--register-timeout-s", register_timeout, "how long to wait for the controller")
      ->check(RealRange(0.1, 86400));
  AddCostOptions(app.get(), &cost, "Cost model");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  InitLogging("sim-workers");
  struct sigaction sa = {};
  sa.sa_handler = OnSimSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<SimWorker> workers;
  workers.reserve(static_cast<size_t>(rollouts + trainers));
  for (int64_t k = 0; k < rollouts + trainers; ++k) {
    const bool rollout = k < rollouts;
    const int index = static_cast<int>(rollout ? k : k - rollouts);
    SimWorker w;
    w.session = std::make_unique<rpc::WorkerSession>(
        controller, rollout ? v1::WORKER_ROLE_ROLLOUT : v1::WORKER_ROLE_TRAINER, index);
    rpc::WorkerSession* session = w.session.get();
    auto on_stop = [session](const std::string& why) { session->RequestStop(why); };
    std::function<int64_t()> version;
    if (rollout) {
      auto s = std::make_unique<sim::SimRollout>(cost, on_stop);
      version = [p = s.get()] { return p->version(); };
      w.service = std::move(s);
    } else {
      auto s = std::make_unique<sim::SimTrainer>(cost, on_stop);
      version = [p = s.get()] { return p->version(); };
      w.service = std::move(s);
    }
    // Serve first (on a free port), then register: the controller calls a worker only after
    // its first heartbeat.
    std::string address;
    auto server = rpc::StartServer(bind_host, 0, {w.service.get()}, &address);
    Status s = server.ok() ? session->Register(address, register_timeout) : server.status();
    if (!s.ok()) {
      std::fprintf(stderr, "gyre sim-workers: %s %d: %s\n", rollout ? "rollout" : "trainer", index,
                   s.ToString().c_str());
      for (auto& other : workers) other.session->RequestStop("a sibling failed to start");
      return 1;
    }
    w.server = std::move(*server);
    session->StartHeartbeats(version);
    workers.push_back(std::move(w));
  }
  GYRE_LOG_INFO("serving {} simulated rollout and {} simulated trainer workers", rollouts,
                trainers);
  std::printf("sim-workers: %lld rollout + %lld trainer workers registered with %s\n",
              static_cast<long long>(rollouts), static_cast<long long>(trainers),
              controller.c_str());
  std::fflush(stdout);
  for (auto& w : workers) {
    while (!w.session->WaitForStopFor(0.2)) {
      if (int sig = g_sim_signal.load()) {
        for (auto& other : workers) {
          other.session->RequestStop(sig == SIGINT ? "SIGINT" : "SIGTERM");
        }
      }
    }
  }
  for (auto& w : workers) {
    w.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    w.session->Shutdown();
  }
  return 0;
}

}  // namespace gyre::bench
