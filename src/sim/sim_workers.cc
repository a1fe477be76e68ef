#include "sim/sim_workers.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <set>
#include <vector>

#include "common/crc32.h"
#include "common/file_util.h"
#include "rpc/rpc_util.h"

namespace gyre::sim {
namespace {

grpc::Status Refused(grpc::StatusCode code, const std::string& why) {
  return grpc::Status(code, why);
}

// The token payload a simulated trainer sends for `version` (what the receipts check).
std::string Payload(int64_t version) {
  std::string bytes(256, '\0');
  uint64_t x = static_cast<uint64_t>(version) * 0x9e3779b97f4a7c15ULL + 1;
  for (char& c : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x & 0xff);
  }
  return bytes;
}

// Spends the sender's uplink time for one copy per receiver (model_gb each), then streams the
// token payload of `version` to every receiver at once and records their receipts: a simulated
// trainer's publish, or a simulated rollout worker's relay.
grpc::Status SendSimulated(const CostModel& cost, grpc::ServerContext* ctx, int64_t version,
                           const google::protobuf::RepeatedPtrField<std::string>& addresses,
                           const google::protobuf::RepeatedPtrField<std::string>& ids,
                           double timeout_s, v1::PublishWeightsResponse* resp) {
  const int n = addresses.size();
  if (!SleepUnless(cost.model_gb * n / cost.publish_gb_per_s * cost.time_scale,
                   [ctx] { return ctx->IsCancelled(); })) {
    return Refused(grpc::StatusCode::CANCELLED, "weight transfer cancelled by the caller");
  }
  const std::string payload = Payload(version);
  const uint32_t crc = Crc32(payload.data(), payload.size());
  const double timeout = timeout_s > 0 ? timeout_s : 60;
  std::vector<std::future<v1::PublishResult>> sends;
  for (int i = 0; i < n; ++i) {
    sends.push_back(std::async(std::launch::async, [&, i] {
      v1::PublishResult r;
      r.set_rollout_id(ids.Get(i));
      r.add_sent_crc32(crc);
      auto stub = v1::Rollout::NewStub(rpc::MakeChannel(addresses.Get(i)));
      grpc::ClientContext c;
      rpc::SetDeadline(&c, timeout);
      auto writer = stub->LoadWeights(&c, r.mutable_receipt());
      v1::WeightChunk chunk;
      chunk.set_version(version);
      chunk.set_total_bytes(static_cast<uint64_t>(cost.model_gb * 1e9));
      chunk.set_num_buckets(1);
      chunk.set_data(payload);
      chunk.set_crc32(crc);
      writer->Write(chunk);
      writer->WritesDone();
      grpc::Status s = writer->Finish();
      r.set_ok(s.ok());
      if (!s.ok()) r.set_error(s.error_message());
      return r;
    }));
  }
  for (auto& f : sends) *resp->add_results() = f.get();
  return grpc::Status::OK;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SimRollout

SimRollout::SimRollout(CostModel cost, std::function<void(const std::string&)> on_stop)
    : cost_(cost), on_stop_(std::move(on_stop)) {
  engine_ = std::thread([this] { EngineLoop(); });
}

SimRollout::~SimRollout() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);  // the engine is waiting or sees stop_ next
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  engine_.join();
}

