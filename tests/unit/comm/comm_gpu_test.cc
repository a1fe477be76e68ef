// GPU transports: NCCL with one rank (a second rank needs a second GPU) and a CUDA IPC colocated
// update between two processes on one GPU. Every test that needs a device skips without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "comm/cuda_ipc.h"
#include "comm/device_weights.h"
#include "comm/nccl_communicator.h"
#include "comm/weight_broadcast.h"
#include "common/crc32.h"
#include "common/file_util.h"
#include "common/subprocess.h"

namespace gyre::comm {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define GYRE_REQUIRE_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

// A one-rank NCCL group on GPU 0.
StatusOr<std::unique_ptr<Communicator>> OneRankNccl() {
  GYRE_ASSIGN_OR_RETURN(std::string id, NewNcclUniqueId());
  NcclOptions o;
  o.unique_id = id;
  return CreateNcclCommunicator(o);
}

TEST(NcclTest, MalformedOptionsAreRejectedWithoutTouchingTheGpu) {
  NcclOptions o;
  o.unique_id = "short";
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), StatusCode::kInvalidArgument);
  o.unique_id.assign(128, '\0');
  o.rank = 1;
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(NcclTest, OneRankCollectivesAbortAndDeadline) {
  GYRE_REQUIRE_GPU();
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclOptions o;
  o.unique_id = *id;
  auto c = CreateNcclCommunicator(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->backend(), "nccl");
  std::vector<float> host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 1000);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  Status s = (*c)->AllReduceSum(dev, host.size(), DataType::kFloat32, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  s = (*c)->Broadcast(dev, host.size() * 4, 0, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE((*c)->Barrier(DeadlineAfter(30)).ok());
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dev, back.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);  // a one-rank sum and broadcast leave the data as it was
  // An expired deadline aborts the communicator; so does Abort().
  EXPECT_EQ((*c)->Broadcast(dev, 4, 0, DeadlineAfter(-1)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE((*c)->aborted());
  EXPECT_EQ((*c)->Barrier(DeadlineAfter(5)).code(), StatusCode::kAborted);
  auto id2 = NewNcclUniqueId();
  ASSERT_TRUE(id2.ok()) << id2.status();
  o.unique_id = *id2;
  auto c2 = CreateNcclCommunicator(o);
  ASSERT_TRUE(c2.ok()) << c2.status();
  (*c2)->Abort();
  EXPECT_EQ((*c2)->Barrier(DeadlineAfter(5)).code(), StatusCode::kAborted);
  cudaFree(dev);
}

TEST(NcclTest, OneRankReduceScatterAllGatherAndScatterOnDeviceAndHostMemory) {
  GYRE_REQUIRE_GPU();
  auto c = OneRankNccl();
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t n = 1000;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i);
  float* in = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0, n * 4), cudaSuccess);
  // One rank: the reduce-scatter and the all-gather both copy the input.
  Status s = (*c)->ReduceScatterSum(in, out, n, DataType::kFloat32, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), out, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  ASSERT_EQ(cudaMemset(out, 0, n * 4), cudaSuccess);
  s = (*c)->AllGather(in, out, n, DataType::kFloat32, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaMemcpy(back.data(), out, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  // Host memory is staged through the device.
  std::vector<float> host_out(n, -1.0f);
  s = (*c)->ReduceScatterSum(host.data(), host_out.data(), n, DataType::kFloat32,
                             DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(host_out, host);
  std::fill(host_out.begin(), host_out.end(), -1.0f);
  s = (*c)->AllGather(host.data(), host_out.data(), n, DataType::kFloat32, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(host_out, host);
  // Scatter over one rank: the root's only part, on the device and through host staging.
  ASSERT_EQ(cudaMemset(out, 0, n * 4), cudaSuccess);
  s = (*c)->Scatter(in, out, n * 4, 0, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaMemcpy(back.data(), out, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  std::fill(host_out.begin(), host_out.end(), -1.0f);
  s = (*c)->Scatter(host.data(), host_out.data(), n * 4, 0, DeadlineAfter(30));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(host_out, host);
  EXPECT_EQ((*c)->Scatter(host.data(), out, n * 4, 0, DeadlineAfter(30)).code(),
            StatusCode::kInvalidArgument);
  cudaFree(in);
  cudaFree(out);
}

// Child half of the IPC test: runs only when the parent test starts this binary with
// GYRE_IPC_HANDLE_FILE set. Maps the parent's buffer, copies it (timed), checks the bytes.
TEST(CudaIpcTest, ChildMapsAndCopies) {
  const char* handle_file = std::getenv("GYRE_IPC_HANDLE_FILE");
  if (handle_file == nullptr) GTEST_SKIP() << "child half of ColocatedUpdateOfOneGigabyte";
  GYRE_REQUIRE_GPU();
  std::ifstream in(handle_file, std::ios::binary);
  std::string handle((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t bytes = size_t{1} << 30;
  auto m = CudaIpcMapping::Open(handle, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, bytes), cudaSuccess);
  ASSERT_TRUE((*m)->CopyTo(dst, 0, bytes, DeadlineAfter(10)).ok());  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  Status s = (*m)->CopyTo(dst, 0, bytes, DeadlineAfter(10));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint8_t> sample(4096);
  for (size_t off : {size_t{0}, bytes / 2, bytes - sample.size()}) {
    ASSERT_EQ(cudaMemcpy(sample.data(), static_cast<char*>(dst) + off, sample.size(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (uint8_t b : sample) ASSERT_EQ(b, 0xA7);
  }
  std::ofstream(std::string(handle_file) + ".seconds") << secs;
  cudaFree(dst);
}

TEST(CudaIpcTest, ColocatedUpdateOfOneGigabyteTakesUnder50Ms) {
  GYRE_REQUIRE_GPU();
  const size_t bytes = size_t{1} << 30;
  void* src = nullptr;
  ASSERT_EQ(cudaMalloc(&src, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(src, 0xA7, bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto handle = ExportCudaIpcHandle(src);
  ASSERT_TRUE(handle.ok()) << handle.status();
  const std::string dir = TempDirectory() + "/gyre_ipc_" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string file = dir + "/handle";
  std::ofstream(file, std::ios::binary) << *handle;
  ::setenv("GYRE_IPC_HANDLE_FILE", file.c_str(), 1);
  auto pid = SpawnProcess({SelfExecutable(), "--gtest_filter=CudaIpcTest.ChildMapsAndCopies"},
                          dir + "/child.log");
  ::unsetenv("GYRE_IPC_HANDLE_FILE");
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  while (!PollExit(*pid, &status)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::ifstream log(dir + "/child.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  double secs = -1;
  std::ifstream(file + ".seconds") >> secs;
  ASSERT_GT(secs, 0) << text;
  std::printf("cuda ipc colocated update, 1 GiB: %.2f ms (%.0f GB/s)\n", secs * 1e3, 1.0737 / secs);
  EXPECT_LT(secs, 0.050);
  cudaFree(src);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

std::vector<uint8_t> PseudoRandom(size_t n) {
  std::vector<uint8_t> v(n);
  uint32_t x = 12345;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(DeviceWeightsTest, CopiesAndGpuChecksumsEqualTheHostCrc32) {
  GYRE_REQUIRE_GPU();
  const auto host = PseudoRandom((10 << 20) + 333);
  auto a = DeviceBuffer::Allocate(host.size(), 0);
  auto b = DeviceBuffer::Allocate(host.size(), 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(CopyHostToDevice((*a)->data(), host.data(), host.size(), 0, DeadlineAfter(30)).ok());
  ASSERT_TRUE(
      CopyDeviceToDevice((*b)->data(), (*a)->data(), host.size(), 0, DeadlineAfter(30)).ok());
  const int64_t bucket = 1 << 20;
  auto crcs = DeviceBucketCrc32((*b)->data(), host.size(), bucket, 0, DeadlineAfter(30));
  ASSERT_TRUE(crcs.ok()) << crcs.status();
  ASSERT_EQ(crcs->size(), 11u);
  for (size_t i = 0; i < crcs->size(); ++i) {
    const size_t off = i * bucket, n = std::min<size_t>(bucket, host.size() - off);
    EXPECT_EQ((*crcs)[i], Crc32(host.data() + off, n)) << "bucket " << i;
  }
  std::unique_ptr<DeviceBuffer> grown;
  bool reallocated = false;
  ASSERT_TRUE(EnsureDeviceBuffer(100, 0, &grown, &reallocated).ok());
  EXPECT_TRUE(reallocated);
  ASSERT_TRUE(EnsureDeviceBuffer(50, 0, &grown, &reallocated).ok());
  EXPECT_FALSE(reallocated);
}

TEST(NcclTest, HostMemoryIsStagedAndADevicePayloadPublishesOnOneRank) {
  GYRE_REQUIRE_GPU();
  auto c = OneRankNccl();
  ASSERT_TRUE(c.ok()) << c.status();
  // Host memory (the weight plane's headers and acknowledgements) goes through the device.
  std::vector<float> host = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(
      (*c)->AllReduceSum(host.data(), host.size(), DataType::kFloat32, DeadlineAfter(30)).ok());
  EXPECT_EQ(host, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  std::string text(100000, 'x');  // larger than the first staging buffer: it grows
  ASSERT_TRUE((*c)->Broadcast(text.data(), text.size(), 0, DeadlineAfter(30)).ok());
  EXPECT_EQ(text, std::string(100000, 'x'));
  // A device payload: published with GPU checksums equal to the host CRC-32 of each bucket.
  const auto bytes = PseudoRandom(3 << 20);
  auto buf = DeviceBuffer::Allocate(bytes.size(), 0);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(
      CopyHostToDevice((*buf)->data(), bytes.data(), bytes.size(), 0, DeadlineAfter(30)).ok());
  DevicePayload payload;
  payload.version = 7;
  payload.data = (*buf)->data();
  payload.bytes = bytes.size();
  payload.manifest.push_back(
      {"w", {static_cast<int64_t>(bytes.size() / 4)}, "float32", 0, bytes.size()});
  auto r = PublishDeviceWeights(c->get(), payload, 1 << 20, DeadlineAfter(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->receivers, 0);
  ASSERT_EQ(r->bucket_crc32.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->bucket_crc32[i], Crc32(bytes.data() + (i << 20), 1 << 20));
  }
}

}  // namespace
}  // namespace gyre::comm
