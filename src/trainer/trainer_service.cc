#include "trainer/trainer_service.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "algorithm/registry.h"
#include "comm/nccl_communicator.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sync.h"
#include "common/check.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "kernels/reference/policy_loss_ref.h"
#include "model/weights.h"
#include "rpc/rpc_util.h"
#include "trainer/trainer_state.h"

namespace gyre::trainer {
namespace {

// The trainer's view of the protocol's samples (prompt, response, rollout log-probs, mask,
// versions, advantage).
std::vector<TrainSample> ToTrainSamples(
    const google::protobuf::RepeatedPtrField<v1::Sample>& samples) {
  std::vector<TrainSample> batch;
  batch.reserve(samples.size());
  for (const auto& s : samples) {
    TrainSample t;
    t.prompt.assign(s.prompt_ids().begin(), s.prompt_ids().end());
    t.response.assign(s.response_ids().begin(), s.response_ids().end());
    t.rollout_logprobs.assign(s.logprobs().begin(), s.logprobs().end());
    t.loss_mask.assign(s.loss_mask().begin(), s.loss_mask().end());
    t.versions.assign(s.versions().begin(), s.versions().end());
    t.advantage = s.advantage();
    batch.push_back(std::move(t));
  }
  return batch;
}

}  // namespace

StatusOr<TrainOptions> TrainOptionsFromJob(const JobConfig& config) {
  TrainOptions opts;
  opts.micro_batch_size = config.trainer.micro_batch_size;
  opts.mini_batches = config.trainer.mini_batches;
  opts.grad_clip = config.trainer.grad_clip;
  const auto& a = config.algorithm;
  auto context = [](const char* key) { return std::string("trainer: ") + key; };
  opts.loss.clip_eps_low = static_cast<float>(a.clip_eps_low);
  opts.loss.clip_eps_high = static_cast<float>(a.clip_eps_high);
  opts.loss.dual_clip_c = static_cast<float>(a.dual_clip_c);
  StatusOr<kernels::Correction> correction = algorithm::CorrectionFor(a.correction);
  if (!correction.ok()) return correction.status().WithContext(context("algorithm.correction"));
  opts.loss.correction = a.tis ? kernels::Correction::kTis : *correction;
  opts.loss.tis_cap = static_cast<float>(a.tis_cap);
  opts.loss.icepop_low = static_cast<float>(a.icepop_low);
  opts.loss.icepop_high = static_cast<float>(a.icepop_high);
  opts.m2po_tau = a.m2po_tau;
  if (a.proximal == "loglinear") {
    opts.proximal = Proximal::kLogLinear;
  } else if (a.proximal == "behaviour") {
    opts.proximal = Proximal::kBehaviour;
  } else if (a.proximal == "recompute") {
    opts.proximal = Proximal::kRecompute;
  } else {
    return InvalidArgument(context("algorithm.proximal") + ": '" + a.proximal +
                           "' is not one of recompute, behaviour, loglinear");
  }
  StatusOr<kernels::LossAgg> agg = algorithm::LossAggFor(a.loss_agg);
  if (!agg.ok()) return agg.status().WithContext(context("algorithm.loss_agg"));
  opts.loss.agg = *agg;
  // A loss the program registered (include_torch/gyre/torch.h) is computed by its function in
  // place of a kernel term.
  if (algorithm::IsUserPolicyLoss(a.policy_loss)) {
    opts.user_loss = a.policy_loss;
  } else {
    StatusOr<kernels::PolicyLossKind> kind = algorithm::PolicyLossKindFor(a.policy_loss);
    if (!kind.ok()) return kind.status().WithContext(context("algorithm.policy_loss"));
    opts.loss.kind = *kind;
  }
  opts.loss.norm_max_len =
      static_cast<float>(a.loss_norm_len > 0 ? a.loss_norm_len : config.rollout.max_new_tokens);
  opts.entropy_coef = a.entropy_coef;
  // algorithm.kl_in: reward puts the KL in the reward (SequenceKl) instead of the loss.
  StatusOr<kernels::KlKind> kl = algorithm::KlKindFor(a.kl);
  if (!kl.ok()) return kl.status().WithContext(context("algorithm.kl"));
  opts.loss.kl = a.kl_in == "loss" ? *kl : kernels::KlKind::kNone;
  opts.loss.kl_coef = static_cast<float>(a.kl_coef);
  return opts;
}

StatusOr<std::unique_ptr<TrainerService>> TrainerService::Create(
    const JobConfig& config, std::unique_ptr<model::Transformer> model,
    std::function<void(const std::string&)> on_stop) {
  GYRE_ASSIGN_OR_RETURN(TrainOptions step_options, TrainOptionsFromJob(config));
  return std::make_unique<TrainerService>(config, std::move(step_options), std::move(model),
                                          std::move(on_stop));
}

TrainerService::TrainerService(const JobConfig& config, TrainOptions step_options,
                               std::unique_ptr<model::Transformer> model,
                               std::function<void(const std::string&)> on_stop)
    : config_(config),
      step_options_(std::move(step_options)),
      trainer_(std::move(model), config.trainer.lr, config.trainer.weight_decay,
               config.trainer.beta1, config.trainer.beta2),
      on_stop_(std::move(on_stop)) {
  last_version_.store(trainer_.version());
  // The configuration was validated: model.dtype is one of the weight dtypes.
  const StatusOr<at::ScalarType> dtype = model::ParseWeightDtype(config.model.dtype);
  dtype_ = dtype.ok() ? *dtype : at::kFloat;
  trainer_.SetComputeDtype(dtype_);
  trainer_.SetSequencePacking(config.trainer.sequence_packing);
  trainer_.SetPromptSharing(config.trainer.prompt_sharing == "on"    ? PromptSharing::kOn
                            : config.trainer.prompt_sharing == "off" ? PromptSharing::kOff
                                                                     : PromptSharing::kAuto);
  trainer_.SetLogprobChunkTokens(config.trainer.logprob_chunk_tokens);
  trainer_.SetActivationCheckpointing(config.trainer.activation_checkpointing);
  // Validated configuration, fresh trainer with float32 master weights: cannot fail.
  const StatusOr<Shard> shard = ParseShard(config.trainer.shard);
  const Status sharded = shard.ok() ? trainer_.SetSharding(*shard) : shard.status();
  GYRE_CHECK(sharded.ok()) << sharded.message();
}

int64_t TrainerService::version() const {
  // Heartbeats read this while a train step holds mu_; one step of a real model can outlast the
  // heartbeat timeout, so they never wait for it and get the last version seen instead.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) last_version_.store(trainer_.version());
  return last_version_.load();
}

grpc::Status TrainerService::HostGroupStore(grpc::ServerContext* ctx,
                                            const v1::HostGroupStoreRequest* req,
                                            v1::HostGroupStoreResponse* resp) {
  return rpc::Guarded("HostGroupStore", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (!store_) {
      auto store = comm::StoreServer::Start(config_.cluster.bind_host);
      if (!store.ok()) return rpc::ToGrpc(store.status().WithContext("data-parallel store"));
      store_ = std::move(*store);
    }
    resp->set_store_address(store_->address());
    return grpc::Status::OK;
  });
}

