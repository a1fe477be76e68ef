#include "rollout/rollout_service.h"

#include <ATen/core/Tensor.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <shared_mutex>
#include <thread>

#include "comm/cuda_ipc.h"
#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sync.h"
#include "common/limits.h"
#include "common/logging.h"
#include "kernels/device_info.h"
#include "model/hf_config.h"
#include "model/weights.h"
#include "rollout/tensor_parallel_weights.h"
#include "rpc/rpc_util.h"

namespace gyre::rollout {

StatusOr<EngineConfig> EngineConfigFromJob(const RolloutSection& rollout,
                                           const model::Transformer& model) {
  EngineConfig c;
  c.block_size = rollout.block_size;
  c.max_running = rollout.max_running;
  c.max_step_tokens = rollout.max_step_tokens;
  c.prefix_sharing = rollout.prefix_sharing;
  c.cuda_graphs = rollout.cuda_graphs;
  c.cuda_graph_max_batch = rollout.cuda_graph_max_batch;
  c.scheduling = rollout.scheduling == "static" ? Scheduling::kStatic : Scheduling::kContinuous;
  c.weight_update_kv =
      rollout.weight_update_kv == "keep" ? WeightUpdateKv::kKeep : WeightUpdateKv::kRecompute;
  int64_t bytes = rollout.kv_cache_bytes;
  if (bytes == 0) {
    const at::Device device = model.device();
    if (device.is_cuda()) {
      // A fraction of the device's total memory, but never more than is free once the model
      // is loaded (with 10% of the free memory left for activations and the sampler).
      int64_t free = 0, total = 0;
      if (!kernels::CudaDeviceMemory(device.index(), &free, &total)) {
        return FailedPrecondition("rollout.kv_cache_fraction: cannot query the memory of " +
                                  device.str() + "; set rollout.kv_cache_bytes instead");
      }
      bytes = std::min(static_cast<int64_t>(static_cast<double>(total) * rollout.kv_cache_fraction),
                       static_cast<int64_t>(static_cast<double>(free) * 0.9));
    } else if (device.is_cpu()) {
      const double ram = PhysicalMemoryBytes();
      bytes = static_cast<int64_t>(ram * rollout.kv_cache_fraction);
    } else {
      return FailedPrecondition("rollout.kv_cache_fraction: cannot query the memory of " +
                                device.str() + "; set rollout.kv_cache_bytes instead");
    }
  }
  GYRE_ASSIGN_OR_RETURN(int64_t blocks, BlocksForBudget(model, bytes, c.block_size));
  const int64_t full = (model.spec().max_seq_len + c.block_size - 1) / c.block_size;
  c.num_blocks = std::min<int64_t>(blocks, 2 * c.max_running * full);
  return c;
}

StatusOr<EpisodeSetup> EpisodeSetupFromJob(const JobConfig& cfg,
                                           std::shared_ptr<const text::TextTokenizer> tokenizer) {
  const EnvSection& env = cfg.env;
  auto chat = text::EpisodeChat::Load(env.chat_template, cfg.model.path, env.template_kwargs);
  if (!chat.ok()) return chat.status().WithContext("env.chat_template");
  GYRE_ASSIGN_OR_RETURN(text::ToolCallFormat format, text::ParseToolCallFormat(env.tool_format));
  EpisodeSetup s;
  s.render = chat->AsFunction();
  s.encode = [tokenizer](const std::string& text) { return tokenizer->Encode(text); };
  s.decode = [tokenizer](const std::vector<int32_t>& ids) { return tokenizer->Decode(ids); };
  s.options.max_turns = env.max_turns;
  s.options.episode_timeout_s = env.episode_timeout_s;
  s.options.env_concurrency = env.concurrency;
  s.options.tool_format = format;
  s.options.end_of_turn_text = env.end_of_turn_text;
  s.options.bos_id = tokenizer->bos_id() ? *tokenizer->bos_id() : -1;
  s.timeouts.reset_s = env.reset_timeout_s;
  s.timeouts.step_s = env.step_timeout_s;
  s.timeouts.close_s = env.close_timeout_s;
  s.timeouts.retries = env.retries;
  s.ready_timeout_s = env.ready_timeout_s;
  return s;
}

RolloutService::RolloutService(std::unique_ptr<model::Transformer> model,
                               std::function<void(const std::string&)> on_stop)
    : model_(std::move(model)), on_stop_(std::move(on_stop)) {}

StatusOr<std::unique_ptr<RolloutService>> RolloutService::Create(
    std::unique_ptr<model::Transformer> model, const EngineConfig& config,
    RolloutEngine::Decoder decoder, std::function<void(const std::string&)> on_stop) {
  std::unique_ptr<RolloutService> s(new RolloutService(std::move(model), std::move(on_stop)));
  GYRE_ASSIGN_OR_RETURN(s->engine_, RolloutEngine::Create(s->model_.get(), config));
  if (decoder) s->engine_->SetDecoder(std::move(decoder));
  GYRE_LOG_INFO("rollout engine: {} KV blocks of {} positions ({} MiB), max_running {}",
                config.num_blocks, config.block_size,
                config.num_blocks * config.block_size * s->model_->KvBytesPerToken() >> 20,
                config.max_running);
  return s;
}

namespace {

// What a worker answers the trainer for a version received over a Communicator.
void FillReceipt(const comm::Receipt& r, v1::WeightReceipt* receipt) {
  receipt->set_version(r.version);
  for (uint32_t c : r.bucket_crc32) receipt->add_bucket_crc32(c);
  receipt->set_bytes(r.bytes);
  receipt->set_seconds(r.seconds);
}

SamplingOptions SamplingFromRequest(const v1::SamplingParams& sp) {
  SamplingOptions so;
  so.temperature = sp.temperature();
  so.top_k = sp.top_k();
  so.top_p = sp.top_p() > 0 ? sp.top_p() : 1.0f;
  so.min_p = sp.min_p();
  so.max_new_tokens = sp.max_new_tokens();
  so.stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
  so.stop_strings.assign(sp.stop_strings().begin(), sp.stop_strings().end());
  return so;
}

// A response's tokens, behaviour log-probs, kept mass and versions into `s`.
void AddResponse(const Response& res, v1::Sample* s) {
  s->mutable_response_ids()->Add(res.tokens.begin(), res.tokens.end());
  s->mutable_logprobs()->Add(res.logprobs.begin(), res.logprobs.end());
  s->mutable_kept_mass()->Add(res.kept_mass.begin(), res.kept_mass.end());
  s->mutable_versions()->Add(res.versions.begin(), res.versions.end());
}

// The engine's counters since its last ResetStats, and the version, into `resp`.
void SetCounters(const EngineStats& st, int64_t version, v1::GenerateResponse* resp) {
  resp->set_policy_version(version);
  resp->set_generated_tokens(st.generated_tokens);
  resp->set_prefill_tokens(st.prefill_tokens);
  resp->set_prefix_shared_tokens(st.prefix_shared_tokens);
  resp->set_parked_reused_tokens(st.parked_reused_tokens);
  resp->set_preemptions(st.preemptions);
}

void FillSample(const SampleResult& r, uint64_t sample_id, uint64_t group_id,
                const google::protobuf::RepeatedField<int32_t>& prompt, v1::Sample* s) {
  s->set_sample_id(sample_id);
  s->set_group_id(group_id);
  *s->mutable_prompt_ids() = prompt;
  AddResponse(r.response, s);
  for (size_t t = 0; t < r.response.tokens.size(); ++t) s->add_loss_mask(1.0f);
  s->set_seed(r.seed);
  s->set_kv_version(r.kv_version);
  s->set_finish_reason(!r.finished                   ? v1::FINISH_REASON_ABORT
                       : r.finish == Finish::kStop   ? v1::FINISH_REASON_STOP
                       : r.finish == Finish::kLength ? v1::FINISH_REASON_LENGTH
                                                     : v1::FINISH_REASON_ABORT);
}

}  // namespace

grpc::Status RolloutService::StartGeneration(const v1::GenerateRequest& req, int64_t version,
                                             uint64_t first_id) {
  if (!generated_.exchange(true)) {
    GYRE_LOG_INFO("first generate request, holding policy version {}", version);
  }
  if (version < req.min_policy_version()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this worker holds policy version " + std::to_string(version) +
                            ", the request needs at least " +
                            std::to_string(req.min_policy_version()));
  }
  if (req.target_finished_groups() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "target_finished_groups must be >= 0");
  }
  const SamplingOptions so = SamplingFromRequest(req.sampling());
  std::vector<Request> requests;
  const int G = req.groups_size();
  for (int k = 0; k < G; ++k) {
    const auto& g = req.groups(k);
    Request r;
    r.id = first_id + static_cast<uint64_t>(k);
    r.group = g.group_id();
    r.prompt.assign(g.prompt_ids().begin(), g.prompt_ids().end());
    r.n = g.n();
    r.seed = g.seed();
    r.sampling = so;
    requests.push_back(std::move(r));
  }
  for (int k = 0; k < req.resume_size(); ++k) {
    const auto& s = req.resume(k);
    Request r;
    r.id = first_id + static_cast<uint64_t>(G + k);
    r.group = s.group_id();
    r.prompt.assign(s.prompt_ids().begin(), s.prompt_ids().end());
    r.seed = s.seed();
    r.sampling = so;
    r.resume.tokens.assign(s.response_ids().begin(), s.response_ids().end());
    r.resume.logprobs.assign(s.logprobs().begin(), s.logprobs().end());
    r.resume.kept_mass.assign(s.kept_mass().begin(), s.kept_mass().end());
    r.resume.versions.assign(s.versions().begin(), s.versions().end());
    requests.push_back(std::move(r));
  }
  engine_->set_version(version);
  if (engine_->idle()) {  // nothing of another call is running: the counters start again
    engine_->ResetStats();
    reported_ = EngineStats{};
  }
  return rpc::ToGrpc(engine_->Add(requests));
}

