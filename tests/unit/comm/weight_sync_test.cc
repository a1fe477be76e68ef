#include "comm/weight_sync.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "model/transformer.h"
#include "rollout/rollout_service.h"
#include "rpc/clients.h"
#include "rpc/rpc_util.h"
#include "testing/tiny_model.h"

namespace gyre::comm {
namespace {

model::ModelSpec Spec() { return testing::TinySpec(40, 32, 2, 4, 2, 64); }

// A real rollout service on a loopback port receiving weights from a real client.
class WeightSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rollout::EngineConfig config;
    config.block_size = 4;
    config.num_blocks = 64;
    config.max_running = 8;
    auto service = rollout::RolloutService::Create(model::Transformer::Create(Spec(), 5, 0.1),
                                                   config, nullptr, nullptr);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    auto server = rpc::StartServer("127.0.0.1", 0, {service_.get()}, &address_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Rollout::NewStub(rpc::MakeChannel(address_));
    source_ = model::Transformer::Create(Spec(), 77, 0.1);
    payload_.version = 3;
    payload_.bytes = model::FlattenParameters(source_->NamedParameters(), &payload_.manifest);
  }
  void TearDown() override { server_->Shutdown(); }

  // Greedy generation on the receiving worker; equal outputs mean equal weights in use.
  std::vector<int32_t> Generate() {
    v1::GenerateRequest req;
    auto* g = req.add_groups();
    for (int32_t id : {1, 5, 9, 12}) g->add_prompt_ids(id);
    g->set_n(1);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_new_tokens(6);
    req.set_min_policy_version(-1);  // also before any weights arrived
    v1::GenerateResponse resp;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    EXPECT_TRUE(stub_->Generate(&ctx, req, &resp).ok());
    version_seen_ = resp.policy_version();
    return {resp.samples(0).response_ids().begin(), resp.samples(0).response_ids().end()};
  }