grpc::Status SimRollout::Join(const v1::GenerateRequest& req, bool streaming, Call* call,
                              uint64_t* id) {
  const int64_t version = version_.load();
  if (version < req.min_policy_version()) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   "this worker holds policy version " + std::to_string(version) +
                       ", the request needs at least " + std::to_string(req.min_policy_version()));
  }
  if (req.target_finished_groups() != 0 || (!streaming && req.resume_size() > 0)) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                   "simulated rollout workers continue partial rollouts (resume) only in "
                   "GenerateStream, and do not stop at a target");
  }
  for (const auto& g : req.groups()) {
    if (g.n() < 1 || g.prompt_ids_size() < 1) {
      return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                     "group " + std::to_string(g.group_id()) + " needs n >= 1 and a prompt");
    }
  }
  for (const auto& r : req.resume()) {
    if (r.prompt_ids_size() < 1 || r.versions_size() != r.response_ids_size()) {
      return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                     "resumed sample " + std::to_string(r.sample_id()) +
                         " needs a prompt and one version per response token");
    }
  }
  call->req = &req;
  call->groups_left = req.groups_size() + req.resume_size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    *id = next_call_++;
    calls_[*id] = call;
    for (int u = 0; u < call->groups_left; ++u) waiting_.emplace_back(*id, u);
  }
  work_cv_.notify_all();
  return grpc::Status::OK;
}

void SimRollout::Leave(uint64_t id) {  // under mu_
  calls_.erase(id);
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [id](const auto& w) { return w.first == id; }),
                 waiting_.end());
  running_.erase(
      std::remove_if(running_.begin(), running_.end(), [id](const Seq& s) { return s.call == id; }),
      running_.end());
}

