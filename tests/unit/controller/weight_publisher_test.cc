// WeightPublisher over fake workers: every transport's request flow, the one receipt check,
// and what happens to a worker whose transfer fails.

#include "controller/weight_publisher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "fakes/fake_job.h"

namespace gyre::controller {
namespace {

using testing::FakeJob;
using testing::FakeJobConfig;

std::string DeathOf(FakeJob& job, const std::string& id) {
  for (const auto& i : job.service.Snapshot()) {
    if (i.id == id) return i.death;
  }
  return "";
}

TEST(WeightPublisherTest, GrpcPublishSetsTheVersionOfEveryWorkerWithAMatchingReceipt) {
  FakeJob job(FakeJobConfig(3, 1));
  ASSERT_TRUE(job.Start().ok());
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(4).ok());
  for (Worker* w : job.pool->AliveRollouts()) EXPECT_EQ(w->version, 4) << w->id;
  const auto calls = job.cluster.trainer[0]->publish_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].version(), 4);
  ASSERT_EQ(calls[0].rollout_ids_size(), 3);
  EXPECT_EQ(calls[0].rollout_addresses(2), "fake-rollout-2:1");
}

// cluster.weight_relay_fanout: the trainer sends F copies; then, round by round, every worker
// holding the version relays it to up to F more. With 7 workers and F = 2: the trainer serves 2,
// round 1 reaches 4 more, round 2 the last one.
TEST(WeightPublisherTest, PeerRelayFansOutFromTheTrainersCopiesInRounds) {
  FakeJob job(FakeJobConfig(7, 1));
  job.cfg.cluster.weight_relay_fanout = 2;
  ASSERT_TRUE(job.Start().ok());
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(5).ok());
  for (Worker* w : job.pool->AliveRollouts()) EXPECT_EQ(w->version, 5) << w->id;
  const auto calls = job.cluster.trainer[0]->publish_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].rollout_ids_size(), 2);
  EXPECT_EQ(pub.last_relay_rounds(), 2);
  std::map<std::string, int> received;  // worker -> copies it got from a relay
  int relays = 0;
  for (const auto& fake : job.cluster.rollout) {
    for (const auto& r : fake->relay_calls()) {
      ++relays;
      EXPECT_EQ(r.version(), 5);
      EXPECT_LE(r.rollout_ids_size(), 2);
      for (const auto& id : r.rollout_ids()) ++received[id];
    }
  }
  EXPECT_EQ(relays, 3);  // 2 in round 1, 1 in round 2
  EXPECT_EQ(received.size(), 5u);
  for (const auto& [id, n] : received) EXPECT_EQ(n, 1) << id;
  for (const auto& id : calls[0].rollout_ids()) EXPECT_EQ(received.count(id), 0u) << id;
}

// By default (weight_relay_fanout -1) the fan-out is chosen per publish: none for 3 receivers,
// 1 for 8 on links taken as equal; and once relays measure 100x slower a copy than the
// trainer's, the next publish to the same 8 goes direct.
TEST(WeightPublisherTest, DefaultFanOutFollowsTheReceiversAndWhatTheLinksMeasured) {
  {
    FakeJob job(FakeJobConfig(3, 1));
    ASSERT_EQ(job.cfg.cluster.weight_relay_fanout, -1);
    ASSERT_TRUE(job.Start().ok());
    WeightPublisher pub(job.cfg, job.pool.get(), "");
    ASSERT_TRUE(pub.Publish(1).ok());
    EXPECT_EQ(pub.last_relay_fanout(), 0);
    EXPECT_EQ(job.cluster.trainer[0]->publish_calls().at(0).rollout_ids_size(), 3);
  }
  FakeJob job(FakeJobConfig(8, 1));
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->relay_delay_s = 0.2;
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(1).ok());
  EXPECT_EQ(pub.last_relay_fanout(), 1);
  EXPECT_EQ(pub.last_relay_rounds(), 3);  // holders 1 -> 2 -> 4 -> 8
  EXPECT_EQ(job.cluster.trainer[0]->publish_calls().at(0).rollout_ids_size(), 1);
  EXPECT_GE(pub.relay_planner().relay_copy_s(), 0.2);
  EXPECT_LT(pub.relay_planner().trainer_copy_s(), 0.2);
  ASSERT_TRUE(pub.Publish(2).ok());
  EXPECT_EQ(pub.last_relay_fanout(), 0);
  EXPECT_EQ(pub.last_relay_rounds(), 0);
  const auto calls = job.cluster.trainer[0]->publish_calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].rollout_ids_size(), 8);
  for (Worker* w : job.pool->AliveRollouts()) EXPECT_EQ(w->version, 2) << w->id;
}

