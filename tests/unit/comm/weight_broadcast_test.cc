// Bucketed weight publishing over real Gloo groups on loopback (one thread per rank).
#include "comm/weight_broadcast.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "comm/gloo_communicator.h"
#include "comm/sliced_payload.h"
#include "comm/weight_sender.h"
#include "common/crc32.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "testing/tiny_model.h"

namespace gyre::comm {
namespace {

class WeightBroadcastTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StoreServer::Start("127.0.0.1");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    auto m = model::Transformer::Create(testing::TinySpec(40, 32, 2, 4, 2, 64), 77, 0.1);
    payload_.version = 5;
    payload_.bytes = model::FlattenParameters(m->NamedParameters(), &payload_.manifest);
  }

  // root(comm) on rank 0, receiver(rank, comm) on ranks 1..size-1.
  void Run(const std::string& group, int size, const std::function<void(Communicator*)>& root,
           const std::function<void(int, Communicator*)>& receiver) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        GlooOptions o;
        o.store_address = store_->address();
        o.group = group;
        o.rank = r;
        o.size = size;
        o.connect_timeout_s = 20;
        auto c = CreateGlooCommunicator(o);
        ASSERT_TRUE(c.ok()) << c.status();
        if (r == 0) {
          root(c->get());
        } else {
          receiver(r, c->get());
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  std::unique_ptr<StoreServer> store_;
  WeightPayload payload_;
};

TEST_F(WeightBroadcastTest, EveryReceiverGetsTheExactVersionAndAMatchingReceipt) {
  const int64_t bucket = 4096;
  const size_t expect_buckets = (payload_.bytes.size() + bucket - 1) / bucket;
  ASSERT_GT(expect_buckets, 3u);
  std::vector<uint32_t> sent;
  std::vector<Receipt> receipts(3);
  std::vector<WeightPayload> got(3);
  Run(
      "ok", 3,
      [&](Communicator* c) {
        auto r = PublishWeights(c, payload_, bucket, DeadlineAfter(30));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->version, 5);
        EXPECT_EQ(r->receivers, 2);
        EXPECT_EQ(r->bucket_crc32.size(), expect_buckets);
        sent = r->bucket_crc32;
        ASSERT_TRUE(PublishEndOfStream(c, DeadlineAfter(30)).ok());
      },
      [&](int rank, Communicator* c) {
        auto r = ReceivePublishedWeights(c, 0, DeadlineAfter(30), &got[rank]);
        ASSERT_TRUE(r.ok()) << r.status();
        receipts[rank] = *r;
        auto end = ReceivePublishedWeights(c, 0, DeadlineAfter(30), &got[rank]);
        EXPECT_EQ(end.status().code(), StatusCode::kOutOfRange) << end.status();
      });
  for (int rank : {1, 2}) {
    EXPECT_EQ(receipts[rank].version, 5);
    EXPECT_EQ(receipts[rank].bytes, payload_.bytes.size());
    EXPECT_EQ(receipts[rank].bucket_crc32, sent);
    EXPECT_EQ(got[rank].bytes, payload_.bytes);
    EXPECT_EQ(got[rank].version, 5);
    ASSERT_EQ(got[rank].manifest.size(), payload_.manifest.size());
    for (size_t i = 0; i < payload_.manifest.size(); ++i) {
      EXPECT_EQ(got[rank].manifest[i].name, payload_.manifest[i].name);
      EXPECT_EQ(got[rank].manifest[i].shape, payload_.manifest[i].shape);
      EXPECT_EQ(got[rank].manifest[i].offset, payload_.manifest[i].offset);
    }
  }
  // The checksums are the CRC-32 of each bucket.
  EXPECT_EQ(sent[1], Crc32(payload_.bytes.data() + bucket, bucket));
}

