#include "controller/weight_publisher.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/logging.h"

namespace gyre::controller {

namespace {

std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

// Watches the receivers of a publish while the source sends: a receiver that is declared dead,
// or whose own receive call failed (Failed), is handed to `abort` once, from this watch's thread,
// so that the source stops waiting for it. Stop() (or the destructor) joins the thread.
class TransferWatch {
 public:
  using AbortFn = std::function<void(const std::vector<std::string>& ids, const std::string& why)>;

  TransferWatch(WorkerPool* pool, const std::vector<Worker*>& receivers, AbortFn abort)
      : pool_(pool),
        abort_(std::move(abort)),
        failures_(receivers.size()),
        ended_(receivers.size(), false) {
    for (const Worker* w : receivers) ids_.push_back(w->id);
    thread_ = std::thread([this] { Loop(); });
  }
  ~TransferWatch() { Stop(); }
  TransferWatch(const TransferWatch&) = delete;
  TransferWatch& operator=(const TransferWatch&) = delete;

  // Receiver `i`'s receive call failed with `why`. Any thread.
  void Failed(size_t i, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[i] = why;
    cv_.notify_all();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stop_) break;
      std::vector<std::string> ids;
      std::string why;
      for (size_t i = 0; i < ids_.size(); ++i) {
        if (ended_[i]) continue;
        // A dead worker's receive call fails too (cancelled): name the death, not the symptom.
        const std::string reason = pool_->IsDead(ids_[i]) ? "declared dead" : failures_[i];
        if (reason.empty()) continue;
        ended_[i] = true;
        ids.push_back(ids_[i]);
        why += (why.empty() ? "" : "; ") + ids_[i] + ": " + reason;
      }
      if (ids.empty()) continue;
      lock.unlock();
      abort_(ids, why);
      lock.lock();
    }
  }

  WorkerPool* pool_;
  AbortFn abort_;
  std::vector<std::string> ids_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> failures_;  // guarded by mu_
  std::vector<bool> ended_;            // watch thread only
  bool stop_ = false;                  // guarded by mu_
  std::thread thread_;
};

}  // namespace

std::string ReceiptMismatch(const v1::WeightReceipt& receipt, int64_t version,
                            const google::protobuf::RepeatedField<uint32_t>& sent) {
  bool match = receipt.version() == version && receipt.bucket_crc32_size() == sent.size();
  for (int b = 0; match && b < sent.size(); ++b) match = receipt.bucket_crc32(b) == sent.Get(b);
  return match ? "" : "receipt for v" + std::to_string(version) + " does not match";
}

WeightPublisher::WeightPublisher(const JobConfig& cfg, WorkerPool* pool, std::string store_address,
                                 LocalWeightSource local)
    : cfg_(cfg), pool_(pool), store_address_(std::move(store_address)), local_(std::move(local)) {}

Status WeightPublisher::SendFromSource(const v1::PublishWeightsRequest& req, double timeout_s,
                                       v1::PublishWeightsResponse* resp) {
  const std::string what = "publish weights v" + std::to_string(req.version());
  if (local_.send) return local_.send(req, resp).WithContext(what);
  Worker* t = trainer();
  // trainer.shard: parameters: no trainer holds the whole model, so every other trainer takes
  // part in trainer-0's publish (they gather the model unit by unit with it) and sends nothing.
  std::vector<Worker*> others;
  if (cfg_.trainer.shard == "parameters" || cfg_.trainer.tensor_parallel > 1) {
    for (Worker* w : pool_->Trainers()) {
      if (w != t) others.push_back(w);
    }
  }
  v1::PublishWeightsRequest part = req;
  part.clear_rollout_addresses();
  part.clear_rollout_ids();
  part.clear_groups();
  std::vector<std::future<Status>> parts;
  for (Worker* w : others) {
    parts.push_back(std::async(std::launch::async, [this, w, &part, timeout_s, &what] {
      v1::PublishWeightsResponse ignored;
      return pool_->Invoke(w->id, timeout_s, [&](const rpc::Call& c) {
        return w->trainer->PublishWeights(c, part, &ignored).WithContext(what + " on " + w->id);
      });
    }));
  }
  Status s = pool_->Invoke(t->id, timeout_s, [&](const rpc::Call& c) {
    return t->trainer->PublishWeights(c, req, resp).WithContext(what);
  });
  for (size_t k = 0; k < parts.size(); ++k) {
    const Status p = pool_->AfterRpcFailure(others[k], parts[k].get());
    if (s.ok()) s = p;
  }
  return s;
}

