// GPU: the fused token log-prob kernels against their CPU reference (label gpu; skips without
// a device).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/device_info.h"
#include "kernels/reference/token_logprobs_ref.h"
#include "kernels/token_logprobs.cuh"

namespace gyre::kernels {
namespace {

template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) { EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  T* ptr = nullptr;
};

class TokenLogprobsGpuTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, bool>> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(TokenLogprobsGpuTest, ForwardAndBackwardMatchTheReference) {
  const auto [T, V, bf16] = GetParam();
  const float tau = 0.9f;
  std::mt19937 rng(static_cast<uint32_t>(T * 31 + V));
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> logits(T * V);
  std::vector<__nv_bfloat16> logits_bf16(T * V);
  for (int64_t i = 0; i < T * V; ++i) {
    logits_bf16[i] = __float2bfloat16(d(rng));
    // The reference sees exactly the values the kernel reads.
    logits[i] = bf16 ? __bfloat162float(logits_bf16[i]) : d(rng);
  }
  std::vector<int64_t> y(T);
  std::vector<float> g_lp(T), g_h(T);
  for (int64_t t = 0; t < T; ++t) {
    y[t] = (t * 104729) % V;
    g_lp[t] = d(rng);
    g_h[t] = 0.1f * d(rng);
  }
  std::vector<float> want_lp(T), want_h(T), want_grad(T * V);
  TokenLogprobsForwardRef(logits.data(), y.data(), T, V, tau, want_lp.data(), want_h.data());
  TokenLogprobsBackwardRef(logits.data(), y.data(), T, V, tau, g_lp.data(), g_h.data(),
                           want_grad.data());

  DeviceBuffer<float> d_logits(T * V), d_lp(T), d_h(T), d_glp(T), d_gh(T), d_grad(T * V);
  DeviceBuffer<__nv_bfloat16> d_logits16(T * V), d_grad16(T * V);
  DeviceBuffer<int64_t> d_y(T);
  cudaMemcpy(d_y.ptr, y.data(), T * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(d_glp.ptr, g_lp.data(), T * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_gh.ptr, g_h.data(), T * 4, cudaMemcpyHostToDevice);
  std::vector<float> grad(T * V);
  if (bf16) {
    cudaMemcpy(d_logits16.ptr, logits_bf16.data(), T * V * 2, cudaMemcpyHostToDevice);
    ASSERT_EQ(
        LaunchTokenLogprobsForward(d_logits16.ptr, d_y.ptr, T, V, tau, d_lp.ptr, d_h.ptr, nullptr),
        cudaSuccess);
    ASSERT_EQ(LaunchTokenLogprobsBackward(d_logits16.ptr, d_y.ptr, T, V, tau, d_glp.ptr, d_gh.ptr,
                                          d_grad16.ptr, nullptr),
              cudaSuccess);
    std::vector<__nv_bfloat16> g16(T * V);
    cudaMemcpy(g16.data(), d_grad16.ptr, T * V * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < T * V; ++i) grad[i] = __bfloat162float(g16[i]);
  } else {
    cudaMemcpy(d_logits.ptr, logits.data(), T * V * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(
        LaunchTokenLogprobsForward(d_logits.ptr, d_y.ptr, T, V, tau, d_lp.ptr, d_h.ptr, nullptr),
        cudaSuccess);
    ASSERT_EQ(LaunchTokenLogprobsBackward(d_logits.ptr, d_y.ptr, T, V, tau, d_glp.ptr, d_gh.ptr,
                                          d_grad.ptr, nullptr),
              cudaSuccess);
    cudaMemcpy(grad.data(), d_grad.ptr, T * V * 4, cudaMemcpyDeviceToHost);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> lp(T), h(T);
  cudaMemcpy(lp.data(), d_lp.ptr, T * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data(), d_h.ptr, T * 4, cudaMemcpyDeviceToHost);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_NEAR(lp[t], want_lp[t], 1e-4 + 1e-5 * std::fabs(want_lp[t])) << "row " << t;
    EXPECT_NEAR(h[t], want_h[t], 1e-4 + 1e-5 * std::fabs(want_h[t])) << "row " << t;
  }
  // bf16 output keeps 8 significant bits.
  const double rel = bf16 ? 1.0 / 128 : 1e-4;
  int64_t bad = 0;
  for (int64_t i = 0; i < T * V; ++i) {
    if (std::fabs(grad[i] - want_grad[i]) > 1e-6 + rel * std::fabs(want_grad[i])) ++bad;
  }
  EXPECT_EQ(bad, 0) << "gradient entries outside tolerance";
}

INSTANTIATE_TEST_SUITE_P(Shapes, TokenLogprobsGpuTest,
                         ::testing::Values(std::make_tuple(1, 151936, false),
                                           std::make_tuple(64, 151936, false),
                                           std::make_tuple(64, 151936, true),
                                           std::make_tuple(257, 1000, false),
                                           std::make_tuple(3, 7, true)));

}  // namespace
}  // namespace gyre::kernels