void RolloutService::ToSample(const v1::GenerateRequest& req, uint64_t first_id,
                              const SampleResult& r, v1::Sample* s) {
  const int G = req.groups_size();
  const uint64_t k = r.id - first_id;
  if (k < static_cast<uint64_t>(G)) {
    const auto& g = req.groups(static_cast<int>(k));
    FillSample(r, g.first_sample_id() + static_cast<uint64_t>(r.index), g.group_id(),
               g.prompt_ids(), s);
  } else {
    const auto& in = req.resume(static_cast<int>(k) - G);
    FillSample(r, in.sample_id(), in.group_id(), in.prompt_ids(), s);
  }
}

std::unique_lock<std::mutex> RolloutService::WaitForEngine() {
  ++engine_waiters_;
  std::unique_lock<std::mutex> lock(mu_);
  --engine_waiters_;
  return lock;
}

grpc::Status RolloutService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                      v1::GenerateResponse* resp) {
  return rpc::Guarded("Generate", [&]() -> grpc::Status {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::shared_mutex> generation(generate_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t version = version_.load();
    if (!req->env_address().empty()) {
      grpc::Status s = RunEpisodes(*req, version, resp);
      resp->set_seconds(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return s;
    }
    grpc::Status started = StartGeneration(*req, version, 0);
    if (!started.ok()) return started;
    auto results = engine_->Run(req->target_finished_groups());
    if (!results.ok()) return rpc::ToGrpc(results.status());
    std::sort(results->begin(), results->end(), [](const SampleResult& a, const SampleResult& b) {
      return a.id != b.id ? a.id < b.id : a.index < b.index;
    });
    for (const SampleResult& r : *results) {
      ToSample(*req, 0, r, r.finished ? resp->add_samples() : resp->add_unfinished());
    }
    if (!engine_->graph_error().empty() && !graph_error_logged_) {
      GYRE_LOG_WARN("CUDA graphs turned off, decode steps now run eagerly: {}",
                    engine_->graph_error());
      graph_error_logged_ = true;
    }
    SetCounters(engine_->stats(), version, resp);
    resp->set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return grpc::Status::OK;
  });
}

grpc::Status RolloutService::RunEpisodes(const v1::GenerateRequest& req, int64_t version,
                                         v1::GenerateResponse* resp) {
  if (!episodes_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this rollout worker runs no environment episodes (its job has no env "
                        "section)");
  }
  if (req.target_finished_groups() != 0 || req.resume_size() != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "environment episodes run to their end: no target_finished_groups or "
                        "resume with env_address");
  }
  if (version < req.min_policy_version()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this worker holds policy version " + std::to_string(version) +
                            ", the request needs at least " +
                            std::to_string(req.min_policy_version()));
  }
  if (env_address_ != req.env_address() || !env_client_) {
    env_client_.reset();
    env_service_.reset();
    agent::ServiceOptions o;
    o.kind = agent::ServiceKind::kEnv;
    o.what = "environment";
    o.address = req.env_address();
    o.ready_timeout_s = episodes_->ready_timeout_s;
    auto started = agent::ServiceSupervisor::Start(o);
    if (!started.ok()) {
      // Not this worker's failure: every episode of the request fails, and the job's
      // reward.on_failure decides what that means.
      GYRE_LOG_WARN("environment server at {} unreachable: {}", req.env_address(),
                    started.status().ToString());
      for (const v1::PromptGroup& g : req.groups()) {
        for (int i = 0; i < g.n(); ++i) {
          v1::Sample* s = resp->add_samples();
          s->set_sample_id(g.first_sample_id() + static_cast<uint64_t>(i));
          s->set_group_id(g.group_id());
          s->set_seed(g.seed() + static_cast<uint64_t>(i));
          s->set_finish_reason(v1::FINISH_REASON_ABORT);
          s->set_reward_status(v1::REWARD_STATUS_ERROR);
          s->set_episode_status("reset failed: environment server unreachable: " +
                                started.status().ToString());
        }
      }
      resp->set_policy_version(version);
      return grpc::Status::OK;
    }
    env_service_ = std::move(*started);
    env_client_ = std::make_unique<agent::EnvClient>(env_service_.get(), episodes_->timeouts);
    env_address_ = req.env_address();
    GYRE_LOG_INFO("environment server at {}", env_address_);
  }
  EpisodeOptions options = episodes_->options;
  options.sampling = SamplingFromRequest(req.sampling());
  std::vector<Episode> episodes;
  std::vector<uint64_t> sample_ids;
  for (const v1::PromptGroup& g : req.groups()) {
    if (g.n() < 1 || g.n() > 65535) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a group holds 1 to 65535 episodes, not " + std::to_string(g.n()));
    }
    for (int i = 0; i < g.n(); ++i) {
      Episode e;
      e.id = (g.group_id() << 16) | static_cast<uint64_t>(i);  // group ids are unique in a job
      e.group = g.group_id();
      e.seed = g.seed() + static_cast<uint64_t>(i);
      e.task_json = g.task_json();
      episodes.push_back(std::move(e));
      sample_ids.push_back(g.first_sample_id() + static_cast<uint64_t>(i));
    }
  }
  engine_->set_version(version);
  engine_->ResetStats();
  reported_ = EngineStats{};
  EpisodeRunner runner(engine_.get(), env_client_.get(), episodes_->render, episodes_->encode,
                       episodes_->decode, options);
  auto done = runner.Run(std::move(episodes));
  if (!done.ok()) return rpc::ToGrpc(done.status());
  for (size_t k = 0; k < done->size(); ++k) {
    const Episode& e = (*done)[k];
    v1::Sample* s = resp->add_samples();
    s->set_sample_id(sample_ids[k]);
    s->set_group_id(e.group);
    s->mutable_prompt_ids()->Add(e.prompt.begin(), e.prompt.end());
    AddResponse(e.response, s);
    s->mutable_loss_mask()->Add(e.loss_mask.begin(), e.loss_mask.end());
    s->set_seed(e.seed);
    s->set_kv_version(version);
    // Terminated by the environment = finished; anything else is a cut-off episode.
    s->set_finish_reason(e.terminated ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH);
    s->set_reward(static_cast<float>(e.reward));
    // A failed environment, or an episode without a trajectory (its prompt was refused), has no
    // reward of the task's: the job's reward.on_failure decides.
    s->set_reward_status(e.env_error || e.failed ? v1::REWARD_STATUS_ERROR : v1::REWARD_STATUS_OK);
    s->set_episode_status(e.status);
    s->set_env_turns(static_cast<int32_t>(e.turns.size()));
  }
  SetCounters(engine_->stats(), version, resp);
  return grpc::Status::OK;
}

