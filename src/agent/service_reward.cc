#include "agent/service_reward.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/crc32.h"
#include "gyre/v1/env.grpc.pb.h"
#include "rpc/rpc_util.h"

namespace gyre::agent {

StatusOr<double> ServiceReward::Score(const RewardInput& input) {
  return ScoreBatch({input}).front();
}

std::vector<StatusOr<double>> ServiceReward::ScoreBatch(const std::vector<RewardInput>& inputs) {
  std::vector<StatusOr<double>> out(inputs.size(), StatusOr<double>(Internal("not scored")));
  const size_t per = static_cast<size_t>(std::max(1, options_.batch_size));
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t b = 0; b < inputs.size(); b += per) {
    ranges.emplace_back(b, std::min(inputs.size(), b + per));
  }
  // Waves of at most `concurrency` requests, each on its own thread.
  const size_t wave = static_cast<size_t>(std::max(1, options_.concurrency));
  for (size_t r0 = 0; r0 < ranges.size(); r0 += wave) {
    std::vector<std::thread> threads;
    for (size_t r = r0; r < std::min(ranges.size(), r0 + wave); ++r) {
      threads.emplace_back([&, r] { ScoreRange(inputs, ranges[r].first, ranges[r].second, &out); });
    }
    for (auto& t : threads) t.join();
  }
  return out;
}

void ServiceReward::ScoreRange(const std::vector<RewardInput>& inputs, size_t begin, size_t end,
                               std::vector<StatusOr<double>>* out) {
  v1::ScoreRequest req;
  req.set_item_timeout_s(options_.item_timeout_s);
  std::string ids;
  // Positions by item id: inputs that share an id are one item (ids are idempotent).
  std::unordered_map<std::string, std::vector<size_t>> index;
  for (size_t i = begin; i < end; ++i) {
    const RewardInput& in = inputs[i];
    // An input without an id gets one never used before, even by an earlier process: a server
    // may cache scores by id for the whole job.
    const std::string id =
        in.id.empty() ? fmt::format("anon-{:016x}-{}", nonce_, next_anonymous_++) : in.id;
    auto [at, fresh] = index.try_emplace(id);
    at->second.push_back(i);
    if (!fresh) continue;
    v1::RewardItem* item = req.add_items();
    item->set_id(id);
    item->set_prompt(in.prompt);
    item->set_response(in.response);
    item->set_task_json(nlohmann::json{{"answer", in.answer}, {"finished", in.finished}}.dump());
    ids += id + "\n";
  }
  req.set_request_id(fmt::format("{:08x}-{}", Crc32(ids.data(), ids.size()), req.items_size()));
  const std::string what = "reward service request " + req.request_id();
  auto fail_all = [&](const Status& s) {
    for (size_t i = begin; i < end; ++i) (*out)[i] = s;
  };
  v1::ScoreResponse resp;
  for (int attempt = 0;; ++attempt) {
    auto stub = v1::Reward::NewStub(service_->channel());
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, options_.timeout_s);
    grpc::Status s = stub->Score(&ctx, req, &resp);
    if (s.ok()) break;
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return fail_all(DeadlineExceeded(
          fmt::format("{}: no answer within {:g} s (reward.timeout_s)", what, options_.timeout_s)));
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || attempt >= options_.retries) {
      return fail_all(rpc::FromGrpc(s, what));
    }
    Status serving = service_->AwaitServing();
    if (!serving.ok()) return fail_all(serving.WithContext(what));
  }
  std::set<std::string> answered;
  for (const v1::ItemScore& sc : resp.scores()) {
    auto it = index.find(sc.id());
    if (it == index.end() || !answered.insert(sc.id()).second) continue;  // unknown or repeated
    StatusOr<double> r = Internal("reward service: item " + sc.id() + " has no status (" +
                                  std::to_string(sc.status()) + ")");
    switch (sc.status()) {
      case v1::SCORE_OK:
        r = sc.reward();
        break;
      case v1::SCORE_TIMEOUT:
        r = DeadlineExceeded("reward service: item " + sc.id() + " timed out: " + sc.error());
        break;
      case v1::SCORE_ERROR:
        r = Internal("reward service: item " + sc.id() + " failed: " + sc.error());
        break;
      default:
        break;
    }
    for (size_t i : it->second) (*out)[i] = r;
  }
  for (const auto& [id, positions] : index) {
    if (answered.count(id)) continue;
    for (size_t i : positions) (*out)[i] = Internal("reward service: no score for item " + id);
  }
}

}  // namespace gyre::agent
