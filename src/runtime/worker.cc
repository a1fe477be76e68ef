#include "runtime/worker.h"

#include <ATen/Parallel.h>
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/tensor_parallel_group.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "config/config.h"
#include "kernels/device_info.h"
#include "model/hf_config.h"
#include "model/hf_model.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "rollout/rollout_engine.h"
#include "rollout/rollout_service.h"
#include "rollout/tensor_parallel_weights.h"
#include "rpc/rpc_util.h"
#include "rpc/security.h"
#include "rpc/worker_discovery.h"
#include "rpc/worker_session.h"
#include "text/text_tokenizer.h"
#include "text/tokenizer.h"
#include "trainer/trainer_service.h"

namespace gyre::runtime {

namespace {

// model.device for worker `index` of its role: cpu, cuda (GPU index mod the visible count), or
// auto (cuda when a device is usable).
// The device of worker `index` of `role` (cluster.placement, see docs/config.md).
StatusOr<at::Device> ResolveDevice(const JobConfig& cfg, v1::WorkerRole role, int index) {
  const std::string& setting = cfg.model.device;
  if (setting == "cpu") return at::Device(at::kCPU);
  const int gpus = kernels::CudaDeviceCount();
  if (gpus == 0) {
    if (setting == "auto") return at::Device(at::kCPU);
    return FailedPrecondition(
        "model.device is cuda but this worker sees no usable CUDA device (no GPU or driver, "
        "CUDA_VISIBLE_DEVICES empty, or a build without CUDA); set model.device: cpu or auto");
  }
  // A tensor-parallel rollout worker's ranks take consecutive GPUs (RankDevice): rank 0 of worker
  // i starts at slot i * rollout.tensor_parallel.
  const int slot =
      role == v1::WORKER_ROLE_ROLLOUT ? index * std::max(1, cfg.rollout.tensor_parallel) : index;
  int gpu = slot % gpus;
  if (cfg.cluster.placement == "disaggregated" && role == v1::WORKER_ROLE_ROLLOUT) {
    const int trainers = cfg.trainer.workers;
    gpu = (trainers + slot) % gpus;
    if (gpu < trainers) {
      return FailedPrecondition("cluster.placement is disaggregated, but rollout worker " +
                                std::to_string(index) + " would share GPU " + std::to_string(gpu) +
                                " with a trainer: this host has " + std::to_string(gpus) +
                                " GPU(s) for " + std::to_string(trainers) +
                                " trainer(s); add GPUs or use cluster.placement: colocated");
    }
  }
  return at::Device(at::kCUDA, static_cast<at::DeviceIndex>(gpu));
}

// trainer.torch_threads, or for 0 (auto) this process's share of the CPU cores it may run on
// (its affinity mask, which taskset, cgroups and Slurm's cpusets narrow): local workers that
// compute at the same time split them. Synchronously, rollout and training alternate, so the
// rollout workers share the cores while generating and the trainers while training;
// asynchronously both run at once and all workers share them. An external worker (started by
// a launcher that gives it its own cores) takes all of its mask. At most 32: beyond that one
// process's small matmuls gain nothing.
int AutoTorchThreads(const JobConfig& cfg, v1::WorkerRole role) {
  if (cfg.trainer.torch_threads > 0) return cfg.trainer.torch_threads;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  int cores = 1;
  if (::sched_getaffinity(0, sizeof(mask), &mask) == 0) cores = std::max(1, CPU_COUNT(&mask));
  int sharing = 1;
  if (cfg.cluster.mode != "external") {
    // A tensor-parallel rollout worker is rollout.tensor_parallel processes.
    const int rollouts = cfg.rollout.workers * cfg.rollout.tensor_parallel,
              trainers = cfg.trainer.workers;
    sharing = cfg.rollout.async ? rollouts + trainers
                                : (role == v1::WORKER_ROLE_ROLLOUT ? rollouts : trainers);
  }
  return std::clamp(cores / std::max(1, sharing), 1, 32);
}

// The job's model as a worker builds it at start: the built-in model from job.seed, or
// model.path. Errors say what to change.
StatusOr<std::unique_ptr<model::Transformer>> BuildModel(const JobConfig& cfg, bool trainer) {
  if (!cfg.model.path.empty()) {
    auto loaded = model::LoadHfModel(cfg.model.path, cfg.model.max_seq_len);
    if (!loaded.ok()) return loaded.status().WithContext("cannot load model.path");
    return std::move(*loaded);
  }
  text::CharTokenizer tokenizer;
  const model::ModelSpec spec = model::SpecFromConfig(cfg.model, tokenizer.vocab_size());
  GYRE_RETURN_IF_ERROR(model::CheckModelSize(spec, "the model section"));
  try {
    return model::Transformer::Create(spec, cfg.job.seed, cfg.model.init_std);
  } catch (const std::exception& e) {
    // Out of memory, typically under trainer.memory_limit_gb.
    return FailedPrecondition(
        "cannot build the model (" + HumanBytes(4 * model::EstimateParameterCount(spec)) +
        " of float32 weights)" +
        (trainer && cfg.trainer.memory_limit_gb > 0
             ? " within trainer.memory_limit_gb " +
                   std::to_string(cfg.trainer.memory_limit_gb).substr(0, 6) + " GiB"
             : std::string()) +
        ": " + e.what());
  }
}

constexpr char kWorkerSummary[] =
    "Starts one worker process of a Gyre job. The worker serves gRPC on --bind-host:--port,\n"
    "registers with the controller as <role>-<index>, receives the job configuration from it,\n"
    "and runs until the controller stops it or cannot be reached for\n"
    "cluster.heartbeat_timeout_s. `gyre train` starts its workers this way; on a cluster, a\n"
    "launcher starts them with the controller's address.";

constexpr char kWorkerDetails[] =
    "Under a launcher (docs/cluster.md), what the flags leave unset comes from the environment:\n"
    "  --controller      $GYRE_CONTROLLER\n"
    "  --index           $GYRE_WORKER_INDEX, else $JOB_COMPLETION_INDEX (Kubernetes Indexed\n"
    "                    Job), else $SLURM_PROCID (srun task rank), else 0\n"
    "  --advertise-host  the address the controller and peers dial: $GYRE_ADVERTISE_HOST,\n"
    "                    else --bind-host, or with --bind-host 0.0.0.0 this host's first\n"
    "                    non-loopback IPv4 address\n"
    "\n"
    "Security (docs/security.md): with --tls-cert/--tls-key/--tls-ca every gRPC channel and\n"
    "server of the worker uses mutual TLS (the job's cluster.tls_* files, or this host's own\n"
    "certificate from the same CA); --tls-server-name is the name the servers' certificates\n"
    "carry; --token-file names a file whose first line is the cluster token\n"
    "(cluster.auth_token_file), sent on every call and checked on every call served.";

// Tensor-parallel rollout workers (rollout.tensor_parallel T; docs/rollout.md, "Tensor
// parallelism"). Rank 0 is the worker the controller sees: it starts ranks 1..T-1 on its host
// as `gyre worker --role rollout --tp-store ADDRESS --tp-rank R`, hands them the job and its
// device through a store it serves, and forms the worker's group with them. Every rank builds
// the model, keeps its slice (moved to its device only then, so no GPU ever holds the whole
// model) and makes an engine with rank 0's number of KV blocks; ranks 1.. then follow rank 0's
// engine steps and weight updates (RolloutEngine::Follow) until it stops them. On the CPU the
// group is Gloo. On GPUs the ranks take consecutive GPUs of the rollout workers' (RankDevice):
// with one each the group is NCCL; with fewer GPUs than ranks they share them and exchange over
// Gloo through host memory (slow; it lets a one-GPU host run and test the same code).
constexpr char kTensorParallelGroup[] = "rollout-tp";
constexpr double kFollowerIdleS = 7 * 24 * 3600.0;  // a peer's exit ends the wait at once

// The GPUs rollout workers run on, [first, first + count): every GPU of the host, or with
// cluster.placement: disaggregated those after the trainers' (ResolveDevice refuses a host with
// none left).
std::pair<int, int> RolloutGpus(const JobConfig& cfg) {
  const int gpus = std::max(1, kernels::CudaDeviceCount());
  if (cfg.cluster.placement == "disaggregated" && cfg.trainer.workers < gpus) {
    return {cfg.trainer.workers, gpus - cfg.trainer.workers};
  }
  return {0, gpus};
}

// The device of rank `rank` when rank 0 runs on `device`: the next GPUs of the rollout workers'
// (wrapping around among them, never onto a trainer's).
at::Device RankDevice(const JobConfig& cfg, const at::Device& device, int rank) {
  if (!device.is_cuda()) return device;
  const auto [first, count] = RolloutGpus(cfg);
  const int at = std::max(0, std::max<int>(0, device.index()) - first);
  return at::Device(at::kCUDA, static_cast<at::DeviceIndex>(first + (at + rank) % count));
}

// Whether the ranks of a worker whose rank 0 runs on `device` have a GPU each, and so form an
// NCCL group.
bool RanksUseNccl(const JobConfig& cfg, const at::Device& device) {
  return device.is_cuda() && comm::NcclCompiled() &&
         RolloutGpus(cfg).second >= cfg.rollout.tensor_parallel;
}

// The log of rank `rank`: beside this process's own log when its stderr is a file (X.log ->
// X-tpR.log), else in the temporary directory.
std::string FollowerLogPath(const std::string& name, int rank) {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/fd/2", buf, sizeof(buf) - 1);
  std::string own = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  const std::string suffix = "-tp" + std::to_string(rank) + ".log";
  if (!own.empty() && own[0] == '/' && own.size() > 4 && own.substr(own.size() - 4) == ".log") {
    return own.substr(0, own.size() - 4) + suffix;
  }
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gyre-" + name + suffix;
}

// The model a rank of a tensor-parallel rollout worker runs: the job's model, on the CPU, in
// model.dtype (the slice is taken once the group exists). Rank 0 starts the other ranks only
// when its own model is on the CPU.
StatusOr<std::unique_ptr<model::Transformer>> BuildRolloutRankModel(const JobConfig& cfg) {
  GYRE_ASSIGN_OR_RETURN(auto model, BuildModel(cfg, /*trainer=*/false));
  GYRE_ASSIGN_OR_RETURN(const at::ScalarType dtype, model::ParseWeightDtype(cfg.model.dtype));
  model->ToDtype(dtype);
  return model;
}

// `device`: this rank's. Over NCCL rank 0 has put the group's id in the store.
StatusOr<std::unique_ptr<comm::Communicator>> JoinRolloutGroup(const JobConfig& cfg,
                                                               const std::string& store, int rank,
                                                               const std::string& host,
                                                               const at::Device& device,
                                                               bool nccl) {
  const double timeout_s = std::max(60.0, cfg.cluster.register_timeout_s);
  if (nccl) {
    GYRE_ASSIGN_OR_RETURN(const std::string id, comm::StoreGet(store, "nccl_id", timeout_s));
    comm::NcclOptions o;
    o.unique_id = id;
    o.rank = rank;
    o.size = cfg.rollout.tensor_parallel;
    o.device = std::max<int>(0, device.index());
    o.connect_timeout_s = timeout_s;
    return comm::CreateNcclCommunicator(o);
  }
  comm::GlooOptions o;
  o.store_address = store;
  o.group = kTensorParallelGroup;
  o.rank = rank;
  o.size = cfg.rollout.tensor_parallel;
  o.bind_host = host;
  o.connect_timeout_s = timeout_s;
  return comm::CreateGlooCommunicator(o);
}

// Rank `rank` > 0: the whole life of a follower process. Returns the exit code.
int RunRolloutFollower(const std::string& store, int rank, int index, const std::string& host) {
  const std::string name = "rollout-" + std::to_string(index) + "-tp" + std::to_string(rank);
  InitLogging(name);
  auto fail = [&](const Status& s) {
    GYRE_LOG_ERROR("{}: {}", name, s.ToString());
    std::fprintf(stderr, "gyre worker (%s): %s\n", name.c_str(), s.ToString().c_str());
    return 1;
  };
  auto yaml = comm::StoreGet(store, "job", 120);
  if (!yaml.ok()) return fail(yaml.status().WithContext("the job from rank 0"));
  auto cfg = config::ParseJobConfig(*yaml, "<rank 0>");
  if (!cfg.ok()) return fail(cfg.status());
  InitLogging(name + "-main", cfg->job.log_level);
  at::set_num_threads(AutoTorchThreads(*cfg, v1::WORKER_ROLE_ROLLOUT));
  TuneAllocatorForRepeatedSteps();
  auto rank0_device = comm::StoreGet(store, "device", 120);
  if (!rank0_device.ok()) return fail(rank0_device.status().WithContext("rank 0's device"));
  at::Device device(at::kCPU);
  try {
    device = RankDevice(*cfg, at::Device(*rank0_device), rank);
  } catch (const std::exception& e) {
    return fail(InvalidArgument("rank 0's device \"" + *rank0_device + "\": " + e.what()));
  }
  auto whole = BuildRolloutRankModel(*cfg);
  if (!whole.ok()) return fail(whole.status());
  auto comm = JoinRolloutGroup(*cfg, store, rank, host, device,
                               RanksUseNccl(*cfg, at::Device(*rank0_device)));
  if (!comm.ok()) return fail(comm.status());
  comm::CommTensorParallel group(comm->get(), cfg->trainer.collective_timeout_s);
  std::unique_ptr<model::Transformer> slice =
      model::Transformer::TensorParallelSlice(**whole, &group);
  whole->reset();
  try {
    slice->To(device);
  } catch (const std::exception& e) {
    return fail(Unavailable("cannot move the slice to " + device.str() + ": " + e.what()));
  }
  auto engine_config = rollout::EngineConfigFromJob(cfg->rollout, *slice);
  if (!engine_config.ok()) return fail(engine_config.status());
  auto blocks = comm::StoreGet(store, "num_blocks", 120);
  if (!blocks.ok()) return fail(blocks.status().WithContext("rank 0's KV blocks"));
  engine_config->num_blocks = std::stoll(*blocks);
  auto engine = rollout::RolloutEngine::Create(slice.get(), *engine_config);
  if (!engine.ok()) return fail(engine.status());
  GYRE_LOG_INFO(
      "{}: tensor-parallel rank {} of {} ({} parameters in its slice, on {}, {} group), following "
      "rank 0",
      name, rank, cfg->rollout.tensor_parallel, slice->NumParameters(), device.str(),
      (*comm)->backend());
  // Its own group with the trainer, when versions come to every rank straight from it.
  rollout::DirectReceiver direct;
  bool direct_logged = false;
  const Status s = (*engine)->Follow(
      [&](int64_t version) {
        const uint64_t before = group.received_bytes();
        const std::optional<rollout::DirectRoute> route = rollout::ReceiveRoute(&group);
        if (route) {
          auto got =
              rollout::ReceiveDirectSlices(*route, &direct, slice->NamedParameters(), &group);
          const std::string what = fmt::format(
              "{}: version {}: {} bytes of its slices straight from the trainer, {} bytes from "
              "the other ranks: {}",
              name, got.ok() ? got->version : version, direct.payload.bytes.size(),
              group.received_bytes() - before, got.status().ToString());
          if (got.ok() && !direct_logged) {
            GYRE_LOG_INFO("{}", what);  // the first one; the others at debug
            direct_logged = true;
          } else {
            GYRE_LOG_DEBUG("{}", what);
          }
          return got.status();
        }
        const Status got = rollout::ReceiveSlices(slice->NamedParameters(), &group);
        GYRE_LOG_DEBUG("{}: version {}: received {} bytes of slices: {}", name, version,
                       group.received_bytes() - before, got.ToString());
        return got;
      },
      kFollowerIdleS);
  if (!s.ok()) return fail(s);
  GYRE_LOG_INFO("{}: rank 0 stopped the worker", name);
  return 0;
}

// Rank 0's side: the store, the follower processes and the group, kept while the worker serves.
struct RolloutTensorParallel {
  std::unique_ptr<comm::StoreServer> store;
  std::vector<pid_t> followers;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::CommTensorParallel> group;