void WeightPublisher::AbortAtSource(uint64_t publish_id, const std::vector<std::string>& ids,
                                    const std::string& why) {
  GYRE_LOG_INFO("ending the weight transfer of publish {} to {}", publish_id, why);
  if (local_.send) {
    if (local_.abort) local_.abort(publish_id, ids);
    return;
  }
  v1::AbortWeightTransferRequest req;
  req.set_publish_id(publish_id);
  for (const std::string& id : ids) req.add_rollout_ids(id);
  req.set_reason(why);
  v1::AbortWeightTransferResponse resp;
  Worker* t = trainer();
  const Status s = pool_->Invoke(t->id, 10, [&](const rpc::Call& c) {
    return t->trainer->AbortWeightTransfer(c, req, &resp);
  });
  // Without it the transfer still ends, at its deadline.
  if (!s.ok()) GYRE_LOG_WARN("could not end the weight transfer to {}: {}", why, s.ToString());
}

Status WeightPublisher::SettleSource(const Status& s) {
  if (local_.send) return s;
  return pool_->AfterRpcFailure(trainer(), s);
}

std::string WeightPublisher::SourceHost() {
  return local_.send ? local_.host : HostOf(trainer()->address);
}

Status WeightPublisher::Publish(int64_t version) {
  return PublishTo(version, pool_->AliveRollouts());
}

Status WeightPublisher::CatchUp(Worker* w, int64_t version) {
  if (!store_address_.empty()) ++weight_epoch_;  // a fresh group with this worker
  return PublishTo(version, {w});
}

Status WeightPublisher::PublishTo(int64_t version, const std::vector<Worker*>& rollouts) {
  const auto t0 = SteadyClock::now();
  last_outcomes_.clear();
  Status s;
  if (!store_address_.empty()) {
    s = PublishGroups(version, rollouts);
  } else if (cfg_.cluster.weight_transport == "cuda_ipc") {
    s = PublishCudaIpc(version, rollouts);
  } else {
    // cluster.weight_relay_fanout, or (-1) the fan-out with the least estimated time for this
    // many receivers (controller/relay_plan.h).
    // Tensor-parallel rollout workers hold slices: they do not relay.
    const int configured = cfg_.rollout.tensor_parallel > 1 ? 0 : cfg_.cluster.weight_relay_fanout;
    last_relay_fanout_ =
        configured >= 0 ? configured : relay_planner_.Choose(static_cast<int64_t>(rollouts.size()));
    s = PublishGrpc(version, rollouts, static_cast<size_t>(last_relay_fanout_));
  }
  last_seconds_ = SecondsSince(t0);
  GYRE_RETURN_IF_ERROR(s);
  GYRE_LOG_DEBUG("published v{} over {} to {} worker(s) in {:.3f} s", version,
                 cfg_.cluster.weight_transport, rollouts.size(), last_seconds_);
  return pool_->CheckHealth();
}

Status WeightPublisher::Settle(Worker* w, int64_t version, const std::string& error,
                               const v1::WeightReceipt& receipt,
                               const google::protobuf::RepeatedField<uint32_t>& sent) {
  Outcome& outcome = last_outcomes_[w->id];
  outcome.receipt = receipt;
  outcome.error = !error.empty() ? error : ReceiptMismatch(receipt, version, sent);
  if (!error.empty()) {
    // A worker that died mid-transfer is reported by the monitor (with its pid and signal); one
    // that is alive but failed the transfer is stopped and dropped.
    return pool_->AfterWorkFailure(
        w, "weight transfer of v" + std::to_string(version) + " failed: " + error);
  }
  // Alive and answering, but holding something else than was sent: never use it again.
  if (std::string mismatch = ReceiptMismatch(receipt, version, sent); !mismatch.empty()) {
    return pool_->DropWorker(w, mismatch);
  }
  w->version = version;
  return Status::Ok();
}

std::string WeightPublisher::WeightGroup(const Worker& w) const {
  return weight_epoch_ == 0 ? "weights/" + w.id
                            : "weights/e" + std::to_string(weight_epoch_) + "/" + w.id;
}

