// Simulated workers (src/sim): the cost model's lengths and times, and the services over real
// gRPC servers on loopback, driven through the controller's own clients.

#include "sim/sim_workers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rpc/clients.h"
#include "rpc/rpc_util.h"
#include "sim/cost_model.h"

namespace gyre::sim {
namespace {

TEST(CostModelTest, LengthsAreLognormalPerSeedAndCapped) {
  CostModel c;
  c.length_median = 600;
  c.length_sigma = 1.0;
  std::vector<int64_t> lengths;
  int64_t capped = 0;
  for (uint64_t seed = 0; seed < 20000; ++seed) {
    const int64_t len = c.Length(seed, 8192);
    EXPECT_EQ(len, c.Length(seed, 8192)) << "seed " << seed;
    ASSERT_GE(len, 1);
    ASSERT_LE(len, 8192);
    capped += len == 8192;
    lengths.push_back(len);
  }
  std::sort(lengths.begin(), lengths.end());
  // Median 600; P(L >= 8192) = P(z >= ln(8192 / 600)) = P(z >= 2.614) = 0.45%.
  EXPECT_NEAR(static_cast<double>(lengths[lengths.size() / 2]), 600.0, 30.0);
  EXPECT_NEAR(static_cast<double>(capped) / 20000, 0.0045, 0.0015);
  // The 84th percentile is median * e^sigma.
  EXPECT_NEAR(static_cast<double>(lengths[static_cast<size_t>(0.8413 * 20000)]), 600 * 2.71828,
              90.0);
  EXPECT_EQ(c.Length(5, 1), 1);
}

// ToArgs is how `gyre bench e2e --simulate` hands its cost model to `gyre sim-workers`, which
// declares the same table's options with their ranges (src/bench/sim_workers.cc).
TEST(CostModelTest, ToArgsGivesEveryOptionWithItsValueInRange) {
  CostModel c;
  c.max_running = 17;
  c.length_median = 123.5;
  c.time_scale = 0.002;
  const std::vector<std::string> args = c.ToArgs();
  ASSERT_EQ(args.size(), 2 * std::size(kCostOptions));
  std::map<std::string, std::string> values;
  for (size_t i = 0; i < std::size(kCostOptions); ++i) {
    EXPECT_EQ(args[2 * i], kCostOptions[i].flag);
    values[args[2 * i]] = args[2 * i + 1];
  }
  EXPECT_EQ(values["--max-running"], "17");
  EXPECT_EQ(values["--length-median"], "123.5");
  EXPECT_EQ(values["--time-scale"], "0.002");
  // The defaults are valid values of their own options.
  const CostModel defaults;
  for (const CostOption& o : kCostOptions) {
    const double v =
        o.field == nullptr ? static_cast<double>(defaults.max_running) : defaults.*o.field;
    EXPECT_GE(v, o.lo) << o.flag;
    EXPECT_LE(v, o.hi) << o.flag;
  }
}

// A simulated rollout worker and a simulated trainer, each on its own loopback server.
class SimWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cost_.time_scale = 1e-3;  // 15 us engine steps
    cost_.length_median = 20;
    cost_.max_running = 4;
    rollout_ = std::make_unique<SimRollout>(cost_, nullptr);
    trainer_ = std::make_unique<SimTrainer>(cost_, nullptr);
    auto rs = rpc::StartServer("127.0.0.1", 0, {rollout_.get()}, &rollout_address_);
    auto ts = rpc::StartServer("127.0.0.1", 0, {trainer_.get()}, &trainer_address_);
    ASSERT_TRUE(rs.ok() && ts.ok());
    rollout_server_ = std::move(*rs);
    trainer_server_ = std::move(*ts);
    rollout_client_ = rpc::MakeGrpcRolloutClient(rollout_address_);
    trainer_client_ = rpc::MakeGrpcTrainerClient(trainer_address_);
  }
  void TearDown() override {
    rollout_server_->Shutdown();
    trainer_server_->Shutdown();
  }

  v1::GenerateRequest Request(int groups, int n) const {
    v1::GenerateRequest req;
    for (int g = 0; g < groups; ++g) {
      auto* pg = req.add_groups();
      pg->set_group_id(100 + g);
      pg->set_n(n);
      pg->set_first_sample_id(1000 + 10 * g);
      pg->set_seed(77 * g + 5);
      pg->add_prompt_ids(7);
      pg->add_prompt_ids(8);
    }
    req.mutable_sampling()->set_max_new_tokens(64);
    req.mutable_sampling()->add_stop_token_ids(2);
    req.set_min_policy_version(-1);
    return req;
  }

