#pragma once
// Fakes of the controller's worker clients (rpc/clients.h). Each fake records its calls and
// lets a test decide replies (a handler per method, or the default below) and delays; a delayed
// call ends early with kAborted when the controller cancels it, as a gRPC call would.
// FakeCluster plays the workers' side of a job: it registers them with a real
// ControllerService (what a worker process does over gRPC) and hands the WorkerPool clients
// that forward to the test's fakes.
//
// Defaults: Generate finishes every group with n samples of kFakeResponseLen tokens at the
// fake's `version`; ReceiveWeights acknowledges the request's version with kFakeCrcs (or the
// request's sent_crc32 when it has them); TrainStep answers expected_version + 1 and
// {"loss": 0.5}; PublishWeights reports every rollout id as sent with kFakeCrcs.
//
// Thread-safe: handlers run on the caller's thread, under no lock of the fake.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller/controller_service.h"
#include "controller/worker_pool.h"
#include "rpc/clients.h"

namespace gyre::testing {

inline const std::vector<uint32_t> kFakeCrcs = {11, 22, 33};
constexpr int kFakeResponseLen = 3;

// Appends one successful PublishResult per id of `ids` for `version`, sent with `crcs`; the
// receipt holds received(id, c) for each sent checksum c (by default c itself).
inline void AddFakeResults(
    const google::protobuf::RepeatedPtrField<std::string>& ids, int64_t version,
    const std::vector<uint32_t>& crcs, v1::PublishWeightsResponse* resp,
    const std::function<uint32_t(const std::string&, uint32_t)>& received = nullptr) {
  for (const auto& id : ids) {
    v1::PublishResult* r = resp->add_results();
    r->set_rollout_id(id);
    r->set_ok(true);
    r->mutable_receipt()->set_version(version);
    for (uint32_t c : crcs) {
      r->add_sent_crc32(c);
      r->mutable_receipt()->add_bucket_crc32(received ? received(id, c) : c);
    }
  }
}

// Waits `seconds`, or less when the call is cancelled (then returns kAborted, as gRPC's
// CANCELLED maps), or past its deadline (kDeadlineExceeded).
inline Status FakeWait(const rpc::Call& call, double seconds,
                       const std::function<bool()>& done = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    if (call.cancel && call.cancel->cancelled()) return Aborted("Cancelled");
    if (done && done()) return Status::Ok();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t >= call.timeout_s) return DeadlineExceeded("Deadline Exceeded");
    if (t >= seconds) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The samples a rollout engine would return for `g` (all finished) at policy `version`.
inline std::vector<v1::Sample> FakeSamples(const v1::PromptGroup& g, int64_t version) {
  std::vector<v1::Sample> out;
  for (int i = 0; i < g.n(); ++i) {
    v1::Sample s;
    s.set_sample_id(g.first_sample_id() + static_cast<uint64_t>(i));
    s.set_group_id(g.group_id());
    *s.mutable_prompt_ids() = g.prompt_ids();
    for (int t = 0; t < kFakeResponseLen; ++t) {
      s.add_response_ids(100 + t);
      s.add_logprobs(-0.5f);
      s.add_versions(version);
      s.add_kept_mass(1.0f);
      s.add_loss_mask(1.0f);
    }
    s.set_finish_reason(v1::FINISH_REASON_STOP);
    s.set_seed(g.seed() + static_cast<uint64_t>(i));
    out.push_back(std::move(s));
  }
  return out;
}

// The requests a fake received, in order; thread-safe.
template <typename T>
class CallLog {
 public:
  void Add(const T& x) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(x);
  }
  std::vector<T> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<T> calls_;
};

class FakeRollout final : public rpc::RolloutClient {
 public:
  std::function<Status(const v1::GenerateRequest&, v1::GenerateResponse*)> on_generate;
  std::function<Status(const v1::ReceiveWeightsRequest&, v1::WeightReceipt*)> on_receive;
  std::function<Status(const v1::RelayWeightsRequest&, v1::PublishWeightsResponse*)> on_relay;
  std::function<Status(const v1::PreemptRequest&, v1::PreemptResponse*)> on_preempt;
  std::atomic<double> relay_delay_s{0};
  std::atomic<double> preempt_delay_s{0};
  std::atomic<double> generate_delay_s{0};
  std::atomic<double> stream_group_delay_s{0};  // GenerateStream: between two groups
  std::atomic<int> stream_fail_after{-1};       // GenerateStream: fail after this many groups
  std::atomic<double> receive_delay_s{0};
  std::atomic<int64_t> version{0};  // the version its default samples carry

