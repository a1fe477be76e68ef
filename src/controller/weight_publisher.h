#pragma once
// WeightPublisher: moves a policy version from trainer-0 to rollout workers over the job's
// cluster.weight_transport, and accepts a worker as holding that version only on a receipt that
// matches what the trainer sent, bucket by bucket (docs/design.md, "Weight plane").
//   grpc      the trainer streams buckets to each rollout worker itself; with a relay fan-out
//             F > 0 only to F of them, and then, in rounds, every worker that holds the version
//             relays it to up to F that do not (peer relay), each receipt checked against the
//             trainer's checksums. F is cluster.weight_relay_fanout, or by default (-1) chosen
//             for each publish from its number of receivers and the measured cost of a copy
//             (controller/relay_plan.h);
//   gloo/nccl the trainer and each rollout worker meet in a two-member group through the
//             controller's rendezvous store; the trainer broadcasts in buckets;
//   cuda_ipc  the trainer fills its GPU buffer; every rollout worker copies from it through a
//             CUDA IPC handle.
// A worker whose transfer fails is left to the monitor when it died, otherwise stopped and
// dropped (WorkerPool::AfterWorkFailure); the others keep the version. While the trainer sends
// (grpc and gloo/nccl), a receiver that is declared dead or whose receive call fails has its
// transfer ended on the trainer at once (Trainer.AbortWeightTransfer), so that the publish does
// not wait for cluster.weight_sync_timeout_s on a host that is gone.
//
// Threads: job thread only. Its calls fan out to helper threads that it joins before returning.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "controller/relay_plan.h"
#include "controller/worker_pool.h"

namespace gyre::controller {

// Where a version comes from when it is not trainer-0 (an embedding program's RolloutFleet
// sends its own weights): `send` answers a publish request in this process, as the trainer's
// PublishWeights RPC would (comm::WeightSender), and `host` is the address its gloo device binds.
struct LocalWeightSource {
  std::function<Status(const v1::PublishWeightsRequest&, v1::PublishWeightsResponse*)> send;
  // Ends the transfers of publish `publish_id` to these receivers (WeightSender::AbortReceivers);
  // called from another thread while `send` runs.
  std::function<void(uint64_t publish_id, const std::vector<std::string>& rollout_ids)> abort;
  std::string host = "127.0.0.1";
};

class WeightPublisher {
 public:
  // `pool` (not owned) must outlive the publisher. `store_address` is the rendezvous store of
  // the gloo and nccl transports ("" for the others). Without `local.send` the versions come
  // from trainer-0.
  WeightPublisher(const JobConfig& cfg, WorkerPool* pool, std::string store_address,
                  LocalWeightSource local = LocalWeightSource());

  // Publishes `version` to every alive rollout worker. Sets each one's Worker::version on a
  // matching receipt. Error = the job must end.
  Status Publish(int64_t version);
  // Publishes `version` to `w` alone (a restarted worker's catch-up). With group transports the
  // next full publish then forms fresh groups with every worker.
  Status CatchUp(Worker* w, int64_t version);

  // Seconds the last Publish or CatchUp took.
  double last_seconds() const { return last_seconds_; }

  // What each worker of the last Publish or CatchUp answered: its receipt, and why it does not
  // hold the version ("" when it does). Workers the call never reached are absent.
  struct Outcome {
    v1::WeightReceipt receipt;
    std::string error;
  };
  const std::map<std::string, Outcome>& last_outcomes() const { return last_outcomes_; }

 private:
  Status PublishTo(int64_t version, const std::vector<Worker*>& rollouts);
  // The trainer sends to `fanout` of `rollouts` (all of them when 0), which relay to the rest.
  Status PublishGrpc(int64_t version, const std::vector<Worker*>& rollouts, size_t fanout);
  // Peer relay rounds: `holders` hold `version` (sent by the trainer with checksums `sent`);
  // each round every holder sends it on to up to `fanout` of `waiting`.
  Status Relay(int64_t version, std::vector<Worker*> holders, std::vector<Worker*> waiting,
               const google::protobuf::RepeatedField<uint32_t>& sent, size_t fanout);
  Status PublishGroups(int64_t version, const std::vector<Worker*>& rollouts);
  Status PublishCudaIpc(int64_t version, const std::vector<Worker*>& rollouts);
  // The one receipt check: `error` is why the transfer failed ("" when it went through), and
  // the receipt must match `sent`.
  Status Settle(Worker* w, int64_t version, const std::string& error,
                const v1::WeightReceipt& receipt,
                const google::protobuf::RepeatedField<uint32_t>& sent);
  std::string WeightGroup(const Worker& w) const;
  Worker* trainer() { return pool_->Trainers().front(); }
  // The source's side of a publish: trainer-0's PublishWeights RPC, or local_.send.
  Status SendFromSource(const v1::PublishWeightsRequest& req, double timeout_s,
                        v1::PublishWeightsResponse* resp);
  // The error handling of a failed SendFromSource (a trainer's death is named by the monitor).
  Status SettleSource(const Status& s);
  // Ends the source's transfers of publish `publish_id` to `ids` (see the top of this file).
  void AbortAtSource(uint64_t publish_id, const std::vector<std::string>& ids,
                     const std::string& why);
  std::string SourceHost();

  const JobConfig cfg_;
  WorkerPool* pool_;
  const std::string store_address_;
  const LocalWeightSource local_;
  // Gloo weight groups are named with this epoch; a catch-up publish starts a new one, so that
  // the next full publish forms fresh groups with every worker (the trainer keeps only the
  // groups a publish names).
  int weight_epoch_ = 0;
  uint64_t publish_ids_ = 0;  // the last PublishWeightsRequest.publish_id
  double last_seconds_ = 0;
  std::map<std::string, Outcome> last_outcomes_;  // by worker id
  int last_relay_rounds_ = 0;
  int last_relay_fanout_ = 0;
  RelayPlanner relay_planner_;  // gRPC: what a copy costs the trainer and a relaying worker

 public:
  // Relay rounds of the last Publish (0 without peer relay).
  int last_relay_rounds() const { return last_relay_rounds_; }
  // The fan-out of the last gRPC Publish or CatchUp: cluster.weight_relay_fanout, or the one
  // chosen for its receivers when that is -1 (0 = the trainer sent every copy).
  int last_relay_fanout() const { return last_relay_fanout_; }
  const RelayPlanner& relay_planner() const { return relay_planner_; }
};

// Why `receipt` does not confirm `version` as sent (empty when it does): it must name the
// version and match what the trainer sent, bucket by bucket.
std::string ReceiptMismatch(const v1::WeightReceipt& receipt, int64_t version,
                            const google::protobuf::RepeatedField<uint32_t>& sent);

}  // namespace gyre::controller