Status WeightPublisher::PublishGrpc(int64_t version, const std::vector<Worker*>& rollouts,
                                    size_t fanout) {
  const size_t direct = fanout > 0 ? std::min(fanout, rollouts.size()) : rollouts.size();
  v1::PublishWeightsRequest req;
  req.set_version(version);
  req.set_timeout_s(cfg_.cluster.weight_sync_timeout_s);
  req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
  req.set_publish_id(++publish_ids_);
  for (size_t i = 0; i < direct; ++i) {
    req.add_rollout_addresses(rollouts[i]->address);
    req.add_rollout_ids(rollouts[i]->id);
  }
  v1::PublishWeightsResponse resp;
  Status source_status;
  {
    TransferWatch watch(
        pool_, std::vector<Worker*>(rollouts.begin(), rollouts.begin() + direct),
        [this, id = req.publish_id()](const std::vector<std::string>& ids, const std::string& why) {
          AbortAtSource(id, ids, why);
        });
    const auto sent_at = SteadyClock::now();
    source_status = SendFromSource(req, cfg_.cluster.weight_sync_timeout_s + 10, &resp);
    if (source_status.ok()) {
      relay_planner_.ObserveTrainer(SecondsSince(sent_at), static_cast<int64_t>(direct));
    }
  }
  GYRE_RETURN_IF_ERROR(SettleSource(source_status));
  std::vector<Worker*> holders;
  google::protobuf::RepeatedField<uint32_t> sent;  // the trainer's checksums of this version
  for (const auto& r : resp.results()) {
    Worker* w = pool_->Get(r.rollout_id());
    GYRE_RETURN_IF_ERROR(Settle(w, version, r.ok() ? "" : r.error(), r.receipt(), r.sent_crc32()));
    if (w->version == version && !pool_->IsDead(w->id)) {
      holders.push_back(w);
      if (sent.empty()) sent = r.sent_crc32();
    }
  }
  last_relay_rounds_ = 0;
  if (direct == rollouts.size()) return Status::Ok();
  return Relay(
      version, std::move(holders),
      std::vector<Worker*>(rollouts.begin() + static_cast<std::ptrdiff_t>(direct), rollouts.end()),
      sent, fanout);
}