  CostModel cost_;
  std::unique_ptr<SimRollout> rollout_;
  std::unique_ptr<SimTrainer> trainer_;
  std::string rollout_address_, trainer_address_;
  std::unique_ptr<grpc::Server> rollout_server_, trainer_server_;
  std::unique_ptr<rpc::RolloutClient> rollout_client_;
  std::unique_ptr<rpc::TrainerClient> trainer_client_;
};

TEST_F(SimWorkersTest, GenerateStreamSendsWholeGroupsAsTheirLongestSampleEnds) {
  const v1::GenerateRequest req = Request(6, 3);
  std::vector<v1::GenerateResponse> parts;
  Status s = rollout_client_->GenerateStream({10, nullptr}, req,
                                             [&](v1::GenerateResponse& p) { parts.push_back(p); });
  ASSERT_TRUE(s.ok()) << s;
  std::map<uint64_t, std::string> streamed;
  int64_t tokens = 0, samples = 0;
  std::vector<int64_t> finish_order;  // each group's longest sample, in arrival order
  for (const auto& p : parts) {
    tokens += p.generated_tokens();
    std::map<uint64_t, int64_t> longest;
    for (const auto& smp : p.samples()) {
      ++samples;
      streamed[smp.sample_id()] = smp.SerializeAsString();
      const int i = static_cast<int>(smp.sample_id() - (1000 + 10 * (smp.group_id() - 100)));
      const uint64_t seed = 77 * (smp.group_id() - 100) + 5 + static_cast<uint64_t>(i);
      EXPECT_EQ(smp.seed(), seed);
      const int64_t want = cost_.Length(seed, 64);
      ASSERT_EQ(smp.response_ids_size(), want);
      EXPECT_EQ(smp.versions_size(), want);
      EXPECT_EQ(smp.finish_reason(), want < 64 ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH);
      if (want < 64) EXPECT_EQ(smp.response_ids(want - 1), 2);  // the stop token
      longest[smp.group_id()] = std::max(longest[smp.group_id()], want);
    }
    std::map<uint64_t, int> count;
    for (const auto& smp : p.samples()) ++count[smp.group_id()];
    for (const auto& [g, c] : count) EXPECT_EQ(c, 3) << "group " << g << " split";
    for (const auto& [g, l] : longest) finish_order.push_back(l);
  }
  EXPECT_EQ(samples, 18);
  int64_t total_len = 0;
  for (const auto& [id, bytes] : streamed) {
    v1::Sample smp;
    smp.ParseFromString(bytes);
    total_len += smp.response_ids_size();
  }
  EXPECT_EQ(tokens, total_len);
  EXPECT_GE(parts.size(), 3u) << "groups should arrive as they finish, not together";
  // Unary Generate returns the same samples, in request order.
  v1::GenerateResponse whole;
  s = rollout_client_->Generate({10, nullptr}, req, &whole);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(whole.samples_size(), 18);
  for (int k = 1; k < whole.samples_size(); ++k) {
    EXPECT_LT(whole.samples(k - 1).sample_id(), whole.samples(k).sample_id());
  }
  for (const auto& smp : whole.samples()) {
    EXPECT_EQ(streamed[smp.sample_id()], smp.SerializeAsString());
  }
  EXPECT_EQ(whole.generated_tokens(), tokens);
  v1::GenerateRequest partial = req;
  partial.set_target_finished_groups(2);
  s = rollout_client_->Generate({10, nullptr}, partial, &whole);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
}

TEST_F(SimWorkersTest, TrainerChecksVersionsAndPublishesReceiptsThatMatch) {
  v1::TrainStepRequest step;
  step.set_expected_version(3);
  v1::TrainStepResponse resp;
  Status s = trainer_client_->TrainStep({10, nullptr}, step, &resp);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  step.set_expected_version(0);
  v1::Sample* smp = step.add_samples();
  for (int t = 0; t < 5; ++t) smp->add_response_ids(1);
  ASSERT_TRUE(trainer_client_->TrainStep({10, nullptr}, step, &resp).ok());
  EXPECT_EQ(resp.policy_version(), 1);
  EXPECT_EQ(resp.metrics().at("tokens"), 5);

  v1::PublishWeightsRequest pub;
  pub.set_version(1);
  pub.add_rollout_addresses(rollout_address_);
  pub.add_rollout_ids("rollout-0");
  v1::PublishWeightsResponse presp;
  s = trainer_client_->PublishWeights({10, nullptr}, pub, &presp);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(presp.results_size(), 1);
  const auto& r = presp.results(0);
  EXPECT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r.receipt().version(), 1);
  ASSERT_EQ(r.receipt().bucket_crc32_size(), 1);
  ASSERT_EQ(r.sent_crc32_size(), 1);
  EXPECT_EQ(r.receipt().bucket_crc32(0), r.sent_crc32(0));
  EXPECT_EQ(rollout_->version(), 1);
  // A request for a newer version than the worker holds is refused, as by a real worker.
  v1::GenerateRequest req = Request(1, 1);
  req.set_min_policy_version(2);
  v1::GenerateResponse none;
  s = rollout_client_->Generate({10, nullptr}, req, &none);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  pub.set_transport("gloo");
  s = trainer_client_->PublishWeights({10, nullptr}, pub, &presp);
  EXPECT_NE(s.message().find("grpc only"), std::string::npos) << s;
}