StatusOr<std::unique_ptr<comm::Communicator>> TrainerService::FormGroup(
    const v1::JoinGroupRequest& req, double timeout_s) {
  // Trainers on GPUs form an NCCL group: the sharded optimizer's reduce-scatter and all-gather
  // then run on device memory (the gradient all-reduce buckets are host memory, staged). Rank 0
  // makes the NCCL id and hands it over through the group's store. On the CPU, or in a build
  // without NCCL, the group is Gloo.
  const at::Device device = trainer_.model().device();
  if (device.is_cuda() && comm::NcclCompiled()) {
    const std::string key = req.group() + "/nccl_id";
    std::string id;
    if (req.rank() == 0) {
      GYRE_ASSIGN_OR_RETURN(id, comm::NewNcclUniqueId());
      GYRE_RETURN_IF_ERROR(comm::StoreSet(req.store_address(), key, id, timeout_s));
    } else {
      GYRE_ASSIGN_OR_RETURN(id, comm::StoreGet(req.store_address(), key, timeout_s));
    }
    comm::NcclOptions opts;
    opts.unique_id = id;
    opts.rank = req.rank();
    opts.size = req.size();
    opts.device = device.index() < 0 ? 0 : device.index();
    opts.connect_timeout_s = timeout_s;
    return comm::CreateNcclCommunicator(opts);
  }
  comm::GlooOptions opts;
  opts.store_address = req.store_address();
  opts.group = req.group();
  opts.rank = req.rank();
  opts.size = req.size();
  opts.bind_host = config_.cluster.bind_host;
  opts.connect_timeout_s = timeout_s;
  return comm::CreateGlooCommunicator(opts);
}

