// GlooCommunicator with real TCP on loopback: each rank runs on its own thread with its own
// ProcessGroupGloo, meeting through a real StoreServer on an OS-chosen port.
#include "comm/gloo_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace gyre::comm {
namespace {

double Elapsed(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class GlooTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StoreServer::Start("127.0.0.1");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }

  GlooOptions Options(const std::string& group, int rank, int size) {
    GlooOptions o;
    o.store_address = store_->address();
    o.group = group;
    o.rank = rank;
    o.size = size;
    o.connect_timeout_s = 20;
    return o;
  }

  // Runs body(rank, comm) on `size` threads, each with its own communicator.
  void RunRanks(const std::string& group, int size,
                const std::function<void(int, Communicator*)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        auto c = CreateGlooCommunicator(Options(group, r, size));
        ASSERT_TRUE(c.ok()) << c.status();
        EXPECT_EQ((*c)->rank(), r);
        EXPECT_EQ((*c)->size(), size);
        body(r, c->get());
      });
    }
    for (auto& t : threads) t.join();
  }

  std::unique_ptr<StoreServer> store_;
};

TEST_F(GlooTest, StoreListensOnAnOsChosenLoopbackPort) {
  EXPECT_GT(store_->port(), 0);
  EXPECT_EQ(store_->address(), "127.0.0.1:" + std::to_string(store_->port()));
  auto second = StoreServer::Start("127.0.0.1");
  ASSERT_TRUE(second.ok());
  EXPECT_NE((*second)->port(), store_->port());
}

TEST_F(GlooTest, StoreHandsAValueToAnotherClientAndTimesOutOnAMissingKey) {
  // The value is binary (an NCCL unique id is 128 raw bytes, zeros included).
  std::string secret(128, '\0');
  for (size_t i = 0; i < secret.size(); i += 3) secret[i] = static_cast<char>(i);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ASSERT_TRUE(StoreSet(store_->address(), "weights/rollout-0/nccl_id", secret, 10).ok());
  });
  auto got = StoreGet(store_->address(), "weights/rollout-0/nccl_id", 10);  // waits for the set
  late.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, secret);
  const auto t0 = std::chrono::steady_clock::now();
  auto missing = StoreGet(store_->address(), "never/set", 0.5);
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
  EXPECT_FALSE(StoreGet("127.0.0.1", "k", 1).ok());  // not HOST:PORT
}

TEST_F(GlooTest, BroadcastAllReduceAndBarrierAcrossThreeRanks) {
  RunRanks("basic", 3, [](int rank, Communicator* c) {
    // Broadcast from rank 1: everyone ends with rank 1's bytes.
    std::vector<uint8_t> data(1 << 20);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(rank * 31 + i * 7);
    ASSERT_TRUE(c->Broadcast(data.data(), data.size(), 1, DeadlineAfter(20)).ok());
    for (size_t i = 0; i < data.size(); i += 4099) {
      ASSERT_EQ(data[i], static_cast<uint8_t>(31 + i * 7)) << "rank " << rank << " byte " << i;
    }
    // Sum all-reduce: element i ends as sum over ranks of (rank + 1) * i.
    std::vector<float> f(1000);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>((rank + 1) * i);
    ASSERT_TRUE(c->AllReduceSum(f.data(), f.size(), DataType::kFloat32, DeadlineAfter(20)).ok());
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(f[i], static_cast<float>(6 * i));
    std::vector<double> d = {0.5 * rank, 1.0};
    ASSERT_TRUE(c->AllReduceSum(d.data(), d.size(), DataType::kFloat64, DeadlineAfter(20)).ok());
    EXPECT_EQ(d[0], 1.5);
    EXPECT_EQ(d[1], 3.0);
    // bfloat16 (what data-parallel gradients may use): 1.5 * (1 + 2 + 3) is exact in bf16.
    const uint16_t bf16_1_5 = 0x3FC0;  // 1.5 = 0x3FC00000 as float32
    std::vector<uint16_t> h(8, static_cast<uint16_t>(rank == 0 ? bf16_1_5 : 0x0000));
    if (rank == 1) std::fill(h.begin(), h.end(), static_cast<uint16_t>(0x4040));  // 3.0
    if (rank == 2) std::fill(h.begin(), h.end(), static_cast<uint16_t>(0x4090));  // 4.5
    ASSERT_TRUE(c->AllReduceSum(h.data(), h.size(), DataType::kBFloat16, DeadlineAfter(20)).ok());
    for (uint16_t v : h) EXPECT_EQ(v, 0x4110);  // 9.0
    EXPECT_TRUE(c->Barrier(DeadlineAfter(20)).ok());
    EXPECT_FALSE(c->aborted());
  });
}