grpc::Status SimRollout::Next(grpc::ServerContext* ctx, uint64_t id, Call* call,
                              std::vector<std::vector<v1::Sample>>* groups, int64_t* tokens,
                              bool* more) {
  std::unique_lock<std::mutex> lock(mu_);
  while (call->outbox.empty() && call->groups_left > 0) {
    if ((ctx != nullptr && ctx->IsCancelled()) || stop_) {
      Leave(id);
      return Refused(grpc::StatusCode::CANCELLED, "generation cancelled by the caller");
    }
    done_cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  groups->swap(call->outbox);
  call->outbox.clear();
  *tokens = call->tokens;
  call->tokens = 0;
  *more = call->groups_left > 0;
  if (!*more) calls_.erase(id);
  return grpc::Status::OK;
}

v1::Sample SimRollout::SampleOf(const Seq& seq, const v1::GenerateRequest& req,
                                bool finished) const {
  const int64_t max_new = std::max<int64_t>(1, req.sampling().max_new_tokens());
  const int32_t stop_id =
      req.sampling().stop_token_ids_size() > 0 ? req.sampling().stop_token_ids(0) : -1;
  v1::Sample s;
  if (seq.group < req.groups_size()) {
    const auto& g = req.groups(seq.group);
    s.set_sample_id(g.first_sample_id() + static_cast<uint64_t>(seq.index));
    s.set_group_id(g.group_id());
    *s.mutable_prompt_ids() = g.prompt_ids();
    s.set_seed(g.seed() + static_cast<uint64_t>(seq.index));
  } else {
    const auto& r = req.resume(seq.group - req.groups_size());
    s.set_sample_id(r.sample_id());
    s.set_group_id(r.group_id());
    *s.mutable_prompt_ids() = r.prompt_ids();
    s.set_seed(r.seed());
  }
  const int64_t tokens = finished ? seq.length : seq.done;
  const bool stopped = finished && seq.length < max_new && stop_id >= 0;
  for (int64_t t = 0; t < tokens; ++t) {
    s.add_response_ids(stopped && t + 1 == tokens ? stop_id : s.prompt_ids(0));
    s.add_logprobs(-1.0f);
    s.add_kept_mass(1.0f);
    s.add_loss_mask(1.0f);
  }
  for (const auto& [v, count] : seq.versions) {
    for (int64_t t = 0; t < count; ++t) s.add_versions(v);
  }
  s.set_finish_reason(!finished ? v1::FINISH_REASON_ABORT
                      : stopped ? v1::FINISH_REASON_STOP
                                : v1::FINISH_REASON_LENGTH);
  s.set_kv_version(seq.versions.empty() ? version_.load() : seq.versions.front().first);
  return s;
}

int SimRollout::Call::Expected(int unit) const {
  const int n = unit < req->groups_size() ? req->groups(unit).n() : 1;
  const auto t = taken.find(unit);
  return n - (t == taken.end() ? 0 : t->second);
}

bool SimRollout::Complete(Call* call, int unit) {
  auto& samples = call->finishing[unit];
  if (static_cast<int>(samples.size()) < call->Expected(unit)) return false;
  std::sort(samples.begin(), samples.end(),
            [](const v1::Sample& a, const v1::Sample& b) { return a.sample_id() < b.sample_id(); });
  if (!samples.empty()) call->outbox.push_back(std::move(samples));
  call->finishing.erase(unit);
  call->taken.erase(unit);
  --call->groups_left;
  return true;
}

grpc::Status SimRollout::Preempt(grpc::ServerContext*, const v1::PreemptRequest* req,
                                 v1::PreemptResponse* resp) {
  const std::set<uint64_t> wanted(req->sample_ids().begin(), req->sample_ids().end());
  bool completed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto take = [&](Call* call, const Seq& seq) {
      *resp->add_unfinished() = SampleOf(seq, *call->req, false);
      ++call->taken[seq.group];
      completed = Complete(call, seq.group) || completed;
    };
    for (auto it = running_.begin(); it != running_.end();) {
      Call* call = calls_.at(it->call);
      const v1::GenerateRequest& r = *call->req;
      const uint64_t sid =
          it->group < r.groups_size()
              ? r.groups(it->group).first_sample_id() + static_cast<uint64_t>(it->index)
              : r.resume(it->group - r.groups_size()).sample_id();
      if (wanted.count(sid) == 0) {
        ++it;
        continue;
      }
      const Seq seq = std::move(*it);
      it = running_.erase(it);
      take(call, seq);
    }
    // Units not admitted yet: a group only whole, a resumed sample as it came.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const auto [cid, unit] = *it;
      Call* call = calls_.at(cid);
      const v1::GenerateRequest& r = *call->req;
      std::vector<Seq> seqs;
      if (unit < r.groups_size()) {
        const auto& g = r.groups(unit);
        for (int i = 0; i < g.n(); ++i) {
          if (wanted.count(g.first_sample_id() + static_cast<uint64_t>(i)) == 0) break;
          Seq seq;
          seq.call = cid;
          seq.group = unit;
          seq.index = i;
          seqs.push_back(std::move(seq));
        }
        if (static_cast<int>(seqs.size()) < g.n()) seqs.clear();
      } else if (wanted.count(r.resume(unit - r.groups_size()).sample_id()) > 0) {
        seqs.push_back(ResumedSeq(cid, unit, r));
      }
      if (seqs.empty()) {
        ++it;
        continue;
      }
      it = waiting_.erase(it);
      for (const Seq& seq : seqs) take(call, seq);
    }
  }
  if (completed) done_cv_.notify_all();
  std::sort(resp->mutable_unfinished()->begin(), resp->mutable_unfinished()->end(),
            [](const v1::Sample& a, const v1::Sample& b) { return a.sample_id() < b.sample_id(); });
  return grpc::Status::OK;
}

SimRollout::Seq SimRollout::ResumedSeq(uint64_t cid, int unit,
                                       const v1::GenerateRequest& req) const {
  const v1::Sample& r = req.resume(unit - req.groups_size());
  Seq seq;
  seq.call = cid;
  seq.group = unit;
  seq.done = r.response_ids_size();
  for (int64_t v : r.versions()) {
    if (seq.versions.empty() || seq.versions.back().first != v) seq.versions.emplace_back(v, 0);
    ++seq.versions.back().second;
  }
  const int64_t max_new = std::max<int64_t>(1, req.sampling().max_new_tokens());
  seq.length = std::max(seq.done + 1, cost_.Length(r.seed(), max_new));
  return seq;
}