grpc::Status TrainerService::JoinGroup(grpc::ServerContext* ctx, const v1::JoinGroupRequest* req,
                                       v1::JoinGroupResponse* resp) {
  return rpc::Guarded("JoinGroup", [&]() -> grpc::Status {
    if (req->size() < 1 || req->rank() < 0 || req->rank() >= req->size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "JoinGroup: rank " + std::to_string(req->rank()) + " of size " +
                              std::to_string(req->size()) + " is not a valid rank");
    }
    const double timeout_s = req->timeout_s() > 0 ? req->timeout_s() : 60;
    // Tensor parallel: first the group of the T ranks holding one model (every rank forms its
    // groups in the same order), then the data-parallel group of the ranks holding this slice.
    const int tp = std::max(1, req->tensor_parallel());
    if (req->size() % tp != 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "JoinGroup: tensor_parallel " + std::to_string(tp) +
                              " does not divide the group's size " + std::to_string(req->size()));
    }
    std::unique_ptr<comm::Communicator> tp_group;
    v1::JoinGroupRequest dp_req = *req;
    if (tp > 1) {
      v1::JoinGroupRequest tp_req = *req;
      tp_req.set_group(req->group() + "-tp" + std::to_string(req->rank() / tp));
      tp_req.set_rank(req->rank() % tp);
      tp_req.set_size(tp);
      auto formed = FormGroup(tp_req, timeout_s);
      if (!formed.ok()) {
        return rpc::ToGrpc(formed.status().WithContext("join tensor-parallel group"));
      }
      tp_group = std::move(*formed);
      dp_req.set_group(req->group() + "-dp" + std::to_string(req->rank() % tp));
      dp_req.set_rank(req->rank() / tp);
      dp_req.set_size(req->size() / tp);
    }
    // Forming the group blocks until every rank joined: not under mu_.
    std::unique_ptr<comm::Communicator> dp_group;
    if (dp_req.size() > 1) {
      auto group = FormGroup(dp_req, timeout_s);
      if (!group.ok()) return rpc::ToGrpc(group.status().WithContext("join data-parallel group"));
      dp_group = std::move(*group);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (tp_group != nullptr) {
      const Status set =
          trainer_.tp_size() > 1
              ? trainer_.RebindTensorParallel(tp_group.get())
              : trainer_.SetTensorParallel(tp_group.get(), config_.trainer.collective_timeout_s);
      if (!set.ok()) return rpc::ToGrpc(set.WithContext("join tensor-parallel group"));
      tp_group_ = std::move(tp_group);
    }
    if (Status s = trainer_.SetDataParallel(nullptr, {}); !s.ok()) {
      return rpc::ToGrpc(s.WithContext("join data-parallel group"));
    }
    group_ = std::move(dp_group);
    DataParallelOptions dp;
    dp.bucket_bytes = static_cast<int64_t>(config_.trainer.grad_bucket_mb) << 20;
    dp.timeout_s = config_.trainer.collective_timeout_s;
    dp.overlap_grad_reduce = config_.trainer.overlap_grad_reduce;
    dp.reshard_after_forward = config_.trainer.reshard_after_forward;
    if (Status s = trainer_.SetDataParallel(group_.get(), dp); !s.ok()) {
      return rpc::ToGrpc(s.WithContext("join data-parallel group"));
    }
    GYRE_LOG_INFO(
        "joined data-parallel group {} as rank {} of {} (trainer {} of {}, tensor-parallel rank "
        "{} of {}; {}, trainer.shard: {})",
        dp_req.group(), trainer_.dp_rank(), trainer_.dp_size(), req->rank(), req->size(),
        trainer_.tp_rank(), trainer_.tp_size(),
        group_      ? group_->backend()
        : tp_group_ ? tp_group_->backend()
                    : "-",
        ShardName(trainer_.sharding()));
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::SequenceKl(grpc::ServerContext* ctx, const v1::SequenceKlRequest* req,
                                        v1::SequenceKlResponse* resp) {
  return rpc::Guarded("SequenceKl", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->expected_version() != trainer_.version()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "KL requested for policy version " +
                              std::to_string(req->expected_version()) + ", trainer holds " +
                              std::to_string(trainer_.version()));
    }
    const StatusOr<kernels::KlKind> estimator = algorithm::KlKindFor(req->estimator());
    const kernels::KlKind kind = estimator.ok() ? *estimator : kernels::KlKind::kNone;
    if (kind == kernels::KlKind::kNone) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "SequenceKl: estimator '" + req->estimator() + "' is not k1, k2 or k3");
    }
    const double temperature = req->temperature() > 0 ? req->temperature() : 1.0;
    auto kl = trainer_.SequenceKl(ToTrainSamples(req->samples()), kind, temperature,
                                  config_.trainer.micro_batch_size);
    if (!kl.ok()) return rpc::ToGrpc(kl.status());
    for (double v : *kl) resp->add_kl(v);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* req,
                                       v1::TrainStepResponse* resp) {
  return rpc::Guarded("TrainStep", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->expected_version() != trainer_.version()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "batch was sampled for policy version " +
                              std::to_string(req->expected_version()) + ", trainer holds " +
                              std::to_string(trainer_.version()));
    }
    std::vector<TrainSample> batch = ToTrainSamples(req->samples());
    TrainOptions opts = step_options_;
    opts.temperature = req->temperature() > 0 ? req->temperature() : 1.0;
    opts.mini_batch_sizes.assign(req->mini_batch_sizes().begin(), req->mini_batch_sizes().end());
    opts.reset_optimizer_state = req->reset_optimizer_state();
    const Objective obj =
        req->objective() == v1::OBJECTIVE_SFT ? Objective::kSft : Objective::kPolicyGradient;
    const auto t0 = std::chrono::steady_clock::now();
    auto metrics = trainer_.Step(batch, obj, req->lr(), opts);
    if (!metrics.ok()) return rpc::ToGrpc(metrics.status());
    // The step's own time (forward, backward, all-reduces, AdamW): the rest of the controller's
    // train phase is the request, the response and the controller's bookkeeping.
    (*metrics)["step_compute_s"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    resp->set_policy_version(trainer_.version());
    for (const auto& [k, v] : *metrics) (*resp->mutable_metrics())[k] = v;
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::PublishWeights(grpc::ServerContext* ctx,
                                            const v1::PublishWeightsRequest* req,
                                            v1::PublishWeightsResponse* resp) {
  return rpc::Guarded("PublishWeights", [&]() -> grpc::Status {
    auto transport = comm::WeightSender::Transport(*req);
    if (!transport.ok()) return rpc::ToGrpc(transport.status());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (req->version() != trainer_.version()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "asked to publish version " + std::to_string(req->version()) +
                                ", trainer holds " + std::to_string(trainer_.version()));
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> wlock(weights_mu_);
    Status s;
    bool split = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // trainer.shard: parameters: every trainer is asked; a model still whole is split first
      // (a checkpoint, if any, was loaded before the first publish), so that the version is
      // sent from the slices and no trainer holds the whole model from here on.
      if (trainer_.sharding() == Shard::kParameters) {
        if (Status s = trainer_.SplitParameters(); !s.ok()) {
          return rpc::ToGrpc(s.WithContext("split the parameters before publishing"));
        }
      }
      split = trainer_.holds_slices();
    }
    if (split) {
      s = PublishFromSlices(*req, *transport, resp);
    } else if (*transport == "nccl" || *transport == "cuda_ipc") {
      comm::DevicePayload payload;
      s = FlattenToDevice(comm::WeightSender::TimeoutSeconds(*req), &payload);
      if (s.ok()) s = sender_.PublishDevice(*req, payload, resp);
    } else {
      comm::WeightPayload payload;
      {
        std::lock_guard<std::mutex> lock(mu_);
        payload.version = trainer_.version();
        // In the rollout's dtype (model.dtype): bfloat16 halves the bytes of a version.
        payload.bytes =
            model::FlattenParameters(trainer_.model().NamedParameters(), &payload.manifest, dtype_);
      }
      s = sender_.PublishHost(*req, payload, resp);
    }
    if (!s.ok()) return rpc::ToGrpc(s.WithContext("publish weights over " + *transport));
    resp->set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return grpc::Status::OK;
  });
}

