// Group-relative advantages and their broadcast to tokens, matching
// kernels/reference/advantages_ref.cc to float rounding. Each sample's value comes from
// kernels/advantage_terms.h, which the reference calls too; this file holds the parallel parts.
//
// Parallel decomposition and launch configuration:
//  * GroupAdvantagesKernel: one block of kGroupThreads (256) threads per group (grid = num_groups),
//    so groups of different sizes are independent. Each thread strides over its group's samples.
//    The zero-variance flag is a block-wide AND (__syncthreads_and). The mean and the unbiased
//    variance are double sums combined by a fixed-shape tree reduction in shared memory (so the
//    result is deterministic), then each sample's advantage is computed in double and rounded
//    once to float, as the reference does.
//    The median (kMedian) is found by ranking, not sorting: sample i's rank is the number of
//    samples smaller than it plus the number of equal samples at lower indices. Ranks are then a
//    permutation of 0..n-1, and the samples of rank (n-1)/2 and n/2 are the two middle values of
//    the sorted group. This costs n^2 / 256 comparisons per thread; groups of up to
//    kMedianSharedMaxGroupSize samples are first copied to shared memory (16 KiB), larger groups
//    are ranked straight from global memory. A NaN anywhere in the group makes its median NaN.
//  * kReinforcePpBaseline and kReinforcePp need statistics of the whole batch: the group kernel
//    writes the centred values R_i - mean_g (kReinforcePp: R_i itself) in double to stream-ordered
//    scratch, then ReinforceWhitenKernel, a single block of kWhitenThreads (1024) threads, reduces
//    their mean and unbiased std over the batch and writes the whitened advantages. Batches hold at
//    most millions of samples, so one block is enough and keeps the reduction order fixed.
//  * BroadcastKernel: elementwise over the [S, T] mask, a grid-stride loop with 256 threads per
//    block and at most 65536 blocks.
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cstdint>

#include "kernels/advantage_terms.h"
#include "kernels/advantages.cuh"

namespace gyre::kernels {
namespace {

constexpr int kGroupThreads = 256;
constexpr int kWhitenThreads = 1024;
constexpr int kBroadcastThreads = 256;
constexpr int64_t kBroadcastMaxBlocks = 65536;

// Sum of `value` over the block (blockDim.x == kThreads, a power of two), returned to every
// thread. `scratch` is kThreads doubles of shared memory; it is free again when this returns.
// Every thread of the block must call it.
template <int kThreads>
__device__ double BlockSum(double value, double* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      scratch[threadIdx.x] += scratch[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();
  return total;
}

// The median of vals[0, n) (n >= 1) in double, or NaN when any value is NaN; same value on every
// thread. `middle` is 2 doubles of shared memory. Every thread of the block must call it.
__device__ double BlockMedian(const float* vals, int32_t n, double* middle) {
  bool has_nan = false;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) has_nan |= isnan(vals[i]);
  if (__syncthreads_or(has_nan)) return CUDART_NAN;

  const int32_t lower = (n - 1) / 2;  // equal to upper when n is odd
  const int32_t upper = n / 2;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = vals[i];
    int32_t rank = 0;
    for (int32_t j = 0; j < n; ++j) {
      const float u = vals[j];
      rank += (u < v || (u == v && j < i)) ? 1 : 0;
    }
    if (rank == lower) middle[0] = v;
    if (rank == upper) middle[1] = v;
  }
  __syncthreads();
  const double median = (n % 2 == 1) ? middle[1] : 0.5 * (middle[0] + middle[1]);
  __syncthreads();
  return median;
}

__global__ void __launch_bounds__(kGroupThreads)
    GroupAdvantagesKernel(const float* __restrict__ rewards, const int32_t* __restrict__ offsets,
                          AdvantageKind kind, float eps, float* __restrict__ advantages,
                          uint8_t* __restrict__ zero_variance, double* __restrict__ centred) {
  __shared__ double reduce_scratch[kGroupThreads];
  __shared__ float group_copy[kMedianSharedMaxGroupSize];
  __shared__ double middle[2];

  const int32_t g = blockIdx.x;
  const int32_t begin = offsets[g];
  const int32_t n = offsets[g + 1] - begin;
  const float* r = rewards + begin;
  float* adv = advantages + begin;

  bool equal = true;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) equal &= (r[i] == r[0]);
  // A lone NaN is not "zero variance": its advantage is NaN, not 0 (as the reference).
  const bool all_equal = __syncthreads_and(equal) != 0 && (n == 0 || !isnan(r[0]));
  if (zero_variance != nullptr && threadIdx.x == 0) zero_variance[g] = all_equal ? 1 : 0;
  if (n == 0) return;

  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) sum += static_cast<double>(r[i]);
  const double mean = BlockSum<kGroupThreads>(sum, reduce_scratch) / static_cast<double>(n);

  // The group's statistics (every thread of the block takes part in each reduction; n, kind and
  // all_equal are the same for the whole block), then each sample's value from
  // kernels/advantage_terms.h, as the reference.
  terms::GroupStats stats;
  stats.n = n;
  stats.mean = mean;
  stats.all_equal = all_equal;
  if (terms::NeedsStd(kind) && n > 1 && !all_equal) {
    double sq = 0.0;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const double d = static_cast<double>(r[i]) - mean;
      sq += d * d;
    }
    stats.std = sqrt(BlockSum<kGroupThreads>(sq, reduce_scratch) / static_cast<double>(n - 1));
  }
  if (terms::NeedsMedian(kind)) {
    const float* vals = r;
    if (n <= kMedianSharedMaxGroupSize) {  // uniform across the block
      for (int32_t i = threadIdx.x; i < n; i += blockDim.x) group_copy[i] = r[i];
      __syncthreads();
      vals = group_copy;
    }
    stats.median = BlockMedian(vals, n, middle);
  }
  const bool whiten = terms::WhitenedOverBatch(kind);
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v =
        terms::SampleValue(kind, static_cast<double>(r[i]), stats, static_cast<double>(eps));
    if (whiten) {
      centred[begin + i] = v;
    } else {
      adv[i] = static_cast<float>(v);
    }
  }
}