TEST_F(WeightBroadcastTest, CorruptedBucketIsCaughtByItsChecksumOnBothSides) {
  Run(
      "corrupt", 3,
      [&](Communicator* c) {
        auto r = PublishWeights(c, payload_, 4096, DeadlineAfter(30), /*corrupt_bucket=*/2);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
        EXPECT_NE(r.status().message().find("2 of 2 receivers did not confirm version 5"),
                  std::string::npos)
            << r.status();
        // The group stays usable: the next version goes through.
        WeightPayload next = payload_;
        next.version = 6;
        EXPECT_TRUE(PublishWeights(c, next, 4096, DeadlineAfter(30)).ok());
      },
      [&](int, Communicator* c) {
        WeightPayload got;
        auto r = ReceivePublishedWeights(c, 0, DeadlineAfter(30), &got);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
        EXPECT_NE(r.status().message().find("bucket 2 of version 5"), std::string::npos)
            << r.status();
        auto again = ReceivePublishedWeights(c, 0, DeadlineAfter(30), &got);
        ASSERT_TRUE(again.ok()) << again.status();
        EXPECT_EQ(again->version, 6);
        EXPECT_EQ(got.bytes, payload_.bytes);
      });
}

// Bucket by bucket without holding the version: the buckets come in payload order through one
// bucket-sized buffer and add up to the version; a corrupted bucket, a refused manifest and a
// bucket the caller cannot take fail the version on both sides (the callbacks' own errors as they
// are) and leave the group in step for the next one.
TEST_F(WeightBroadcastTest, BucketsArriveInOrderThroughOneBufferAndFailuresKeepTheGroupInStep) {
  const int64_t bucket = 1000;
  enum Case { kWhole, kCorrupt, kRefused, kStopped, kAfter };
  const std::vector<Case> cases = {kWhole, kCorrupt, kRefused, kStopped, kAfter};
  std::vector<Status> root_results(cases.size());
  Run(
      "buckets", 2,
      [&](Communicator* c) {
        for (size_t i = 0; i < cases.size(); ++i) {
          WeightPayload v = payload_;
          v.version = 10 + static_cast<int64_t>(i);
          auto r = PublishWeights(c, v, bucket, DeadlineAfter(30), cases[i] == kCorrupt ? 3 : -1);
          root_results[i] = r.status();
        }
      },
      [&](int, Communicator* c) {
        for (size_t i = 0; i < cases.size(); ++i) {
          const Case k = cases[i];
          const std::string what = "case " + std::to_string(k);
          std::vector<uint8_t> got;
          const uint8_t* buffer = nullptr;
          int calls = 0;
          int64_t version = -1;
          auto r = ReceivePublishedBuckets(
              c, 0, DeadlineAfter(30),
              [&](int64_t v, const std::vector<model::TensorEntry>& manifest, uint64_t total) {
                version = v;
                EXPECT_EQ(manifest.size(), payload_.manifest.size()) << what;
                EXPECT_EQ(total, payload_.bytes.size()) << what;
                return k == kRefused ? FailedPrecondition("no room for it") : Status::Ok();
              },
              [&](uint64_t offset, const uint8_t* data, size_t size) {
                ++calls;
                EXPECT_EQ(offset, got.size()) << what;
                EXPECT_LE(size, static_cast<size_t>(bucket)) << what;
                if (buffer == nullptr) buffer = data;
                EXPECT_EQ(data, buffer) << what << ": every bucket lands in the same buffer";
                got.insert(got.end(), data, data + size);
                return k == kStopped && calls == 2 ? Aborted("stop here") : Status::Ok();
              });
          EXPECT_EQ(version, 10 + static_cast<int64_t>(i)) << what;
          const size_t buckets = (payload_.bytes.size() + bucket - 1) / bucket;
          switch (k) {
            case kWhole:
            case kAfter:
              ASSERT_TRUE(r.ok()) << what << ": " << r.status();
              EXPECT_EQ(got, payload_.bytes) << what;
              EXPECT_EQ(r->bucket_crc32.size(), buckets) << what;
              break;
            case kCorrupt:
              EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what << ": " << r.status();
              EXPECT_NE(r.status().message().find("bucket 3 of version 11"), std::string::npos)
                  << r.status();
              EXPECT_EQ(calls, static_cast<int>(buckets)) << what;
              break;
            case kRefused:
              EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
              EXPECT_EQ(calls, 0) << what;
              break;
            case kStopped:
              EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status();
              EXPECT_EQ(calls, 2) << what;
              break;
          }
        }
      });
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool ok = cases[i] == kWhole || cases[i] == kAfter;
    EXPECT_EQ(root_results[i].ok(), ok) << "case " << cases[i] << ": " << root_results[i];
    if (!ok) EXPECT_EQ(root_results[i].code(), StatusCode::kDataLoss) << root_results[i];
  }
}