void SimRollout::EngineLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (waiting_.empty() && running_.empty()) {
      work_cv_.wait(lock);
      continue;
    }
    // A busy period runs on an absolute schedule: the engine sleeps only when something becomes
    // visible (a group finishes) or 5 ms have built up, until `due` after its start.
    const auto start = std::chrono::steady_clock::now();
    double due = 0, slept_to = 0;
    while (!stop_ && (!waiting_.empty() || !running_.empty())) {
      double seconds = 0;
      // Admit whole groups, oldest call first, while they fit (one always does into an empty
      // batch).
      while (!waiting_.empty()) {
        const auto [cid, gi] = waiting_.front();
        const v1::GenerateRequest& req = *calls_.at(cid)->req;
        if (gi >= req.groups_size()) {  // a resumed sample: its context is prefilled again
          if (!running_.empty() && static_cast<int64_t>(running_.size()) + 1 > cost_.max_running) {
            break;
          }
          Seq seq = ResumedSeq(cid, gi, req);
          const auto& r = req.resume(gi - req.groups_size());
          seconds += static_cast<double>(r.prompt_ids_size() + seq.done) /
                     cost_.prefill_tokens_per_s * cost_.time_scale;
          running_.push_back(std::move(seq));
          waiting_.pop_front();
          continue;
        }
        const auto& g = req.groups(gi);
        if (!running_.empty() &&
            static_cast<int64_t>(running_.size()) + g.n() > cost_.max_running) {
          break;
        }
        seconds += static_cast<double>(g.prompt_ids_size()) / cost_.prefill_tokens_per_s *
                   cost_.time_scale;
        const int64_t max_new = std::max<int64_t>(1, req.sampling().max_new_tokens());
        for (int i = 0; i < g.n(); ++i) {
          Seq seq;
          seq.call = cid;
          seq.group = gi;
          seq.index = i;
          seq.length = cost_.Length(g.seed() + static_cast<uint64_t>(i), max_new);
          running_.push_back(std::move(seq));
        }
        waiting_.pop_front();
      }
      due += seconds + cost_.StepSeconds(static_cast<int64_t>(running_.size()));
      const int64_t now_version = version_.load();
      std::vector<std::pair<uint64_t, int>> finished;  // (call, unit) of units just finished
      for (auto it = running_.begin(); it != running_.end();) {
        Seq& seq = *it;
        Call* call = calls_.at(seq.call);
        ++call->tokens;
        if (seq.versions.empty() || seq.versions.back().first != now_version) {
          seq.versions.emplace_back(now_version, 0);
        }
        ++seq.versions.back().second;
        if (++seq.done < seq.length) {
          ++it;
          continue;
        }
        auto& unit = call->finishing[seq.group];
        unit.push_back(SampleOf(seq, *call->req, true));
        // Only a unit's last sample makes something visible to the caller.
        if (static_cast<int>(unit.size()) == call->Expected(seq.group)) {
          finished.emplace_back(seq.call, seq.group);
        }
        it = running_.erase(it);
      }
      if (finished.empty() && due - slept_to <= 0.005) continue;
      lock.unlock();
      SleepUntilUnless(start, due, [this] { return stop_.load(); });
      lock.lock();
      slept_to = due;
      // Units whose samples have all finished (or been preempted meanwhile) become visible now.
      bool completed = false;
      for (const auto& [cid, unit] : finished) {
        auto it = calls_.find(cid);
        if (it == calls_.end()) continue;  // it left while the engine slept
        if (it->second->finishing.count(unit) > 0) {
          completed = Complete(it->second, unit) || completed;
        }
      }
      if (completed) done_cv_.notify_all();
    }
  }
}

grpc::Status SimRollout::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                  v1::GenerateResponse* resp) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t version = version_.load();
  Call call;
  uint64_t id = 0;
  grpc::Status s = Join(*req, false, &call, &id);
  if (!s.ok()) return s;
  std::map<uint64_t, std::vector<v1::Sample>> by_group;
  int64_t tokens = 0;
  for (bool more = true; more;) {
    std::vector<std::vector<v1::Sample>> groups;
    int64_t t = 0;
    s = Next(ctx, id, &call, &groups, &t, &more);
    if (!s.ok()) return s;
    tokens += t;
    for (auto& samples : groups) by_group[samples.front().group_id()] = std::move(samples);
  }
  for (const auto& g : req->groups()) {  // request order
    for (auto& smp : by_group[g.group_id()]) *resp->add_samples() = std::move(smp);
  }
  resp->set_policy_version(version);
  resp->set_generated_tokens(tokens);
  resp->set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return grpc::Status::OK;
}

