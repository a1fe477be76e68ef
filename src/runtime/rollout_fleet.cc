// The public RolloutFleet (include/gyre/rollout.h), the sample record's names (gyre/sample.h)
// and the problem stream (gyre/task.h) on top of the controller's pieces: a controller::Cluster
// without trainers (the server the workers register with, a pool of rollout workers only, the
// RolloutScheduler), whose WeightPublisher takes its versions from this process
// (comm::WeightSender) instead of a trainer worker.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "comm/device_weights.h"
#include "comm/weight_sender.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "config/config.h"
#include "controller/cluster.h"
#include "controller/prompts.h"
#include "controller/task.h"
#include "gyre/rollout.h"
#include "gyre/sample.h"
#include "gyre/task.h"
#include "model/hf_config.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "text/text_tokenizer.h"
#include "text/tokenizer.h"

namespace gyre {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kUnspecified:
      break;
  }
  return "unspecified";
}

const char* RewardStatusName(RewardStatus status) {
  switch (status) {
    case RewardStatus::kOk:
      return "ok";
    case RewardStatus::kTimeout:
      return "timeout";
    case RewardStatus::kError:
      return "error";
    case RewardStatus::kUnset:
      break;
  }
  return "unset";
}

int64_t Sample::OldestVersion() const {
  if (versions.empty()) return -1;
  return *std::min_element(versions.begin(), versions.end());
}

namespace {

FinishReason FromProto(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP:
      return FinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return FinishReason::kLength;
    case v1::FINISH_REASON_ABORT:
      return FinishReason::kAbort;
    default:
      return FinishReason::kUnspecified;
  }
}

RewardStatus FromProto(v1::RewardStatus s) {
  switch (s) {
    case v1::REWARD_STATUS_OK:
      return RewardStatus::kOk;
    case v1::REWARD_STATUS_TIMEOUT:
      return RewardStatus::kTimeout;
    case v1::REWARD_STATUS_ERROR:
      return RewardStatus::kError;
    default:
      return RewardStatus::kUnset;
  }
}

Sample FromProto(v1::Sample&& s) {
  Sample out;
  out.sample_id = s.sample_id();
  out.group_id = s.group_id();
  out.prompt_ids.assign(s.prompt_ids().begin(), s.prompt_ids().end());
  out.response_ids.assign(s.response_ids().begin(), s.response_ids().end());
  out.logprobs.assign(s.logprobs().begin(), s.logprobs().end());
  out.versions.assign(s.versions().begin(), s.versions().end());
  out.kept_mass.assign(s.kept_mass().begin(), s.kept_mass().end());
  out.loss_mask.assign(s.loss_mask().begin(), s.loss_mask().end());
  out.finish_reason = FromProto(s.finish_reason());
  out.reward = s.reward();
  out.reward_status = FromProto(s.reward_status());
  out.seed = s.seed();
  return out;
}

Status CheckSampling(const SamplingOptions& s, int max_seq_len) {
  auto bad = [](const std::string& what) { return InvalidArgument("sampling: " + what); };
  if (!(s.temperature >= 0)) return bad("temperature must be >= 0 (0 = greedy)");
  if (s.top_k < 0) return bad("top_k must be >= 0 (0 = off)");
  if (!(s.top_p > 0 && s.top_p <= 1)) return bad("top_p must be in (0, 1] (1 = off)");
  if (!(s.min_p >= 0 && s.min_p <= 1)) return bad("min_p must be in [0, 1] (0 = off)");
  if (s.max_new_tokens < 1 || s.max_new_tokens >= max_seq_len) {
    return bad("max_new_tokens must be in [1, model.max_seq_len = " + std::to_string(max_seq_len) +
               ")");
  }
  for (const std::string& stop : s.stop_strings) {
    if (stop.empty()) return bad("stop_strings may not hold an empty string");
  }
  return Status::Ok();
}