struct RolloutService::Stream {
  const v1::GenerateRequest* req = nullptr;
  uint64_t first_id = 0;
  uint64_t end_id = 0;  // first_id + the request's groups and resumed samples
  int units_left = 0;   // groups and resumed samples not yet sent
  std::map<uint64_t, std::vector<SampleResult>> pending;  // by request id, until all finish
  std::map<uint64_t, int> taken;                          // by request id: samples Preempt took
  std::vector<v1::GenerateResponse> outbox;               // finished units, not yet written
  grpc::Status failed;                                    // a step failed: the call ends with this

  // The samples request `id` still owes this stream: its group's n (1 for a resumed sample),
  // less those Preempt took.
  int Expected(uint64_t id) const {
    const int k = static_cast<int>(id - first_id);
    const int n = k < req->groups_size() ? req->groups(k).n() : 1;
    const auto t = taken.find(id);
    return n - (t == taken.end() ? 0 : t->second);
  }
};

void RolloutService::MaybeComplete(Stream* st, uint64_t id) {
  auto& unit = st->pending[id];
  if (static_cast<int>(unit.size()) < st->Expected(id)) return;
  std::sort(unit.begin(), unit.end(),
            [](const SampleResult& a, const SampleResult& b) { return a.index < b.index; });
  if (!unit.empty()) {
    if (st->outbox.empty()) st->outbox.emplace_back();
    for (const SampleResult& smp : unit) {
      ToSample(*st->req, st->first_id, smp, st->outbox.back().add_samples());
    }
  }
  st->pending.erase(id);
  st->taken.erase(id);
  --st->units_left;
}