grpc::Status SimRollout::GenerateStream(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  auto last = std::chrono::steady_clock::now();
  Call call;
  uint64_t id = 0;
  grpc::Status s = Join(*req, true, &call, &id);
  if (!s.ok()) return s;
  for (bool more = true; more;) {
    std::vector<std::vector<v1::Sample>> groups;
    int64_t tokens = 0;
    s = Next(ctx, id, &call, &groups, &tokens, &more);
    if (!s.ok()) return s;
    for (auto& samples : groups) {
      v1::GenerateResponse part;
      for (auto& smp : samples) *part.add_samples() = std::move(smp);
      const auto now = std::chrono::steady_clock::now();
      part.set_policy_version(version_.load());
      part.set_generated_tokens(tokens);
      tokens = 0;
      part.set_seconds(std::chrono::duration<double>(now - last).count());
      last = now;
      if (!writer->Write(part)) {
        if (more) {
          std::lock_guard<std::mutex> lock(mu_);
          Leave(id);
        }
        return Refused(grpc::StatusCode::CANCELLED, "the caller went away mid-stream");
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status SimRollout::LoadWeights(grpc::ServerContext*,
                                     grpc::ServerReader<v1::WeightChunk>* reader,
                                     v1::WeightReceipt* receipt) {
  const auto t0 = std::chrono::steady_clock::now();
  v1::WeightChunk chunk;
  std::map<uint32_t, uint32_t> crcs;  // bucket -> CRC-32 of its bytes, in arrival order
  int64_t version = -1;
  uint64_t total = 0;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      version = chunk.version();
      total = chunk.total_bytes();
      first = false;
    } else if (chunk.version() != version) {
      return Refused(grpc::StatusCode::INVALID_ARGUMENT, "chunks of two versions in one transfer");
    }
    crcs[chunk.bucket_index()] =
        Crc32(chunk.data().data(), chunk.data().size(), crcs[chunk.bucket_index()]);
  }
  if (first) return Refused(grpc::StatusCode::INVALID_ARGUMENT, "an empty weight transfer");
  receipt->set_version(version);
  for (const auto& [b, crc] : crcs) receipt->add_bucket_crc32(crc);
  receipt->set_bytes(total);
  receipt->set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  version_ = version;
  return grpc::Status::OK;
}

grpc::Status SimRollout::ReceiveWeights(grpc::ServerContext*, const v1::ReceiveWeightsRequest*,
                                        v1::WeightReceipt*) {
  return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                 "simulated workers take weights over cluster.weight_transport: grpc only");
}

grpc::Status SimRollout::RelayWeights(grpc::ServerContext* ctx, const v1::RelayWeightsRequest* req,
                                      v1::PublishWeightsResponse* resp) {
  if (req->rollout_addresses_size() != req->rollout_ids_size()) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                   "rollout_addresses and rollout_ids differ in length");
  }
  if (req->version() != version_.load()) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   "asked to relay version " + std::to_string(req->version()) +
                       ", this worker holds " + std::to_string(version_.load()));
  }
  std::lock_guard<std::mutex> lock(relay_mu_);  // one uplink
  return SendSimulated(cost_, ctx, req->version(), req->rollout_addresses(), req->rollout_ids(),
                       req->timeout_s(), resp);
}

