// Weight publishing to real receiver processes over Gloo on loopback, one two-member group per
// receiver: a receiver killed during a publish is detected at once, the publish completes for the
// other within its deadline, and a restarted receiver (a new group) catches up to the current
// version. The receivers are this test binary, re-executed with GYRE_FANOUT_* set.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sender.h"
#include "common/file_util.h"
#include "common/subprocess.h"

namespace gyre::comm {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Receiver half: joins its group as rank 1 and receives versions until the stream ends. Each
// verified receipt is appended to $GYRE_FANOUT_OUT as "version crc crc ...". With
// GYRE_FANOUT_STALL_AT=v it stops taking part when version v is published (it just sleeps), so
// the parent can kill it while that publish is in progress.
TEST(WeightFanoutChild, Receive) {
  const char* store = std::getenv("GYRE_FANOUT_STORE");
  if (store == nullptr) GTEST_SKIP() << "receiver half of WeightFanoutTest";
  const char* stall = std::getenv("GYRE_FANOUT_STALL_AT");
  const int64_t stall_at = stall ? std::atoll(stall) : -1;
  GlooOptions o;
  o.store_address = store;
  o.group = std::getenv("GYRE_FANOUT_GROUP");
  o.rank = 1;
  o.size = 2;
  auto c = CreateGlooCommunicator(o);
  ASSERT_TRUE(c.ok()) << c.status();
  WeightPayload payload;
  for (int64_t expected = 1;; ++expected) {
    // Versions are published in order; the one that is announced next is known in advance.
    if (expected == stall_at) std::this_thread::sleep_for(std::chrono::hours(1));
    auto r = ReceivePublishedWeights(c->get(), 0, DeadlineAfter(60), &payload);
    if (r.status().code() == StatusCode::kOutOfRange) return;
    ASSERT_TRUE(r.ok()) << r.status();
    std::ofstream out(std::getenv("GYRE_FANOUT_OUT"), std::ios::app);
    out << r->version;
    for (uint32_t crc : r->bucket_crc32) out << " " << crc;
    out << "\n";
    expected = r->version;
  }
}

class WeightFanoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDirectory() + "/gyre_fanout_" + std::to_string(::getpid());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    auto s = StoreServer::Start("127.0.0.1");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    payload_.bytes.resize(48 << 20);
    for (size_t i = 0; i < payload_.bytes.size(); ++i) payload_.bytes[i] = (i * 2654435761u) >> 13;
    model::TensorEntry e;
    e.name = "w";
    e.shape = {static_cast<int64_t>(payload_.bytes.size())};
    e.dtype = "uint8";
    e.nbytes = payload_.bytes.size();
    payload_.manifest = {e};
  }
  void TearDown() override {
    for (pid_t pid : pids_) TerminateProcess(pid, 2);
    (void)RemoveTree(dir_);
  }

  // Starts a receiver process for `group`; returns its pid.
  pid_t StartReceiver(const std::string& group, int64_t stall_at) {
    ::setenv("GYRE_FANOUT_STORE", store_->address().c_str(), 1);
    ::setenv("GYRE_FANOUT_GROUP", group.c_str(), 1);
    ::setenv("GYRE_FANOUT_OUT", (dir_ + "/" + group + ".receipts").c_str(), 1);
    if (stall_at >= 0) ::setenv("GYRE_FANOUT_STALL_AT", std::to_string(stall_at).c_str(), 1);
    auto pid = SpawnProcess({SelfExecutable(), "--gtest_filter=WeightFanoutChild.Receive"},
                            dir_ + "/" + group + ".log");
    for (const char* v :
         {"GYRE_FANOUT_STORE", "GYRE_FANOUT_GROUP", "GYRE_FANOUT_OUT", "GYRE_FANOUT_STALL_AT"}) {
      ::unsetenv(v);
    }
    if (!pid.ok()) std::abort();
    pids_.push_back(*pid);
    return *pid;
  }

  std::unique_ptr<Communicator> Join(const std::string& group) {
    GlooOptions o;
    o.store_address = store_->address();
    o.group = group;
    o.rank = 0;
    o.size = 2;
    o.connect_timeout_s = 30;
    auto c = CreateGlooCommunicator(o);
    if (!c.ok()) ADD_FAILURE() << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::vector<std::string> Receipts(const std::string& group) {
    std::ifstream in(dir_ + "/" + group + ".receipts");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  static std::string ReceiptLine(const PublishResult& r) {
    std::ostringstream s;
    s << r.version;
    for (uint32_t crc : r.bucket_crc32) s << " " << crc;
    return s.str();
  }

  std::string dir_;
  std::unique_ptr<StoreServer> store_;
  WeightPayload payload_;
  std::vector<pid_t> pids_;
};

TEST_F(WeightFanoutTest, KilledReceiverFailsAloneAndARestartedOneCatchesUp) {
  const int64_t bucket = 1 << 20;
  const double deadline_s = 30;
  const pid_t a = StartReceiver("a", /*stall_at=*/2);
  StartReceiver("b", -1);
  std::unique_ptr<Communicator> ga, gb;
  std::thread join_a([&] { ga = Join("a"); });
  gb = Join("b");
  join_a.join();
  ASSERT_TRUE(ga && gb);

  // Version 1 reaches both, with receipts equal to what was sent.
  payload_.version = 1;
  auto v1 = PublishToEach({ga.get(), gb.get()}, payload_, bucket, DeadlineAfter(deadline_s));
  ASSERT_TRUE(v1[0].status.ok()) << v1[0].status;
  ASSERT_TRUE(v1[1].status.ok()) << v1[1].status;

  // Version 2: receiver a stops taking part and is killed while the publish is under way.
  payload_.version = 2;
  payload_.bytes[12345] ^= 0xff;
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(a, SIGKILL);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto v2 = PublishToEach({ga.get(), gb.get()}, payload_, bucket, DeadlineAfter(deadline_s));
  const double took = Since(t0);
  killer.join();
  EXPECT_FALSE(v2[0].status.ok());
  EXPECT_TRUE(ga->aborted());
  EXPECT_TRUE(v2[1].status.ok()) << v2[1].status;
  // The death is seen through the closed connection, well before the deadline.
  EXPECT_LT(took, deadline_s / 3) << v2[0].status;

  // A restarted receiver joins a new group and catches up to the current version.
  StartReceiver("a-2", -1);
  auto ga2 = Join("a-2");
  ASSERT_TRUE(ga2);
  auto catch_up = PublishToEach({ga2.get()}, payload_, bucket, DeadlineAfter(deadline_s));
  ASSERT_TRUE(catch_up[0].status.ok()) << catch_up[0].status;
  for (Communicator* c : {gb.get(), ga2.get()}) {
    ASSERT_TRUE(PublishEndOfStream(c, DeadlineAfter(10)).ok());
  }
  gb.reset();
  ga2.reset();
  for (size_t i = 1; i < pids_.size(); ++i) {
    int status = 0;
    const auto w0 = std::chrono::steady_clock::now();
    while (!PollExit(pids_[i], &status) && Since(w0) < 30) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status);
  }
  pids_ = {a};  // reaped; only the killed one is left for TearDown
  EXPECT_EQ(Receipts("a"), std::vector<std::string>{ReceiptLine(v1[0].result)});
  EXPECT_EQ(Receipts("b"),
            (std::vector<std::string>{ReceiptLine(v1[1].result), ReceiptLine(v2[1].result)}));
  EXPECT_EQ(Receipts("a-2"), std::vector<std::string>{ReceiptLine(catch_up[0].result)});
  EXPECT_NE(v1[1].result.bucket_crc32[0], v2[1].result.bucket_crc32[0]);
}