v1::SamplingParams ToProto(const SamplingOptions& s) {
  v1::SamplingParams p;
  p.set_temperature(static_cast<float>(s.temperature));
  p.set_top_k(s.top_k);
  p.set_top_p(static_cast<float>(s.top_p));
  p.set_min_p(static_cast<float>(s.min_p));
  p.set_max_new_tokens(s.max_new_tokens);
  for (int32_t id : s.stop_token_ids) p.add_stop_token_ids(id);
  for (const std::string& stop : s.stop_strings) p.add_stop_strings(stop);
  return p;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

class RolloutFleet::Impl {
 public:
  explicit Impl(RolloutFleetOptions options) : opts_(std::move(options)), cfg_(opts_.config) {}
  ~Impl() { Close(); }

  Status Open();
  StatusOr<std::vector<Sample>> Generate(const std::vector<PromptGroup>& groups,
                                         const SamplingOptions& sampling, GenerateStats* stats);
  StatusOr<PublishReport> PublishWeights(int64_t version, const WeightSource& source);
  void Close();

  Status Usable() const {
    if (closed_) return FailedPrecondition("the rollout fleet is closed");
    if (!broken_.ok()) return FailedPrecondition("the rollout fleet failed: " + broken_.message());
    return Status::Ok();
  }
  // Restarted workers (cluster.on_worker_failure: restart) catch up to the current version.
  Status Revive() {
    if (version_.load() < 0) return cluster_->pool()->CheckHealth();
    return cluster_->pool()->Revive(version_.load(),
                                    [this](controller::Worker* w) { return CatchUp(w); });
  }
  Status CatchUp(controller::Worker* w);
  // The expected manifest: the workers' model's parameters (names, shapes, offsets).
  Status BuildManifest();
  // `source` laid out as manifest_: into host memory, or the sender's device staging buffer.
  Status Gather(int64_t version, const WeightSource& source, bool to_device);

  const RolloutFleetOptions opts_;
  const JobConfig cfg_;
  std::unique_ptr<text::TextTokenizer> tokenizer_;
  std::unique_ptr<controller::PromptEncoder> prompts_;
  std::vector<model::TensorEntry> manifest_;
  uint64_t payload_bytes_ = 0;
  // The server, the rollout workers, the publisher and the scheduler (no trainers).
  std::unique_ptr<controller::Cluster> cluster_;
  // The sending side of publishes and the version being sent (host or device payload).
  comm::WeightSender sender_;
  comm::WeightPayload host_payload_;
  comm::DevicePayload device_payload_;
  bool device_transport_ = false;
  // Written by the owner's thread, read by the accessors from any thread.
  std::atomic<int64_t> version_{-1};
  std::atomic<bool> closed_{false};
  Status broken_;  // a failed publish
};

Status RolloutFleet::Impl::BuildManifest() {
  model::ModelSpec spec;
  if (cfg_.model.path.empty()) {
    spec = model::SpecFromConfig(cfg_.model, text::CharTokenizer().vocab_size());
  } else {
    GYRE_ASSIGN_OR_RETURN(spec, model::LoadHfConfig(cfg_.model.path));
  }
  // Uninitialised parameters (never touched): only their names and shapes are read.
  auto model = model::Transformer::Create(spec, 0, -1.0);
  GYRE_ASSIGN_OR_RETURN(const at::ScalarType dtype, model::ParseWeightDtype(cfg_.model.dtype));
  manifest_ = model::ParameterManifest(model->NamedParameters(), &payload_bytes_, dtype);
  return Status::Ok();
}

Status RolloutFleet::Impl::Open() {
  GYRE_RETURN_IF_ERROR(config::ValidateJobConfig(cfg_));
  GYRE_ASSIGN_OR_RETURN(tokenizer_, text::MakeTextTokenizer(cfg_.model));
  prompts_ = std::make_unique<controller::PromptEncoder>(cfg_, tokenizer_.get());
  GYRE_RETURN_IF_ERROR(BuildManifest().WithContext("model section"));

  const std::string logs = !opts_.logs_dir.empty()
                               ? opts_.logs_dir
                               : AbsolutePath(cfg_.job.output_dir + "/" + cfg_.job.name + "/logs");
  GYRE_RETURN_IF_ERROR(MakeDirs(logs).WithContext("rollout fleet logs"));
  controller::ClusterOptions co;
  co.logs_dir = logs;
  co.worker_binary = opts_.worker_binary;
  if (opts_.print_progress) {
    co.print = [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };
  }
  co.interrupt_reason = [cancel = opts_.cancel] {
    return cancel && cancel->cancelled() ? "cancelled: " + cancel->reason() : std::string();
  };
  // The rollout workers only: the trainer is this process, which sends its own versions.
  co.trainers = false;
  co.local_weights.host = cfg_.cluster.bind_host;
  co.local_weights.send = [this](const v1::PublishWeightsRequest& req,
                                 v1::PublishWeightsResponse* resp) {
    return device_transport_ ? sender_.PublishDevice(req, device_payload_, resp)
                             : sender_.PublishHost(req, host_payload_, resp);
  };
  co.local_weights.abort = [this](uint64_t publish_id, const std::vector<std::string>& ids) {
    sender_.AbortReceivers(publish_id, ids);
  };
  co.shutdown_grace_s = 2.0;
  GYRE_ASSIGN_OR_RETURN(cluster_, controller::Cluster::Start(cfg_, std::move(co)));
  const controller::WeightTransport transport = cluster_->transport();
  device_transport_ = transport == controller::WeightTransport::kNccl ||
                      transport == controller::WeightTransport::kCudaIpc;
  GYRE_LOG_INFO("rollout fleet: workers register at {}; logs in {}", cluster_->address(), logs);
  return cluster_->StartWorkers();
}

void RolloutFleet::Impl::Close() {
  if (closed_.exchange(true)) return;
  if (cluster_) cluster_->Shutdown();
}

Status RolloutFleet::Impl::CatchUp(controller::Worker* w) {
  // The payload of version_ is still in place: PublishWeights keeps it until the next one.
  return cluster_->publisher()->CatchUp(w, version_.load());
}

Status RolloutFleet::Impl::Gather(int64_t version, const WeightSource& source, bool to_device) {
  std::map<std::string, TensorView> by_name;
  for (TensorView& t : source.Tensors()) {
    const std::string name = t.name;
    if (!by_name.emplace(name, std::move(t)).second) {
      return InvalidArgument("weight source: tensor '" + name + "' appears twice");
    }
  }
  int device = -1;
  for (const model::TensorEntry& e : manifest_) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return InvalidArgument("weight source: the rollout model's tensor '" + e.name +
                             "' is missing");
    }
    const TensorView& t = it->second;
    if (t.dtype != e.dtype) {
      return InvalidArgument("weight source: tensor '" + e.name + "' is " + t.dtype +
                             "; the rollout model runs " + e.dtype +
                             " (model.dtype), so its weights travel in " + e.dtype);
    }
    if (t.shape != e.shape) {
      return InvalidArgument("weight source: tensor '" + e.name + "' has shape " +
                             ShapeText(t.shape) + ", the rollout model's is " + ShapeText(e.shape));
    }
    if (t.bytes != e.nbytes || (t.data == nullptr && e.nbytes > 0)) {
      return InvalidArgument(
          "weight source: tensor '" + e.name + "' has " + std::to_string(t.bytes) + " bytes" +
          (t.data == nullptr ? " and no data" : "") + ", expected " + std::to_string(e.nbytes));
    }
    if (t.device >= 0 && !to_device) {
      return InvalidArgument("weight source: tensor '" + e.name + "' is on CUDA device " +
                             std::to_string(t.device) + "; the " + cfg_.cluster.weight_transport +
                             " transport sends from host memory (copy the weights to the host, "
                             "or use cluster.weight_transport: nccl or cuda_ipc)");
    }
    if (t.device >= 0) {
      if (device >= 0 && t.device != device) {
        return InvalidArgument("weight source: tensors on CUDA devices " + std::to_string(device) +
                               " and " + std::to_string(t.device) + "; a version lives on one");
      }
      device = t.device;
    }
  }
  if (by_name.size() != manifest_.size()) {
    std::set<std::string> known;
    for (const auto& e : manifest_) known.insert(e.name);
    for (const auto& [name, t] : by_name) {
      if (!known.count(name)) {
        return InvalidArgument("weight source: tensor '" + name +
                               "' is not a parameter of the rollout model");
      }
    }
  }
  if (!to_device) {
    host_payload_.version = version;
    host_payload_.manifest = manifest_;
    host_payload_.bytes.resize(payload_bytes_);
    for (const model::TensorEntry& e : manifest_) {
      if (e.nbytes > 0)
        std::memcpy(host_payload_.bytes.data() + e.offset, by_name.at(e.name).data, e.nbytes);
    }
    return Status::Ok();
  }
  if (device < 0) device = 0;  // host tensors staged on the first GPU
  const double timeout = cfg_.cluster.weight_sync_timeout_s;
  GYRE_ASSIGN_OR_RETURN(void* staging, sender_.StagingBuffer(payload_bytes_, device));
  for (const model::TensorEntry& e : manifest_) {
    const TensorView& t = by_name.at(e.name);
    void* dst = static_cast<uint8_t*>(staging) + e.offset;
    GYRE_RETURN_IF_ERROR(
        t.device >= 0
            ? comm::CopyDeviceToDevice(dst, t.data, e.nbytes, device, comm::DeadlineAfter(timeout))
            : comm::CopyHostToDevice(dst, t.data, e.nbytes, device, comm::DeadlineAfter(timeout)));
  }
  GYRE_RETURN_IF_ERROR(comm::SynchronizeDevice(device, comm::DeadlineAfter(timeout)));
  device_payload_.version = version;
  device_payload_.manifest = manifest_;
  device_payload_.data = staging;
  device_payload_.bytes = payload_bytes_;
  device_payload_.device = device;
  return Status::Ok();
}