grpc::Status SimRollout::Stop(grpc::ServerContext*, const v1::StopRequest* req, v1::StopResponse*) {
  if (on_stop_) on_stop_(req->reason().empty() ? "stop requested" : req->reason());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------------------------
// SimTrainer

SimTrainer::SimTrainer(CostModel cost, std::function<void(const std::string&)> on_stop)
    : cost_(cost), on_stop_(std::move(on_stop)) {}

grpc::Status SimTrainer::HostGroupStore(grpc::ServerContext*, const v1::HostGroupStoreRequest*,
                                        v1::HostGroupStoreResponse* resp) {
  resp->set_store_address("simulated");
  return grpc::Status::OK;
}

grpc::Status SimTrainer::JoinGroup(grpc::ServerContext*, const v1::JoinGroupRequest* req,
                                   v1::JoinGroupResponse*) {
  if (req->rank() < 0 || req->rank() >= req->size()) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, "rank outside the group");
  }
  return grpc::Status::OK;
}

grpc::Status SimTrainer::TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* req,
                                   v1::TrainStepResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  if (req->expected_version() != version_.load()) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   "batch was sampled for policy version " +
                       std::to_string(req->expected_version()) + ", trainer holds " +
                       std::to_string(version_.load()));
  }
  double tokens = 0;
  for (const auto& s : req->samples()) {
    if (s.loss_mask_size() == 0) {
      tokens += s.response_ids_size();
    } else {
      for (float m : s.loss_mask()) tokens += m;
    }
  }
  if (!SleepUnless(tokens * cost_.train_s_per_token * cost_.time_scale,
                   [ctx] { return ctx->IsCancelled(); })) {
    return Refused(grpc::StatusCode::CANCELLED, "train step cancelled by the caller");
  }
  version_ = req->expected_version() + 1;
  resp->set_policy_version(version_.load());
  auto& m = *resp->mutable_metrics();
  for (const char* k : {"loss", "grad_norm", "clip_frac", "approx_kl", "entropy"}) m[k] = 0;
  m["tokens"] = tokens;
  return grpc::Status::OK;
}

grpc::Status SimTrainer::PublishWeights(grpc::ServerContext* ctx,
                                        const v1::PublishWeightsRequest* req,
                                        v1::PublishWeightsResponse* resp) {
  if (!req->transport().empty() && req->transport() != "grpc") {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   "simulated workers take weights over cluster.weight_transport: grpc only");
  }
  if (req->rollout_addresses_size() != req->rollout_ids_size()) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT,
                   "rollout_addresses and rollout_ids differ in length");
  }
  std::lock_guard<std::mutex> lock(mu_);
  return SendSimulated(cost_, ctx, req->version(), req->rollout_addresses(), req->rollout_ids(),
                       req->timeout_s(), resp);
}

grpc::Status SimTrainer::Save(grpc::ServerContext*, const v1::SaveRequest* req,
                              v1::SaveResponse* resp) {
  Status made = MakeDirs(req->directory());
  if (made.ok()) {
    made = WriteFileAtomic(
        req->directory() + "/simulated.json",
        "{\"simulated\": true, \"policy_version\": " + std::to_string(version_.load()) + "}\n");
  }
  if (!made.ok()) return rpc::ToGrpc(made);
  resp->set_path(req->directory());
  resp->set_policy_version(version_.load());
  return grpc::Status::OK;
}

grpc::Status SimTrainer::SaveState(grpc::ServerContext*, const v1::SaveStateRequest*,
                                   v1::SaveStateResponse*) {
  return Refused(
      grpc::StatusCode::FAILED_PRECONDITION,
      "simulated trainers hold no state to checkpoint (set trainer.checkpoint_every: 0)");
}

grpc::Status SimTrainer::LoadState(grpc::ServerContext*, const v1::LoadStateRequest*,
                                   v1::LoadStateResponse*) {
  return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                 "simulated trainers hold no state to resume");
}

grpc::Status SimTrainer::Stop(grpc::ServerContext*, const v1::StopRequest* req, v1::StopResponse*) {
  if (on_stop_) on_stop_(req->reason().empty() ? "stop requested" : req->reason());
  return grpc::Status::OK;
}

}  // namespace gyre::sim