  ~RolloutTensorParallel() {
    for (pid_t pid : followers) TerminateProcess(pid, 10);
  }
};

// Rank 0: starts the followers, forms the group and replaces *model (whole, on the CPU) with rank
// 0's slice on `device`.
Status StartRolloutTensorParallel(const JobConfig& cfg, const std::string& job_yaml,
                                  const std::string& name, int index, const std::string& host,
                                  const at::Device& device,
                                  std::unique_ptr<model::Transformer>* model,
                                  RolloutTensorParallel* tp) {
  GYRE_ASSIGN_OR_RETURN(tp->store, comm::StoreServer::Start(host));
  const std::string store = tp->store->address();
  GYRE_RETURN_IF_ERROR(comm::StoreSet(store, "job", job_yaml, 30));
  GYRE_RETURN_IF_ERROR(comm::StoreSet(store, "device", device.str(), 30));
  const bool nccl = RanksUseNccl(cfg, device);
  if (nccl) {
    GYRE_ASSIGN_OR_RETURN(const std::string id, comm::NewNcclUniqueId());
    GYRE_RETURN_IF_ERROR(comm::StoreSet(store, "nccl_id", id, 30));
  } else if (device.is_cuda()) {
    GYRE_LOG_WARN(
        "{}: rollout.tensor_parallel {} with {} GPU(s) for rollout workers: ranks share GPUs and "
        "exchange over Gloo through host memory, which is slow; one GPU per rank uses NCCL",
        name, cfg.rollout.tensor_parallel, RolloutGpus(cfg).second);
  }
  for (int r = 1; r < cfg.rollout.tensor_parallel; ++r) {
    const std::string log = FollowerLogPath(name, r);
    GYRE_ASSIGN_OR_RETURN(
        pid_t pid, SpawnProcess({SelfExecutable(), "worker", "--role", "rollout", "--index",
                                 std::to_string(index), "--bind-host", host, "--tp-store", store,
                                 "--tp-rank", std::to_string(r)},
                                log));
    tp->followers.push_back(pid);
    GYRE_LOG_INFO("{}: started tensor-parallel rank {} (pid {}), log {}", name, r, pid, log);
  }
  GYRE_ASSIGN_OR_RETURN(tp->comm, JoinRolloutGroup(cfg, store, 0, host, device, nccl));
  tp->group =
      std::make_unique<comm::CommTensorParallel>(tp->comm.get(), cfg.trainer.collective_timeout_s);
  *model = model::Transformer::TensorParallelSlice(**model, tp->group.get());
  try {
    (*model)->To(device);
  } catch (const std::exception& e) {
    return Unavailable("cannot move the slice to " + device.str() + ": " + e.what());
  }
  return Status::Ok();
}

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }  // async-signal-safe: the main loop reacts

}  // namespace

