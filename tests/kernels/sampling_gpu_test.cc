// GPU: the fused sampler against its CPU reference (label gpu; skips without a device).
//  - identical tokens for >= 99.9% of 100k (seed, position) draws over mixed parameters, with
//    logprob and kept mass within float tolerance;
//  - empirical frequencies match the true truncated distribution, and truncated tokens are
//    never drawn;
//  - edge cases: ties at the top-k boundary, top_p = 1, min_p = 0, all -inf but one, all -inf,
//    V not a multiple of the block size, B = 1 and B = 1024, bf16 input, V = 151936;
//  - the same launch twice gives bit-identical outputs.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/device_info.h"
#include "kernels/reference/sampling_ref.h"
#include "kernels/sampling.cuh"

namespace gyre::kernels {
namespace {

using gpu_test::Close;
using gpu_test::DeviceArray;

const float kInf = std::numeric_limits<float>::infinity();

struct Outputs {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> kept;
};

Outputs RunReference(const std::vector<float>& logits, int64_t V,
                     const std::vector<SamplingRowParams>& params) {
  const int64_t B = static_cast<int64_t>(params.size());
  Outputs o{std::vector<int32_t>(B), std::vector<float>(B), std::vector<float>(B)};
  SampleRowsRef(logits.data(), B, V, params.data(), o.tokens.data(), o.logprobs.data(),
                o.kept.data());
  return o;
}

template <typename T>
Outputs RunKernel(const std::vector<T>& logits, int64_t V,
                  const std::vector<SamplingRowParams>& params) {
  const int64_t B = static_cast<int64_t>(params.size());
  DeviceArray<T> d_logits(logits);
  DeviceArray<SamplingRowParams> d_params(params);
  DeviceArray<int32_t> d_tokens(B);
  DeviceArray<float> d_logprobs(B), d_kept(B);
  EXPECT_EQ(d_logits.status(), cudaSuccess);
  const cudaError_t err = LaunchSampleRows(d_logits.get(), B, V, d_params.get(), d_tokens.get(),
                                           d_logprobs.get(), d_kept.get(), nullptr);
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {d_tokens.Download(), d_logprobs.Download(), d_kept.Download()};
}

// Compares kernel and reference; returns the number of rows whose token differs. Rows with the
// same token must agree on logprob and kept mass within float tolerance.
int64_t CompareRows(const Outputs& gpu, const Outputs& ref) {
  int64_t differ = 0;
  for (size_t r = 0; r < ref.tokens.size(); ++r) {
    if (gpu.tokens[r] != ref.tokens[r]) {
      ++differ;
      continue;
    }
    EXPECT_TRUE(Close(gpu.logprobs[r], ref.logprobs[r], 1e-5, 1e-5))
        << "row " << r << " logprob " << gpu.logprobs[r] << " vs " << ref.logprobs[r];
    EXPECT_TRUE(Close(gpu.kept[r], ref.kept[r], 1e-6, 1e-5))
        << "row " << r << " kept mass " << gpu.kept[r] << " vs " << ref.kept[r];
  }
  return differ;
}

class SamplingGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

SamplingRowParams Params(float t, int32_t k, float p, float min_p, uint64_t seed, uint64_t pos) {
  return SamplingRowParams{t, k, p, min_p, seed, pos};
}

TEST_F(SamplingGpuTest, TokensMatchTheReferenceOver100kDraws) {
  // 1000 rows of V = 1000 (not a multiple of the block size) with mixed options, drawn at 100
  // positions each: 100k (seed, position) pairs.
  const int64_t B = 1000, V = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(B * V);
  for (auto& x : logits) x = normal(rng);
  int64_t differ = 0, total = 0;
  for (uint64_t pos = 0; pos < 100; ++pos) {
    std::vector<SamplingRowParams> params(B);
    for (int64_t r = 0; r < B; ++r) {
      const int mode = static_cast<int>(r % 8);
      params[r] = Params(mode == 7 ? 0.f : 0.5f + 0.25f * (r % 5), mode & 1 ? 1 + r % 64 : 0,
                         mode & 2 ? 0.3f + 0.1f * (r % 7) : 1.f, mode & 4 ? 0.05f : 0.f,
                         1000003ull * r + 17, pos);
    }
    differ += CompareRows(RunKernel(logits, V, params), RunReference(logits, V, params));
    total += B;
  }
  EXPECT_LE(differ * 1000, total) << differ << " of " << total << " draws differ";
}

TEST_F(SamplingGpuTest, Bf16AndLargeVocabularyMatchTheReference) {
  const int64_t B = 64, V = 151936;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 4.f);
  std::vector<__nv_bfloat16> bf(B * V);
  std::vector<float> as_float(B * V);
  for (int64_t i = 0; i < B * V; ++i) {
    bf[i] = __float2bfloat16(normal(rng));
    as_float[i] = __bfloat162float(bf[i]);  // the reference sees the values the kernel reads
  }
  std::vector<SamplingRowParams> params(B);
  for (int64_t r = 0; r < B; ++r) {
    params[r] = Params(1.0f, r % 2 ? 50 : 0, r % 3 ? 0.9f : 1.f, r % 5 == 0 ? 0.02f : 0.f, r, 3);
  }
  const Outputs ref = RunReference(as_float, V, params);
  EXPECT_LE(CompareRows(RunKernel(bf, V, params), ref), 0);
  EXPECT_LE(CompareRows(RunKernel(as_float, V, params), ref), 0);
}

TEST_F(SamplingGpuTest, FrequenciesFollowTheTruncatedDistribution) {
  // One row drawn at 200k positions. top_k = 6 then top_p = 0.8 then min_p = 0.1.
  const int64_t V = 16, draws = 200000;
  std::vector<float> row = {2.0f, 1.5f, 1.5f,  1.0f, 0.5f, 0.2f, 0.1f, 0.f,
                            -1.f, -2.f, -kInf, 3.f,  -3.f, 0.7f, 0.7f, -0.5f};
  std::vector<float> logits;
  std::vector<SamplingRowParams> params;
  for (int64_t i = 0; i < draws; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    params.push_back(Params(1.0f, 6, 0.8f, 0.1f, 42, static_cast<uint64_t>(i)));
  }
  const Outputs gpu = RunKernel(logits, V, params);
  // The true truncated distribution, computed independently of both implementations.
  std::vector<double> p(V);
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(static_cast<double>(row[i]) - 3.0);
  for (int64_t i = 0; i < V; ++i) p[i] = std::exp(static_cast<double>(row[i]) - 3.0) / s;
  std::vector<int64_t> order(V);
  for (int64_t i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  // top-6 by probability: 11, 0, 1, 2, 3, 13/14 tie at the 6th place -> both kept (7 tokens).
  const double kth = p[order[5]];
  std::vector<bool> kept(V);
  double mass_k = 0;
  for (int64_t i = 0; i < V; ++i) {
    kept[i] = p[i] >= kth;
    if (kept[i]) mass_k += p[i];
  }
  double running = 0, boundary = 0;
  for (int64_t i : order) {
    if (!kept[i]) continue;
    running += p[i];
    if (running >= 0.8 * mass_k) {
      boundary = p[i];
      break;
    }
  }
  double kept_mass = 0;
  for (int64_t i = 0; i < V; ++i) {
    kept[i] = kept[i] && p[i] >= boundary && p[i] >= 0.1 * p[order[0]];
    if (kept[i]) kept_mass += p[i];
  }
  std::vector<int64_t> count(V);
  for (int32_t t : gpu.tokens) ++count[t];
  for (int64_t i = 0; i < V; ++i) {
    if (!kept[i]) {
      EXPECT_EQ(count[i], 0) << "truncated token " << i << " was drawn";
      continue;
    }
    const double q = p[i] / kept_mass;
    const double sigma = std::sqrt(q * (1 - q) / draws);
    EXPECT_NEAR(static_cast<double>(count[i]) / draws, q, 5 * sigma) << "token " << i;
  }
}

TEST_F(SamplingGpuTest, EdgeCases) {
  const int64_t V = 1031;  // prime: no block-size multiple
  std::vector<std::vector<float>> rows;
  std::vector<SamplingRowParams> params;
  auto add = [&](std::vector<float> row, SamplingRowParams prm) {
    rows.push_back(std::move(row));
    params.push_back(prm);
  };
  std::vector<float> base(V);
  for (int64_t i = 0; i < V; ++i) base[i] = static_cast<float>((i * 37) % 101) * 0.05f;
  std::vector<float> ties(V, 0.f);
  for (int64_t i = 0; i < 10; ++i) ties[i * 100] = 5.f;  // ten tokens tied at the top
  std::vector<float> one(V, -kInf);
  one[777] = 0.f;
  std::vector<float> none(V, -kInf);
  std::vector<float> nan_inf(V, std::numeric_limits<float>::quiet_NaN());
  nan_inf[5] = kInf;
  nan_inf[9] = kInf;
  for (uint64_t s = 0; s < 32; ++s) {
    add(ties, Params(1.f, 3, 1.f, 0.f, s, s));     // tie at the top-k boundary: all 10 kept
    add(base, Params(1.f, 0, 1.f, 0.f, s, s));     // top_p = 1, min_p = 0: untruncated
    add(base, Params(0.7f, 0, 0.f, 0.f, s, s));    // top_p = 0: the top token only
    add(one, Params(1.f, 5, 0.5f, 0.5f, s, s));    // all -inf but one
    add(none, Params(1.f, 0, 1.f, 0.f, s, s));     // degenerate
    add(none, Params(0.f, 0, 1.f, 0.f, s, s));     // degenerate, greedy
    add(nan_inf, Params(1.f, 0, 1.f, 0.f, s, s));  // +inf tokens share the mass
    add(base, Params(0.f, 0, 1.f, 0.f, s, s));     // greedy
    add(base, Params(1e-3f, 0, 1.f, 0.f, s, s));   // tiny temperature
    add(base, Params(1.f, static_cast<int32_t>(V), 0.95f, 1.f, s, s));  // top_k = V, min_p = 1
  }
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Outputs ref = RunReference(flat, V, params);
  const Outputs gpu = RunKernel(flat, V, params);
  EXPECT_EQ(CompareRows(gpu, ref), 0);
  for (size_t r = 0; r < params.size(); ++r) {
    if (rows[r] == ties && ref.tokens[r] == gpu.tokens[r]) EXPECT_EQ(gpu.tokens[r] % 100, 0);
  }
}

TEST_F(SamplingGpuTest, BatchOfOneAnd1024AndDeterminism) {
  const int64_t V = 4099;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (int64_t B : {int64_t{1}, int64_t{1024}}) {
    std::vector<float> logits(B * V);
    for (auto& x : logits) x = normal(rng);
    std::vector<SamplingRowParams> params(B);
    for (int64_t r = 0; r < B; ++r) params[r] = Params(0.9f, 40, 0.95f, 0.01f, 99 + r, 5);
    const Outputs a = RunKernel(logits, V, params);
    const Outputs b = RunKernel(logits, V, params);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.logprobs, b.logprobs);
    EXPECT_EQ(a.kept, b.kept);
    EXPECT_LE(CompareRows(a, RunReference(logits, V, params)) * 1000, std::max<int64_t>(B, 1));
  }
}

}  // namespace
}  // namespace gyre::kernels