// Peer relay between simulated workers: a worker holding the trainer's version passes it on with
// the trainer's checksums, and refuses to relay a version it does not hold.
TEST_F(SimWorkersTest, ARolloutWorkerRelaysTheTrainersVersion) {
  SimRollout peer(cost_, nullptr);
  std::string peer_address;
  auto peer_server = rpc::StartServer("127.0.0.1", 0, {&peer}, &peer_address);
  ASSERT_TRUE(peer_server.ok());
  v1::TrainStepRequest step;
  step.set_expected_version(0);
  v1::TrainStepResponse trained;
  ASSERT_TRUE(trainer_client_->TrainStep({10, nullptr}, step, &trained).ok());
  v1::PublishWeightsRequest pub;
  pub.set_version(1);
  pub.add_rollout_addresses(rollout_address_);
  pub.add_rollout_ids("rollout-0");
  v1::PublishWeightsResponse published;
  ASSERT_TRUE(trainer_client_->PublishWeights({10, nullptr}, pub, &published).ok());
  ASSERT_EQ(published.results_size(), 1);
  v1::RelayWeightsRequest relay;
  relay.set_version(1);
  relay.add_rollout_addresses(peer_address);
  relay.add_rollout_ids("rollout-1");
  v1::PublishWeightsResponse relayed;
  Status s = rollout_client_->RelayWeights({10, nullptr}, relay, &relayed);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(relayed.results_size(), 1);
  const auto& r = relayed.results(0);
  EXPECT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r.receipt().version(), 1);
  ASSERT_EQ(r.receipt().bucket_crc32_size(), published.results(0).sent_crc32_size());
  EXPECT_EQ(r.receipt().bucket_crc32(0), published.results(0).sent_crc32(0));
  EXPECT_EQ(peer.version(), 1);
  relay.set_version(2);
  s = rollout_client_->RelayWeights({10, nullptr}, relay, &relayed);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  (*peer_server)->Shutdown();
}

// Calls share one simulated engine, as on a real worker: a call that arrives while another's
// long sample runs joins the batch and ends first.
TEST_F(SimWorkersTest, ConcurrentCallsShareTheEngine) {
  CostModel cost = cost_;
  cost.time_scale = 0.5;  // 7.5 ms engine steps: a long sample outlasts a new call's setup
  SimRollout rollout(cost, nullptr);
  std::string address;
  auto server = rpc::StartServer("127.0.0.1", 0, {&rollout}, &address);
  ASSERT_TRUE(server.ok());
  auto client = rpc::MakeGrpcRolloutClient(address);
  // Two single-sample groups: one ends within 5 tokens, the other runs at least 40.
  uint64_t short_seed = 0, long_seed = 0;
  while (cost.Length(short_seed, 64) > 5) ++short_seed;
  while (cost.Length(long_seed, 64) < 40) ++long_seed;
  v1::GenerateRequest first = Request(2, 1), second = Request(1, 2);
  first.mutable_groups(0)->set_seed(short_seed);
  first.mutable_groups(1)->set_seed(long_seed);
  second.mutable_groups(0)->set_group_id(200);
  second.mutable_groups(0)->set_first_sample_id(5000);
  second.mutable_sampling()->set_max_new_tokens(1);
  std::mutex mu;
  std::vector<uint64_t> arrivals;  // group ids in arrival order
  std::promise<void> short_done;
  auto record = [&](v1::GenerateResponse& p) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& smp : p.samples()) {
      if (arrivals.empty() || arrivals.back() != smp.group_id()) arrivals.push_back(smp.group_id());
    }
  };
  Status first_status;
  std::thread first_call([&] {
    bool signalled = false;
    first_status = client->GenerateStream({30, nullptr}, first, [&](v1::GenerateResponse& p) {
      record(p);
      if (!signalled) short_done.set_value();
      signalled = true;
    });
  });
  ASSERT_EQ(short_done.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const Status second_status = client->GenerateStream({30, nullptr}, second, record);
  first_call.join();
  ASSERT_TRUE(first_status.ok()) << first_status;
  ASSERT_TRUE(second_status.ok()) << second_status;
  EXPECT_EQ(arrivals, (std::vector<uint64_t>{100, 200, 101}))
      << "the second call waited for the first one's long sample";
  (*server)->Shutdown();
}