TEST_F(WeightBroadcastTest, OneBucketAndUnevenLastBucket) {
  for (int64_t bucket : {int64_t{1} << 30, int64_t{1000}}) {
    Run(
        "sizes" + std::to_string(bucket), 2,
        [&](Communicator* c) {
          auto r = PublishWeights(c, payload_, bucket, DeadlineAfter(30));
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_EQ(r->bucket_crc32.size(), (payload_.bytes.size() + bucket - 1) / bucket);
        },
        [&](int, Communicator* c) {
          WeightPayload got;
          auto r = ReceivePublishedWeights(c, 0, DeadlineAfter(30), &got);
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_EQ(got.bytes, payload_.bytes);
        });
  }
}

TEST_F(WeightBroadcastTest, BadArgumentsChangeNothing) {
  Run(
      "args", 2,
      [&](Communicator* c) {
        EXPECT_EQ(PublishWeights(c, payload_, 0, DeadlineAfter(5)).status().code(),
                  StatusCode::kInvalidArgument);
        WeightPayload root_payload;
        EXPECT_EQ(ReceivePublishedWeights(c, 0, DeadlineAfter(5), &root_payload).status().code(),
                  StatusCode::kInvalidArgument);
        EXPECT_FALSE(c->aborted());
        ASSERT_TRUE(PublishEndOfStream(c, DeadlineAfter(10)).ok());
      },
      [&](int, Communicator* c) {
        WeightPayload got;
        EXPECT_EQ(ReceivePublishedWeights(c, 0, DeadlineAfter(10), &got).status().code(),
                  StatusCode::kOutOfRange);
      });
}

// A receiver that leaves the group between versions (its process group destroyed, connections
// closed cleanly) is never counted as having received the next one.
TEST_F(WeightBroadcastTest, ReceiverThatLeftIsNotCountedAsConfirmed) {
  std::atomic<bool> left{false};
  Run(
      "left", 2,
      [&](Communicator* c) {
        ASSERT_TRUE(PublishWeights(c, payload_, 4096, DeadlineAfter(30)).ok());
        while (!left) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        WeightPayload next = payload_;
        next.version = 6;
        const auto t0 = std::chrono::steady_clock::now();
        auto r = PublishWeights(c, next, 4096, DeadlineAfter(10));
        EXPECT_FALSE(r.ok());
        EXPECT_TRUE(r.status().code() == StatusCode::kDataLoss ||
                    r.status().code() == StatusCode::kUnavailable)
            << r.status();
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  5.0);
      },
      [&](int, Communicator* c) {
        WeightPayload got;
        ASSERT_TRUE(ReceivePublishedWeights(c, 0, DeadlineAfter(30), &got).ok());
        left = true;  // returning destroys this member's communicator
      });
}

// A receiver that stops taking part: the publish fails at its deadline, not later.
TEST_F(WeightBroadcastTest, PublishToASilentReceiverEndsAtTheDeadline) {
  Run(
      "silent", 2,
      [&](Communicator* c) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = PublishWeights(c, payload_, 4096, DeadlineAfter(1.0));
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
        EXPECT_LT(took, 2.5);
      },
      [&](int, Communicator*) { std::this_thread::sleep_for(std::chrono::seconds(3)); });
}