Status WeightPublisher::Relay(int64_t version, std::vector<Worker*> holders,
                              std::vector<Worker*> waiting,
                              const google::protobuf::RepeatedField<uint32_t>& sent,
                              size_t fanout) {
  const double timeout = cfg_.cluster.weight_sync_timeout_s;
  std::deque<Worker*> queue(waiting.begin(), waiting.end());
  while (!queue.empty()) {
    if (holders.empty()) {
      // Every holder failed: the trainer sends the next copies itself.
      std::vector<Worker*> next;
      while (!queue.empty() && next.size() < fanout) {
        next.push_back(queue.front());
        queue.pop_front();
      }
      const int rounds = last_relay_rounds_;
      GYRE_RETURN_IF_ERROR(PublishGrpc(version, next, fanout));  // direct: next.size() <= fanout
      last_relay_rounds_ += rounds;
      for (Worker* w : next) {
        if (w->version == version && !pool_->IsDead(w->id)) holders.push_back(w);
      }
      continue;
    }
    ++last_relay_rounds_;
    // One round: every holder sends to up to `fanout` waiting workers, all holders at once.
    struct Hop {
      Worker* from = nullptr;
      std::vector<Worker*> to;
      v1::RelayWeightsRequest req;
      v1::PublishWeightsResponse resp;
    };
    std::vector<Hop> hops;
    for (Worker* h : holders) {
      if (queue.empty()) break;
      Hop hop;
      hop.from = h;
      hop.req.set_version(version);
      hop.req.set_timeout_s(timeout);
      hop.req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
      while (!queue.empty() && hop.to.size() < fanout) {
        Worker* w = queue.front();
        queue.pop_front();
        hop.to.push_back(w);
        hop.req.add_rollout_addresses(w->address);
        hop.req.add_rollout_ids(w->id);
      }
      hops.push_back(std::move(hop));
    }
    std::vector<std::future<Status>> pending;
    const auto round_start = SteadyClock::now();
    size_t most_copies = 0;  // the busiest sender's: it sets the round's length
    for (Hop& hop : hops) {
      most_copies = std::max(most_copies, hop.to.size());
      pending.push_back(std::async(std::launch::async, [this, &hop, timeout] {
        return pool_->Invoke(hop.from->id, timeout + 10, [&](const rpc::Call& c) {
          return hop.from->rollout->RelayWeights(c, hop.req, &hop.resp);
        });
      }));
    }
    std::vector<Status> results;
    for (auto& f : pending) results.push_back(f.get());
    // Full rounds only: as many copies from the busiest sender as the trainer made
    // (controller/relay_plan.h).
    if (most_copies == fanout &&
        std::all_of(results.begin(), results.end(), [](const Status& r) { return r.ok(); })) {
      relay_planner_.ObserveRelay(SecondsSince(round_start), static_cast<int64_t>(most_copies));
    }
    std::vector<Worker*> received;
    std::set<Worker*> failed_holders;
    for (size_t i = 0; i < hops.size(); ++i) {
      Hop& hop = hops[i];
      bool relayer_ok = results[i].ok();
      std::string why = relayer_ok ? "" : results[i].ToString();
      for (const auto& r : hop.resp.results()) {
        const bool as_trainer =
            r.sent_crc32_size() == sent.size() &&
            std::equal(r.sent_crc32().begin(), r.sent_crc32().end(), sent.begin());
        if (relayer_ok && r.ok() && !as_trainer) {
          relayer_ok = false;
          why = "it relayed v" + std::to_string(version) +
                " with checksums that differ from the trainer's";
        }
      }
      if (!relayer_ok) {
        // The relaying worker is at fault: it is dropped (or left to the monitor), and its
        // targets wait for another holder, whatever they received.
        GYRE_LOG_WARN("peer relay of v{} from {} failed: {}", version, hop.from->id, why);
        GYRE_RETURN_IF_ERROR(pool_->AfterWorkFailure(hop.from, "weight relay failed: " + why));
        failed_holders.insert(hop.from);
        for (auto it = hop.to.rbegin(); it != hop.to.rend(); ++it) queue.push_front(*it);
        continue;
      }
      std::map<std::string, const v1::PublishResult*> by_id;
      for (const auto& r : hop.resp.results()) by_id[r.rollout_id()] = &r;
      static const v1::WeightReceipt kNoReceipt;
      for (Worker* w : hop.to) {
        const v1::PublishResult* r = by_id.count(w->id) ? by_id.at(w->id) : nullptr;
        const std::string error = r == nullptr
                                      ? "the relaying worker " + hop.from->id + " did not report it"
                                  : r->ok() ? ""
                                            : r->error() + " (relayed by " + hop.from->id + ")";
        GYRE_RETURN_IF_ERROR(Settle(w, version, error, r ? r->receipt() : kNoReceipt, sent));
        if (w->version == version && !pool_->IsDead(w->id)) received.push_back(w);
      }
    }
    holders.erase(std::remove_if(holders.begin(), holders.end(),
                                 [&](Worker* w) { return failed_holders.count(w) > 0; }),
                  holders.end());
    holders.insert(holders.end(), received.begin(), received.end());
  }
  return Status::Ok();
}

Status WeightPublisher::PublishCudaIpc(int64_t version, const std::vector<Worker*>& rollouts) {
  const double timeout = cfg_.cluster.weight_sync_timeout_s;
  // 1. The trainer writes the version into its GPU buffer and answers with the buffer's handle.
  v1::PublishWeightsRequest req;
  req.set_version(version);
  req.set_timeout_s(timeout);
  req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
  req.set_transport("cuda_ipc");
  v1::PublishWeightsResponse resp;
  GYRE_RETURN_IF_ERROR(SettleSource(SendFromSource(req, timeout + 10, &resp)));
  // 2. Every rollout worker copies it device-to-device, concurrently, and checks each bucket.
  v1::ReceiveWeightsRequest base;
  base.set_transport("cuda_ipc");
  base.set_timeout_s(timeout);
  base.set_ipc_handle(resp.ipc_handle());
  base.set_version(version);
  *base.mutable_manifest() = resp.manifest();
  base.set_total_bytes(resp.total_bytes());
  base.set_bucket_bytes(resp.bucket_bytes());
  *base.mutable_sent_crc32() = resp.bucket_crc32();
  std::vector<v1::WeightReceipt> receipts(rollouts.size());
  std::vector<std::future<Status>> pending;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    pending.push_back(
        std::async(std::launch::async, [this, w = rollouts[i], &base, &receipts, i, timeout] {
          return pool_->Invoke(w->id, timeout + 10, [&](const rpc::Call& c) {
            return w->rollout->ReceiveWeights(c, base, &receipts[i]);
          });
        }));
  }
  std::vector<Status> results;
  for (auto& f : pending) results.push_back(f.get());
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const std::string error = results[i].ok() ? "" : results[i].WithContext("receive").ToString();
    GYRE_RETURN_IF_ERROR(Settle(rollouts[i], version, error, receipts[i], resp.bucket_crc32()));
  }
  GYRE_LOG_DEBUG("v{} over cuda_ipc: trainer side {:.3f} s", version, resp.seconds());
  return Status::Ok();
}