// Whitens the batch's centred values (the reinforce_pp kinds' second pass). One block; total >= 1.
__global__ void __launch_bounds__(kWhitenThreads)
    ReinforceWhitenKernel(const double* __restrict__ centred, int32_t total, float eps,
                          float* __restrict__ advantages) {
  __shared__ double reduce_scratch[kWhitenThreads];
  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < total; i += blockDim.x) sum += centred[i];
  const double batch_mean =
      BlockSum<kWhitenThreads>(sum, reduce_scratch) / static_cast<double>(total);
  double sq = 0.0;
  for (int32_t i = threadIdx.x; i < total; i += blockDim.x) {
    const double d = centred[i] - batch_mean;
    sq += d * d;
  }
  const double sq_total = BlockSum<kWhitenThreads>(sq, reduce_scratch);
  const double batch_std = total > 1 ? sqrt(sq_total / static_cast<double>(total - 1)) : 0.0;
  const double denom = batch_std + static_cast<double>(eps);
  for (int32_t i = threadIdx.x; i < total; i += blockDim.x) {
    advantages[i] = static_cast<float>((centred[i] - batch_mean) / denom);
  }
}

__global__ void BroadcastKernel(const float* __restrict__ seq_values,
                                const float* __restrict__ mask, int64_t count, int64_t T,
                                float* __restrict__ out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    const float m = mask[i];
    out[i] = m == 0.0f ? 0.0f : seq_values[i / T] * m;
  }
}

}  // namespace

cudaError_t LaunchGroupAdvantages(const float* rewards, const int32_t* group_offsets,
                                  int32_t num_groups, AdvantageKind kind, float eps,
                                  float* advantages, uint8_t* zero_variance, int32_t total,
                                  cudaStream_t stream) {
  if (num_groups < 0 || total < 0) return cudaErrorInvalidValue;
  if (num_groups == 0) return cudaSuccess;
  if (group_offsets == nullptr) return cudaErrorInvalidValue;
  if (total > 0 && (rewards == nullptr || advantages == nullptr)) return cudaErrorInvalidValue;

  const bool whiten =
      (kind == AdvantageKind::kReinforcePpBaseline || kind == AdvantageKind::kReinforcePp) &&
      total > 0;
  double* centred = nullptr;
  if (whiten) {
    const cudaError_t err =
        cudaMallocAsync(&centred, sizeof(double) * static_cast<size_t>(total), stream);
    if (err != cudaSuccess) return err;
  }

  GroupAdvantagesKernel<<<num_groups, kGroupThreads, 0, stream>>>(
      rewards, group_offsets, kind, eps, advantages, zero_variance, centred);
  cudaError_t err = cudaGetLastError();
  if (whiten) {
    if (err == cudaSuccess) {
      ReinforceWhitenKernel<<<1, kWhitenThreads, 0, stream>>>(centred, total, eps, advantages);
      err = cudaGetLastError();
    }
    const cudaError_t free_err = cudaFreeAsync(centred, stream);
    if (err == cudaSuccess) err = free_err;
  }
  return err;
}

cudaError_t LaunchBroadcastToTokens(const float* seq_values, const float* mask, int64_t S,
                                    int64_t T, float* out, cudaStream_t stream) {
  if (S < 0 || T < 0) return cudaErrorInvalidValue;
  const int64_t count = S * T;
  if (count == 0) return cudaSuccess;
  if (seq_values == nullptr || mask == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const int64_t blocks =
      std::min((count + kBroadcastThreads - 1) / kBroadcastThreads, kBroadcastMaxBlocks);
  BroadcastKernel<<<static_cast<unsigned int>(blocks), kBroadcastThreads, 0, stream>>>(
      seq_values, mask, count, T, out);
  return cudaGetLastError();
}

}  // namespace gyre::kernels