// A relaying worker that sends checksums other than the trainer's is dropped (it holds something
// else), and its targets get the version from another holder; a target whose receipt does not
// match is dropped itself.
TEST(WeightPublisherTest, PeerRelayDropsAWorkerThatRelaysOtherBytesAndServesItsTargetsAgain) {
  FakeJob job(FakeJobConfig(5, 1));
  job.cfg.cluster.weight_relay_fanout = 1;
  job.death_grace_s = 0;
  ASSERT_TRUE(job.Start().ok());
  // rollout-0 (served by the trainer) relays different bytes.
  job.cluster.rollout[0]->on_relay = [](const v1::RelayWeightsRequest& req,
                                        v1::PublishWeightsResponse* resp) {
    testing::AddFakeResults(req.rollout_ids(), req.version(), {7, 8, 9}, resp);
    return Status::Ok();
  };
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(3).ok());
  EXPECT_TRUE(job.pool->IsDead("rollout-0"));
  EXPECT_NE(DeathOf(job, "rollout-0").find("checksums that differ from the trainer's"),
            std::string::npos)
      << DeathOf(job, "rollout-0");
  for (int i = 1; i < 5; ++i) {
    const std::string id = "rollout-" + std::to_string(i);
    EXPECT_FALSE(job.pool->IsDead(id)) << id;
    EXPECT_EQ(job.pool->Get(id)->version, 3) << id;
  }
  // rollout-1 was rollout-0's target; the trainer served it after the relayer was dropped.
  const auto calls = job.cluster.trainer[0]->publish_calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].rollout_ids(0), "rollout-1");
}

TEST(WeightPublisherTest, AReceiptThatDoesNotMatchDropsThatWorkerOnly) {
  FakeJob job(FakeJobConfig(3, 1));
  ASSERT_TRUE(job.Start().ok());
  // The trainer reports rollout-1's receipt with one bucket's checksum wrong.
  job.cluster.trainer[0]->on_publish = [](const v1::PublishWeightsRequest& req,
                                          v1::PublishWeightsResponse* resp) {
    testing::AddFakeResults(
        req.rollout_ids(), req.version(), testing::kFakeCrcs, resp,
        [](const std::string& id, uint32_t c) { return id == "rollout-1" && c == 22 ? 23u : c; });
    return Status::Ok();
  };
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(2).ok());
  EXPECT_TRUE(job.pool->IsDead("rollout-1"));
  EXPECT_EQ(DeathOf(job, "rollout-1"), "receipt for v2 does not match");
  EXPECT_EQ(job.pool->Get("rollout-1")->version, -1);
  EXPECT_EQ(job.pool->Get("rollout-0")->version, 2);
  EXPECT_EQ(job.pool->Get("rollout-2")->version, 2);
}

TEST(WeightPublisherTest, AFailedTransferToALiveWorkerDropsItWithTheReason) {
  FakeJob job(FakeJobConfig(2, 1));
  ASSERT_TRUE(job.Start().ok());
  job.cluster.trainer[0]->on_publish = [](const v1::PublishWeightsRequest& req,
                                          v1::PublishWeightsResponse* resp) {
    for (const auto& id : req.rollout_ids()) {
      v1::PublishResult* r = resp->add_results();
      r->set_rollout_id(id);
      r->set_ok(id != "rollout-0");
      if (id == "rollout-0") r->set_error("stream reset");
      r->mutable_receipt()->set_version(req.version());
    }
    return Status::Ok();
  };
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(1).ok());
  EXPECT_EQ(DeathOf(job, "rollout-0"), "weight transfer of v1 failed: stream reset");
  EXPECT_EQ(job.pool->AliveRollouts().size(), 1u);
}

