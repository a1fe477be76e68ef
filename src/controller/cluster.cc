#include "controller/cluster.h"

#include <chrono>
#include <utility>

#include "comm/gloo_communicator.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "config/config.h"
#include "rpc/rpc_util.h"
#include "rpc/security.h"

namespace gyre::controller {

WeightTransport ParseWeightTransport(const std::string& name) {
  if (name == "gloo") return WeightTransport::kGloo;
  if (name == "nccl") return WeightTransport::kNccl;
  if (name == "cuda_ipc") return WeightTransport::kCudaIpc;
  GYRE_CHECK(name == "grpc") << "cluster.weight_transport '" << name << "' was not validated";
  return WeightTransport::kGrpc;
}

namespace {

// The job's config as the cluster's components see it: without trainers, trainer.workers is 0
// (the pool starts rollout workers only, the publisher and scheduler expect no trainer).
JobConfig ComponentConfig(const JobConfig& config, bool trainers) {
  JobConfig c = config;
  if (!trainers) c.trainer.workers = 0;
  return c;
}

}  // namespace

Cluster::Cluster(const JobConfig& config, ClusterOptions options)
    : cfg_(ComponentConfig(config, options.trainers)),
      opts_(std::move(options)),
      transport_(ParseWeightTransport(config.cluster.weight_transport)) {}

Cluster::~Cluster() { Shutdown(); }

StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const JobConfig& config, ClusterOptions options) {
  std::unique_ptr<Cluster> cluster(new Cluster(config, std::move(options)));
  // The workers receive the job's config as it was given (trainer.workers included).
  GYRE_RETURN_IF_ERROR(cluster->StartServing(config::DumpJobConfig(config)));
  return cluster;
}

Status Cluster::StartServing(const std::string& config_yaml) {
  GYRE_RETURN_IF_ERROR(rpc::ConfigureJobSecurity(cfg_.cluster));
  service_ = std::make_unique<ControllerService>(config_yaml, cfg_.cluster.heartbeat_interval_s,
                                                 cfg_.cluster.heartbeat_timeout_s);
  GYRE_ASSIGN_OR_RETURN(server_,
                        rpc::StartServer(cfg_.cluster.bind_host, cfg_.cluster.controller_port,
                                         {service_.get()}, &address_));
  if (transport_ == WeightTransport::kGloo || transport_ == WeightTransport::kNccl) {
    GYRE_ASSIGN_OR_RETURN(store_, comm::StoreServer::Start(cfg_.cluster.bind_host));
    GYRE_LOG_INFO("weight rendezvous store on {}", store_->address());
  }
  WorkerPoolOptions po;
  po.controller_address = address_;
  po.worker_binary = !opts_.worker_binary.empty()          ? opts_.worker_binary
                     : !cfg_.cluster.worker_binary.empty() ? cfg_.cluster.worker_binary
                                                           : SelfExecutable();
  po.logs_dir = opts_.logs_dir;
  po.clients = opts_.clients;
  po.print = opts_.print;
  po.death_grace_s = opts_.death_grace_s;
  po.interrupt_reason = opts_.interrupt_reason;
  pool_ = std::make_unique<WorkerPool>(cfg_, service_.get(), std::move(po));
  publisher_ =
      std::make_unique<WeightPublisher>(cfg_, pool_.get(), store_address(), opts_.local_weights);
  scheduler_ = std::make_unique<RolloutScheduler>(cfg_, pool_.get());
  if (opts_.trainers) trainers_ = std::make_unique<TrainerGroup>(cfg_, pool_.get());
  return Status::Ok();
}

Status Cluster::StartWorkers() {
  GYRE_RETURN_IF_ERROR(pool_->Start());
  if (opts_.on_workers_expected) GYRE_RETURN_IF_ERROR(opts_.on_workers_expected(service_.get()));
  if (opts_.status) {
    opts_.status("starting " + std::to_string(cfg_.rollout.workers + cfg_.trainer.workers) +
                 " workers (each loads the model)");
  }
  GYRE_RETURN_IF_ERROR(pool_->WaitRegistered());
  if (!trainers_) return Status::Ok();
  if (opts_.status) opts_.status("forming the trainer group");
  return trainers_->Form();
}

void Cluster::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (pool_) {
    pool_->Shutdown();
  } else if (service_) {
    service_->RequestStopAll();
  }
  if (server_) {
    server_->Shutdown(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(opts_.shutdown_grace_s * 1e3)));
  }
}

std::string Cluster::store_address() const { return store_ ? store_->address() : std::string(); }

}  // namespace gyre::controller