void RolloutService::TakeCounters(v1::GenerateResponse* part) {
  const EngineStats& st = engine_->stats();
  part->set_policy_version(engine_->version());
  part->set_generated_tokens(st.generated_tokens - reported_.generated_tokens);
  part->set_prefill_tokens(st.prefill_tokens - reported_.prefill_tokens);
  part->set_prefix_shared_tokens(st.prefix_shared_tokens - reported_.prefix_shared_tokens);
  part->set_parked_reused_tokens(st.parked_reused_tokens - reported_.parked_reused_tokens);
  part->set_preemptions(st.preemptions - reported_.preemptions);
  reported_ = st;
}

void RolloutService::StepStreams() {
  auto finished = engine_->Step();
  if (!finished.ok()) {
    engine_->DropAll();
    for (auto& [id, st] : streams_) st->failed = rpc::ToGrpc(finished.status());
    return;
  }
  for (SampleResult& r : *finished) {
    Stream* st = StreamOf(r.id);
    if (st == nullptr) continue;  // a call that has gone away (cannot happen: dropped)
    const uint64_t id = r.id;
    st->pending[id].push_back(std::move(r));
    MaybeComplete(st, id);
  }
}

RolloutService::Stream* RolloutService::StreamOf(uint64_t id) {
  auto it = streams_.upper_bound(id);
  if (it == streams_.begin()) return nullptr;
  Stream* st = std::prev(it)->second;
  return id < st->end_id ? st : nullptr;
}