TEST(WeightPublisherTest, ATrainerFailureEndsThePublishWithItsContext) {
  FakeJob job(FakeJobConfig(1, 1));
  ASSERT_TRUE(job.Start().ok());
  job.cluster.trainer[0]->on_publish = [](const v1::PublishWeightsRequest&,
                                          v1::PublishWeightsResponse*) {
    return Internal("out of memory");
  };
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  Status s = pub.Publish(1);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "publish weights v1: out of memory");
}

TEST(WeightPublisherTest, CudaIpcReceiversCheckEveryBucketTheTrainerReports) {
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.cluster.weight_transport = "cuda_ipc";
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  // rollout-1 copies something else than the trainer wrote.
  job.cluster.rollout[1]->on_receive = [](const v1::ReceiveWeightsRequest& req,
                                          v1::WeightReceipt* receipt) {
    receipt->set_version(req.version());
    for (int i = 0; i < req.sent_crc32_size(); ++i) receipt->add_bucket_crc32(i);
    return Status::Ok();
  };
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(3).ok());
  EXPECT_EQ(job.pool->Get("rollout-0")->version, 3);
  EXPECT_EQ(DeathOf(job, "rollout-1"), "receipt for v3 does not match");
  const auto calls = job.cluster.rollout[0]->receive_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].transport(), "cuda_ipc");
  EXPECT_EQ(calls[0].sent_crc32_size(), 3);
}

TEST(WeightPublisherTest, GroupTransportsNameAFreshGroupAfterACatchUp) {
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.cluster.weight_transport = "gloo";
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  // Over a group the version arrives with the broadcast, not in the request.
  std::atomic<int64_t> broadcast{1};
  for (auto& r : job.cluster.rollout) {
    r->on_receive = [&broadcast](const v1::ReceiveWeightsRequest&, v1::WeightReceipt* receipt) {
      receipt->set_version(broadcast.load());
      for (uint32_t c : testing::kFakeCrcs) receipt->add_bucket_crc32(c);
      return Status::Ok();
    };
  }
  WeightPublisher pub(job.cfg, job.pool.get(), "127.0.0.1:9");
  ASSERT_TRUE(pub.Publish(1).ok());
  ASSERT_TRUE(pub.CatchUp(job.pool->Get("rollout-1"), 1).ok());
  broadcast = 2;
  ASSERT_TRUE(pub.Publish(2).ok());
  const auto r1 = job.cluster.rollout[1]->receive_calls();
  ASSERT_EQ(r1.size(), 3u);
  EXPECT_EQ(r1[0].group(), "weights/rollout-1");
  EXPECT_EQ(r1[1].group(), "weights/e1/rollout-1");
  EXPECT_EQ(r1[2].group(), "weights/e1/rollout-1");
  EXPECT_EQ(r1[0].store_address(), "127.0.0.1:9");
  const auto pubs = job.cluster.trainer[0]->publish_calls();
  ASSERT_EQ(pubs.size(), 3u);
  EXPECT_EQ(pubs[1].rollout_ids_size(), 1);  // the catch-up went to rollout-1 alone
  EXPECT_EQ(pubs[2].groups(0), "weights/e1/rollout-0");
  for (Worker* w : job.pool->AliveRollouts()) EXPECT_EQ(w->version, 2);
}