Status TrainerService::PublishFromSlices(const v1::PublishWeightsRequest& req,
                                         const std::string& transport,
                                         v1::PublishWeightsResponse* resp) {
  // The gathers are the trainer's collectives: nothing else may run on it until the last one.
  std::lock_guard<std::mutex> lock(mu_);
  if (transport == "nccl" || transport == "cuda_ipc") {
    return FailedPrecondition(
        "trainers holding slices (trainer.shard: parameters, trainer.tensor_parallel) publish "
        "over grpc or gloo, not " +
        transport);
  }
  // The version in the rollout's dtype, cut into pieces of at most one bucket, ending at every
  // multiple of the bucket size: without tensor parallelism a piece is a range of a unit's flat
  // weights, gathered from the ranks that own it (each broadcasts its part,
  // ParameterShards::GatherRange); with it a piece is a range of one tensor, inside one rank's
  // rows when the tensor is split along them, cut from the whole rows that hold it
  // (PolicyTrainer::GatherWholeRows). Each piece
  // is gathered when the first receiver's sender reaches it, and trainer-0's stream holds about
  // one bucket of them (the senders move in step). So no rank holds a whole unit, let alone the
  // model, to publish it. Every rank computes the same pieces and gathers them in order.
  struct Piece {
    int unit = 0;
    int tensor = -1;               // tensor parallel: the tensor; else -1
    int64_t begin = 0, count = 0;  // elements of the unit's flat weights, or of the tensor
    int64_t row = 1;               // tensor parallel: the tensor's elements per row
  };
  const std::vector<model::ParameterUnit> units = model::ParameterUnits(trainer_.model().spec());
  const bool ranges = trainer_.gathers_ranges();
  const int tp = trainer_.tp_size();
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype_));
  const auto bucket = static_cast<uint64_t>(comm::WeightSender::BucketBytes(req));
  model::NamedTensors shapes;
  std::vector<Piece> pieces;
  std::vector<uint64_t> starts;
  uint64_t offset = 0;
  int64_t largest = 0;
  // Cuts [0, extent) of elements at the bucket's multiples and at `ends` (sorted); `row`: the
  // elements of a row of the tensor.
  auto cut = [&](int u, int tensor, int64_t extent, const std::vector<int64_t>& ends, int64_t row) {
    size_t next_end = 0;
    for (int64_t e = 0; e < extent;) {
      const uint64_t boundary = (offset / bucket + 1) * bucket;
      const int64_t fit = static_cast<int64_t>((boundary - offset) / static_cast<uint64_t>(esize));
      int64_t n = std::min(extent - e, std::max<int64_t>(1, fit));
      while (next_end < ends.size() && ends[next_end] <= e) ++next_end;
      if (next_end < ends.size()) n = std::min(n, ends[next_end] - e);
      pieces.push_back({u, tensor, e, n, row});
      starts.push_back(offset);
      largest = std::max(largest, n);
      offset += static_cast<uint64_t>(n * esize);
      e += n;
    }
  };
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t total = 0;
    for (size_t i = 0; i < units[u].names.size(); ++i) {
      const at::Tensor meta =
          at::empty(units[u].shapes[i], at::TensorOptions().dtype(dtype_).device(at::kMeta));
      total += meta.numel();
      shapes.emplace_back(units[u].names[i], meta);
      if (ranges) continue;
      const std::vector<int64_t>& shape = units[u].shapes[i];
      const int64_t extent = shape.empty() ? 1 : shape[0];
      const int64_t row = meta.numel() / std::max<int64_t>(1, extent);
      std::vector<int64_t> ends;  // a row split: each rank's rows end a piece
      if (model::TensorParallelDim(units[u].names[i]) == 0) {
        for (int r = 0; r < tp; ++r) {
          ends.push_back(row * model::TensorParallelRange(units[u].names[i], extent, r, tp).second);
        }
      }
      cut(static_cast<int>(u), static_cast<int>(i), meta.numel(), ends, row);
    }
    if (ranges) cut(static_cast<int>(u), -1, total, {}, 1);
  }
  const at::Device device = trainer_.model().device();
  const at::TensorOptions opts = at::TensorOptions().dtype(dtype_).device(device);
  // Piece `p` into `host` (its bytes, CPU, dtype_), or gathered and dropped (host undefined).
  const at::Tensor scratch = ranges ? at::empty({largest}, opts) : at::Tensor();
  auto gather = [&](const Piece& p, const at::Tensor& host) -> Status {
    if (!ranges) {
      // The whole rows holding the piece's elements (a row across a bucket's end is gathered for
      // both pieces), then the piece cut from them.
      const int64_t first = p.begin / p.row;
      const int64_t last = (p.begin + p.count - 1) / p.row;
      GYRE_ASSIGN_OR_RETURN(at::Tensor rows,
                            trainer_.GatherWholeRows(p.unit, p.tensor, first, last - first + 1));
      if (host.defined()) {
        host.copy_(rows.reshape({-1}).narrow(0, p.begin - first * p.row, p.count));
      }
      return Status::Ok();
    }
    if (!host.defined()) {
      return trainer_.GatherUnitRange(p.unit, p.begin, scratch.narrow(0, 0, p.count));
    }
    // On the CPU straight into the piece's bytes; from a device through a copy of the piece.
    if (device.is_cpu()) return trainer_.GatherUnitRange(p.unit, p.begin, host);
    const at::Tensor on_device = at::empty({p.count}, opts);
    GYRE_RETURN_IF_ERROR(trainer_.GatherUnitRange(p.unit, p.begin, on_device));
    host.copy_(on_device);
    return Status::Ok();
  };
  if (!trainer_.writes_gathered()) {
    // The other ranks take part in the gathers and send nothing.
    for (const Piece& p : pieces) GYRE_RETURN_IF_ERROR(gather(p, at::Tensor()));
    return Status::Ok();
  }
  comm::WeightPayload payload;
  payload.version = trainer_.version();
  uint64_t total = 0;
  payload.manifest = model::ParameterManifest(shapes, &total, dtype_);
  GYRE_CHECK(total == offset) << total << " != " << offset;
  auto produce = [&pieces, &gather, esize, this](size_t i, std::vector<uint8_t>* bytes) -> Status {
    const Piece& p = pieces[i];
    bytes->resize(static_cast<size_t>(p.count * esize));
    const at::Tensor host =
        at::from_blob(bytes->data(), {p.count}, at::TensorOptions().dtype(dtype_));
    return gather(p, host);
  };
  // One reader per receiver, or over gloo per tensor-parallel rank of each (WeightSender).
  const int readers =
      req.rollout_ids_size() * (transport == "gloo" ? comm::WeightSender::ReceiverRanks(req) : 1);
  auto stream = std::make_shared<comm::PayloadStream>(total, starts, produce, readers, bucket);
  payload.stream = stream;
  Status s = sender_.PublishHost(req, payload, resp);
  // Every piece is gathered, also those no receiver got to: the other ranks gather all of them.
  const Status drained = stream->Drain();
  if (s.ok()) s = drained;
  // The first one at info: what a user checks the memory of a publish by.
  const bool first = s.ok() && !logged_publish_;
  logged_publish_ = logged_publish_ || s.ok();
  if (first) {
    GYRE_LOG_INFO(
        "published v{} from this rank's slices a bucket at a time: {} bytes in {} "
        "pieces, at most {} bytes of it held at once (bucket {} bytes)",
        payload.version, total, pieces.size(), stream->peak_bytes(), bucket);
  } else {
    GYRE_LOG_DEBUG("published v{} from slices: {} bytes, at most {} held at once", payload.version,
                   total, stream->peak_bytes());
  }
  return s;
}