// Rank `rank` of `size`'s slices, as SlicedPayload must lay them out: every entry of `got`'s
// manifest is the slice model/tensor_parallel.h cuts from `whole[name]` (converted to the
// entry's dtype), at its offset in `bytes`, and the entries tile `bytes` exactly.
void ExpectSlices(const std::map<std::string, at::Tensor>& whole,
                  const std::vector<model::TensorEntry>& manifest, const uint8_t* bytes,
                  uint64_t size, int rank, int ranks) {
  ASSERT_EQ(manifest.size(), whole.size());
  uint64_t covered = 0;
  for (const model::TensorEntry& e : manifest) {
    ASSERT_TRUE(whole.count(e.name)) << e.name;
    auto dtype = model::ParseWeightDtype(e.dtype);
    ASSERT_TRUE(dtype.ok());
    const at::Tensor want =
        model::TensorParallelSliceOf(e.name, whole.at(e.name).to(*dtype), rank, ranks).contiguous();
    EXPECT_EQ(e.shape, want.sizes().vec()) << e.name << " on rank " << rank << " of " << ranks;
    ASSERT_EQ(e.nbytes, static_cast<uint64_t>(want.nbytes())) << e.name;
    ASSERT_LE(e.offset + e.nbytes, size) << e.name;
    EXPECT_EQ(std::memcmp(bytes + e.offset, want.data_ptr(), e.nbytes), 0)
        << e.name << " on rank " << rank << " of " << ranks;
    covered += e.nbytes;
  }
  EXPECT_EQ(covered, size);
}

// Vocabulary rows that split unevenly over 3 (1031 = 344 + 344 + 343), rows (q_proj) and columns
// (o_proj, down_proj) that split evenly, a replicated norm, tensors over kSlicePieceBytes (read
// in several pieces) and under it; float32 and bfloat16; from a whole payload and from a
// streamed one read by every rank as its own reader.
TEST(SlicedPayloadTest, EachRankGetsExactlyItsSlicesOfAWholeOrAStreamedPayload) {
  at::manual_seed(3);
  std::map<std::string, at::Tensor> whole = {
      {"model.embed_tokens.weight", at::randn({1031, 1024})},
      {"model.layers.0.self_attn.q_proj.weight", at::randn({6, 8})},
      {"model.layers.0.self_attn.q_proj.bias", at::randn({6})},
      {"model.layers.0.self_attn.o_proj.weight", at::randn({8, 6})},
      {"model.layers.0.mlp.down_proj.weight", at::randn({9, 150006})},
      {"model.norm.weight", at::randn({8})},
  };
  ASSERT_GT(whole.at("model.embed_tokens.weight").nbytes(), kSlicePieceBytes);
  ASSERT_GT(whole.at("model.layers.0.mlp.down_proj.weight").nbytes(), kSlicePieceBytes);
  model::NamedTensors named(whole.begin(), whole.end());
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    WeightPayload flat;
    flat.version = 9;
    flat.bytes = model::FlattenParameters(named, &flat.manifest, dtype);
    for (int ranks : {1, 2, 3}) {
      // The same bytes as a stream of two pieces that every rank reads as its own reader.
      WeightPayload streamed;
      streamed.version = 9;
      streamed.manifest = flat.manifest;
      const uint64_t half = flat.bytes.size() / 2;
      streamed.stream = std::make_shared<PayloadStream>(
          flat.bytes.size(), std::vector<uint64_t>{0, half},
          [&](size_t piece, std::vector<uint8_t>* bytes) {
            const uint64_t begin = piece == 0 ? 0 : half;
            const uint64_t end = piece == 0 ? half : flat.bytes.size();
            bytes->assign(flat.bytes.begin() + begin, flat.bytes.begin() + end);
            return Status::Ok();
          },
          ranks);
      for (const WeightPayload* source : {&flat, &streamed}) {
        for (int rank = 0; rank < ranks; ++rank) {
          auto sliced = SlicedPayload(*source, rank, rank, ranks);
          ASSERT_TRUE(sliced.ok()) << sliced.status();
          EXPECT_EQ(sliced->version, 9);
          ASSERT_TRUE(sliced->stream);
          std::vector<uint8_t> bytes(sliced->size());
          ASSERT_TRUE(sliced->stream->Read(0, 0, bytes.size(), bytes.data()).ok());
          ExpectSlices(whole, sliced->manifest, bytes.data(), bytes.size(), rank, ranks);
          if (source->stream) source->stream->Finish(rank);
        }
      }
    }
  }
  // down_proj's 150006 columns (and q_proj's 6 rows) do not split over 4 ranks: refused, naming
  // the first such tensor of the payload.
  WeightPayload flat;
  flat.bytes = model::FlattenParameters(named, &flat.manifest);
  auto refused = SlicedPayload(flat, 0, 0, 4);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "model.layers.0.mlp.down_proj.weight: [9, 150006] does not split over 4"),
            std::string::npos)
      << refused.status();
}

