// The per-sample math of the group-relative advantage estimators, written once for the CPU
// reference (kernels/reference/advantages_ref.cc) and the CUDA kernel (advantages.cu): each
// computes a group's statistics its own way (a loop, a block reduction), then every sample's value
// with SampleValue. Everything in double. Plain C++ that nvcc compiles for the device too.
//
// Adding a built-in group estimator: an AdvantageKind value (advantages_ref.h), its case below
// (and in NeedsStd / NeedsMedian / WhitenedOverBatch when it needs those), its registry entry
// (src/algorithm/registry.cc: name, formula, paper, kind) and its hand-computed test
// (tests/unit/kernels/advantages_ref_test.cc).
#pragma once

#include <cstdint>

#include "kernels/reference/advantages_ref.h"

#if defined(__CUDACC__)
#define GYRE_ADV_HOST_DEVICE __host__ __device__
#else
#define GYRE_ADV_HOST_DEVICE
#endif

namespace gyre::kernels::terms {

// What SampleValue reads of a group of n >= 1 rewards.
struct GroupStats {
  int64_t n = 0;
  double mean = 0;         // the mean reward
  double std = 0;          // the unbiased standard deviation (NeedsStd kinds only)
  double median = 0;       // (NeedsMedian kinds only); even n: the mean of the two middle values
  bool all_equal = false;  // every reward equal (and not NaN)
};

// Whether `kind` reads GroupStats::std (computed only for groups of two or more distinct values).
GYRE_ADV_HOST_DEVICE inline bool NeedsStd(AdvantageKind kind) {
  return kind == AdvantageKind::kGrpo;
}

// Whether `kind` reads GroupStats::median.
GYRE_ADV_HOST_DEVICE inline bool NeedsMedian(AdvantageKind kind) {
  return kind == AdvantageKind::kMedian;
}

// Whether SampleValue's values are then whitened over the whole batch: (v - mean_B) / (std_B +
// eps), std_B unbiased and taken as 0 for a batch of one.
GYRE_ADV_HOST_DEVICE inline bool WhitenedOverBatch(AdvantageKind kind) {
  return kind == AdvantageKind::kReinforcePpBaseline || kind == AdvantageKind::kReinforcePp;
}

// The advantage of reward r in a group with statistics g (advantages_ref.h gives each meaning),
// or for WhitenedOverBatch kinds the value that is whitened afterwards.
GYRE_ADV_HOST_DEVICE inline double SampleValue(AdvantageKind kind, double r, const GroupStats& g,
                                               double eps) {
  switch (kind) {
    case AdvantageKind::kGrpo:
      if (g.n == 1 || g.all_equal) return 0.0;
      return (r - g.mean) / (g.std + eps);
    case AdvantageKind::kGrpoNoStd:
      return r - g.mean;
    case AdvantageKind::kRloo:
      if (g.n == 1) return 0.0;
      return static_cast<double>(g.n) / static_cast<double>(g.n - 1) * (r - g.mean);
    case AdvantageKind::kMedian:
      return r - g.median;
    case AdvantageKind::kReinforcePpBaseline:
      return r - g.mean;
    case AdvantageKind::kReinforcePp:
      return r;
  }
  return 0.0;
}

}  // namespace gyre::kernels::terms