  Status Generate(const rpc::Call& call, const v1::GenerateRequest& req,
                  v1::GenerateResponse* resp) override {
    return GenerateUntil(call, req, resp, nullptr);
  }

  // Generate, whose delay ends early once `gone()` says there is nothing left to generate.
  Status GenerateUntil(const rpc::Call& call, const v1::GenerateRequest& req,
                       v1::GenerateResponse* resp, const std::function<bool()>& gone) {
    generate_calls_.Add(req);
    GYRE_RETURN_IF_ERROR(FakeWait(call, generate_delay_s.load(), gone));
    if (on_generate) return on_generate(req, resp);
    for (const auto& g : req.groups()) {
      for (auto& s : FakeSamples(g, version.load())) {
        resp->set_generated_tokens(resp->generated_tokens() + s.response_ids_size());
        *resp->add_samples() = std::move(s);
      }
    }
    for (const auto& r : req.resume()) *resp->add_samples() = r;
    resp->set_policy_version(version.load());
    return Status::Ok();
  }

  // Streams what Generate would return, one unit per message in request order (each group,
  // then each resumed sample, finished to kFakeResponseLen tokens at `version`): the first
  // after generate_delay_s (or whatever on_generate decides), each later one
  // stream_group_delay_s after the previous. A failure from on_generate or the delay ends the
  // stream before any unit; with stream_fail_after = k >= 0 the stream fails (Unavailable)
  // after k units when the request has more, once. Until its unit is sent a sample can be
  // taken by Preempt (then its unit is sent without it, or not at all when none is left); a
  // stream whose samples were all taken ends at once, as a real worker's does.
  Status GenerateStream(const rpc::Call& call, const v1::GenerateRequest& req,
                        const std::function<void(v1::GenerateResponse&)>& on_part) override {
    stream_calls_.Add(req);
    // Streams running at once, and the most seen. A stream stops counting when its last sample
    // is sent (End), not when the handler returns: its worker then holds no work of it, and the
    // scheduler may already have sent the next call.
    struct Count {
      explicit Count(FakeRollout* f) : f(f) {
        const int now = ++f->streams_now_;
        int seen = f->streams_max_.load();
        while (now > seen && !f->streams_max_.compare_exchange_weak(seen, now)) {
        }
      }
      void End() {
        if (!ended) --f->streams_now_;
        ended = true;
      }
      ~Count() { End(); }
      FakeRollout* f;
      bool ended = false;
    } count(this);
    // Each sample's state before its first token is streamed, for Preempt.
    std::vector<std::vector<uint64_t>> units;
    const uint64_t serial = ++stream_serial_;  // which stream owns a live sample
    {
      std::lock_guard<std::mutex> lock(preempt_mu_);
      for (const auto& g : req.groups()) {
        units.emplace_back();
        for (auto& smp : FakeSamples(g, version.load())) {
          smp.mutable_response_ids()->Truncate(1);
          smp.mutable_logprobs()->Truncate(1);
          smp.mutable_versions()->Truncate(1);
          smp.mutable_kept_mass()->Truncate(1);
          smp.mutable_loss_mask()->Truncate(1);
          smp.set_finish_reason(v1::FINISH_REASON_ABORT);
          const uint64_t id = smp.sample_id();
          units.back().push_back(id);
          live_[id] = {serial, std::move(smp)};
        }
      }
      for (const auto& r : req.resume()) {
        units.push_back({r.sample_id()});
        live_[r.sample_id()] = {serial, r};
      }
    }
    // Whatever is still live leaves the preemptable set when the stream ends (a sample taken
    // from it may be live in a later stream by then).
    struct Forget {
      ~Forget() {
        std::lock_guard<std::mutex> lock(f->preempt_mu_);
        for (const auto& u : *units) {
          for (uint64_t id : u) {
            auto it = f->live_.find(id);
            if (it != f->live_.end() && it->second.first == serial) f->live_.erase(it);
          }
        }
      }
      FakeRollout* f;
      const std::vector<std::vector<uint64_t>>* units;
      uint64_t serial;
    } forget{this, &units, serial};
    auto gone = [&] {
      std::lock_guard<std::mutex> lock(preempt_mu_);
      for (const auto& u : units) {
        for (uint64_t id : u) {
          auto it = live_.find(id);
          if (it != live_.end() && it->second.first == serial) return false;
        }
      }
      return true;
    };
    v1::GenerateResponse all;
    GYRE_RETURN_IF_ERROR(GenerateUntil(call, req, &all, gone));
    std::map<uint64_t, v1::Sample> by_id;
    for (const auto& r : req.resume()) {  // what on_generate leaves out is continued here
      bool returned = false;
      for (const auto& smp : all.samples()) returned = returned || smp.sample_id() == r.sample_id();
      if (!returned) *all.add_samples() = r;
    }
    for (auto& smp : *all.mutable_samples()) {
      if (smp.finish_reason() == v1::FINISH_REASON_ABORT) {  // a resumed sample: finish it
        while (smp.response_ids_size() < kFakeResponseLen) {
          smp.add_response_ids(100 + smp.response_ids_size());
          smp.add_logprobs(-0.5f);
          smp.add_versions(version.load());
          smp.add_kept_mass(1.0f);
          smp.add_loss_mask(1.0f);
        }
        smp.set_finish_reason(v1::FINISH_REASON_STOP);
      }
      const uint64_t id = smp.sample_id();
      by_id[id] = std::move(smp);
    }
    bool first = true;
    int sent = 0;
    for (const auto& unit : units) {
      if (!first) GYRE_RETURN_IF_ERROR(FakeWait(call, stream_group_delay_s.load(), gone));
      first = false;
      if (sent == stream_fail_after.load()) {
        stream_fail_after = -1;  // once
        return Unavailable("Socket closed");
      }
      ++sent;
      v1::GenerateResponse part;
      {
        std::lock_guard<std::mutex> lock(preempt_mu_);
        for (uint64_t id : unit) {
          auto l = live_.find(id);
          if (l == live_.end() || l->second.first != serial) continue;  // preempted
          live_.erase(l);
          auto it = by_id.find(id);
          if (it != by_id.end()) *part.add_samples() = std::move(it->second);
        }
      }
      if (part.samples_size() == 0) continue;
      part.set_policy_version(all.policy_version());
      part.set_generated_tokens(part.samples_size() * int64_t{kFakeResponseLen});
      if (gone()) count.End();  // the last unit of this stream
      on_part(part);
    }
    return Status::Ok();
  }