TEST_F(GlooTest, ReduceScatterAndAllGatherAcrossThreeRanks) {
  RunRanks("scatter-gather", 3, [](int rank, Communicator* c) {
    // Reduce-scatter: rank r's input element i is (r + 1) * i + r; rank r receives elements
    // [r * count, (r + 1) * count) summed over ranks: 6 * i + 3.
    const size_t count = 1001;
    std::vector<float> in(3 * count), out(count, -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((rank + 1) * i + rank);
    const Status rs =
        c->ReduceScatterSum(in.data(), out.data(), count, DataType::kFloat32, DeadlineAfter(20));
    ASSERT_TRUE(rs.ok()) << rs;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out[i], static_cast<float>(6 * (rank * count + i) + 3)) << "rank " << rank;
    }
    // All-gather: slot r of every rank's output holds rank r's input.
    std::vector<double> mine(5), all(15, -1.0);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 10.0 * rank + static_cast<double>(i);
    const Status ag =
        c->AllGather(mine.data(), all.data(), mine.size(), DataType::kFloat64, DeadlineAfter(20));
    ASSERT_TRUE(ag.ok()) << ag;
    for (int r = 0; r < 3; ++r) {
      for (size_t i = 0; i < 5; ++i) EXPECT_EQ(all[r * 5 + i], 10.0 * r + static_cast<double>(i));
    }
    EXPECT_FALSE(c->aborted());
  });
}

// An all-gather and a reduce-scatter larger than one segment of the communicator (8 MiB of all
// ranks' parts): 3 ranks of 1,000,003 float32 each go in two segments, the second one short,
// and land in rank order.
TEST_F(GlooTest, LargeAllGatherAndReduceScatterGoInSegmentsIntoRankOrder) {
  RunRanks("large-gather", 3, [](int rank, Communicator* c) {
    const size_t count = 1000003;
    std::vector<float> mine(count), all(3 * count, -1.0f);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(rank * 4000000 + i);
    const Status s =
        c->AllGather(mine.data(), all.data(), count, DataType::kFloat32, DeadlineAfter(30));
    ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < 3; ++r) {
      for (size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(all[r * count + i], static_cast<float>(r * 4000000 + i)) << r << " " << i;
      }
      ASSERT_EQ(all[r * count + count - 1], static_cast<float>(r * 4000000 + count - 1)) << r;
    }
    // Reduce-scatter: element j of every rank's input is j % 4000000 plus the rank (sums stay
    // exact in float32), so rank r receives 3 * ((r * count + i) % 4000000) + 0 + 1 + 2.
    for (size_t j = 0; j < all.size(); ++j) all[j] = static_cast<float>(j % 4000000 + rank);
    std::vector<float> sum(count, -1.0f);
    const Status rs =
        c->ReduceScatterSum(all.data(), sum.data(), count, DataType::kFloat32, DeadlineAfter(30));
    ASSERT_TRUE(rs.ok()) << rs;
    auto want = [&](size_t i) {
      return static_cast<float>(3 * ((rank * count + i) % 4000000) + 3);
    };
    for (size_t i = 0; i < count; i += 991) ASSERT_EQ(sum[i], want(i)) << rank << " " << i;
    ASSERT_EQ(sum[count - 1], want(count - 1));
  });
}

