#pragma once
// Cluster: the controller's side of a running cluster, started once for a training job
// (JobRunner) or an embedded rollout fleet (gyre::RolloutFleet): the job's security settings,
// the ControllerService and the gRPC server the workers register with, the rendezvous store of
// the gloo and nccl weight transports, the WorkerPool, the WeightPublisher, the
// RolloutScheduler, and the TrainerGroup when the cluster has trainer workers.
//
// Start-up has two phases, so that a caller can act between them: Start() brings up everything
// the workers need to find (security, server, store) and makes the components; a job then
// writes controller.address, notes the Slurm job and starts its metrics endpoint; StartWorkers()
// spawns (local mode) or awaits (external mode) the workers, waits until every one has
// registered, and forms the trainer group.
//
// Ownership: the Cluster owns all of the above; the accessors' pointers stay valid until it is
// destroyed. Shutdown() stops the workers and then the server, and is idempotent (the
// destructor calls it).
//
// Threads: the owner's thread (the job thread) calls everything. The components keep their own
// thread contracts (the pool's monitor thread, the server's gRPC threads).

#include <functional>
#include <memory>
#include <string>

#include "controller/controller_service.h"
#include "controller/rollout_scheduler.h"
#include "controller/trainer_group.h"
#include "controller/weight_publisher.h"
#include "controller/worker_pool.h"
#include "gyre/config.h"
#include "gyre/status.h"
#include "rpc/clients.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace gyre::comm {
class StoreServer;
}  // namespace gyre::comm

namespace gyre::controller {

// cluster.weight_transport, decided once when the cluster starts.
enum class WeightTransport { kGrpc, kGloo, kNccl, kCudaIpc };

// `name` is a validated cluster.weight_transport value (config::ValidateJobConfig).
WeightTransport ParseWeightTransport(const std::string& name);

// What differs between the clusters of a job and of a rollout fleet. Defaults suit a job.
struct ClusterOptions {
  // Where each worker's log goes (<logs_dir>/<id>.log); the caller creates the directory.
  std::string logs_dir;
  // The executable spawned as a worker (local mode). Empty: cluster.worker_binary, and when that
  // is empty too, the running executable.
  std::string worker_binary;
  // Prints a line for the user (worker restarts); null = silent.
  std::function<void(const std::string&)> print;
  // Sets the live status line while the workers start ("starting 3 workers ..."); null = none.
  std::function<void(const std::string&)> status;
  // Why the job must stop now ("cancelled: ...", "interrupted by SIGINT"), or "". Any thread.
  std::function<std::string()> interrupt_reason;
  // Whether the cluster has trainer workers (trainer.workers of them). A rollout fleet has none:
  // its versions come from `local_weights`.
  bool trainers = true;
  // Where versions come from when not from trainer-0 (see WeightPublisher); no `send` =
  // trainer-0.
  LocalWeightSource local_weights;
  // The clients to the workers. Tests pass fakes (tests/fakes/fake_clients.h).
  rpc::ClientFactory clients = rpc::GrpcClientFactory();
  // How long a failed call waits for the monitor to see a worker's death (WorkerPoolOptions).
  double death_grace_s = 2.0;
  // Tests: called once the pool has declared the workers (external mode), before waiting for
  // them to register, with the service they register with; fake workers register here. An error
  // fails StartWorkers.
  std::function<Status(ControllerService*)> on_workers_expected;
  // How long Shutdown gives the server's calls in flight to end.
  double shutdown_grace_s = 1.0;
};

class Cluster {
 public:
  // Phase one: configures the job's security, starts the controller's server (on
  // cluster.bind_host:cluster.controller_port) and the weight rendezvous store when the
  // transport needs one, and makes the pool, publisher, scheduler and trainer group. No worker
  // is started yet.
  static StatusOr<std::unique_ptr<Cluster>> Start(const JobConfig& config, ClusterOptions options);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Phase two: starts the workers, waits until all registered, and forms the trainer group.
  // Call once, after Start.
  Status StartWorkers();
  // Stops the workers (WorkerPool::Shutdown), then the server. Idempotent.
  void Shutdown();

  // Where the workers dial the controller ("host:port").
  const std::string& address() const { return address_; }
  WeightTransport transport() const { return transport_; }
  // The rendezvous store's address ("" unless the transport is gloo or nccl).
  std::string store_address() const;
  ControllerService* service() { return service_.get(); }
  WorkerPool* pool() { return pool_.get(); }
  WeightPublisher* publisher() { return publisher_.get(); }
  RolloutScheduler* scheduler() { return scheduler_.get(); }
  // Null when the cluster has no trainer workers.
  TrainerGroup* trainers() { return trainers_.get(); }

 private:
  Cluster(const JobConfig& config, ClusterOptions options);
  Status StartServing(const std::string& config_yaml);

  const JobConfig cfg_;  // trainer.workers is 0 without trainers
  ClusterOptions opts_;
  const WeightTransport transport_;
  std::unique_ptr<ControllerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<comm::StoreServer> store_;
  // Declared after the service they use, and destroyed before it.
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<WeightPublisher> publisher_;
  std::unique_ptr<RolloutScheduler> scheduler_;
  std::unique_ptr<TrainerGroup> trainers_;
  bool shut_down_ = false;
};

}  // namespace gyre::controller