// WeightSender over gloo to a receiver of 2 tensor-parallel ranks: each rank joins its own group
// and receives exactly its slices (no byte it does not keep), checksummed, and the trainer's
// result carries rank 0's bucket checksums then rank 1's, as the receipts do.
TEST_F(WeightBroadcastTest, ATensorParallelReceiverTakesItsSlicesRankByRank) {
  auto m = model::Transformer::Create(testing::TinySpec(40, 32, 2, 4, 2, 64), 77, 0.1);
  std::map<std::string, at::Tensor> whole;
  for (const auto& [name, t] : m->NamedParameters()) whole[name] = t.detach().clone();
  v1::PublishWeightsRequest req;
  req.set_version(5);
  req.set_transport("gloo");
  req.set_store_address(store_->address());
  req.add_groups("worker");
  req.add_rollout_ids("rollout-0");
  req.add_rollout_addresses("unused");
  req.set_bucket_bytes(1024);
  req.set_timeout_s(30);
  req.set_receiver_tensor_parallel(2);
  WeightSender sender;
  v1::PublishWeightsResponse resp;
  Status published;
  std::vector<WeightPayload> got(2);
  std::vector<StatusOr<Receipt>> receipts(2, Unavailable("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { published = sender.PublishHost(req, payload_, &resp); });
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions o;
      o.store_address = store_->address();
      o.group = "worker-tp" + std::to_string(rank);
      o.rank = 1;
      o.size = 2;
      o.connect_timeout_s = 20;
      auto c = CreateGlooCommunicator(o);
      ASSERT_TRUE(c.ok()) << c.status();
      receipts[rank] = ReceivePublishedWeights(c->get(), 0, DeadlineAfter(30), &got[rank]);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(published.ok()) << published;
  ASSERT_EQ(resp.results_size(), 1);
  ASSERT_TRUE(resp.results(0).ok()) << resp.results(0).error();
  std::vector<uint32_t> received_crcs;
  uint64_t received = 0;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(receipts[rank].ok()) << receipts[rank].status();
    EXPECT_EQ(receipts[rank]->version, 5);
    ExpectSlices(whole, got[rank].manifest, got[rank].bytes.data(), got[rank].bytes.size(), rank,
                 2);
    received_crcs.insert(received_crcs.end(), receipts[rank]->bucket_crc32.begin(),
                         receipts[rank]->bucket_crc32.end());
    received += got[rank].bytes.size();
  }
  const auto& sent = resp.results(0).sent_crc32();
  EXPECT_EQ(std::vector<uint32_t>(sent.begin(), sent.end()), received_crcs);
  // Everything once, except the replicated norms, which both ranks keep.
  uint64_t replicated = 0;
  for (const auto& [name, t] : whole) {
    if (model::TensorParallelDim(name) < 0) replicated += static_cast<uint64_t>(t.nbytes());
  }
  EXPECT_EQ(received, payload_.bytes.size() + replicated);
}

}  // namespace
}  // namespace gyre::comm