grpc::Status RolloutService::Preempt(grpc::ServerContext*, const v1::PreemptRequest* req,
                                     v1::PreemptResponse* resp) {
  return rpc::Guarded("Preempt", [&]() -> grpc::Status {
    const std::set<uint64_t> wanted(req->sample_ids().begin(), req->sample_ids().end());
    std::unique_lock<std::mutex> lock = WaitForEngine();
    std::set<std::pair<uint64_t, int32_t>> take;  // (request id, sample index)
    for (const auto& [first, st] : streams_) {
      const int G = st->req->groups_size();
      for (int k = 0; k < G; ++k) {
        const auto& g = st->req->groups(k);
        const uint64_t end = g.first_sample_id() + static_cast<uint64_t>(g.n());
        for (auto it = wanted.lower_bound(g.first_sample_id()); it != wanted.end() && *it < end;
             ++it) {
          take.emplace(first + static_cast<uint64_t>(k),
                       static_cast<int32_t>(*it - g.first_sample_id()));
        }
      }
      for (int k = 0; k < st->req->resume_size(); ++k) {
        if (wanted.count(st->req->resume(k).sample_id()) > 0) {
          take.emplace(first + static_cast<uint64_t>(G + k), 0);
        }
      }
    }
    if (take.empty()) return grpc::Status::OK;
    const std::vector<SampleResult> results = engine_->Preempt([&](uint64_t id, int32_t index) {
      return take.count({id, index}) > 0;
    });
    for (const SampleResult& r : results) {
      Stream* st = StreamOf(r.id);
      if (st == nullptr) continue;  // cannot happen: only streams' requests were picked
      ToSample(*st->req, st->first_id, r, resp->add_unfinished());
      ++st->taken[r.id];
      MaybeComplete(st, r.id);
    }
    std::sort(
        resp->mutable_unfinished()->begin(), resp->mutable_unfinished()->end(),
        [](const v1::Sample& a, const v1::Sample& b) { return a.sample_id() < b.sample_id(); });
    GYRE_LOG_DEBUG("preempted {} of {} requested sample(s)", resp->unfinished_size(),
                   wanted.size());
    return grpc::Status::OK;
  });
}

grpc::Status RolloutService::GenerateStream(grpc::ServerContext* ctx,
                                            const v1::GenerateRequest* req,
                                            grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return rpc::Guarded("GenerateStream", [&]() -> grpc::Status {
    if (!req->env_address().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "environment episodes run through Generate, not GenerateStream");
    }
    if (req->target_finished_groups() != 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "GenerateStream does not stop at a target (target_finished_groups); "
                          "use Generate");
    }
    auto last = std::chrono::steady_clock::now();
    // Streams share the engine: whichever call holds mu_ runs the next step for all of them,
    // and each writes its own finished groups without the lock. Between steps a waiting weight
    // update (LoadWeights, ReceiveWeights) goes first, so later tokens carry its version.
    std::shared_lock<std::shared_mutex> generation(generate_mu_);
    std::unique_lock<std::mutex> lock = WaitForEngine();
    Stream st;
    st.req = req;
    st.first_id = next_request_id_;
    st.units_left = req->groups_size() + req->resume_size();
    st.end_id = st.first_id + static_cast<uint64_t>(st.units_left);
    grpc::Status started = StartGeneration(*req, version_.load(), st.first_id);
    if (!started.ok()) return started;
    next_request_id_ = st.end_id;
    streams_[st.first_id] = &st;
    // Leaves the engine and the stream table; the call's unfinished groups are dropped.
    auto leave = [&](grpc::Status why) {
      streams_.erase(st.first_id);
      engine_->Drop([&](uint64_t id) { return id >= st.first_id && id < st.end_id; });
      return why;
    };
    auto write = [&](v1::GenerateResponse* part) {
      TakeCounters(part);
      const auto now = std::chrono::steady_clock::now();
      part->set_seconds(std::chrono::duration<double>(now - last).count());
      last = now;
      lock.unlock();
      const bool ok = writer->Write(*part);
      lock.lock();
      return ok;
    };
    while (true) {
      if (!st.failed.ok()) return leave(st.failed);
      if (!st.outbox.empty()) {
        std::vector<v1::GenerateResponse> parts;
        parts.swap(st.outbox);
        stream_cv_.notify_all();
        for (auto& part : parts) {
          if (!write(&part)) {
            return leave(
                grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away mid-stream"));
          }
        }
        continue;
      }
      if (st.units_left == 0) break;
      if (ctx->IsCancelled()) {
        return leave(
            grpc::Status(grpc::StatusCode::CANCELLED, "generation cancelled by the caller"));
      }
      if (engine_waiters_.load() > 0) {
        // A weight update or a new call is waiting for the engine: let it go first.
        lock.unlock();
        while (engine_waiters_.load() > 0)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        lock.lock();
        continue;
      }
      // Another stream has finished groups to write: let it take them before the next step.
      const bool others_waiting = std::any_of(streams_.begin(), streams_.end(), [&](const auto& e) {
        return e.second != &st && !e.second->outbox.empty();
      });
      if (others_waiting) {
        stream_cv_.wait_for(lock, std::chrono::milliseconds(1));
        continue;
      }
      StepStreams();
    }
    streams_.erase(st.first_id);
    if (!engine_->graph_error().empty() && !graph_error_logged_) {
      GYRE_LOG_WARN("CUDA graphs turned off, decode steps now run eagerly: {}",
                    engine_->graph_error());
      graph_error_logged_ = true;
    }
    v1::GenerateResponse tail;
    if (!write(&tail)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away mid-stream");
    }
    return grpc::Status::OK;
  });
}

