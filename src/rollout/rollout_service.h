#pragma once
// RolloutService: the gRPC face of a rollout worker. Generate runs the rollout engine
// (rollout_engine.h) on the groups and resumed samples it is given and labels every new token
// with the policy version the worker holds; with a target number of finished groups it stops
// there and returns the other samples unfinished (partial rollouts). LoadWeights receives a new
// version from a trainer (see comm/weight_sync.h) and applies it through the engine, which keeps
// or drops the KV cache of parked unfinished samples as configured. A mutex serialises the two,
// so a weight update never lands in the middle of a generation step. GenerateStream calls may
// run concurrently: their groups join one continuous batch (a worker takes new work while the
// long tail of earlier calls still runs), and each call streams back its own finished groups.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "agent/env_client.h"
#include "agent/service_supervisor.h"
#include "comm/communicator.h"
#include "comm/cuda_ipc.h"
#include "comm/device_weights.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sync.h"
#include "gyre/config.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "model/transformer.h"
#include "rollout/episode_runner.h"
#include "rollout/rollout_engine.h"
#include "rollout/tensor_parallel_weights.h"
#include "text/text_tokenizer.h"

namespace gyre::rollout {

// The engine limits of a job's rollout section for `model`: the KV budget is
// rollout.kv_cache_bytes, or rollout.kv_cache_fraction of the device's memory (physical RAM
// on CPU), capped at what 2 * max_running samples of max_seq_len positions can use.
StatusOr<EngineConfig> EngineConfigFromJob(const RolloutSection& rollout,
                                           const model::Transformer& model);

// What a rollout worker needs to run environment episodes (the job's env section): the chat
// template, the tokenizer, the episode limits and the environment call deadlines.
struct EpisodeSetup {
  RenderFn render;
  EncodeFn encode;
  DecodeFn decode;
  EpisodeOptions options;  // options.sampling comes from each request
  agent::EnvTimeouts timeouts;
  double ready_timeout_s = 60;  // for an environment address the worker has not used yet
};

// The episode setup of a job with an env section: env.chat_template (or the model's own),
// env.template_kwargs, the limits and deadlines of env.*, and `tokenizer` (kept alive by the
// returned functions). Errors say which setting to change.
StatusOr<EpisodeSetup> EpisodeSetupFromJob(const JobConfig& cfg,
                                           std::shared_ptr<const text::TextTokenizer> tokenizer);

class RolloutService final : public v1::Rollout::Service {
 public:
  // Fails when the engine config is invalid. `decoder` (may be null) turns response tokens
  // into text for stop strings.
  static StatusOr<std::unique_ptr<RolloutService>> Create(
      std::unique_ptr<model::Transformer> model, const EngineConfig& config,
      RolloutEngine::Decoder decoder, std::function<void(const std::string&)> on_stop);

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override;
  grpc::Status GenerateStream(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                              grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status LoadWeights(grpc::ServerContext* ctx, grpc::ServerReader<v1::WeightChunk>* reader,
                           v1::WeightReceipt* receipt) override;
  // Gloo transport: joins (or reuses) this worker's two-member group with the trainer, receives
  // one version, checks every bucket, then loads it under the model lock.
  grpc::Status ReceiveWeights(grpc::ServerContext* ctx, const v1::ReceiveWeightsRequest* req,
                              v1::WeightReceipt* receipt) override;
  // Peer relay: streams the version this worker holds (it must be req.version) to the listed
  // rollout workers over gRPC, as a trainer's grpc publish does.
  grpc::Status RelayWeights(grpc::ServerContext* ctx, const v1::RelayWeightsRequest* req,
                            v1::PublishWeightsResponse* resp) override;
  // Work stealing: takes the requested samples that are still generating out of the running
  // streams (rollout_engine.h, RolloutEngine::Preempt) and returns them unfinished.
  grpc::Status Preempt(grpc::ServerContext* ctx, const v1::PreemptRequest* req,
                       v1::PreemptResponse* resp) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  int64_t version() const { return version_.load(); }

  // Tensor parallelism (the model is a slice): ends the other ranks' Follow (engine stopped).
  Status StopFollowers();

  // Turns on environment episodes: a Generate request with env_address runs each group's n
  // samples as episodes of its task_json (episode_runner.h). Call before serving.
  void EnableEpisodes(EpisodeSetup setup) {
    episodes_ = std::make_unique<EpisodeSetup>(std::move(setup));
  }

 private:
  // Generate with env_address, under mu_: the request's episodes, as samples in request order.
  grpc::Status RunEpisodes(const v1::GenerateRequest& req, int64_t version,
                           v1::GenerateResponse* resp);
  // cuda_ipc: copies the version out of the trainer's mapped buffer into device_buffer_ and
  // checks every bucket against the trainer's checksums. Under weights_mu_.
  StatusOr<comm::Receipt> ReceiveCudaIpc(const v1::ReceiveWeightsRequest& req, int device,
                                         comm::Deadline deadline,
                                         std::vector<model::TensorEntry>* manifest);
  // gloo into a tensor-parallel worker: streams the version from weight_comm_ bucket by bucket
  // into every rank's staging, inside the engine's update (rollout/tensor_parallel_weights.h).
  // Under weights_mu_.
  grpc::Status ReceiveGlooSlices(comm::Deadline deadline, v1::WeightReceipt* receipt);
  // gloo into a tensor-parallel worker whose publisher sends every rank its own slices
  // (ReceiveWeightsRequest.slices_per_rank): each rank receives from the trainer in its own
  // group, inside the engine's update. Under weights_mu_.
  grpc::Status ReceiveDirectSlices(const v1::ReceiveWeightsRequest& req, double timeout_s,
                                   v1::WeightReceipt* receipt);
  RolloutService(std::unique_ptr<model::Transformer> model,
                 std::function<void(const std::string&)> on_stop);
  // Generate and GenerateStream, under mu_: checks the request against the held version and
  // queues its groups and resumed samples on the engine, as request ids first_id + 0..G-1 (the
  // groups) and first_id + G.. (the resumed samples).
  grpc::Status StartGeneration(const v1::GenerateRequest& req, int64_t version, uint64_t first_id);
  // The engine result `r` of request `req` (queued from `first_id`) as a Sample.
  static void ToSample(const v1::GenerateRequest& req, uint64_t first_id, const SampleResult& r,
                       v1::Sample* s);
  // One GenerateStream call sharing the engine with the others (rollout_service.cc).
  struct Stream;
  // Under mu_: one engine step for every stream; finished groups go to their stream's outbox.
  // A failed step fails every stream.
  void StepStreams();
  // Under mu_: the stream that queued request `id`, or null.
  Stream* StreamOf(uint64_t id);
  // Under mu_: once every sample request `id` still owes its stream has finished, they go to
  // the stream's outbox as one unit (nothing when Preempt took them all).
  static void MaybeComplete(Stream* st, uint64_t id);
  // Under mu_: the engine counters not yet reported, into `part`.
  void TakeCounters(v1::GenerateResponse* part);

  // Generate takes it exclusively (it needs the engine to itself, for partial rollouts); each
  // GenerateStream shares it, so concurrent streams feed one continuous batch. Taken before mu_.
  std::shared_mutex generate_mu_;
  std::mutex mu_;  // guards model_, engine_ and the stream state below
  // Weight updates and arriving streams take mu_ through WaitForEngine, which a running
  // GenerateStream sees between engine steps (engine_waiters_ > 0) and yields to.
  std::unique_lock<std::mutex> WaitForEngine();
  std::atomic<int> engine_waiters_{0};
  std::map<uint64_t, Stream*> streams_;  // by first request id, under mu_
  uint64_t next_request_id_ = 0;         // under mu_
  EngineStats reported_;                 // engine counters already reported, under mu_
  std::condition_variable stream_cv_;    // a stream took its outbox
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<RolloutEngine> engine_;
  std::atomic<int64_t> version_{-1};    // -1: no weights received yet
  bool graph_error_logged_ = false;     // guarded by mu_
  std::atomic<bool> generated_{false};  // a Generate call arrived (logged once)
  std::function<void(const std::string&)> on_stop_;
  // Gloo weight plane; weights_mu_ serialises ReceiveWeights calls and guards these.
  std::mutex weights_mu_;
  // gloo into a tensor-parallel worker whose ranks each take their own slices: rank 0's group
  // with the trainer and its buffer (tensor_parallel_weights.h).
  DirectReceiver direct_;
  std::string weight_group_;
  std::unique_ptr<comm::Communicator> weight_comm_;
  // Reused between versions; a tensor-parallel worker lets it go after each load.
  comm::WeightPayload weight_payload_;
  // GPU transports: the version as received on this worker's GPU (nccl, cuda_ipc), and the
  // trainer's buffer mapped into this process (cuda_ipc, kept while its handle stays the same).
  std::unique_ptr<comm::DeviceBuffer> device_buffer_;
  std::unique_ptr<comm::CudaIpcMapping> ipc_mapping_;
  std::string ipc_handle_;
  // Environment episodes (EnableEpisodes), and the client of the environment address in use;
  // a request naming another address (the server was restarted elsewhere) replaces it. Under mu_.
  std::unique_ptr<EpisodeSetup> episodes_;
  std::string env_address_;
  std::unique_ptr<agent::ServiceSupervisor> env_service_;
  std::unique_ptr<agent::EnvClient> env_client_;
};

}  // namespace gyre::rollout