grpc::Status TrainerService::AbortWeightTransfer(grpc::ServerContext* ctx,
                                                 const v1::AbortWeightTransferRequest* req,
                                                 v1::AbortWeightTransferResponse* resp) {
  return rpc::Guarded("AbortWeightTransfer", [&]() -> grpc::Status {
    const std::vector<std::string> ids(req->rollout_ids().begin(), req->rollout_ids().end());
    const int ended = sender_.AbortReceivers(req->publish_id(), ids);
    std::string names;
    for (const std::string& id : ids) names += (names.empty() ? "" : ", ") + id;
    GYRE_LOG_WARN("ending the weight transfer to {} ({} in flight): {}", names, ended,
                  req->reason().empty() ? "asked by the controller" : req->reason());
    resp->set_ended(ended);
    return grpc::Status::OK;
  });
}

Status TrainerService::FlattenToDevice(double timeout, comm::DevicePayload* payload) {
  std::lock_guard<std::mutex> lock(mu_);
  const at::Device device = trainer_.model().device();
  if (!device.is_cuda()) {
    return FailedPrecondition(
        "the nccl and cuda_ipc weight transports need the model on a GPU (model.device: cuda)");
  }
  const auto params = trainer_.model().NamedParameters();
  payload->version = trainer_.version();
  payload->manifest = model::ParameterManifest(params, &payload->bytes, dtype_);
  payload->device = device.index();
  GYRE_ASSIGN_OR_RETURN(payload->data, sender_.StagingBuffer(payload->bytes, payload->device));
  GYRE_RETURN_IF_ERROR(model::FlattenParametersInto(params, payload->manifest, payload->data,
                                                    payload->bytes, device));
  return comm::SynchronizeDevice(payload->device, comm::DeadlineAfter(timeout));
}