Status WeightPublisher::PublishGroups(int64_t version, const std::vector<Worker*>& rollouts) {
  const double timeout = cfg_.cluster.weight_sync_timeout_s;
  const std::string transport = cfg_.cluster.weight_transport;
  v1::PublishWeightsRequest req;
  req.set_version(version);
  req.set_timeout_s(timeout);
  req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
  req.set_transport(transport);
  req.set_store_address(store_address_);
  req.set_bind_host(SourceHost());
  req.set_publish_id(++publish_ids_);
  // A tensor-parallel rollout worker's ranks each take their slices from the trainer (gloo).
  if (transport == "gloo" && cfg_.rollout.tensor_parallel > 1) {
    req.set_receiver_tensor_parallel(cfg_.rollout.tensor_parallel);
  }
  // Each rollout worker is asked to receive at the same time as the trainer publishes.
  std::vector<v1::ReceiveWeightsRequest> receive(rollouts.size());
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const Worker* w = rollouts[i];
    const std::string group = WeightGroup(*w);
    req.add_rollout_ids(w->id);
    req.add_rollout_addresses(w->address);
    req.add_groups(group);
    receive[i].set_transport(transport);
    receive[i].set_store_address(store_address_);
    receive[i].set_group(group);
    receive[i].set_timeout_s(timeout);
    receive[i].set_bind_host(HostOf(w->address));
    receive[i].set_slices_per_rank(req.receiver_tensor_parallel() > 1);
  }
  // A receiver that fails or dies has its transfer ended on the trainer at once.
  TransferWatch watch(
      pool_, rollouts,
      [this, id = req.publish_id()](const std::vector<std::string>& ids, const std::string& why) {
        AbortAtSource(id, ids, why);
      });
  // The receivers' cancellations, so that a failed publish ends them at once.
  std::vector<std::unique_ptr<rpc::Cancellation>> cancels(rollouts.size());
  std::vector<v1::WeightReceipt> receipts(rollouts.size());
  std::vector<std::future<Status>> pending;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    cancels[i] = std::make_unique<rpc::Cancellation>();
    pending.push_back(std::async(std::launch::async, [this, w = rollouts[i], &receive, &receipts,
                                                      &cancels, &watch, i, timeout] {
      Status s = pool_->Invoke(w->id, timeout + 10, cancels[i].get(), [&](const rpc::Call& c) {
        return w->rollout->ReceiveWeights(c, receive[i], &receipts[i]);
      });
      if (!s.ok()) watch.Failed(i, s.ToString());
      return s;
    }));
  }
  v1::PublishWeightsResponse resp;
  const Status source_status = SendFromSource(req, timeout + 10, &resp);
  if (!source_status.ok()) {
    for (auto& c : cancels) c->Cancel();
  }
  std::vector<Status> results;
  for (auto& f : pending) results.push_back(f.get());
  watch.Stop();
  GYRE_RETURN_IF_ERROR(SettleSource(source_status));
  std::map<std::string, const v1::PublishResult*> sent;
  for (const auto& pr : resp.results()) sent[pr.rollout_id()] = &pr;
  static const google::protobuf::RepeatedField<uint32_t> kNothingSent;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    Worker* w = rollouts[i];
    const v1::PublishResult* pr = sent.count(w->id) ? sent.at(w->id) : nullptr;
    std::string error;
    if (pr == nullptr || !pr->ok()) {
      error = pr ? pr->error() : "the trainer did not report it";
    } else if (!results[i].ok()) {
      error = results[i].WithContext("receive").ToString();
    }
    GYRE_RETURN_IF_ERROR(
        Settle(w, version, error, receipts[i], pr ? pr->sent_crc32() : kNothingSent));
  }
  return Status::Ok();
}

}  // namespace gyre::controller