  // Takes the requested samples of running streams whose unit has not been sent yet.
  Status Preempt(const rpc::Call& call, const v1::PreemptRequest& req,
                 v1::PreemptResponse* resp) override {
    preempt_calls_.Add(req);
    GYRE_RETURN_IF_ERROR(FakeWait(call, preempt_delay_s.load()));
    if (on_preempt) return on_preempt(req, resp);
    std::lock_guard<std::mutex> lock(preempt_mu_);
    for (uint64_t id : req.sample_ids()) {
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      *resp->add_unfinished() = std::move(it->second.second);
      live_.erase(it);
    }
    return Status::Ok();
  }

  Status ReceiveWeights(const rpc::Call& call, const v1::ReceiveWeightsRequest& req,
                        v1::WeightReceipt* receipt) override {
    receive_calls_.Add(req);
    GYRE_RETURN_IF_ERROR(FakeWait(call, receive_delay_s.load()));
    if (on_receive) return on_receive(req, receipt);
    receipt->set_version(req.version());
    if (req.sent_crc32_size() > 0) {
      *receipt->mutable_bucket_crc32() = req.sent_crc32();
    } else {
      for (uint32_t c : kFakeCrcs) receipt->add_bucket_crc32(c);
    }
    return Status::Ok();
  }

  // By default every target receives the version with kFakeCrcs, as from FakeTrainer.
  Status RelayWeights(const rpc::Call& call, const v1::RelayWeightsRequest& req,
                      v1::PublishWeightsResponse* resp) override {
    relay_calls_.Add(req);
    GYRE_RETURN_IF_ERROR(FakeWait(call, relay_delay_s.load()));
    if (on_relay) return on_relay(req, resp);
    AddFakeResults(req.rollout_ids(), req.version(), kFakeCrcs, resp);
    return Status::Ok();
  }