  std::unique_ptr<rollout::RolloutService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::Rollout::Stub> stub_;
  std::unique_ptr<model::Transformer> source_;
  WeightPayload payload_;
  int64_t version_seen_ = -2;
};

TEST_F(WeightSyncTest, BucketedTransferLoadsExactWeightsAndReturnsReceipt) {
  const int64_t bucket = 4096;  // many buckets
  auto r = SendWeights(stub_.get(), payload_, bucket, 10.0);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t expect_buckets = (payload_.bytes.size() + bucket - 1) / bucket;
  EXPECT_EQ(r->sent_crc32.size(), expect_buckets);
  EXPECT_EQ(r->receipt.version(), 3);
  EXPECT_EQ(r->receipt.bytes(), payload_.bytes.size());
  EXPECT_EQ(service_->version(), 3);
  // The receiver now generates exactly what a model holding the sender's weights generates.
  auto reference = model::Transformer::Create(Spec(), 77, 0.1);
  std::vector<int32_t> want;
  {
    rollout::EngineConfig config;
    config.block_size = 4;
    config.num_blocks = 8;
    auto engine = rollout::RolloutEngine::Create(reference.get(), config);
    ASSERT_TRUE(engine.ok()) << engine.status();
    rollout::Request g;
    g.prompt = {1, 5, 9, 12};
    g.sampling.temperature = 0;
    g.sampling.max_new_tokens = 6;
    auto out = (*engine)->Generate({g});
    ASSERT_TRUE(out.ok());
    want = (*out)[0].response.tokens;
  }
  EXPECT_EQ(Generate(), want);
  EXPECT_EQ(version_seen_, 3);
}

// A streamed payload (what a trainer with split parameters sends): the same bytes, buckets and
// receipt as the whole payload, each piece made once and in order, while two receivers read at
// their own pace; one receiver alone holds no more than two pieces at a time.
TEST_F(WeightSyncTest, AStreamedPayloadSendsTheSameBytesPieceByPiece) {
  const uint64_t total = payload_.bytes.size();
  std::vector<uint64_t> starts;
  for (uint64_t at = 0; at < total; at += total / 5 + 1) starts.push_back(at);
  std::vector<size_t> made;
  auto produce = [&](size_t k, std::vector<uint8_t>* bytes) {
    made.push_back(k);
    const uint64_t end = k + 1 < starts.size() ? starts[k + 1] : total;
    bytes->assign(payload_.bytes.begin() + static_cast<int64_t>(starts[k]),
                  payload_.bytes.begin() + static_cast<int64_t>(end));
    return Status::Ok();
  };
  WeightPayload streamed;
  streamed.version = 4;
  streamed.manifest = payload_.manifest;
  streamed.stream = std::make_shared<PayloadStream>(total, starts, produce, 2);
  EXPECT_EQ(streamed.size(), total);
  // Receiver 0 over gRPC in buckets of 4 KiB; reader 1 in 1000-byte reads on another thread.
  std::vector<uint8_t> copy(total);
  std::thread other([&] {
    for (uint64_t at = 0; at < total; at += 1000) {
      const uint64_t n = std::min<uint64_t>(1000, total - at);
      ASSERT_TRUE(streamed.stream->Read(1, at, n, copy.data() + at).ok());
    }
    streamed.stream->Finish(1);
  });
  auto r = SendWeights(stub_.get(), streamed, 4096, 10.0, -1, nullptr, 0);
  other.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(copy, payload_.bytes);
  auto whole = SendWeights(stub_.get(), payload_, 4096, 10.0);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(r->sent_crc32, whole->sent_crc32);
  EXPECT_EQ(r->receipt.bytes(), total);
  EXPECT_EQ(made, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(streamed.stream->Drain().ok());
  // One reader in 4 KiB buckets holds at most the two pieces a bucket can straddle.
  made.clear();
  WeightPayload single = streamed;
  single.stream = std::make_shared<PayloadStream>(total, starts, produce, 1);
  ASSERT_TRUE(SendWeights(stub_.get(), single, 4096, 10.0).ok());
  EXPECT_EQ(made.size(), starts.size());
  EXPECT_LE(single.stream->peak_bytes(), 2 * (total / 5 + 1));
  EXPECT_LT(single.stream->peak_bytes(), total);
  // A reader cannot go back to a dropped piece; a producer's failure reaches the readers and
  // Drain.
  uint8_t byte = 0;
  EXPECT_EQ(streamed.stream->Read(0, 0, 1, &byte).code(), StatusCode::kFailedPrecondition);
  auto failing = std::make_shared<PayloadStream>(
      total, starts,
      [&](size_t k, std::vector<uint8_t>* bytes) {
        return k == 2 ? Unavailable("gather failed") : produce(k, bytes);
      },
      1);
  std::vector<uint8_t> buf(total);
  EXPECT_TRUE(failing->Read(0, 0, starts[1], buf.data()).ok());
  const Status failed = failing->Read(0, starts[1], total - starts[1], buf.data());
  EXPECT_NE(failed.message().find("gather failed"), std::string::npos) << failed;
  EXPECT_NE(failing->Drain().message().find("gather failed"), std::string::npos);
}

// A stream bounded to one bucket (how a trainer with split parameters publishes): three readers
// at their own pace, one quick, one slow and one reading only every other bucket (as a
// tensor-parallel rank reads its slices), each on a thread of its own, all get their bytes while
// the stream never holds more than one bucket; a reader that finishes early frees the others.
TEST_F(WeightSyncTest, ABoundedStreamKeepsItsReadersInStepWithinOneBucket) {
  const uint64_t total = payload_.bytes.size();
  const uint64_t bucket = 1024;
  ASSERT_GT(total, 8 * bucket);
  // Pieces end at every bucket boundary and, in between, at a few other places (units' ends).
  std::vector<uint64_t> starts;
  for (uint64_t at = 0; at < total; at += bucket) {
    starts.push_back(at);
    if (at + 300 < total && (at / bucket) % 3 == 1) starts.push_back(at + 300);
  }
  std::atomic<int> made{0};
  auto produce = [&](size_t k, std::vector<uint8_t>* bytes) {
    ++made;
    const uint64_t end = k + 1 < starts.size() ? starts[k + 1] : total;
    bytes->assign(payload_.bytes.begin() + static_cast<int64_t>(starts[k]),
                  payload_.bytes.begin() + static_cast<int64_t>(end));
    return Status::Ok();
  };
  auto stream = std::make_shared<PayloadStream>(total, starts, produce, 4, bucket);
  std::vector<std::vector<uint8_t>> copies(3, std::vector<uint8_t>(total, 0));
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      for (uint64_t at = 0; at < total; at += bucket) {
        if (r == 2 && (at / bucket) % 2 == 1) continue;
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const uint64_t n = std::min(bucket, total - at);
        const Status s = stream->Read(r, at, n, copies[static_cast<size_t>(r)].data() + at);
        ASSERT_TRUE(s.ok()) << s;
      }
      stream->Finish(r);
    });
  }
  // Reader 3 reads its first bucket, then stops: the others must not wait for it.
  std::vector<uint8_t> first(bucket);
  ASSERT_TRUE(stream->Read(3, 0, bucket, first.data()).ok());
  stream->Finish(3);
  for (auto& t : readers) t.join();
  EXPECT_EQ(copies[0], payload_.bytes);
  EXPECT_EQ(copies[1], payload_.bytes);
  for (uint64_t at = 0; at < total; at += bucket) {
    const uint64_t n = std::min(bucket, total - at);
    const bool read = (at / bucket) % 2 == 0;
    EXPECT_EQ(std::equal(copies[2].begin() + static_cast<int64_t>(at),
                         copies[2].begin() + static_cast<int64_t>(at + n),
                         payload_.bytes.begin() + static_cast<int64_t>(at)),
              read)
        << at;
  }
  EXPECT_EQ(made.load(), static_cast<int>(starts.size()));
  EXPECT_LE(stream->peak_bytes(), bucket);
  EXPECT_GT(stream->peak_bytes(), 0u);
  // A reader that stops moving (a stalled receiver) holds the others back only for the stream's
  // patience (0.2 s here): then they go on, and the stream holds what lies between them.
  auto patient = std::make_shared<PayloadStream>(total, starts, produce, 2, bucket, 0.2);
  std::vector<uint8_t> quick(total), stalled(bucket);
  ASSERT_TRUE(patient->Read(1, 0, bucket, stalled.data()).ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t at = 0; at < total; at += bucket) {
    ASSERT_TRUE(patient->Read(0, at, std::min(bucket, total - at), quick.data() + at).ok());
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(quick, payload_.bytes);
  EXPECT_GE(waited, 0.15);
  EXPECT_LT(waited, 5.0);
  EXPECT_GT(patient->peak_bytes(), 2 * bucket);
  patient->Finish(0);
  EXPECT_TRUE(patient->Drain().ok());  // finishes reader 1, drops everything
  // Unbounded, a reader runs ahead of the other and the stream holds what lies between them.
  auto unbounded = std::make_shared<PayloadStream>(total, starts, produce, 2);
  std::vector<uint8_t> a(total), b(total);
  for (uint64_t at = 0; at < total; at += bucket) {
    ASSERT_TRUE(unbounded->Read(0, at, std::min(bucket, total - at), a.data() + at).ok());
  }
  unbounded->Finish(0);
  ASSERT_TRUE(unbounded->Read(1, 0, total, b.data()).ok());
  unbounded->Finish(1);
  EXPECT_EQ(a, payload_.bytes);
  EXPECT_EQ(b, payload_.bytes);
  EXPECT_EQ(unbounded->peak_bytes(), total);
}

