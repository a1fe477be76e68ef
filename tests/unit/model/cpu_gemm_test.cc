#include "model/cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace gyre::model {
namespace {

// out (+)= W X against a float64 reference, element by element, with a bound scaled to each
// element's magnitude: |error| <= 4 * k * eps_f32 * sum_k |w||x| (a float sum of k products).
void ExpectMatches(int level, int64_t n, int64_t k, int64_t cols, bool accumulate,
                   bool transpose_out) {
  SCOPED_TRACE(::testing::Message()
               << "level " << level << " n " << n << " k " << k << " cols " << cols
               << (accumulate ? " accumulate" : "") << (transpose_out ? " transposed" : ""));
  at::manual_seed(n * 1000 + k * 10 + cols);
  // Strided operands: every leading dimension is wider than its row.
  at::Tensor w_store = at::randn({n, k + 3});
  at::Tensor x_store = at::randn({k, cols + 5});
  at::Tensor w = w_store.narrow(1, 1, k), x = x_store.narrow(1, 2, cols);
  const int64_t out_rows = transpose_out ? cols : n, out_cols = transpose_out ? n : cols;
  at::Tensor out_store = at::randn({out_rows, out_cols + 7});
  at::Tensor out = out_store.narrow(1, 0, out_cols);
  const at::Tensor before = out_store.clone();

  CpuMatmulArgs a;
  a.w = w.data_ptr<float>();
  a.ldw = w.stride(0);
  a.x = x.data_ptr<float>();
  a.ldx = x.stride(0);
  a.out = out.data_ptr<float>();
  a.ldo = out.stride(0);
  a.n = n;
  a.k = k;
  a.cols = cols;
  a.accumulate = accumulate;
  a.transpose_out = transpose_out;
  ASSERT_TRUE(CpuMatmul(a, level));

  at::Tensor ref = at::mm(w.to(at::kDouble), x.to(at::kDouble));  // [n, cols]
  at::Tensor bound = at::mm(w.abs().to(at::kDouble), x.abs().to(at::kDouble)) *
                     (4.0 * static_cast<double>(k + 1) * 1.1920929e-7);
  at::Tensor got = out.to(at::kDouble);
  if (transpose_out) got = got.t();
  if (accumulate) {
    at::Tensor prior = before.narrow(1, 0, out_cols).to(at::kDouble);
    if (transpose_out) prior = prior.t();
    ref = ref + prior;
    bound = bound + prior.abs() * 1.1920929e-7;
  }
  const at::Tensor excess = ((got - ref).abs() - bound).max();
  EXPECT_LE(excess.item<double>(), 0.0)
      << "largest error " << (got - ref).abs().max().item<double>();
  // The padding columns of the output rows are untouched.
  EXPECT_TRUE(at::equal(out_store.narrow(1, out_cols, 7), before.narrow(1, out_cols, 7)));
}

// Whether the SIMD kernel runs here. Under ATEN_CPU_CAPABILITY=default (one of CI's runs of
// this binary) it is off by design: then CpuMatmul must decline at every level and write nothing,
// so that the caller uses ATen, and that is what such a run checks. A CPU without AVX2 skips,
// like a host without a GPU.
bool KernelRunsHere(bool* skip) {
  *skip = false;
  if (CpuMatmulLevel() > 0) return true;
  float w = 1, x = 1, out = 7;
  CpuMatmulArgs a;
  a.w = &w;
  a.ldw = 1;
  a.x = &x;
  a.ldx = 1;
  a.out = &out;
  a.ldo = 1;
  a.n = a.k = a.cols = 1;
  EXPECT_FALSE(CpuMatmul(a));
  EXPECT_FALSE(CpuMatmul(a, 2));
  EXPECT_EQ(out, 7.0f);
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  *skip = cap == nullptr || std::strcmp(cap, "default") != 0;
  return false;
}

TEST(CpuMatmulTest, MatchesAFloat64ReferenceAtEveryTileRemainder) {
  bool skip = false;
  if (!KernelRunsHere(&skip)) {
    if (skip) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512";
    return;
  }
  for (int level = 1; level <= CpuMatmulLevel(); ++level) {
    // Rows not a multiple of the 6-row tile, columns around the 8/16/64-column vectors and
    // strips, k of 1 and more than a cache line.
    for (int64_t n : {1, 5, 6, 7, 13, 48}) {
      for (int64_t cols : {1, 7, 8, 15, 16, 17, 33, 63, 64, 65, 130}) {
        ExpectMatches(level, n, 37, cols, false, false);
      }
    }
    for (int64_t k : {1, 2, 16, 577}) ExpectMatches(level, 11, k, 70, false, false);
    ExpectMatches(level, 19, 64, 64, true, false);
    ExpectMatches(level, 19, 64, 21, true, false);
    ExpectMatches(level, 23, 40, 64, false, true);
    ExpectMatches(level, 23, 40, 9, true, true);
  }
}

TEST(CpuMatmulTest, SameResultOnAnyNumberOfThreadsAndEqualToAten) {
  bool skip = false;
  if (!KernelRunsHere(&skip)) {
    if (skip) GTEST_SKIP() << "this CPU has neither AVX2 with FMA nor AVX-512";
    return;
  }
  at::manual_seed(3);
  // SmolLM2's down projection at a decode batch of 64.
  const int64_t n = 576, k = 1536, cols = 64;
  at::Tensor w = at::randn({n, k}) * 0.02, x = at::randn({k, cols});
  auto run = [&](int threads) {
    const int saved = at::get_num_threads();
    at::set_num_threads(threads);
    at::Tensor out = at::empty({n, cols});
    CpuMatmulArgs a;
    a.w = w.data_ptr<float>();
    a.ldw = k;
    a.x = x.data_ptr<float>();
    a.ldx = cols;
    a.out = out.data_ptr<float>();
    a.ldo = cols;
    a.n = n;
    a.k = k;
    a.cols = cols;
    EXPECT_TRUE(CpuMatmul(a));
    at::set_num_threads(saved);
    return out;
  };
  const at::Tensor one = run(1), two = run(2);
  EXPECT_TRUE(at::equal(one, two)) << "each output is one sum over k in order";
  const at::Tensor aten = at::mm(w, x);
  EXPECT_TRUE(at::allclose(one, aten, 1e-4, 1e-5)) << (one - aten).abs().max().item<float>();
}

TEST(CpuMatmulTest, ALevelOfZeroWritesNothing) {
  float w[4] = {1, 2, 3, 4}, x[4] = {1, 1, 1, 1}, out[4] = {7, 7, 7, 7};
  CpuMatmulArgs a;
  a.w = w;
  a.ldw = 2;
  a.x = x;
  a.ldx = 2;
  a.out = out;
  a.ldo = 2;
  a.n = a.k = a.cols = 2;
  EXPECT_FALSE(CpuMatmul(a, 0));
  for (float v : out) EXPECT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace gyre::model
