#include "rollout/rollout_service.h"

#include <chrono>

#include "comm/gloo_communicator.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sync.h"
#include "common/logging.h"
#include "rpc/rpc_util.h"

namespace gyre::rollout {

RolloutService::RolloutService(std::unique_ptr<model::Transformer> model, int64_t max_batch,
                               std::function<void(const std::string&)> on_stop)
    : model_(std::move(model)), engine_(model_.get(), max_batch), on_stop_(std::move(on_stop)) {}

grpc::Status RolloutService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                      v1::GenerateResponse* resp) {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t version = version_.load();
  if (version < req->min_policy_version()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this worker holds policy version " + std::to_string(version) +
                            ", the request needs at least " +
                            std::to_string(req->min_policy_version()));
  }
  const auto& sp = req->sampling();
  std::vector<GenerationRequest> gens;
  for (const auto& g : req->groups()) {
    if (g.n() < 1) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "group " + std::to_string(g.group_id()) + " asks for n < 1 samples");
    }
    for (int i = 0; i < g.n(); ++i) {
      GenerationRequest r;
      r.prompt.assign(g.prompt_ids().begin(), g.prompt_ids().end());
      r.seed = g.seed() + static_cast<uint64_t>(i);
      r.temperature = sp.temperature();
      r.top_k = sp.top_k();
      r.top_p = sp.top_p() > 0 ? sp.top_p() : 1.0f;
      r.min_p = sp.min_p();
      r.max_new_tokens = sp.max_new_tokens();
      r.stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
      gens.push_back(std::move(r));
    }
  }
  auto results = engine_.Generate(gens);
  if (!results.ok()) return rpc::ToGrpc(results.status());
  size_t k = 0;
  int64_t generated = 0;
  for (const auto& g : req->groups()) {
    for (int i = 0; i < g.n(); ++i, ++k) {
      const GenerationResult& r = (*results)[k];
      v1::Sample* s = resp->add_samples();
      s->set_sample_id(g.first_sample_id() + static_cast<uint64_t>(i));
      s->set_group_id(g.group_id());
      *s->mutable_prompt_ids() = g.prompt_ids();
      s->mutable_response_ids()->Add(r.tokens.begin(), r.tokens.end());
      s->mutable_logprobs()->Add(r.logprobs.begin(), r.logprobs.end());
      s->mutable_kept_mass()->Add(r.kept_mass.begin(), r.kept_mass.end());
      for (size_t t = 0; t < r.tokens.size(); ++t) {
        s->add_versions(version);
        s->add_loss_mask(1.0f);
      }
      s->set_finish_reason(r.finish == Finish::kStop     ? v1::FINISH_REASON_STOP
                           : r.finish == Finish::kLength ? v1::FINISH_REASON_LENGTH
                                                         : v1::FINISH_REASON_ABORT);
      generated += static_cast<int64_t>(r.tokens.size());
    }
  }
  resp->set_policy_version(version);
  resp->set_generated_tokens(generated);
  resp->set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return grpc::Status::OK;
}

grpc::Status RolloutService::LoadWeights(grpc::ServerContext* ctx,
                                         grpc::ServerReader<v1::WeightChunk>* reader,
                                         v1::WeightReceipt* receipt) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = comm::ReceiveWeights(reader, model_->NamedParameters(), receipt);
  if (!s.ok()) {
    GYRE_LOG_ERROR("weight transfer rejected: {}", s.ToString());
    return rpc::ToGrpc(s);
  }
  version_.store(receipt->version());
  GYRE_LOG_DEBUG("loaded policy version {} ({} bytes)", receipt->version(), receipt->bytes());
  return grpc::Status::OK;
}

grpc::Status RolloutService::ReceiveWeights(grpc::ServerContext* ctx,
                                            const v1::ReceiveWeightsRequest* req,
                                            v1::WeightReceipt* receipt) {
  std::lock_guard<std::mutex> wlock(weights_mu_);
  const double timeout = req->timeout_s() > 0 ? req->timeout_s() : 60.0;
  const comm::Deadline deadline = comm::DeadlineAfter(timeout);
  if (!weight_comm_ || weight_comm_->aborted() || weight_group_ != req->group()) {
    weight_comm_.reset();
    comm::GlooOptions o;
    o.store_address = req->store_address();
    o.group = req->group();
    o.rank = 1;
    o.size = 2;
    if (!req->bind_host().empty()) o.bind_host = req->bind_host();
    o.connect_timeout_s = timeout;
    auto c = comm::CreateGlooCommunicator(o);
    if (!c.ok()) return rpc::ToGrpc(c.status());
    weight_comm_ = std::move(*c);
    weight_group_ = req->group();
  }
  auto r = comm::ReceivePublishedWeights(weight_comm_.get(), 0, deadline, &weight_payload_);
  if (!r.ok()) {
    GYRE_LOG_ERROR("weight transfer rejected: {}", r.status().ToString());
    if (weight_comm_->aborted()) weight_comm_.reset();
    return rpc::ToGrpc(r.status());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status s = model::LoadFlatParameters(weight_payload_.manifest, weight_payload_.bytes.data(),
                                         weight_payload_.bytes.size(), model_->NamedParameters());
    if (!s.ok()) {
      return rpc::ToGrpc(s.WithContext("weights of version " + std::to_string(r->version)));
    }
    version_.store(r->version);
  }
  receipt->set_version(r->version);
  for (uint32_t c : r->bucket_crc32) receipt->add_bucket_crc32(c);
  receipt->set_bytes(r->bytes);
  receipt->set_seconds(r->seconds);
  GYRE_LOG_DEBUG("loaded policy version {} over gloo ({} bytes)", r->version, r->bytes);
  return grpc::Status::OK;
}

grpc::Status RolloutService::Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                                  v1::StopResponse* resp) {
  if (on_stop_) on_stop_(req->reason().empty() ? "stop requested" : req->reason());
  return grpc::Status::OK;
}

}  // namespace gyre::rollout