// Peer relay (Rollout.RelayWeights): a worker that received version 3 streams exactly those
// bytes on to another worker, whose receipt matches what the trainer sent, bucket by bucket. A
// relay of a version the worker does not hold is refused.
TEST_F(WeightSyncTest, AWorkerRelaysTheVersionItHoldsWithTheTrainersChecksums) {
  const int64_t bucket = 4096;
  auto sent = SendWeights(stub_.get(), payload_, bucket, 10.0);
  ASSERT_TRUE(sent.ok()) << sent.status();
  rollout::EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 64;
  auto peer = rollout::RolloutService::Create(model::Transformer::Create(Spec(), 9, 0.1), config,
                                              nullptr, nullptr);
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::string peer_address;
  auto peer_server = rpc::StartServer("127.0.0.1", 0, {peer->get()}, &peer_address);
  ASSERT_TRUE(peer_server.ok()) << peer_server.status();
  auto client = rpc::MakeGrpcRolloutClient(address_);
  v1::RelayWeightsRequest req;
  req.set_version(3);
  req.set_bucket_bytes(bucket);
  req.set_timeout_s(10);
  req.add_rollout_addresses(peer_address);
  req.add_rollout_ids("rollout-1");
  v1::PublishWeightsResponse resp;
  Status s = client->RelayWeights({20, nullptr}, req, &resp);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(resp.results_size(), 1);
  const auto& r = resp.results(0);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r.rollout_id(), "rollout-1");
  EXPECT_EQ(r.receipt().version(), 3);
  ASSERT_EQ(static_cast<size_t>(r.sent_crc32_size()), sent->sent_crc32.size());
  for (int b = 0; b < r.sent_crc32_size(); ++b) {
    EXPECT_EQ(r.sent_crc32(b), sent->sent_crc32[static_cast<size_t>(b)]) << "bucket " << b;
    EXPECT_EQ(r.receipt().bucket_crc32(b), sent->sent_crc32[static_cast<size_t>(b)]);
  }
  // Every bucket the peer loaded has the checksum of the trainer's bucket.
  EXPECT_EQ((*peer)->version(), 3);
  req.set_version(4);
  s = client->RelayWeights({20, nullptr}, req, &resp);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("this worker holds 3"), std::string::npos) << s;
  (*peer_server)->Shutdown();
}

TEST_F(WeightSyncTest, CorruptedBucketIsCaughtAndNothingIsLoaded) {
  const auto before = Generate();
  auto r = SendWeights(stub_.get(), payload_, 4096, 10.0, /*corrupt_bucket=*/2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("bucket 2"), std::string::npos) << r.status();
  EXPECT_EQ(service_->version(), -1);
  EXPECT_EQ(Generate(), before);
}

TEST_F(WeightSyncTest, WrongShapesAreRejectedWithTheTensorName) {
  auto other = model::Transformer::Create(
      [] {
        auto s = Spec();
        s.intermediate_size = 48;
        return s;
      }(),
      1, 0.1);
  WeightPayload p;
  p.version = 9;
  p.bytes = model::FlattenParameters(other->NamedParameters(), &p.manifest);
  auto r = SendWeights(stub_.get(), p, 1 << 20, 10.0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("mlp.gate_proj.weight"), std::string::npos) << r.status();
  EXPECT_EQ(service_->version(), -1);
}