// A worker repeats steps of the same shapes, whose tensors glibc's malloc would otherwise give
// back to the kernel when freed (the top of the heap beyond 128 KiB, and chunks it decided to
// mmap) and fault in again, zeroed, on the next step: measured on the quickstart (alternating
// runs), the GRPO step was 5-8% faster and the warm-up step 10% faster without that. Keep freed
// memory for reuse and mmap only chunks of 32 MiB and more, as allocators that cache (PyTorch's
// CUDA allocator, jemalloc) do. The process then holds its peak resident memory.
// GYRE_MALLOC_DEFAULTS=1 keeps glibc's defaults.
void TuneAllocatorForRepeatedSteps() {
  const char* keep = std::getenv("GYRE_MALLOC_DEFAULTS");
  if (keep != nullptr && std::string(keep) == "1") return;
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

// trainer.memory_limit_gb: the kernel refuses this process private writable memory (heap,
// anonymous mappings, the libraries' data segments: what /proc/self/status calls VmData) beyond
// the limit, so an allocation past it fails (libtorch then throws, the step fails with that
// error) instead of the process growing until the node runs out. A lower limit already set
// (ulimit -d, a batch system) is kept.
namespace {
Status LimitMemory(double gib) {
  const double bytes = gib * 1024.0 * 1024.0 * 1024.0;
  rlimit current{};
  if (::getrlimit(RLIMIT_DATA, &current) != 0) {
    return Internal(std::string("getrlimit(RLIMIT_DATA): ") + std::strerror(errno));
  }
  rlim_t want =
      bytes >= static_cast<double>(RLIM_INFINITY) ? RLIM_INFINITY : static_cast<rlim_t>(bytes);
  if (current.rlim_max != RLIM_INFINITY && current.rlim_max < want) {
    GYRE_LOG_WARN(
        "trainer.memory_limit_gb {} is above this process's hard data limit of {}: "
        "keeping the lower one",
        gib, HumanBytes(static_cast<double>(current.rlim_max)));
    want = current.rlim_max;
  }
  const rlimit limit{want, want};
  if (::setrlimit(RLIMIT_DATA, &limit) != 0) {
    return Internal("cannot apply trainer.memory_limit_gb (setrlimit RLIMIT_DATA to " +
                    HumanBytes(static_cast<double>(want)) + "): " + std::strerror(errno));
  }
  GYRE_LOG_INFO("memory limited to {} (trainer.memory_limit_gb, RLIMIT_DATA)",
                HumanBytes(static_cast<double>(want)));
  return Status::Ok();
}
}  // namespace

int RunWorker(const std::vector<std::string>& args) {
  std::string role, controller, bind_host = "127.0.0.1", advertise_host, index_text;
  int index = -1, port = 0;
  double register_timeout = 60;
  rpc::SecurityOptions security;
  auto app = NewCommand("gyre worker", kWorkerSummary, kWorkerDetails);
  app->add_option("--role", role, "the worker's role")
      ->required()
      ->check(CLI::IsMember({"rollout", "trainer"}));
  app->add_option("--controller", controller,
                  "the controller's HOST:PORT (default: $GYRE_CONTROLLER)");
  app->add_option("--index", index_text,
                  "the worker's index within its role (default: from the environment, else 0)")
      ->type_name("N");
  app->add_option("--bind-host", bind_host, "the address the worker's gRPC server binds");
  app->add_option("--advertise-host", advertise_host,
                  "the address the controller and peers dial (default: see below)");
  app->add_option("--port", port, "the worker's gRPC port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  app->add_option("--register-timeout", register_timeout,
                  "seconds to keep trying to register with the controller")
      ->check(NumberIn(0, kNoUpperBound, /*min_open=*/true))
      ->type_name("SECONDS");
  app->add_option("--tls-cert", security.tls_cert, "this worker's certificate (PEM)")
      ->type_name("PEM");
  app->add_option("--tls-key", security.tls_key, "its private key (PEM)")->type_name("PEM");
  app->add_option("--tls-ca", security.tls_ca, "the cluster's certificate authority (PEM)")
      ->type_name("PEM");
  app->add_option("--tls-server-name", security.server_name,
                  "the name the servers' certificates carry");
  app->add_option("--token-file", security.token_file,
                  "a file whose first line is the cluster token")
      ->type_name("FILE");
  std::string tp_store;
  int tp_rank = 0;
  app->add_option("--tp-store", tp_store,
                  "(started by a tensor-parallel rollout worker) the store of its rank 0")
      ->group("Tensor-parallel ranks (started by rank 0, not by hand)");
  app->add_option("--tp-rank", tp_rank, "(with --tp-store) this process's tensor-parallel rank")
      ->check(CLI::Range(1, 63))
      ->group("Tensor-parallel ranks (started by rank 0, not by hand)");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;

  if (!index_text.empty()) {
    auto parsed = rpc::ParseWorkerIndex(index_text, "--index");
    if (!parsed.ok()) return CommandLineError(*app, parsed.status().message());
    index = *parsed;
  }
  if (!tp_store.empty()) {
    if (role != "rollout" || tp_rank < 1) {
      return CommandLineError(*app, "--tp-store is for --role rollout with --tp-rank >= 1");
    }
    return RunRolloutFollower(tp_store, tp_rank, index < 0 ? 0 : index, bind_host);
  }
  auto placement = rpc::DiscoverPlacement(controller, index, bind_host, advertise_host,
                                          rpc::ProcessEnvironment());
  if (!placement.ok()) {
    std::fprintf(stderr, "gyre worker: %s\n", placement.status().message().c_str());
    return 2;
  }
  controller = placement->controller;
  index = placement->index;
  const std::string name = role + "-" + std::to_string(index);
  InitLogging(name);
  if (Status st = rpc::ConfigureSecurity(security); !st.ok()) {
    std::fprintf(stderr, "gyre worker: %s\n", st.message().c_str());
    return 2;
  }
  const v1::WorkerRole wrole =
      role == "rollout" ? v1::WORKER_ROLE_ROLLOUT : v1::WORKER_ROLE_TRAINER;
  rpc::WorkerSession session(controller, wrole, index);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  RolloutTensorParallel tp;  // outlives the service, whose model uses its group
  std::unique_ptr<rollout::RolloutService> rollout_service;
  std::unique_ptr<trainer::TrainerService> trainer_service;
  auto on_stop = [&session](const std::string& reason) { session.RequestStop(reason); };

  // Registration needs our address, and the services need the config that registration
  // returns: pick the port first, learn the config, then serve on that port. The controller
  // calls us only after our first heartbeat, which starts once the server is up.
  // The port stays reserved until the server holds it, so that no worker starting beside this
  // one is given it meanwhile (rpc::PortReservation).
  int bound_port = port;
  std::optional<rpc::PortReservation> reserved;
  if (bound_port == 0) {
    auto reservation = rpc::PortReservation::Make(bind_host);
    if (!reservation.ok()) {
      std::fprintf(stderr, "gyre worker: %s\n", reservation.status().ToString().c_str());
      return 1;
    }
    bound_port = reservation->port();
    reserved.emplace(std::move(*reservation));
  }
  // What the controller and the other workers dial (the bind address may be a wildcard).
  const std::string address = placement->advertise_host + ":" + std::to_string(bound_port);
  GYRE_LOG_INFO("{}: index from {}, controller {}, serving on {}:{} as {}", name,
                placement->index_source, controller, bind_host, bound_port, address);
  Status s = session.Register(address, register_timeout);
  if (!s.ok()) {
    GYRE_LOG_ERROR("{}", s.ToString());
    std::fprintf(stderr, "gyre worker: %s\n", s.ToString().c_str());
    return 1;
  }
  auto cfg = config::ParseJobConfig(session.job_config_yaml(), "<controller>");
  if (!cfg.ok()) {
    session.ReportFatal("bad job configuration: " + cfg.status().ToString());
    std::fprintf(stderr, "gyre worker: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  InitLogging(name + "-main", cfg->job.log_level);
  // cluster.bind_host is the controller's; in this process the address of this host is the one
  // it advertises (the trainers' data-parallel store and Gloo devices listen on it).
  cfg->cluster.bind_host = placement->advertise_host;
  const int threads = AutoTorchThreads(*cfg, wrole);
  at::set_num_threads(threads);
  const bool trainer = wrole == v1::WORKER_ROLE_TRAINER;
  if (trainer && (cfg->trainer.memory_limit_gb > 0 || cfg->trainer.shard == "parameters" ||
                  cfg->trainer.tensor_parallel > 1)) {
    // A trainer that must stay small gives memory back: the whole model it builds at start-up
    // (split and freed under trainer.shard: parameters or tensor parallelism) would otherwise stay
    // on the heap, counted against trainer.memory_limit_gb, for the rest of the run. Tensors of 1
    // MiB and more are mapped on their own and unmapped when freed.
    ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  } else {
    TuneAllocatorForRepeatedSteps();
  }
  if (trainer && cfg->trainer.memory_limit_gb > 0) {
    if (Status s = LimitMemory(cfg->trainer.memory_limit_gb); !s.ok()) {
      session.ReportFatal(s.ToString());
      std::fprintf(stderr, "gyre worker: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  auto built = BuildModel(*cfg, trainer);
  if (!built.ok()) {
    session.ReportFatal(built.status().message());
    std::fprintf(stderr, "gyre worker: %s\n", built.status().message().c_str());
    return 1;
  }
  std::unique_ptr<model::Transformer> model = std::move(*built);
  auto device = ResolveDevice(*cfg, wrole, index);
  if (!device.ok()) {
    session.ReportFatal(device.status().message());
    std::fprintf(stderr, "gyre worker: %s\n", device.status().ToString().c_str());
    return 1;
  }
  // A tensor-parallel rollout worker's ranks move only their slices to the device.
  const bool rollout_tp = wrole == v1::WORKER_ROLE_ROLLOUT && cfg->rollout.tensor_parallel > 1;
  if (!rollout_tp) model->To(*device);
  const StatusOr<at::ScalarType> dtype = model::ParseWeightDtype(cfg->model.dtype);
  if (!dtype.ok()) {
    session.ReportFatal("model.dtype: " + dtype.status().ToString());
    return 1;
  }
  // A rollout worker runs the model in model.dtype; a trainer keeps float32 master weights and
  // computes in model.dtype (mixed precision).
  if (wrole == v1::WORKER_ROLE_ROLLOUT) model->ToDtype(*dtype);
  GYRE_LOG_INFO("{}: model with {} parameters on {} ({} intra-op thread{}) in {}",
                session.worker_id(), model->NumParameters(),
                rollout_tp ? "the CPU until it is split" : device->str(), threads,
                threads == 1 ? "" : "s",
                wrole == v1::WORKER_ROLE_ROLLOUT || *dtype == at::kFloat
                    ? cfg->model.dtype
                    : "float32 (master weights), computing in " + cfg->model.dtype);

  grpc::Service* service = nullptr;
  std::function<int64_t()> version;
  if (rollout_tp) {
    Status started = StartRolloutTensorParallel(*cfg, session.job_config_yaml(), name, index,
                                                placement->advertise_host, *device, &model, &tp);
    if (!started.ok()) {
      session.ReportFatal("cannot start the tensor-parallel rollout worker: " + started.ToString());
      std::fprintf(stderr, "gyre worker: %s\n", started.ToString().c_str());
      return 1;
    }
    GYRE_LOG_INFO("{}: tensor-parallel rank 0 of {} ({} parameters in its slice, on {}, {} group)",
                  session.worker_id(), cfg->rollout.tensor_parallel, model->NumParameters(),
                  device->str(), tp.comm->backend());
  }
  if (wrole == v1::WORKER_ROLE_ROLLOUT) {
    auto engine_config = rollout::EngineConfigFromJob(cfg->rollout, *model);
    if (engine_config.ok() && tp.store) {  // the other ranks make as many KV blocks
      const Status told = comm::StoreSet(tp.store->address(), "num_blocks",
                                         std::to_string(engine_config->num_blocks), 30);
      if (!told.ok()) engine_config = told;
    }
    // Stop strings need the job's tokenizer to turn response tokens into text.
    std::shared_ptr<text::TextTokenizer> tokenizer;
    const bool env = cfg->env.enabled();
    if (engine_config.ok() && (!cfg->rollout.stop_strings.empty() || env)) {
      auto made = text::MakeTextTokenizer(cfg->model);
      if (!made.ok()) {
        engine_config = made.status();
      } else {
        tokenizer = std::move(*made);
      }
    }
    rollout::RolloutEngine::Decoder decoder;
    if (tokenizer) {
      decoder = [tokenizer](const std::vector<int32_t>& ids) { return tokenizer->Decode(ids); };
    }
    auto made_service =
        engine_config.ok()
            ? rollout::RolloutService::Create(std::move(model), *engine_config, std::move(decoder),
                                              on_stop)
            : StatusOr<std::unique_ptr<rollout::RolloutService>>(engine_config.status());
    if (!made_service.ok()) {
      session.ReportFatal("cannot start the rollout engine: " + made_service.status().ToString());
      std::fprintf(stderr, "gyre worker: %s\n", made_service.status().ToString().c_str());
      return 1;
    }
    rollout_service = std::move(*made_service);
    if (env) {
      auto setup = rollout::EpisodeSetupFromJob(*cfg, tokenizer);
      if (!setup.ok()) {
        session.ReportFatal("cannot run environment episodes: " + setup.status().ToString());
        std::fprintf(stderr, "gyre worker: %s\n", setup.status().ToString().c_str());
        return 1;
      }
      rollout_service->EnableEpisodes(std::move(*setup));
    }
    service = rollout_service.get();
    version = [&] { return rollout_service->version(); };
  } else {
    auto made = trainer::TrainerService::Create(*cfg, std::move(model), on_stop);
    if (!made.ok()) {
      session.ReportFatal("cannot train this job: " + made.status().ToString());
      std::fprintf(stderr, "gyre worker: %s\n", made.status().ToString().c_str());
      return 1;
    }
    trainer_service = std::move(*made);
    service = trainer_service.get();
    version = [&] { return trainer_service->version(); };
  }
  std::string serving;
  auto server = rpc::StartServer(bind_host, bound_port, {service}, &serving);
  if (!server.ok()) {
    session.ReportFatal("cannot serve on " + address + ": " + server.status().ToString());
    return 1;
  }
  if (reserved) reserved->Release();
  session.StartHeartbeats(version);  // the first heartbeat tells the controller we are ready
  GYRE_LOG_INFO("{} serving on {}", session.worker_id(), serving);
  while (!session.WaitForStopFor(0.2)) {
    if (int sig = g_signal.load()) session.RequestStop(sig == SIGINT ? "SIGINT" : "SIGTERM");
  }
  const std::string reason = session.WaitForStop();
  GYRE_LOG_INFO("{} stopping: {}", session.worker_id(), reason);
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (rollout_service && !tp.followers.empty()) {
    if (Status s = rollout_service->StopFollowers(); !s.ok()) {
      GYRE_LOG_WARN("stopping the tensor-parallel ranks: {}", s.ToString());
    }
    std::vector<pid_t> running;  // those still running after 10 s get SIGTERM (~tp)
    for (pid_t pid : tp.followers) {
      int status = 0;
      bool exited = false;
      for (int i = 0; i < 100 && !(exited = PollExit(pid, &status)); ++i) ::usleep(100000);
      if (!exited) running.push_back(pid);
    }
    tp.followers = running;
  }
  session.Shutdown();
  return 0;
}

}  // namespace gyre::runtime