grpc::Status TrainerService::Save(grpc::ServerContext* ctx, const v1::SaveRequest* req,
                                  v1::SaveResponse* resp) {
  return rpc::Guarded("Save", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    // An empty name would make DIR.tmp the working directory's ".tmp", removed first.
    if (req->directory().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Save needs a directory");
    }
    // trainer.shard: parameters: the controller asks every rank; rank 0 writes while the others
    // take part in gathering the model unit by unit (once it is split).
    if ((trainer_.sharding() == Shard::kParameters || trainer_.tp_size() > 1) &&
        !trainer_.writes_gathered()) {
      if (trainer_.holds_slices()) {
        const Status s = WriteModelDirectoryFromSlices(req->directory(), trainer_, "");
        if (!s.ok()) return rpc::ToGrpc(s.WithContext("save " + req->directory()));
      }
      resp->set_path(req->directory());
      resp->set_policy_version(trainer_.version());
      return grpc::Status::OK;
    }
    // Atomic: write everything into DIR.tmp, fsync, then rename over DIR.
    const std::string final_dir = req->directory();
    const std::string tmp_dir = final_dir + ".tmp";
    Status s = RemoveTree(tmp_dir);
    if (s.ok()) s = MakeDirs(tmp_dir);
    // A model loaded from a Hugging Face directory keeps its own config.json (eos ids, etc.) and
    // tokenizer files, so the checkpoint is a drop-in replacement for it.
    if (trainer_.holds_slices()) {
      // Also after a failure above: the other ranks are gathering with this one.
      const Status written = WriteModelDirectoryFromSlices(tmp_dir, trainer_, config_.model.path);
      if (s.ok()) s = written;
    } else if (s.ok()) {
      s = WriteModelDirectory(tmp_dir, trainer_.model(), config_.model.path);
    }
    if (s.ok()) s = SyncDirectory(tmp_dir);
    if (s.ok()) s = RemoveTree(final_dir);
    if (s.ok()) s = RenamePath(tmp_dir, final_dir);
    if (!s.ok()) return rpc::ToGrpc(s.WithContext("save " + final_dir));
    resp->set_path(final_dir);
    resp->set_policy_version(trainer_.version());
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::SaveState(grpc::ServerContext* ctx, const v1::SaveStateRequest* req,
                                       v1::SaveStateResponse* resp) {
  return rpc::Guarded("SaveState", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->directory().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "SaveState needs a directory");
    }
    Status s = SaveTrainerState(req->directory(), trainer_, config_.model.path);
    if (!s.ok()) return rpc::ToGrpc(s.WithContext("save trainer state to " + req->directory()));
    resp->set_policy_version(trainer_.version());
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::LoadState(grpc::ServerContext* ctx, const v1::LoadStateRequest* req,
                                       v1::LoadStateResponse* resp) {
  return rpc::Guarded("LoadState", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->directory().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "LoadState needs a directory");
    }
    Status s = LoadTrainerState(req->directory(), &trainer_);
    if (!s.ok()) return rpc::ToGrpc(s);
    GYRE_LOG_INFO("restored trainer state from {}: policy version {}", req->directory(),
                  trainer_.version());
    resp->set_policy_version(trainer_.version());
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                                  v1::StopResponse* resp) {
  return rpc::Guarded("Stop", [&]() -> grpc::Status {
    if (on_stop_) on_stop_(req->reason().empty() ? "stop requested" : req->reason());
    return grpc::Status::OK;
  });
}

}  // namespace gyre::trainer