grpc::Status RolloutService::RelayWeights(grpc::ServerContext*, const v1::RelayWeightsRequest* req,
                                          v1::PublishWeightsResponse* resp) {
  return rpc::Guarded("RelayWeights", [&]() -> grpc::Status {
    if (model_->tensor_parallel() != nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this rollout worker is tensor-parallel: it holds slices of the model "
                          "and cannot relay a version");
    }
    if (req->rollout_addresses_size() != req->rollout_ids_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "rollout_addresses and rollout_ids differ in length");
    }
    comm::WeightPayload payload;
    {
      // Between engine steps, as a weight update: the parameters are not being replaced.
      std::unique_lock<std::mutex> lock = WaitForEngine();
      if (req->version() != version_.load()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "asked to relay version " + std::to_string(req->version()) +
                                ", this worker holds " + std::to_string(version_.load()));
      }
      payload.version = version_.load();
      payload.bytes =
          model::FlattenParameters(model_->NamedParameters(), &payload.manifest, model_->dtype());
    }
    const int64_t bucket = req->bucket_bytes() > 0 ? req->bucket_bytes() : (4 << 20);
    const double timeout = req->timeout_s() > 0 ? req->timeout_s() : 60.0;
    comm::SendToEach(payload, req->rollout_addresses(), req->rollout_ids(), bucket, timeout, resp);
    return grpc::Status::OK;
  });
}

Status RolloutService::StopFollowers() {
  std::unique_lock<std::mutex> lock = WaitForEngine();
  return engine_->StopFollowers();
}

grpc::Status RolloutService::LoadWeights(grpc::ServerContext* ctx,
                                         grpc::ServerReader<v1::WeightChunk>* reader,
                                         v1::WeightReceipt* receipt) {
  return rpc::Guarded("LoadWeights", [&]() -> grpc::Status {
    std::unique_lock<std::mutex> lock = WaitForEngine();
    // The engine is idle between Generate calls; the update drops or keeps the KV of parked
    // unfinished samples (rollout.weight_update_kv). The version is known once the transfer ends.
    Status s = engine_->UpdateWeights(version_.load(), [&] {
      if (model::TensorParallelGroup* tp = model_->tensor_parallel()) {
        // Each tensor goes to every rank of the worker as soon as the stream completed it, into
        // their staging; all ranks load it once the whole version passed its checks (no rank
        // holds the whole version).
        const model::NamedTensors slices = model_->NamedParameters();
        AnnounceRoute(tp, nullptr);
        SliceSender sender(slices, tp);
        const auto cap = static_cast<uint64_t>(model::EstimateParameterCount(model_->spec()) * 4);
        const Status got = comm::ReceiveWeightBuckets(
            reader, receipt, cap + (1 << 20),
            [&](int64_t, const std::vector<model::TensorEntry>& manifest, uint64_t total) {
              return sender.Begin(manifest, total);
            },
            [&](uint64_t offset, const uint8_t* data, size_t size) {
              return sender.Add(offset, data, size);
            });
        return sender.Finish(got);
      }
      return comm::ReceiveWeights(reader, model_->NamedParameters(), receipt);
    });
    if (!s.ok()) {
      GYRE_LOG_ERROR("weight transfer rejected: {}", s.ToString());
      return rpc::ToGrpc(s);
    }
    engine_->set_version(receipt->version());
    const int64_t before = version_.exchange(receipt->version());
    if (before < 0) {
      GYRE_LOG_INFO("received policy version {} ({} bytes; this process's first weights)",
                    receipt->version(), receipt->bytes());
    }
    GYRE_LOG_DEBUG("loaded policy version {} ({} bytes)", receipt->version(), receipt->bytes());
    return grpc::Status::OK;
  });
}