  Status Stop(const rpc::Call&, const v1::StopRequest&) override {
    ++stops_;
    return Status::Ok();
  }

  // Generate calls, GenerateStream's included (it runs Generate first).
  std::vector<v1::GenerateRequest> generate_calls() const { return generate_calls_.Get(); }
  std::vector<v1::GenerateRequest> stream_calls() const { return stream_calls_.Get(); }
  std::vector<v1::ReceiveWeightsRequest> receive_calls() const { return receive_calls_.Get(); }
  std::vector<v1::RelayWeightsRequest> relay_calls() const { return relay_calls_.Get(); }
  std::vector<v1::PreemptRequest> preempt_calls() const { return preempt_calls_.Get(); }
  int stops() const { return stops_.load(); }
  // The most GenerateStream calls that ran at the same time (holding samples not yet sent).
  int max_concurrent_streams() const { return streams_max_.load(); }

 private:
  std::atomic<int> streams_now_{0}, streams_max_{0};
  CallLog<v1::GenerateRequest> generate_calls_;
  CallLog<v1::GenerateRequest> stream_calls_;
  CallLog<v1::ReceiveWeightsRequest> receive_calls_;
  CallLog<v1::RelayWeightsRequest> relay_calls_;
  CallLog<v1::PreemptRequest> preempt_calls_;
  std::mutex preempt_mu_;
  // Samples of running streams not sent yet: id -> (the stream's serial, state to hand over).
  std::map<uint64_t, std::pair<uint64_t, v1::Sample>> live_;
  std::atomic<uint64_t> stream_serial_{0};
  std::atomic<int> stops_{0};
};

class FakeTrainer final : public rpc::TrainerClient {
 public:
  std::function<Status(const v1::TrainStepRequest&, v1::TrainStepResponse*)> on_train_step;
  std::function<Status(const v1::PublishWeightsRequest&, v1::PublishWeightsResponse*)> on_publish;
  std::function<Status(const v1::JoinGroupRequest&)> on_join;
  std::function<Status(const v1::AbortWeightTransferRequest&, v1::AbortWeightTransferResponse*)>
      on_abort;
  std::atomic<double> train_delay_s{0};
  std::atomic<double> publish_delay_s{0};
  std::atomic<int64_t> saved_version{0};  // what SaveState and LoadState report

  Status HostGroupStore(const rpc::Call&, v1::HostGroupStoreResponse* resp) override {
    resp->set_store_address("127.0.0.1:1");
    return Status::Ok();
  }
  Status JoinGroup(const rpc::Call&, const v1::JoinGroupRequest& req,
                   v1::JoinGroupResponse*) override {
    join_calls_.Add(req);
    return on_join ? on_join(req) : Status::Ok();
  }
  Status TrainStep(const rpc::Call& call, const v1::TrainStepRequest& req,
                   v1::TrainStepResponse* resp) override {
    train_calls_.Add(req);
    GYRE_RETURN_IF_ERROR(FakeWait(call, train_delay_s.load()));
    if (on_train_step) return on_train_step(req, resp);
    resp->set_policy_version(req.expected_version() + 1);
    (*resp->mutable_metrics())["loss"] = 0.5;
    return Status::Ok();
  }
  // A KL of 0.25 per response token of each sample.
  Status SequenceKl(const rpc::Call&, const v1::SequenceKlRequest& req,
                    v1::SequenceKlResponse* resp) override {
    for (const auto& s : req.samples()) resp->add_kl(0.25 * s.response_ids_size());
    return Status::Ok();
  }
  Status PublishWeights(const rpc::Call& call, const v1::PublishWeightsRequest& req,
                        v1::PublishWeightsResponse* resp) override {
    publish_calls_.Add(req);
    GYRE_RETURN_IF_ERROR(FakeWait(call, publish_delay_s.load()));
    if (on_publish) return on_publish(req, resp);
    for (uint32_t c : kFakeCrcs) resp->add_bucket_crc32(c);
    AddFakeResults(req.rollout_ids(), req.version(), kFakeCrcs, resp);
    return Status::Ok();
  }
  Status AbortWeightTransfer(const rpc::Call&, const v1::AbortWeightTransferRequest& req,
                             v1::AbortWeightTransferResponse* resp) override {
    abort_calls_.Add(req);
    if (on_abort) return on_abort(req, resp);
    return Status::Ok();
  }
  Status Save(const rpc::Call&, const v1::SaveRequest& req, v1::SaveResponse* resp) override {
    resp->set_path(req.directory());
    resp->set_policy_version(saved_version.load());
    return Status::Ok();
  }
  Status SaveState(const rpc::Call&, const v1::SaveStateRequest&,
                   v1::SaveStateResponse* resp) override {
    resp->set_policy_version(saved_version.load());
    return Status::Ok();
  }
  Status LoadState(const rpc::Call&, const v1::LoadStateRequest&,
                   v1::LoadStateResponse* resp) override {
    resp->set_policy_version(saved_version.load());
    return Status::Ok();
  }
  Status Stop(const rpc::Call&, const v1::StopRequest&) override { return Status::Ok(); }

