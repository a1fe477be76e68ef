#pragma once
// Simulated workers: a rollout service and a trainer service that answer the real protocol
// (proto/gyre/v1/gyre.proto) without a model, spending the time a CostModel says instead of
// computing. The controller cannot tell them from real workers apart from their samples'
// content: every response token is the group's first prompt token (a response shorter than
// max_new_tokens ends with the request's first stop token), every behaviour log-prob is -1, and
// rewards are whatever the task's verifier makes of that. `gyre sim-workers` serves many of
// them from one process, each with its own gRPC server and heartbeat (src/cli/sim_workers.cc).
//
// SimRollout: one simulated engine (continuous batching, cost_model.h) run by its own thread;
// concurrent Generate and GenerateStream calls feed the same batch, as on a real worker.
// GenerateStream sends each group when its last sample finishes; weights arrive
// over the grpc transport only (LoadWeights), and the version is what the trainer sent. A version
// that arrives mid-call labels the tokens of the steps after it (rollout.weight_updates:
// between_steps).
// SimTrainer: TrainStep checks expected_version and advances the version by one; PublishWeights
// (grpc transport only) spends the uplink time, then streams a small token payload to each
// rollout worker so the receipts are real; Save writes simulated.json; SaveState and LoadState
// are refused (a simulated job cannot be checkpointed).
//
// Thread-safe: gRPC calls may arrive concurrently; each service serialises what must be.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gyre/v1/gyre.grpc.pb.h"
#include "sim/cost_model.h"

namespace gyre::sim {

class SimRollout final : public v1::Rollout::Service {
 public:
  SimRollout(CostModel cost, std::function<void(const std::string&)> on_stop);

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override;
  grpc::Status GenerateStream(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                              grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status LoadWeights(grpc::ServerContext* ctx, grpc::ServerReader<v1::WeightChunk>* reader,
                           v1::WeightReceipt* receipt) override;
  grpc::Status ReceiveWeights(grpc::ServerContext* ctx, const v1::ReceiveWeightsRequest* req,
                              v1::WeightReceipt* receipt) override;
  // Peer relay: spends this worker's uplink time for each copy, then streams the payload of the
  // version it holds to each target, as SimTrainer::PublishWeights does.
  grpc::Status RelayWeights(grpc::ServerContext* ctx, const v1::RelayWeightsRequest* req,
                            v1::PublishWeightsResponse* resp) override;
  // Work stealing: takes the listed samples out of the running streams with the tokens they
  // have so far (a group not admitted yet only whole).
  grpc::Status Preempt(grpc::ServerContext* ctx, const v1::PreemptRequest* req,
                       v1::PreemptResponse* resp) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  int64_t version() const { return version_.load(); }

  ~SimRollout() override;

 private:
  // A call waiting for its groups (Generate or GenerateStream), by call id in calls_.
  // A call's units are its request's groups (index 0..G-1) and resumed samples (G..).
  struct Call {
    const v1::GenerateRequest* req = nullptr;
    int groups_left = 0;  // units not yet finished
    int64_t tokens = 0;   // generated since its last part
    // Finished units, in sample order, not yet taken by the call's thread.
    std::vector<std::vector<v1::Sample>> outbox;
    std::map<int, std::vector<v1::Sample>> finishing;  // by unit, until all its samples finish
    std::map<int, int> taken;                          // by unit: samples Preempt took
    int Expected(int unit) const;                      // samples the unit still owes
  };
  struct Seq {
    uint64_t call = 0;
    int group = 0;  // unit index in the call's request
    int index = 0;  // sample index in its group
    int64_t length = 0, done = 0;
    // The policy version of its tokens, run-length encoded: (version, tokens), oldest first. A
    // weight update that lands mid-generation (LoadWeights between two steps) starts a new run.
    std::vector<std::pair<int64_t, int64_t>> versions;
  };
  // Registers `req` (checked first) as call `*id`: its groups join the engine's queue.
  // Resumed samples only when `streaming`.
  grpc::Status Join(const v1::GenerateRequest& req, bool streaming, Call* call, uint64_t* id);
  // Waits for the call's next finished groups (the outbox, emptied into `*groups`). Returns
  // false once it has none left; CANCELLED when `ctx` is cancelled (the call has left then).
  grpc::Status Next(grpc::ServerContext* ctx, uint64_t id, Call* call,
                    std::vector<std::vector<v1::Sample>>* groups, int64_t* tokens, bool* more);
  // Removes call `id` and its groups still in the engine.
  void Leave(uint64_t id);
  void EngineLoop();
  // The sample `seq` stands for: finished (all of its length) or not (the tokens done so far).
  v1::Sample SampleOf(const Seq& seq, const v1::GenerateRequest& req, bool finished) const;
  // The sequence of resumed unit `unit` of call `cid`: its tokens so far are done.
  Seq ResumedSeq(uint64_t cid, int unit, const v1::GenerateRequest& req) const;
  // Under mu_: once unit `unit` has no samples left to finish, its finished ones go to the
  // outbox. Returns whether it completed.
  static bool Complete(Call* call, int unit);

  const CostModel cost_;
  std::function<void(const std::string&)> on_stop_;
  std::atomic<int64_t> version_{-1};  // -1: no weights received yet
  std::mutex mu_;                     // guards the engine state below
  std::condition_variable work_cv_;   // new groups, or stop
  std::condition_variable done_cv_;   // groups finished
  std::map<uint64_t, Call*> calls_;
  uint64_t next_call_ = 0;
  std::deque<std::pair<uint64_t, int>> waiting_;  // (call, group index), not admitted yet
  std::vector<Seq> running_;
  std::atomic<bool> stop_{false};
  std::thread engine_;
  std::mutex relay_mu_;  // one relay at a time (one uplink)
};

class SimTrainer final : public v1::Trainer::Service {
 public:
  SimTrainer(CostModel cost, std::function<void(const std::string&)> on_stop);

  grpc::Status HostGroupStore(grpc::ServerContext* ctx, const v1::HostGroupStoreRequest* req,
                              v1::HostGroupStoreResponse* resp) override;
  grpc::Status JoinGroup(grpc::ServerContext* ctx, const v1::JoinGroupRequest* req,
                         v1::JoinGroupResponse* resp) override;
  grpc::Status TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* req,
                         v1::TrainStepResponse* resp) override;
  grpc::Status PublishWeights(grpc::ServerContext* ctx, const v1::PublishWeightsRequest* req,
                              v1::PublishWeightsResponse* resp) override;
  grpc::Status Save(grpc::ServerContext* ctx, const v1::SaveRequest* req,
                    v1::SaveResponse* resp) override;
  grpc::Status SaveState(grpc::ServerContext* ctx, const v1::SaveStateRequest* req,
                         v1::SaveStateResponse* resp) override;
  grpc::Status LoadState(grpc::ServerContext* ctx, const v1::LoadStateRequest* req,
                         v1::LoadStateResponse* resp) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  int64_t version() const { return version_.load(); }

 private:
  const CostModel cost_;
  std::function<void(const std::string&)> on_stop_;
  std::mutex mu_;  // one train step or publish at a time
  std::atomic<int64_t> version_{0};
};

}  // namespace gyre::sim