grpc::Status RolloutService::ReceiveWeights(grpc::ServerContext* ctx,
                                            const v1::ReceiveWeightsRequest* req,
                                            v1::WeightReceipt* receipt) {
  return rpc::Guarded("ReceiveWeights", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> wlock(weights_mu_);
    const double timeout = req->timeout_s() > 0 ? req->timeout_s() : 60.0;
    const comm::Deadline deadline = comm::DeadlineAfter(timeout);
    const std::string transport = req->transport().empty() ? "gloo" : req->transport();
    if (transport != "gloo" && transport != "nccl" && transport != "cuda_ipc") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "unknown weight transport '" + transport + "'");
    }
    at::Device device = at::Device(at::kCPU);
    {
      std::unique_lock<std::mutex> lock = WaitForEngine();
      device = model_->device();
    }
    if (transport != "gloo" && model_->tensor_parallel() != nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this rollout worker is tensor-parallel: it takes versions over grpc or "
                          "gloo, not " +
                              transport);
    }
    if (transport != "gloo" && !device.is_cuda()) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          "the " + transport + " weight transport needs the model on a GPU (model.device: cuda)");
    }
    if (transport == "gloo" && req->slices_per_rank() && model_->tensor_parallel() != nullptr) {
      return ReceiveDirectSlices(*req, timeout, receipt);
    }
    StatusOr<comm::Receipt> r = Unavailable("no transfer");
    std::vector<model::TensorEntry> device_manifest;
    if (transport == "cuda_ipc") {
      r = ReceiveCudaIpc(*req, device.index(), deadline, &device_manifest);
    } else {
      if (!weight_comm_ || weight_comm_->aborted() || weight_group_ != req->group()) {
        weight_comm_.reset();
        StatusOr<std::unique_ptr<comm::Communicator>> c = Unavailable("no group");
        if (transport == "nccl") {
          auto id = comm::StoreGet(req->store_address(), req->group() + "/nccl_id", timeout);
          if (!id.ok()) return rpc::ToGrpc(id.status().WithContext("nccl weight group"));
          comm::NcclOptions o;
          o.unique_id = *id;
          o.rank = 1;
          o.size = 2;
          o.device = device.index();
          o.connect_timeout_s = timeout;
          c = comm::CreateNcclCommunicator(o);
        } else {
          comm::GlooOptions o;
          o.store_address = req->store_address();
          o.group = req->group();
          o.rank = 1;
          o.size = 2;
          if (!req->bind_host().empty()) o.bind_host = req->bind_host();
          o.connect_timeout_s = timeout;
          c = comm::CreateGlooCommunicator(o);
        }
        if (!c.ok()) return rpc::ToGrpc(c.status());
        weight_comm_ = std::move(*c);
        weight_group_ = req->group();
      }
      if (transport == "nccl") {
        r = comm::ReceiveDeviceWeights(weight_comm_.get(), 0, device.index(), deadline,
                                       &device_manifest, &device_buffer_);
      } else if (model_->tensor_parallel() != nullptr) {
        return ReceiveGlooSlices(deadline, receipt);
      } else {
        r = comm::ReceivePublishedWeights(weight_comm_.get(), 0, deadline, &weight_payload_);
      }
    }
    if (!r.ok()) {
      GYRE_LOG_ERROR("weight transfer rejected: {}", r.status().ToString());
      if (weight_comm_ && weight_comm_->aborted()) weight_comm_.reset();
      return rpc::ToGrpc(r.status());
    }
    {
      // As LoadWeights: through the engine, which keeps or recomputes the KV of parked samples.
      std::unique_lock<std::mutex> lock = WaitForEngine();
      Status s = engine_->UpdateWeights(r->version, [&] {
        if (transport == "gloo") {
          return model::LoadFlatParameters(weight_payload_.manifest, weight_payload_.bytes.data(),
                                           weight_payload_.bytes.size(), model_->NamedParameters());
        }
        return model::LoadFlatParameters(device_manifest,
                                         static_cast<const uint8_t*>(device_buffer_->data()),
                                         r->bytes, model_->NamedParameters(), device);
      });
      // A device load is queued on the model's stream: finish it before the buffer can be
      // written again by the next transfer (other streams) and before the receipt says "loaded".
      if (s.ok() && transport != "gloo") s = comm::SynchronizeDevice(device.index(), deadline);
      if (!s.ok()) {
        return rpc::ToGrpc(s.WithContext("weights of version " + std::to_string(r->version)));
      }
      engine_->set_version(r->version);
      if (version_.exchange(r->version) < 0) {
        GYRE_LOG_INFO("received policy version {} over {} ({} bytes; this process's first weights)",
                      r->version, transport, r->bytes);
      }
    }
    FillReceipt(*r, receipt);
    GYRE_LOG_DEBUG("loaded policy version {} over {} ({} bytes)", r->version, transport, r->bytes);
    return grpc::Status::OK;
  });
}

grpc::Status RolloutService::ReceiveGlooSlices(comm::Deadline deadline,
                                               v1::WeightReceipt* receipt) {
  // As LoadWeights over grpc: the engine waits while the buckets arrive, each tensor goes to the
  // ranks as soon as the buckets completed it, and all ranks load once the version passed its
  // checks (no rank holds the whole version). The receive itself is the gloo stream's.
  std::unique_lock<std::mutex> lock = WaitForEngine();
  StatusOr<comm::Receipt> r = Unavailable("no transfer");
  bool received = false;
  Status s = engine_->UpdateWeights(version_.load(), [&] {
    received = true;
    const model::NamedTensors slices = model_->NamedParameters();
    AnnounceRoute(model_->tensor_parallel(), nullptr);
    SliceSender sender(slices, model_->tensor_parallel());
    r = comm::ReceivePublishedBuckets(
        weight_comm_.get(), 0, deadline,
        [&](int64_t, const std::vector<model::TensorEntry>& manifest, uint64_t total) {
          return sender.Begin(manifest, total);
        },
        [&](uint64_t offset, const uint8_t* data, size_t size) {
          return sender.Add(offset, data, size);
        });
    return sender.Finish(r.status());
  });
  if (!s.ok() && (r.ok() || !received)) r = s;  // the load failed, or the engine never took it
  if (!r.ok()) {
    GYRE_LOG_ERROR("weight transfer rejected: {}", r.status().ToString());
    if (weight_comm_ && weight_comm_->aborted()) weight_comm_.reset();
    return rpc::ToGrpc(r.status());
  }
  engine_->set_version(r->version);
  if (version_.exchange(r->version) < 0) {
    GYRE_LOG_INFO("received policy version {} over gloo ({} bytes; this process's first weights)",
                  r->version, r->bytes);
  }
  FillReceipt(*r, receipt);
  GYRE_LOG_DEBUG("loaded policy version {} over gloo ({} bytes, in slices)", r->version, r->bytes);
  return grpc::Status::OK;
}