StatusOr<PublishReport> RolloutFleet::Impl::PublishWeights(int64_t version,
                                                           const WeightSource& source) {
  GYRE_RETURN_IF_ERROR(Usable());
  if (version <= version_.load()) {
    return InvalidArgument("PublishWeights: version " + std::to_string(version) +
                           " is not newer than the fleet's " + std::to_string(version_.load()));
  }
  GYRE_RETURN_IF_ERROR(cluster_->pool()->CheckHealth());
  const auto t0 = SteadyClock::now();
  GYRE_RETURN_IF_ERROR(Gather(version, source, device_transport_));
  // The payload now holds `version`: a failed publish leaves the fleet unusable, so that no
  // restarted worker is ever caught up with bytes of another version than it is told.
  // (Restarted workers catch up at the next Generate, from this payload.)
  if (Status s = cluster_->publisher()->Publish(version); !s.ok()) {
    broken_ = s;
    return s;
  }
  version_ = version;
  PublishReport report;
  report.version = version;
  report.transport = cfg_.cluster.weight_transport;
  report.bytes = payload_bytes_;
  for (const auto& [id, outcome] : cluster_->publisher()->last_outcomes()) {
    WeightReceipt r;
    r.worker = id;
    r.ok = outcome.error.empty();
    r.error = outcome.error;
    r.version = outcome.receipt.version();
    r.bytes = outcome.receipt.bytes();
    r.bucket_crc32.assign(outcome.receipt.bucket_crc32().begin(),
                          outcome.receipt.bucket_crc32().end());
    report.receipts.push_back(std::move(r));
  }
  report.seconds = SecondsSince(t0);
  return report;
}