// Scatter from rank 1: every rank, the root included, ends with its own part of the root's input;
// the others pass no input. A root outside the group is refused.
TEST_F(GlooTest, ScatterHandsEachRankItsPartAcrossThreeRanks) {
  RunRanks("scatter", 3, [](int rank, Communicator* c) {
    const size_t bytes = 70001;  // odd: the parts are not aligned to anything
    std::vector<uint8_t> in;
    if (rank == 1) {
      in.resize(3 * bytes);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 13 + i / bytes);
    }
    std::vector<uint8_t> out(bytes, 0xEE);
    const Status s =
        c->Scatter(rank == 1 ? in.data() : nullptr, out.data(), bytes, 1, DeadlineAfter(20));
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < bytes; ++i) {
      const size_t at = rank * bytes + i;
      ASSERT_EQ(out[i], static_cast<uint8_t>(at * 13 + at / bytes)) << "rank " << rank << " " << i;
    }
    EXPECT_EQ(c->Scatter(nullptr, out.data(), bytes, 3, DeadlineAfter(20)).code(),
              StatusCode::kInvalidArgument);
    EXPECT_FALSE(c->aborted());
  });
}

// Many groups in one process whose ranks start their first collectives at the same moment
// (the data-parallel bench and in-process tests do this). libtorch 2.11's flight recorder adds
// each new group to a map outside its lock there, which corrupted the map one run in ~20 (a
// crash or a spin forever); Gyre turns the recorder off before the first group exists.
TEST_F(GlooTest, ManyGroupsStartingTogetherInOneProcess) {
  constexpr int kRounds = 15;
  constexpr int kGroups = 4;
  constexpr int kRanks = 2;
  for (int round = 0; round < kRounds; ++round) {
    // Every rank of every group connects, then all release their first all-reduce at once.
    std::atomic<int> connected{0};
    std::vector<std::thread> threads;
    for (int g = 0; g < kGroups; ++g) {
      for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, g, r] {
          const std::string group = "many-" + std::to_string(round) + "-" + std::to_string(g);
          auto c = CreateGlooCommunicator(Options(group, r, kRanks));
          connected.fetch_add(1);
          ASSERT_TRUE(c.ok()) << c.status();
          while (connected.load() < kGroups * kRanks) std::this_thread::yield();
          for (int k = 0; k < 3; ++k) {
            std::vector<float> f(64, static_cast<float>(r + 1));
            const Status st =
                (*c)->AllReduceSum(f.data(), f.size(), DataType::kFloat32, DeadlineAfter(20));
            ASSERT_TRUE(st.ok()) << st;
            for (float v : f) ASSERT_EQ(v, 3.0f);
          }
        });
      }
    }
    for (auto& t : threads) t.join();
  }
}

TEST_F(GlooTest, BadOptionsAreRejected) {
  auto o = Options("bad", 2, 2);
  EXPECT_EQ(CreateGlooCommunicator(o).status().code(), StatusCode::kInvalidArgument);
  o = Options("", 0, 1);
  EXPECT_EQ(CreateGlooCommunicator(o).status().code(), StatusCode::kInvalidArgument);
  o = Options("bad", 0, 1);
  o.store_address = "no-port";
  EXPECT_EQ(CreateGlooCommunicator(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GlooTest, MissingMemberFailsWithinTheConnectTimeout) {
  auto o = Options("missing", 0, 2);
  o.connect_timeout_s = 2;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = CreateGlooCommunicator(o);
  ASSERT_FALSE(c.ok());
  EXPECT_LT(Elapsed(t0), 15.0);
  EXPECT_NE(c.status().message().find("missing"), std::string::npos) << c.status();
}

// A peer that never joins the collective: the call ends at its deadline, and the communicator
// refuses further work.
TEST_F(GlooTest, DeadlineExpiresWhenAPeerDoesNotTakePart) {
  RunRanks("deadline", 2, [](int rank, Communicator* c) {
    if (rank == 1) {
      // Stays connected but never calls the broadcast; waits long enough for rank 0 to expire
      // (leaving earlier would close its connections, which is a different test).
      std::this_thread::sleep_for(std::chrono::seconds(6));
      return;
    }
    std::vector<uint8_t> data(1 << 16, 1);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = c->Broadcast(data.data(), data.size(), 1, DeadlineAfter(1.0));
    const double took = Elapsed(t0);
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
    EXPECT_GT(took, 0.9);
    EXPECT_LT(took, 4.0);  // slack for a loaded machine; the peer stays silent for 6 s
    EXPECT_TRUE(c->aborted());
    EXPECT_EQ(c->Barrier(DeadlineAfter(5)).code(), StatusCode::kAborted);
  });
}

TEST_F(GlooTest, AbortFromAnotherThreadEndsAWaitingCall) {
  RunRanks("abort", 2, [](int rank, Communicator* c) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(8));
      return;
    }
    std::thread aborter([c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c->Abort();
    });
    std::vector<uint8_t> data(1024);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = c->Broadcast(data.data(), data.size(), 1, DeadlineAfter(6));
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
    EXPECT_LT(Elapsed(t0), 3.0);  // Abort at 0.3 s, far before the 6 s deadline
    aborter.join();
  });
}