TEST(WeightPublisherTest, AFailedGroupPublishCancelsTheWaitingReceivers) {
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.cluster.weight_transport = "gloo";
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->receive_delay_s = 30;  // they wait for the trainer
  job.cluster.trainer[0]->on_publish = [](const v1::PublishWeightsRequest&,
                                          v1::PublishWeightsResponse*) {
    return Unavailable("store unreachable");
  };
  WeightPublisher pub(job.cfg, job.pool.get(), "127.0.0.1:9");
  const auto t0 = std::chrono::steady_clock::now();
  Status s = pub.Publish(1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(s.message(), "publish weights v1: store unreachable");
}

// A receiver that goes silent while the trainer sends it a version (a host gone mid-transfer) is
// declared dead, and its transfer is ended on the trainer at once (AbortWeightTransfer naming
// this publish): the publish returns long before weight_sync_timeout_s, and the other receiver
// holds the version. The fake trainer sends until it is told, as a real one blocks on the
// receiver's socket.
void ExpectADeadReceiversTransferIsEndedAtOnce(const std::string& transport) {
  SCOPED_TRACE(transport);
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.cluster.weight_transport = transport;
  cfg.cluster.heartbeat_timeout_s = 1;
  cfg.cluster.weight_sync_timeout_s = 40;
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  job.cluster.rollout[0]->on_receive = [](const v1::ReceiveWeightsRequest&,
                                          v1::WeightReceipt* receipt) {
    receipt->set_version(1);
    for (uint32_t c : testing::kFakeCrcs) receipt->add_bucket_crc32(c);
    return Status::Ok();
  };
  job.cluster.rollout[1]->receive_delay_s = 60;  // its receive call hangs (until cancelled)
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;
  auto& trainer = *job.cluster.trainer[0];
  trainer.on_abort = [&](const v1::AbortWeightTransferRequest&, v1::AbortWeightTransferResponse*) {
    std::lock_guard<std::mutex> lock(mu);
    ended = true;
    cv.notify_all();
    return Status::Ok();
  };
  trainer.on_publish = [&](const v1::PublishWeightsRequest& req, v1::PublishWeightsResponse* resp) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return ended; });
    for (uint32_t c : testing::kFakeCrcs) resp->add_bucket_crc32(c);
    testing::AddFakeResults(req.rollout_ids(), req.version(), testing::kFakeCrcs, resp);
    resp->mutable_results(1)->set_ok(false);
    resp->mutable_results(1)->set_error("gloo send aborted");
    return Status::Ok();
  };
  WeightPublisher pub(job.cfg, job.pool.get(), transport == "gloo" ? "127.0.0.1:9" : "");
  job.Silence("rollout-1");
  const auto t0 = std::chrono::steady_clock::now();
  Status s = pub.Publish(1);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_LT(took, 15.0);  // detection takes about the 1 s heartbeat timeout
  EXPECT_EQ(job.pool->Get("rollout-0")->version, 1);
  EXPECT_TRUE(job.pool->IsDead("rollout-1"));
  const auto aborts = trainer.abort_calls();
  ASSERT_EQ(aborts.size(), 1u);
  const auto pubs = trainer.publish_calls();
  ASSERT_EQ(pubs.size(), 1u);
  EXPECT_NE(pubs[0].publish_id(), 0u);
  EXPECT_EQ(aborts[0].publish_id(), pubs[0].publish_id());
  ASSERT_EQ(aborts[0].rollout_ids_size(), 1);
  EXPECT_EQ(aborts[0].rollout_ids(0), "rollout-1");
  EXPECT_EQ(aborts[0].reason(), "rollout-1: declared dead");
  EXPECT_EQ(pub.last_outcomes().at("rollout-1").error, "gloo send aborted");
}

TEST(WeightPublisherTest, AReceiverDeclaredDeadMidTransferHasItsTransferEndedOnTheTrainer) {
  ExpectADeadReceiversTransferIsEndedAtOnce("gloo");
  ExpectADeadReceiversTransferIsEndedAtOnce("grpc");
}

// Publishes are numbered, so that an abort can only ever end the publish it was meant for.
TEST(WeightPublisherTest, EveryPublishHasItsOwnId) {
  JobConfig cfg = FakeJobConfig(2, 1);
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  WeightPublisher pub(job.cfg, job.pool.get(), "");
  ASSERT_TRUE(pub.Publish(1).ok());
  ASSERT_TRUE(pub.CatchUp(job.pool->Get("rollout-1"), 1).ok());
  ASSERT_TRUE(pub.Publish(2).ok());
  const auto pubs = job.cluster.trainer[0]->publish_calls();
  ASSERT_EQ(pubs.size(), 3u);
  EXPECT_EQ(pubs[0].publish_id(), 1u);
  EXPECT_EQ(pubs[1].publish_id(), 2u);
  EXPECT_EQ(pubs[2].publish_id(), 3u);
  EXPECT_TRUE(job.cluster.trainer[0]->abort_calls().empty());
}

}  // namespace
}  // namespace gyre::controller