StatusOr<std::vector<Sample>> RolloutFleet::Impl::Generate(const std::vector<PromptGroup>& groups,
                                                           const SamplingOptions& sampling,
                                                           GenerateStats* stats) {
  GYRE_RETURN_IF_ERROR(Usable());
  if (version_.load() < 0) {
    return FailedPrecondition(
        "Generate: the workers hold no weights yet; call PublishWeights first");
  }
  const int max_seq_len = cfg_.model.max_seq_len;
  GYRE_RETURN_IF_ERROR(CheckSampling(sampling, max_seq_len));
  std::vector<controller::GroupJob> jobs;
  std::set<uint64_t> ids;
  for (const PromptGroup& g : groups) {
    const std::string which = "group " + std::to_string(g.group_id);
    if (!ids.insert(g.group_id).second) return InvalidArgument(which + " appears twice");
    if (g.n < 1) return InvalidArgument(which + ": n must be >= 1");
    if (g.prompt_ids.empty()) return InvalidArgument(which + ": empty prompt");
    if (static_cast<int64_t>(g.prompt_ids.size()) + sampling.max_new_tokens > max_seq_len) {
      return InvalidArgument(which + ": the prompt's " + std::to_string(g.prompt_ids.size()) +
                             " tokens plus max_new_tokens " +
                             std::to_string(sampling.max_new_tokens) +
                             " exceed model.max_seq_len " + std::to_string(max_seq_len));
    }
    controller::GroupJob j;
    j.group.set_group_id(g.group_id);
    j.group.mutable_prompt_ids()->Add(g.prompt_ids.begin(), g.prompt_ids.end());
    j.group.set_n(g.n);
    j.group.set_first_sample_id(g.first_sample_id);
    j.group.set_seed(g.seed);
    jobs.push_back(std::move(j));
  }
  GYRE_RETURN_IF_ERROR(Revive());
  const auto t0 = SteadyClock::now();
  controller::GenerateStats gs;
  GYRE_ASSIGN_OR_RETURN(auto samples, cluster_->scheduler()->GenerateAll(jobs, ToProto(sampling),
                                                                         version_.load(), &gs));
  if (stats != nullptr) {
    stats->generated_tokens = gs.generated_tokens;
    stats->prefill_tokens = gs.prefill_tokens;
    stats->prefix_shared_tokens = gs.prefix_shared_tokens;
    stats->seconds = SecondsSince(t0);
  }
  std::vector<Sample> out;
  out.reserve(samples.size());
  for (auto& s : samples) out.push_back(FromProto(std::move(s)));
  return out;
}