// Rollout.Preempt takes a running sample out of a stream with the tokens it has; the stream sends
// its group without it; a GenerateStream that resumes it (on another worker) finishes it at the
// length its seed gives, keeping the tokens and versions it had.
TEST_F(SimWorkersTest, APreemptedSampleFinishesElsewhereAtItsOwnLength) {
  CostModel cost = cost_;
  cost.time_scale = 0.5;  // 7.5 ms engine steps
  SimRollout rollout(cost, nullptr), other(cost, nullptr);
  std::string address, other_address;
  auto server = rpc::StartServer("127.0.0.1", 0, {&rollout}, &address);
  auto other_server = rpc::StartServer("127.0.0.1", 0, {&other}, &other_address);
  ASSERT_TRUE(server.ok() && other_server.ok());
  auto client = rpc::MakeGrpcRolloutClient(address);
  auto other_client = rpc::MakeGrpcRolloutClient(other_address);
  // One group of 2 whose samples both run at least 30 tokens.
  uint64_t seed = 0;
  while (cost.Length(seed, 64) < 30 || cost.Length(seed + 1, 64) < 30) ++seed;
  v1::GenerateRequest req = Request(1, 2);
  req.mutable_groups(0)->set_seed(seed);
  std::vector<v1::GenerateResponse> parts;
  Status streamed;
  std::thread call([&] {
    streamed = client->GenerateStream({30, nullptr}, req,
                                      [&](v1::GenerateResponse& p) { parts.push_back(p); });
  });
  v1::PreemptResponse taken;
  for (int tries = 0; tries < 200 && taken.unfinished_size() == 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a few tokens in
    v1::PreemptRequest preempt;
    preempt.add_sample_ids(1000);  // sample 0
    preempt.add_sample_ids(4242);  // unknown: left alone
    ASSERT_TRUE(client->Preempt({10, nullptr}, preempt, &taken).ok());
  }
  call.join();
  ASSERT_TRUE(streamed.ok()) << streamed;
  ASSERT_EQ(taken.unfinished_size(), 1);
  const v1::Sample cut = taken.unfinished(0);
  EXPECT_EQ(cut.sample_id(), 1000u);
  EXPECT_EQ(cut.finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_GT(cut.response_ids_size(), 0);
  EXPECT_LT(cut.response_ids_size(), cost.Length(seed, 64));
  EXPECT_EQ(cut.versions_size(), cut.response_ids_size());
  int sent = 0;
  for (const auto& p : parts) {
    for (const auto& smp : p.samples()) {
      EXPECT_EQ(smp.sample_id(), 1001u) << "the taken sample was streamed too";
      EXPECT_EQ(smp.response_ids_size(), cost.Length(seed + 1, 64));
      ++sent;
    }
  }
  EXPECT_EQ(sent, 1);
  v1::GenerateRequest resume = Request(0, 1);
  *resume.add_resume() = cut;
  std::vector<v1::Sample> done;
  Status s = other_client->GenerateStream({30, nullptr}, resume, [&](v1::GenerateResponse& p) {
    for (const auto& smp : p.samples()) done.push_back(smp);
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].sample_id(), 1000u);
  EXPECT_EQ(done[0].seed(), seed);
  EXPECT_EQ(done[0].response_ids_size(), cost.Length(seed, 64));
  EXPECT_EQ(done[0].versions_size(), done[0].response_ids_size());
  EXPECT_NE(done[0].finish_reason(), v1::FINISH_REASON_ABORT);
  // Unary Generate does not continue samples here.
  v1::GenerateResponse unary;
  EXPECT_EQ(other_client->Generate({10, nullptr}, resume, &unary).code(),
            StatusCode::kInvalidArgument);
  (*server)->Shutdown();
  (*other_server)->Shutdown();
}

// The engine's time: every step costs step_base_s + step_per_seq_s * running (scaled); a batch
// capped at max_running sequences takes as long as its longest queue of steps.
TEST_F(SimWorkersTest, GenerationTakesTheCostModelsTime) {
  const v1::GenerateRequest req = Request(4, 2);  // 8 samples, 4 at a time
  const auto t0 = std::chrono::steady_clock::now();
  v1::GenerateResponse resp;
  ASSERT_TRUE(rollout_client_->Generate({10, nullptr}, req, &resp).ok());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // At least one step per token of the longest sample, each of at least step_base_s.
  int64_t longest = 0;
  for (const auto& smp : resp.samples())
    longest = std::max<int64_t>(longest, smp.response_ids_size());
  EXPECT_GE(wall, static_cast<double>(longest) * cost_.step_base_s * cost_.time_scale);
}

}  // namespace
}  // namespace gyre::sim
