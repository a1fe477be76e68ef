#pragma once
// Tensor comparisons for tests whose two sides may be computed in a different order (batch
// width, matmul blocking, SIMD path, thread count), so they agree only up to float rounding.
//
// Element i passes when |got_i - want_i| <= atol + rtol * |want_i| + srtol * max_j |want_j|.
// The last term scales the tolerance with the magnitude of the whole tensor: a value computed as
// a sum of products can be small while its rounding error is the size of its largest summand
// times machine epsilon (cancellation), so a purely element-wise rtol is too tight there.
// Choose the numbers from measured error (print it with a failing run), not from what passed on
// one machine. Exact promises (resume, sampler determinism) use at::equal instead.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace gyre::testing {

struct Tolerance {
  double rtol = 0;   // relative to each reference element
  double atol = 0;   // absolute
  double srtol = 0;  // relative to the largest |reference| in the tensor
};

inline ::testing::AssertionResult AllClose(const at::Tensor& got, const at::Tensor& want,
                                           Tolerance tol) {
  if (!got.sizes().equals(want.sizes())) {
    std::ostringstream os;
    os << "shapes differ: got " << got.sizes() << ", want " << want.sizes();
    return ::testing::AssertionFailure() << os.str();
  }
  if (want.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor g = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor w = want.detach().to(at::kCPU, at::kDouble);
  if (!at::equal(g.isnan(), w.isnan()) || !at::equal(g.isposinf(), w.isposinf()) ||
      !at::equal(g.isneginf(), w.isneginf())) {
    return ::testing::AssertionFailure() << "non-finite entries (nan, +inf, -inf) differ";
  }
  const at::Tensor finite = w.isfinite();
  const at::Tensor wabs = at::where(finite, w.abs(), at::zeros_like(w));
  const double scale = wabs.max().item<double>();
  const at::Tensor diff = at::where(finite, (g - w).abs(), at::zeros_like(w));
  const at::Tensor allowed = tol.atol + tol.rtol * wabs + tol.srtol * scale;
  const at::Tensor excess = diff - allowed;
  const int64_t worst = excess.flatten().argmax().item<int64_t>();
  const double worst_excess = excess.flatten()[worst].item<double>();
  std::ostringstream os;
  os << "max |diff| " << diff.max().item<double>() << ", max |want| " << scale << "; worst element "
     << worst << ": got " << g.flatten()[worst].item<double>() << ", want "
     << w.flatten()[worst].item<double>() << ", allowed " << allowed.flatten()[worst].item<double>()
     << " (rtol " << tol.rtol << ", atol " << tol.atol << ", srtol " << tol.srtol << ")";
  if (worst_excess > 0) return ::testing::AssertionFailure() << os.str();
  // GYRE_TEST_REPORT_CLOSE=1 prints every passing comparison's figures (to choose tolerances
  // from measured error, e.g. under each ATEN_CPU_CAPABILITY).
  if (std::getenv("GYRE_TEST_REPORT_CLOSE") != nullptr) {
    std::fprintf(stderr, "[AllClose] %s\n", os.str().c_str());
  }
  return ::testing::AssertionSuccess() << os.str();
}

}  // namespace gyre::testing