// Within a pair, a broadcast is a send and a receive whose wait Abort() ends inside Gloo: the
// sender of a payload far larger than the socket buffers, to a peer that never receives (a host
// that is gone), returns promptly, after which Gloo no longer reads the payload, so it may be
// freed while the peer is still connected.
TEST_F(GlooTest, AbortEndsAPairsSendAndReleasesThePayload) {
  std::atomic<bool> sender_done{false};
  RunRanks("abort-send", 2, [&](int rank, Communicator* c) {
    if (rank == 1) {
      while (!sender_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // stays connected
      return;
    }
    auto payload = std::make_unique<std::vector<uint8_t>>(size_t{96} << 20, 7);
    std::thread aborter([c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c->Abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    Status s = c->Broadcast(payload->data(), payload->size(), 0, DeadlineAfter(30));
    const double took = Elapsed(t0);
    aborter.join();
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
    EXPECT_LT(took, 5.0);  // Abort at 0.3 s, far before the 30 s deadline
    EXPECT_TRUE(c->aborted());
    payload.reset();  // freed while the peer is still connected
    uint8_t more[16] = {};
    EXPECT_EQ(c->Broadcast(more, sizeof(more), 0, DeadlineAfter(5)).code(), StatusCode::kAborted);
    sender_done = true;
  });
}

// A pair's broadcast carries the root's bytes, both ways round, with several in a row.
TEST_F(GlooTest, PairBroadcastsInEitherDirectionArriveInOrder) {
  RunRanks("pair", 2, [](int rank, Communicator* c) {
    for (int round = 0; round < 4; ++round) {
      const int root = round % 2;
      std::vector<int32_t> data(1000 + round, rank == root ? 100 * round + root : -1);
      ASSERT_TRUE(
          c->Broadcast(data.data(), data.size() * sizeof(int32_t), root, DeadlineAfter(20)).ok());
      for (int32_t v : data) ASSERT_EQ(v, 100 * round + root) << "round " << round;
    }
  });
}

// A peer that leaves (its process group destroyed, connections closed cleanly) never makes the
// survivor hang. Note what Gloo does here: the survivor's collectives may complete at once as if
// the peer had taken part (seen with libtorch 2.11: broadcast, barrier, and a sum all-reduce that
// returns only the local value). Callers must rely on positive acknowledgements, as
// PublishWeights does (weight_broadcast_test: ReceiverThatLeftIsNotCountedAsConfirmed).
TEST_F(GlooTest, PeerThatLeavesTheGroupDoesNotCauseAHang) {
  std::atomic<bool> left{false};
  RunRanks("leave", 2, [&](int rank, Communicator* c) {
    if (rank == 1) {
      left = true;
      return;  // destroys this member's process group: its sockets close
    }
    while (!left) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<uint8_t> data(1 << 20, 1);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = c->Broadcast(data.data(), data.size(), 0, DeadlineAfter(10));
    if (s.ok()) s = c->Barrier(DeadlineAfter(10));
    float v = 1;
    if (s.ok()) s = c->AllReduceSum(&v, 1, DataType::kFloat32, DeadlineAfter(10));
    EXPECT_LT(Elapsed(t0), 5.0) << s;
  });
}

}  // namespace
}  // namespace gyre::comm