grpc::Status RolloutService::ReceiveDirectSlices(const v1::ReceiveWeightsRequest& req,
                                                 double timeout_s, v1::WeightReceipt* receipt) {
  // Every rank takes its own slices from the trainer, in its own group, while the engine waits
  // between steps; all ranks load once every one has its slices.
  std::unique_lock<std::mutex> lock = WaitForEngine();
  DirectRoute route;
  route.store_address = req.store_address();
  route.group = req.group();
  route.bind_host = req.bind_host();
  route.timeout_s = timeout_s;
  StatusOr<comm::Receipt> r = Unavailable("no transfer");
  bool received = false;
  model::TensorParallelGroup* tp = model_->tensor_parallel();
  Status s = engine_->UpdateWeights(version_.load(), [&] {
    received = true;
    AnnounceRoute(tp, &route);
    r = rollout::ReceiveDirectSlices(route, &direct_, model_->NamedParameters(), tp);
    return r.status();
  });
  if (!s.ok() && (r.ok() || !received)) r = s;
  if (!r.ok()) {
    GYRE_LOG_ERROR("weight transfer rejected: {}", r.status().ToString());
    return rpc::ToGrpc(r.status());
  }
  engine_->set_version(r->version);
  if (version_.exchange(r->version) < 0) {
    GYRE_LOG_INFO(
        "received policy version {} over gloo ({} bytes to {} ranks; this process's "
        "first weights)",
        r->version, r->bytes, tp->size());
  }
  FillReceipt(*r, receipt);
  GYRE_LOG_DEBUG(
      "loaded policy version {} over gloo: {} bytes of slices straight to this rank ({} to all "
      "{} ranks)",
      r->version, direct_.payload.bytes.size(), r->bytes, tp->size());
  return grpc::Status::OK;
}

StatusOr<comm::Receipt> RolloutService::ReceiveCudaIpc(const v1::ReceiveWeightsRequest& req,
                                                       int device, comm::Deadline deadline,
                                                       std::vector<model::TensorEntry>* manifest) {
  const auto t0 = std::chrono::steady_clock::now();
  if (req.bucket_bytes() <= 0) return InvalidArgument("cuda_ipc: bucket_bytes must be positive");
  const uint64_t total = req.total_bytes();
  const uint64_t buckets =
      std::max<uint64_t>(1, (total + req.bucket_bytes() - 1) / req.bucket_bytes());
  if (static_cast<uint64_t>(req.sent_crc32_size()) != buckets) {
    return InvalidArgument("cuda_ipc: " + std::to_string(req.sent_crc32_size()) +
                           " checksums for " + std::to_string(buckets) + " buckets");
  }
  *manifest = comm::ManifestFromProto(req.manifest());
  for (const auto& e : *manifest) {
    if (e.offset > total || e.nbytes > total - e.offset) {
      return InvalidArgument("cuda_ipc: tensor " + e.name + " lies outside the payload");
    }
  }
  // The trainer exports one handle per buffer allocation; a new handle means a new buffer.
  if (!ipc_mapping_ || ipc_handle_ != req.ipc_handle()) {
    ipc_mapping_.reset();
    GYRE_ASSIGN_OR_RETURN(ipc_mapping_, comm::CudaIpcMapping::Open(req.ipc_handle(), device));
    ipc_handle_ = req.ipc_handle();
  }
  GYRE_RETURN_IF_ERROR(comm::EnsureDeviceBuffer(total, device, &device_buffer_));
  Status s = ipc_mapping_->CopyTo(device_buffer_->data(), 0, total, deadline);
  if (!s.ok()) {
    ipc_mapping_.reset();  // map again next time
    return s.WithContext("cuda_ipc copy of version " + std::to_string(req.version()));
  }
  GYRE_ASSIGN_OR_RETURN(auto crcs, comm::DeviceBucketCrc32(device_buffer_->data(), total,
                                                           req.bucket_bytes(), device, deadline));
  for (uint64_t b = 0; b < buckets; ++b) {
    if (crcs[b] != req.sent_crc32(static_cast<int>(b))) {
      return DataLoss("bucket " + std::to_string(b) + " of version " +
                      std::to_string(req.version()) + " failed its CRC-32 check");
    }
  }
  comm::Receipt receipt;
  receipt.version = req.version();
  receipt.bytes = total;
  receipt.bucket_crc32 = std::move(crcs);
  receipt.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return receipt;
}

grpc::Status RolloutService::Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                                  v1::StopResponse* resp) {
  return rpc::Guarded("Stop", [&]() -> grpc::Status {
    if (on_stop_) on_stop_(req->reason().empty() ? "stop requested" : req->reason());
    return grpc::Status::OK;
  });
}

}  // namespace gyre::rollout