// Sends hand-made chunks (as a buggy or hostile sender would) and returns the call's status.
grpc::Status SendRawChunks(v1::Rollout::Stub* stub, const std::vector<v1::WeightChunk>& chunks) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, 10);
  v1::WeightReceipt receipt;
  auto writer = stub->LoadWeights(&ctx, &receipt);
  for (const auto& c : chunks) {
    if (!writer->Write(c)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::WeightChunk Chunk(const WeightPayload& p, uint32_t index, uint32_t buckets, uint64_t offset,
                      uint64_t n) {
  v1::WeightChunk c;
  c.set_version(p.version);
  c.set_total_bytes(p.bytes.size());
  c.set_num_buckets(buckets);
  c.set_bucket_index(index);
  c.set_offset(offset);
  c.set_data(p.bytes.data() + offset, n);
  c.set_crc32(model::Crc32(p.bytes.data() + offset, n));
  if (index == 0) ManifestToProto(p.manifest, c.mutable_manifest());
  return c;
}

// The receiver sizes its buffer from the sender's total_bytes: a huge claim is refused before
// anything is allocated, and buckets that overlap or leave a hole are refused. Nothing is loaded.
TEST_F(WeightSyncTest, OversizedOrNonContiguousTransfersAreRefused) {
  const auto before = Generate();
  const uint64_t size = payload_.bytes.size(), half = size / 2;
  v1::WeightChunk huge = Chunk(payload_, 0, 1, 0, size);
  huge.set_total_bytes(uint64_t{1} << 50);
  grpc::Status s = SendRawChunks(stub_.get(), {huge});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("more than the " + std::to_string(size)), std::string::npos)
      << s.error_message();
  // Two buckets at offset 0: the second half of the payload would stay unwritten.
  s = SendRawChunks(stub_.get(),
                    {Chunk(payload_, 0, 2, 0, half), Chunk(payload_, 1, 2, 0, size - half)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("contiguously"), std::string::npos) << s.error_message();
  // A gap between buckets.
  s = SendRawChunks(stub_.get(),
                    {Chunk(payload_, 0, 2, 0, half - 8), Chunk(payload_, 1, 2, half, size - half)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // More buckets than bytes.
  v1::WeightChunk many = Chunk(payload_, 0, 1, 0, size);
  many.set_num_buckets(static_cast<uint32_t>(size + 1));
  s = SendRawChunks(stub_.get(), {many});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(service_->version(), -1);
  EXPECT_EQ(Generate(), before);
  // The same bytes, well formed, still load.
  s = SendRawChunks(stub_.get(),
                    {Chunk(payload_, 0, 2, 0, half), Chunk(payload_, 1, 2, half, size - half)});
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(service_->version(), 3);
}

TEST_F(WeightSyncTest, UnreachableReceiverFailsWithinTheDeadline) {
  auto port = rpc::PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  auto dead = v1::Rollout::NewStub(rpc::MakeChannel("127.0.0.1:" + std::to_string(*port)));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = SendWeights(dead.get(), payload_, 4096, 1.0);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// Partial rollouts through the service: stop at one finished group, receive new weights, resume
// the unfinished samples; their returned tokens are kept and versions say who made each token.
TEST_F(WeightSyncTest, PartialRolloutResumesAfterAWeightUpdate) {
  v1::GenerateRequest req;
  for (uint64_t g = 0; g < 3; ++g) {
    auto* group = req.add_groups();
    for (int32_t id : {1, 5, 9, static_cast<int32_t>(12 + g)}) group->add_prompt_ids(id);
    group->set_group_id(g);
    group->set_n(g == 0 ? 1 : 2);  // group 0's single sample stops early (below)
    group->set_first_sample_id(10 * g);
    group->set_seed(100 * g);
  }
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_max_new_tokens(20);
  req.set_min_policy_version(-1);
  v1::GenerateResponse first;  // the whole run, to pick a stop token that ends a group early
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    ASSERT_TRUE(stub_->Generate(&ctx, req, &first).ok());
  }
  ASSERT_EQ(first.samples_size(), 5);
  EXPECT_EQ(first.unfinished_size(), 0);
  v1::GenerateRequest cut = req;
  cut.set_target_finished_groups(1);
  cut.mutable_sampling()->add_stop_token_ids(first.samples(0).response_ids(2));
  v1::GenerateResponse part;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    ASSERT_TRUE(stub_->Generate(&ctx, cut, &part).ok());
  }
  ASSERT_GT(part.unfinished_size(), 0) << "the target should cut some samples";
  for (const auto& u : part.unfinished()) {
    EXPECT_EQ(u.finish_reason(), v1::FINISH_REASON_ABORT);
    for (int64_t v : u.versions()) EXPECT_EQ(v, -1);
  }
  auto r = SendWeights(stub_.get(), payload_, 4096, 10.0);
  ASSERT_TRUE(r.ok()) << r.status();
  v1::GenerateRequest resume;
  *resume.mutable_sampling() = cut.sampling();
  resume.set_min_policy_version(3);
  for (const auto& u : part.unfinished()) *resume.add_resume() = u;
  v1::GenerateResponse rest;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    ASSERT_TRUE(stub_->Generate(&ctx, resume, &rest).ok());
  }
  ASSERT_EQ(rest.samples_size(), part.unfinished_size());
  EXPECT_EQ(rest.unfinished_size(), 0);
  EXPECT_EQ(rest.policy_version(), 3);
  for (int i = 0; i < rest.samples_size(); ++i) {
    const auto& before = part.unfinished(i);
    const auto& after = rest.samples(i);
    EXPECT_EQ(after.sample_id(), before.sample_id());
    EXPECT_EQ(after.seed(), before.seed());
    ASSERT_GE(after.response_ids_size(), before.response_ids_size());
    for (int t = 0; t < after.response_ids_size(); ++t) {
      if (t < before.response_ids_size()) {
        EXPECT_EQ(after.response_ids(t), before.response_ids(t));
        EXPECT_EQ(after.versions(t), -1);
      } else {
        EXPECT_EQ(after.versions(t), 3) << "token " << t;
      }
    }
  }
  // Only the new tokens were drawn.
  int64_t fresh = 0;
  for (int i = 0; i < rest.samples_size(); ++i) {
    fresh += rest.samples(i).response_ids_size() - part.unfinished(i).response_ids_size();
  }
  EXPECT_EQ(rest.generated_tokens(), fresh);

  // A resume with inconsistent arrays is refused with a clear error.
  v1::GenerateRequest bad = resume;
  bad.mutable_resume(0)->add_logprobs(0.0f);
  v1::GenerateResponse none;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, 10);
  grpc::Status s = stub_->Generate(&ctx, bad, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("log-probs"), std::string::npos) << s.error_message();
}

// Stop strings reach the engine through the service, which decodes with the worker's tokenizer
// (here: token t is the letter 'a' + t).
// Rollout.GenerateStream through the gRPC client: the same samples as Generate (sampling is
// seeded per group), sent group by group as each finishes (stop tokens make the lengths differ),
// with counters that add up to Generate's. Partial rollouts are refused.
TEST_F(WeightSyncTest, GenerateStreamSendsEachGroupWhenItFinishes) {
  v1::GenerateRequest req;
  for (uint64_t g = 0; g < 4; ++g) {
    auto* group = req.add_groups();
    for (int32_t id : {1, 5, static_cast<int32_t>(9 + g)}) group->add_prompt_ids(id);
    group->set_group_id(g);
    group->set_n(3);
    group->set_first_sample_id(10 * g);
    group->set_seed(1000 + 7 * g);
  }
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_max_new_tokens(16);
  for (int32_t stop = 0; stop < 8; ++stop) req.mutable_sampling()->add_stop_token_ids(stop);
  req.set_min_policy_version(-1);
  v1::GenerateResponse whole;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    ASSERT_TRUE(stub_->Generate(&ctx, req, &whole).ok());
  }
  auto client = rpc::MakeGrpcRolloutClient(address_);
  std::vector<v1::GenerateResponse> parts;
  Status s = client->GenerateStream({10, nullptr}, req,
                                    [&](v1::GenerateResponse& p) { parts.push_back(p); });
  ASSERT_TRUE(s.ok()) << s;
  std::map<uint64_t, std::string> streamed;  // sample id -> serialized sample
  int64_t generated = 0, group_messages = 0;
  for (const auto& p : parts) {
    generated += p.generated_tokens();
    if (p.samples_size() > 0) ++group_messages;
    std::map<uint64_t, int> per_group;
    for (const auto& smp : p.samples()) {
      ++per_group[smp.group_id()];
      streamed[smp.sample_id()] = smp.SerializeAsString();
    }
    for (const auto& [g, count] : per_group) EXPECT_EQ(count, 3) << "group " << g << " split";
  }
  EXPECT_GE(group_messages, 2) << "every group finished in the same engine step";
  EXPECT_EQ(generated, whole.generated_tokens());
  ASSERT_EQ(streamed.size(), static_cast<size_t>(whole.samples_size()));
  for (const auto& smp : whole.samples()) {
    EXPECT_EQ(streamed[smp.sample_id()], smp.SerializeAsString()) << "sample " << smp.sample_id();
  }
  v1::GenerateRequest partial = req;
  partial.set_target_finished_groups(1);
  s = client->GenerateStream({10, nullptr}, partial, [](v1::GenerateResponse&) {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("use Generate"), std::string::npos) << s;
}

// 16 groups of 2 through a batch of 8 (max_running); stop tokens make the lengths differ, so
// groups leave and join at different steps and some sample is always mid-way.
v1::GenerateRequest SixteenGroupsOfTwo() {
  v1::GenerateRequest req;
  for (uint64_t g = 0; g < 16; ++g) {
    auto* group = req.add_groups();
    for (int32_t id : {1, 5, static_cast<int32_t>(9 + g)}) group->add_prompt_ids(id);
    group->set_group_id(g);
    group->set_n(2);
    group->set_first_sample_id(100 * g);
    group->set_seed(31 * g);
  }
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_max_new_tokens(24);
  for (int32_t stop : {0, 1}) req.mutable_sampling()->add_stop_token_ids(stop);
  req.set_min_policy_version(-1);
  return req;
}

// Work stealing on a real worker: Rollout.Preempt takes samples out of a running stream (the
// first sample of groups 8-11, all of groups 12-15) with their tokens so far; the stream sends
// every other sample once and ends; a GenerateStream that resumes the taken ones finishes them
// to exactly the tokens the whole request gets from Generate (sampling is seeded per sample and
// position), keeping the tokens they had.
TEST_F(WeightSyncTest, PreemptedSamplesOfAStreamFinishElsewhereToTheSameTokens) {
  const v1::GenerateRequest req = SixteenGroupsOfTwo();
  v1::GenerateResponse whole;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 20);
    ASSERT_TRUE(stub_->Generate(&ctx, req, &whole).ok());
  }
  std::map<uint64_t, v1::Sample> reference;
  for (const auto& smp : whole.samples()) reference[smp.sample_id()] = smp;
  auto client = rpc::MakeGrpcRolloutClient(address_);
  std::mutex mu;
  std::vector<v1::Sample> streamed;
  std::promise<void> first;
  Status status;
  std::thread generation([&] {
    bool signalled = false;
    status = client->GenerateStream({30, nullptr}, req, [&](v1::GenerateResponse& p) {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& smp : p.samples()) streamed.push_back(smp);
      if (!signalled) first.set_value();
      signalled = true;
    });
  });
  ASSERT_EQ(first.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  v1::PreemptRequest preempt;
  for (uint64_t g = 8; g < 16; ++g) {
    preempt.add_sample_ids(100 * g);
    if (g >= 12) preempt.add_sample_ids(100 * g + 1);
  }
  v1::PreemptResponse taken;
  ASSERT_TRUE(client->Preempt({10, nullptr}, preempt, &taken).ok());
  generation.join();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_GT(taken.unfinished_size(), 0) << "everything had finished before the preempt";
  std::set<uint64_t> seen;
  for (const auto& smp : streamed) EXPECT_TRUE(seen.insert(smp.sample_id()).second);
  v1::GenerateRequest resume;
  *resume.mutable_sampling() = req.sampling();
  resume.set_min_policy_version(-1);
  for (const auto& cut : taken.unfinished()) {
    EXPECT_TRUE(seen.insert(cut.sample_id()).second) << cut.sample_id() << " streamed and taken";
    EXPECT_EQ(cut.finish_reason(), v1::FINISH_REASON_ABORT);
    EXPECT_EQ(cut.versions_size(), cut.response_ids_size());
    const v1::Sample& ref = reference.at(cut.sample_id());
    ASSERT_LT(cut.response_ids_size(), ref.response_ids_size());
    for (int t = 0; t < cut.response_ids_size(); ++t) {
      EXPECT_EQ(cut.response_ids(t), ref.response_ids(t));
    }
    *resume.add_resume() = cut;
  }
  EXPECT_EQ(seen.size(), reference.size()) << "a sample was neither streamed nor taken";
  for (const auto& smp : streamed) {
    EXPECT_EQ(smp.response_ids_size(), reference.at(smp.sample_id()).response_ids_size());
  }
  std::vector<v1::Sample> continued;
  Status s = client->GenerateStream({30, nullptr}, resume, [&](v1::GenerateResponse& p) {
    for (const auto& smp : p.samples()) continued.push_back(smp);
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(continued.size(), static_cast<size_t>(taken.unfinished_size()));
  for (const auto& smp : continued) {
    const v1::Sample& ref = reference.at(smp.sample_id());
    EXPECT_EQ(std::vector<int32_t>(smp.response_ids().begin(), smp.response_ids().end()),
              std::vector<int32_t>(ref.response_ids().begin(), ref.response_ids().end()))
        << "sample " << smp.sample_id();
    EXPECT_EQ(smp.finish_reason(), ref.finish_reason());
  }
}

// rollout.weight_updates: between_steps. A version sent while a GenerateStream runs is taken
// between two engine steps: the call goes on, and the tokens after the update carry the new
// version (samples running at that moment hold tokens of both).
TEST_F(WeightSyncTest, AWeightUpdateLandsBetweenTheStepsOfARunningStream) {
  const v1::GenerateRequest req = SixteenGroupsOfTwo();
  auto client = rpc::MakeGrpcRolloutClient(address_);
  std::mutex mu;
  std::vector<v1::GenerateResponse> parts;
  std::promise<void> first;
  Status streamed;
  std::thread generation([&] {
    streamed = client->GenerateStream({30, nullptr}, req, [&](v1::GenerateResponse& p) {
      std::lock_guard<std::mutex> lock(mu);
      parts.push_back(p);
      if (parts.size() == 1) first.set_value();
    });
  });
  ASSERT_EQ(first.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  auto sent = SendWeights(stub_.get(), payload_, 4096, 10.0);
  generation.join();
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_TRUE(streamed.ok()) << streamed;
  EXPECT_EQ(service_->version(), 3);
  ASSERT_GE(parts.size(), 2u);
  EXPECT_EQ(parts.front().policy_version(), -1);
  EXPECT_EQ(parts.back().policy_version(), 3);
  int mixed = 0, samples = 0;
  for (const auto& p : parts) {
    for (const auto& smp : p.samples()) {
      ++samples;
      ASSERT_EQ(smp.versions_size(), smp.response_ids_size());
      for (int t = 1; t < smp.versions_size(); ++t) {
        EXPECT_LE(smp.versions(t - 1), smp.versions(t)) << "sample " << smp.sample_id();
      }
      mixed += smp.versions(0) == -1 && smp.versions(smp.versions_size() - 1) == 3;
    }
  }
  EXPECT_EQ(samples, 32);
  EXPECT_GT(mixed, 0) << "no sample was running when the update landed";
}

// Concurrent GenerateStream calls share the worker's engine: a call that arrives while a long
// one runs joins its batch and ends first, instead of waiting for the long call's end; a call
// cancelled mid-way leaves the engine to the others. Each call still gets the samples Generate
// gives for its groups alone (sampling is seeded per group; log-probs differ by float rounding
// when the batch around a sample differs).
TEST_F(WeightSyncTest, ConcurrentStreamsShareTheEngineAndEndIndependently) {
  auto request = [](uint64_t first_group, int groups, int n, int max_new) {
    v1::GenerateRequest req;
    for (int k = 0; k < groups; ++k) {
      const uint64_t g = first_group + static_cast<uint64_t>(k);
      auto* group = req.add_groups();
      for (int32_t id : {2, 7, static_cast<int32_t>(3 + g % 20)}) group->add_prompt_ids(id);
      group->set_group_id(g);
      group->set_n(n);
      group->set_first_sample_id(100 * g);
      group->set_seed(17 * g + 1);
    }
    req.mutable_sampling()->set_temperature(1.0f);
    req.mutable_sampling()->set_max_new_tokens(max_new);
    req.set_min_policy_version(-1);
    return req;
  };
  auto alone = [&](const v1::GenerateRequest& req) {
    v1::GenerateResponse resp;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    EXPECT_TRUE(stub_->Generate(&ctx, req, &resp).ok());
    std::map<uint64_t, v1::Sample> out;
    for (const auto& smp : resp.samples()) out[smp.sample_id()] = smp;
    return out;
  };
  std::mutex mu;
  std::vector<std::string> order;  // whose groups arrived, in arrival order
  std::map<uint64_t, v1::Sample> streamed;
  auto expect_same = [&](const std::map<uint64_t, v1::Sample>& expected) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [id, want] : expected) {
      ASSERT_TRUE(streamed.count(id)) << "sample " << id << " was not streamed";
      const v1::Sample& got = streamed.at(id);
      EXPECT_EQ(got.response_ids_size(), want.response_ids_size()) << "sample " << id;
      for (int t = 0; t < std::min(got.response_ids_size(), want.response_ids_size()); ++t) {
        ASSERT_EQ(got.response_ids(t), want.response_ids(t)) << "sample " << id << " token " << t;
        EXPECT_EQ(got.versions(t), want.versions(t)) << "sample " << id << " token " << t;
        EXPECT_NEAR(got.logprobs(t), want.logprobs(t),
                    1e-5 * std::max(1.0f, std::fabs(want.logprobs(t))))
            << "sample " << id << " token " << t;
      }
    }
  };
  auto client = rpc::MakeGrpcRolloutClient(address_);
  // Runs `req` as a stream named `name`; `on_part(k)` runs after its k-th part with groups.
  auto run = [&](const v1::GenerateRequest& req, const std::string& name, rpc::Cancellation* c,
                 std::function<void(int)> on_part) {
    int parts = 0;
    return client->GenerateStream({30, c}, req, [&, name](v1::GenerateResponse& p) {
      if (p.samples_size() == 0) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(name);
        for (const auto& smp : p.samples()) streamed[smp.sample_id()] = smp;
      }
      if (on_part) on_part(++parts);
    });
  };

  // max_running is 8: the long call's four groups of 3 run two at a time, in two rounds, leaving
  // two sequence slots free. The short call starts once the first round is back.
  const v1::GenerateRequest long_req = request(0, 4, 3, 28), short_req = request(10, 1, 2, 3);
  const auto long_alone = alone(long_req), short_alone = alone(short_req);
  std::promise<void> first_round;
  Status long_status;
  std::thread long_call([&] {
    long_status = run(long_req, "long", nullptr, [&](int k) {
      if (k == 1) first_round.set_value();
    });
  });
  ASSERT_EQ(first_round.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const Status short_status = run(short_req, "short", nullptr, nullptr);
  long_call.join();
  ASSERT_TRUE(long_status.ok()) << long_status;
  ASSERT_TRUE(short_status.ok()) << short_status;
  ASSERT_EQ(std::count(order.begin(), order.end(), "short"), 1);
  EXPECT_NE(order.back(), "short") << "the short call waited for the long one to end";
  expect_same(long_alone);
  expect_same(short_alone);

  // A call cancelled while its groups run beside another call's: the other one goes on.
  const v1::GenerateRequest other = request(20, 4, 3, 28), doomed = request(30, 4, 2, 12);
  const auto other_alone = alone(other);
  rpc::Cancellation cancel;
  std::promise<void> second_round;
  Status other_status, doomed_status;
  std::thread other_call([&] {
    other_status = run(other, "other", nullptr, [&](int k) {
      if (k == 1) second_round.set_value();
    });
  });
  ASSERT_EQ(second_round.get_future().wait_for(std::chrono::seconds(20)),
            std::future_status::ready);
  doomed_status = run(doomed, "doomed", &cancel, [&](int) { cancel.Cancel(); });
  other_call.join();
  ASSERT_TRUE(other_status.ok()) << other_status;
  // Cancelled after its first finished group, with the others still in the engine (or, on a
  // host too slow to cancel in time, ended normally).
  EXPECT_TRUE(doomed_status.code() == StatusCode::kAborted || doomed_status.ok()) << doomed_status;
  expect_same(other_alone);
  // The cancelled call's sequences left the engine: a Generate, which needs it to itself, runs.
  const auto again = alone(short_req);
  EXPECT_EQ(again.size(), short_alone.size());
}

TEST(RolloutServiceTest, StopStringsEndResponsesAndNeedADecoder) {
  rollout::EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 32;
  auto decode = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s.push_back(static_cast<char>('a' + t));
    return s;
  };
  auto with = rollout::RolloutService::Create(model::Transformer::Create(Spec(), 5, 0.1), config,
                                              decode, nullptr);
  auto without = rollout::RolloutService::Create(model::Transformer::Create(Spec(), 5, 0.1), config,
                                                 nullptr, nullptr);
  ASSERT_TRUE(with.ok() && without.ok());
  v1::GenerateRequest req;
  auto* g = req.add_groups();
  for (int32_t id : {1, 5, 9, 12}) g->add_prompt_ids(id);
  g->set_n(1);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_new_tokens(12);
  req.set_min_policy_version(-1);
  v1::GenerateResponse full;
  grpc::ServerContext server_ctx;
  ASSERT_TRUE((*with)->Generate(&server_ctx, &req, &full).ok());
  std::string text;
  for (int32_t t : full.samples(0).response_ids()) text.push_back(static_cast<char>('a' + t));
  const std::string stop = text.substr(4, 2);
  req.mutable_sampling()->add_stop_strings(stop);
  v1::GenerateResponse stopped;
  ASSERT_TRUE((*with)->Generate(&server_ctx, &req, &stopped).ok());
  EXPECT_EQ(stopped.samples(0).finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped.samples(0).response_ids_size(), static_cast<int>(text.find(stop) + 2));
  // Both strings of a list travel in the request, and the match that ends first wins, though
  // its string comes second: here a letter's first appearance before the first string's match.
  size_t k = 1;
  while (k < 4 && text.find(text[k]) != k) ++k;
  if (k == 4) k = 0;
  req.mutable_sampling()->add_stop_strings(text.substr(k, 1));
  ASSERT_EQ(req.sampling().stop_strings_size(), 2);
  v1::GenerateResponse earlier;
  ASSERT_TRUE((*with)->Generate(&server_ctx, &req, &earlier).ok());
  EXPECT_EQ(earlier.samples(0).finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(earlier.samples(0).response_ids_size(),
            static_cast<int>(std::min(k + 1, text.find(stop) + 2)));
  v1::GenerateResponse refused;
  grpc::Status s = (*without)->Generate(&server_ctx, &req, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("stop strings need a tokenizer decoder"), std::string::npos);
}

// Found by fuzz_rollout_rpc (docs/reliability.md): a ReceiveWeights request with a timeout of
// 1e20 s overflowed the conversion to a deadline (undefined behaviour, caught by UBSan). It now
// gets as far as the store address, which this one lacks.
TEST(RolloutServiceTest, HugeReceiveTimeoutIsNotUndefinedBehaviour) {
  rollout::EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 32;
  auto service = rollout::RolloutService::Create(model::Transformer::Create(Spec(), 5, 0.1), config,
                                                 nullptr, nullptr);
  ASSERT_TRUE(service.ok()) << service.status();
  v1::ReceiveWeightsRequest req;
  req.set_group("weights-rollout-0-1");
  req.set_transport("gloo");
  req.set_timeout_s(1e20);
  v1::WeightReceipt receipt;
  grpc::ServerContext ctx;
  const grpc::Status s = (*service)->ReceiveWeights(&ctx, &req, &receipt);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("store address"), std::string::npos) << s.error_message();
  // The deadline itself: capped far in the future; NaN has already passed.
  EXPECT_GT(SecondsLeft(DeadlineAfter(1e20)), 1e8);
  EXPECT_LT(SecondsLeft(DeadlineAfter(-1e20)), -1e8);
  EXPECT_LE(SecondsLeft(DeadlineAfter(std::nan(""))), 0.0);
}

}  // namespace
}  // namespace gyre::comm