  std::vector<v1::TrainStepRequest> train_calls() const { return train_calls_.Get(); }
  std::vector<v1::PublishWeightsRequest> publish_calls() const { return publish_calls_.Get(); }
  std::vector<v1::JoinGroupRequest> join_calls() const { return join_calls_.Get(); }
  std::vector<v1::AbortWeightTransferRequest> abort_calls() const { return abort_calls_.Get(); }

 private:
  CallLog<v1::TrainStepRequest> train_calls_;
  CallLog<v1::AbortWeightTransferRequest> abort_calls_;
  CallLog<v1::PublishWeightsRequest> publish_calls_;
  CallLog<v1::JoinGroupRequest> join_calls_;
};

// A client that forwards to a shared fake, so the test keeps the fake after the pool owns the
// client.
class ForwardingRollout final : public rpc::RolloutClient {
 public:
  explicit ForwardingRollout(std::shared_ptr<FakeRollout> f) : f_(std::move(f)) {}
  Status Generate(const rpc::Call& c, const v1::GenerateRequest& req,
                  v1::GenerateResponse* resp) override {
    return f_->Generate(c, req, resp);
  }
  Status GenerateStream(const rpc::Call& c, const v1::GenerateRequest& req,
                        const std::function<void(v1::GenerateResponse&)>& on_part) override {
    return f_->GenerateStream(c, req, on_part);
  }
  Status ReceiveWeights(const rpc::Call& c, const v1::ReceiveWeightsRequest& req,
                        v1::WeightReceipt* receipt) override {
    return f_->ReceiveWeights(c, req, receipt);
  }
  Status RelayWeights(const rpc::Call& c, const v1::RelayWeightsRequest& req,
                      v1::PublishWeightsResponse* resp) override {
    return f_->RelayWeights(c, req, resp);
  }
  Status Preempt(const rpc::Call& c, const v1::PreemptRequest& req,
                 v1::PreemptResponse* resp) override {
    return f_->Preempt(c, req, resp);
  }
  Status Stop(const rpc::Call& c, const v1::StopRequest& req) override { return f_->Stop(c, req); }

 private:
  std::shared_ptr<FakeRollout> f_;
};