// WeightSender::AbortReceivers, which the controller calls when a receiver fails or is declared
// dead mid-publish: the transfer to a receiver that stopped taking part (alive and connected, as
// a host whose link went down) ends at once and alone, long before the deadline; a request for
// a publish that has ended does nothing; one that arrives before the publish reaches its
// receiver (a group still forming, whose receiver never joins) takes effect when it does.
TEST_F(WeightFanoutTest, AbortReceiversEndsOneReceiversTransferAtOnce) {
  StartReceiver("a", /*stall_at=*/2);
  StartReceiver("b", -1);
  WeightSender sender;
  auto publish = [&](uint64_t publish_id, int64_t version, double timeout_s,
                     const std::vector<std::pair<std::string, std::string>>& receivers) {
    v1::PublishWeightsRequest req;
    req.set_version(version);
    req.set_transport("gloo");
    req.set_store_address(store_->address());
    req.set_bind_host("127.0.0.1");
    req.set_timeout_s(timeout_s);
    req.set_bucket_bytes(1 << 20);
    req.set_publish_id(publish_id);
    for (const auto& [id, group] : receivers) {
      req.add_rollout_ids(id);
      req.add_rollout_addresses("127.0.0.1:1");  // unused by gloo
      req.add_groups(group);
    }
    payload_.version = version;
    v1::PublishWeightsResponse resp;
    EXPECT_TRUE(sender.PublishHost(req, payload_, &resp).ok());
    return resp;
  };
  auto v1 = publish(1, 1, 30, {{"ra", "a"}, {"rb", "b"}});
  ASSERT_EQ(v1.results_size(), 2);
  ASSERT_TRUE(v1.results(0).ok()) << v1.results(0).error();
  ASSERT_TRUE(v1.results(1).ok()) << v1.results(1).error();

  // Publish 2: receiver a stops taking part; the controller ends its transfer after 0.5 s.
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(sender.AbortReceivers(2, {"ra"}), 1);
  });
  auto t0 = std::chrono::steady_clock::now();
  auto v2 = publish(2, 2, 30, {{"ra", "a"}, {"rb", "b"}});
  double took = Since(t0);
  aborter.join();
  ASSERT_EQ(v2.results_size(), 2);
  EXPECT_FALSE(v2.results(0).ok());
  EXPECT_NE(v2.results(0).error().find("aborted"), std::string::npos) << v2.results(0).error();
  EXPECT_TRUE(v2.results(1).ok()) << v2.results(1).error();
  EXPECT_LT(took, 10.0);  // against a 30 s deadline

  // A late request for publish 2 does not touch publish 3.
  EXPECT_EQ(sender.AbortReceivers(2, {"rb"}), 0);
  auto v3 = publish(3, 3, 30, {{"rb", "b"}});
  ASSERT_EQ(v3.results_size(), 1);
  EXPECT_TRUE(v3.results(0).ok()) << v3.results(0).error();

  // Publish 4 names a fresh group for a's successor, which never joins; its transfer was ended
  // before the publish began.
  EXPECT_EQ(sender.AbortReceivers(4, {"ra2"}), 0);
  t0 = std::chrono::steady_clock::now();
  auto v4 = publish(4, 4, 5, {{"ra2", "a-2"}, {"rb", "b"}});
  took = Since(t0);
  ASSERT_EQ(v4.results_size(), 2);
  EXPECT_FALSE(v4.results(0).ok());
  EXPECT_NE(v4.results(0).error().find("ended while its group formed"), std::string::npos)
      << v4.results(0).error();
  EXPECT_TRUE(v4.results(1).ok()) << v4.results(1).error();
  EXPECT_LT(took, 3.0);  // the group's connect timeout is 5 s
  // b verified every version it was sent (it writes each receipt after acknowledging it); a
  // only the first.
  const auto w0 = std::chrono::steady_clock::now();
  while (Receipts("b").size() < 4 && Since(w0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto b = Receipts("b");
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i].substr(0, 2), std::to_string(i + 1) + " ");
  const auto a = Receipts("a");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].substr(0, 2), "1 ");
}

// The same for a grpc stream: a receiver that accepts the connection but never answers (its
// process hung) has its stream cancelled at once.
TEST_F(WeightFanoutTest, AbortReceiversCancelsAGrpcStreamToASilentReceiver) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);  // the kernel accepts; nobody speaks HTTP/2
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  v1::PublishWeightsRequest req;
  req.set_version(1);
  req.set_timeout_s(30);
  req.set_publish_id(9);
  req.add_rollout_ids("silent");
  req.add_rollout_addresses("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  WeightSender sender;
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(sender.AbortReceivers(9, {"silent"}), 1);
  });
  payload_.version = 1;
  v1::PublishWeightsResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(sender.PublishHost(req, payload_, &resp).ok());
  const double took = Since(t0);
  aborter.join();
  ::close(fd);
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_FALSE(resp.results(0).ok());
  EXPECT_NE(resp.results(0).error().find("CANCELLED"), std::string::npos)
      << resp.results(0).error();
  EXPECT_LT(took, 10.0);  // against a 30 s deadline
}

}  // namespace
}  // namespace gyre::comm