RolloutFleet::RolloutFleet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RolloutFleet::~RolloutFleet() = default;

StatusOr<std::unique_ptr<RolloutFleet>> RolloutFleet::Open(const RolloutFleetOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  Status s = impl->Open();
  if (!s.ok()) {
    impl->Close();
    return s.WithContext("open rollout fleet");
  }
  return std::unique_ptr<RolloutFleet>(new RolloutFleet(std::move(impl)));
}

StatusOr<std::vector<Sample>> RolloutFleet::Generate(const std::vector<PromptGroup>& groups,
                                                     const SamplingOptions& sampling,
                                                     GenerateStats* stats) {
  return impl_->Generate(groups, sampling, stats);
}

StatusOr<PublishReport> RolloutFleet::PublishWeights(int64_t version, const WeightSource& source) {
  return impl_->PublishWeights(version, source);
}

std::vector<ParameterSpec> RolloutFleet::Parameters() const {
  std::vector<ParameterSpec> out;
  for (const model::TensorEntry& e : impl_->manifest_) out.push_back({e.name, e.shape});
  return out;
}

int64_t RolloutFleet::version() const { return impl_->version_; }

std::vector<std::string> RolloutFleet::Workers() const {
  std::vector<std::string> ids;
  if (impl_->closed_) return ids;
  for (const controller::Worker* w : impl_->cluster_->pool()->AliveRollouts()) {
    ids.push_back(w->id);
  }
  return ids;
}

std::string RolloutFleet::controller_address() const {
  return impl_->cluster_ ? impl_->cluster_->address() : std::string();
}

StatusOr<std::vector<int32_t>> RolloutFleet::EncodePrompt(const std::string& prompt) const {
  controller::Problem p;
  p.prompt = prompt;
  return impl_->prompts_->Encode(p);
}

StatusOr<std::vector<int32_t>> RolloutFleet::Encode(const std::string& text) const {
  return impl_->tokenizer_->Encode(text);
}

std::string RolloutFleet::Decode(const std::vector<int32_t>& ids) const {
  return impl_->tokenizer_->Decode(ids);
}

std::vector<int32_t> RolloutFleet::StopTokenIds() const { return impl_->tokenizer_->stop_ids(); }

SamplingOptions RolloutFleet::DefaultSampling() const {
  const JobConfig& c = impl_->cfg_;
  SamplingOptions s;
  s.temperature = c.rollout.sampling.temperature;
  s.top_k = c.rollout.sampling.top_k;
  s.top_p = c.rollout.sampling.top_p;
  s.min_p = c.rollout.sampling.min_p;
  s.max_new_tokens = c.rollout.max_new_tokens;
  s.stop_token_ids = impl_->tokenizer_->stop_ids();
  s.stop_strings = c.rollout.stop_strings;
  return s;
}

void RolloutFleet::Close() { impl_->Close(); }

// ---- gyre/task.h ------------------------------------------------------------------------------

class ProblemStream::Impl {
 public:
  explicit Impl(controller::ProblemSource source) : source(std::move(source)) {
    for (const auto& p : this->source.eval_set()) held_out.push_back({p.prompt, p.answer});
  }
  controller::ProblemSource source;
  std::vector<Problem> held_out;
};

ProblemStream::ProblemStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProblemStream::~ProblemStream() = default;

StatusOr<std::unique_ptr<ProblemStream>> ProblemStream::Open(const DataSection& data,
                                                             uint64_t seed) {
  GYRE_ASSIGN_OR_RETURN(controller::ProblemSource source,
                        controller::ProblemSource::Create(data, seed));
  return std::unique_ptr<ProblemStream>(
      new ProblemStream(std::make_unique<Impl>(std::move(source))));
}

Problem ProblemStream::Next() {
  controller::Problem p = impl_->source.Next();
  return {p.prompt, p.answer};
}

const std::vector<Problem>& ProblemStream::held_out() const { return impl_->held_out; }

std::shared_ptr<RewardFn> ExactMatchVerifier() {
  return std::make_shared<controller::ExactMatchReward>();
}

}  // namespace gyre