class ForwardingTrainer final : public rpc::TrainerClient {
 public:
  explicit ForwardingTrainer(std::shared_ptr<FakeTrainer> f) : f_(std::move(f)) {}
  Status HostGroupStore(const rpc::Call& c, v1::HostGroupStoreResponse* resp) override {
    return f_->HostGroupStore(c, resp);
  }
  Status JoinGroup(const rpc::Call& c, const v1::JoinGroupRequest& req,
                   v1::JoinGroupResponse* resp) override {
    return f_->JoinGroup(c, req, resp);
  }
  Status TrainStep(const rpc::Call& c, const v1::TrainStepRequest& req,
                   v1::TrainStepResponse* resp) override {
    return f_->TrainStep(c, req, resp);
  }
  Status SequenceKl(const rpc::Call& c, const v1::SequenceKlRequest& req,
                    v1::SequenceKlResponse* resp) override {
    return f_->SequenceKl(c, req, resp);
  }
  Status PublishWeights(const rpc::Call& c, const v1::PublishWeightsRequest& req,
                        v1::PublishWeightsResponse* resp) override {
    return f_->PublishWeights(c, req, resp);
  }
  Status AbortWeightTransfer(const rpc::Call& c, const v1::AbortWeightTransferRequest& req,
                             v1::AbortWeightTransferResponse* resp) override {
    return f_->AbortWeightTransfer(c, req, resp);
  }
  Status Save(const rpc::Call& c, const v1::SaveRequest& req, v1::SaveResponse* resp) override {
    return f_->Save(c, req, resp);
  }
  Status SaveState(const rpc::Call& c, const v1::SaveStateRequest& req,
                   v1::SaveStateResponse* resp) override {
    return f_->SaveState(c, req, resp);
  }
  Status LoadState(const rpc::Call& c, const v1::LoadStateRequest& req,
                   v1::LoadStateResponse* resp) override {
    return f_->LoadState(c, req, resp);
  }
  Status Stop(const rpc::Call& c, const v1::StopRequest& req) override { return f_->Stop(c, req); }

 private:
  std::shared_ptr<FakeTrainer> f_;
};

// The workers of a job in external mode, played by fakes: `rollouts` FakeRollouts and
// `trainers` FakeTrainers at addresses "fake-rollout-<i>:1" / "fake-trainer-<i>:1".
class FakeCluster {
 public:
  FakeCluster(int rollouts, int trainers) {
    for (int i = 0; i < rollouts; ++i) rollout.push_back(std::make_shared<FakeRollout>());
    for (int i = 0; i < trainers; ++i) trainer.push_back(std::make_shared<FakeTrainer>());
  }

  // Clients that forward to the fakes (the fakes outlive the clients' owner or not: shared).
  rpc::ClientFactory Factory() {
    rpc::ClientFactory f;
    f.rollout = [this](const std::string& address) -> std::unique_ptr<rpc::RolloutClient> {
      return std::make_unique<ForwardingRollout>(rollout.at(IndexOf(address)));
    };
    f.trainer = [this](const std::string& address) -> std::unique_ptr<rpc::TrainerClient> {
      return std::make_unique<ForwardingTrainer>(trainer.at(IndexOf(address)));
    };
    return f;
  }

  // What worker processes do at start: register and send a first heartbeat.
  static Status Register(controller::ControllerService* service, v1::WorkerRole role, int index) {
    const std::string name = role == v1::WORKER_ROLE_ROLLOUT ? "rollout" : "trainer";
    v1::RegisterRequest req;
    req.set_role(role);
    req.set_index(index);
    req.set_address("fake-" + name + "-" + std::to_string(index) + ":1");
    req.set_pid(1000 + index);
    v1::RegisterResponse resp;
    grpc::Status s = service->Register(nullptr, &req, &resp);
    if (!s.ok()) return Internal("register: " + s.error_message());
    return Heartbeat(service, resp.worker_id());
  }
  static Status Heartbeat(controller::ControllerService* service, const std::string& id) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(id);
    v1::HeartbeatResponse hr;
    grpc::Status s = service->Heartbeat(nullptr, &hb, &hr);
    return s.ok() ? Status::Ok() : Internal("heartbeat: " + s.error_message());
  }
  // Registers every worker of the cluster.
  Status RegisterAll(controller::ControllerService* service) const {
    for (size_t i = 0; i < trainer.size(); ++i) {
      GYRE_RETURN_IF_ERROR(Register(service, v1::WORKER_ROLE_TRAINER, static_cast<int>(i)));
    }
    for (size_t i = 0; i < rollout.size(); ++i) {
      GYRE_RETURN_IF_ERROR(Register(service, v1::WORKER_ROLE_ROLLOUT, static_cast<int>(i)));
    }
    return Status::Ok();
  }

  std::vector<std::shared_ptr<FakeRollout>> rollout;
  std::vector<std::shared_ptr<FakeTrainer>> trainer;

 private:
  static size_t IndexOf(const std::string& address) {
    const size_t dash = address.rfind('-'), colon = address.rfind(':');
    return std::stoul(address.substr(dash + 1, colon - dash - 1));
  }
};

}  // namespace gyre::testing
