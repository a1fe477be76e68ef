// Fused token sampling: one thread block per row of logits, no sort of the vocabulary.
//
// Semantics are those of kernels/reference/sampling_ref.h, decision for decision: the same
// logit cleaning, p_i = float(expf(d_i) / S) with d_i = (logit_i - max) / T, truncation in the
// order top-k -> top-p (on the top-k survivors) -> min-p, ties kept, and the draw u =
// PhiloxUniform(seed, position) walking kept tokens in ascending id order.
//
// Algorithm (radix select instead of sorting). Each truncation rule keeps the tokens whose p is
// at or above a threshold, so the kernel only needs the thresholds:
//   pass 1      argmax (ties -> lowest id) of the cleaned logits;
//   pass 2      S = sum_i expf(d_i), in double, reduced in a fixed order;
//   top-k       the k-th largest p is found by a 4-digit most-significant-digit radix select over
//               the IEEE bits of p (p >= 0, so bit order is value order): each pass builds a
//               256-bin histogram of the candidates that share the digits chosen so far and picks
//               the bin holding the k-th largest. Four passes give the exact value.
//   top-p       the boundary b is the largest p with mass(p > b) < top_p * M <= mass(p >= b),
//               M the top-k survivors' mass: the same radix walk, with per-bin masses instead of
//               counts (ties at b are kept, exactly as the reference's sorted walk keeps them).
//   min-p       min(min_p, 1) * p_max, with p_max = float(1 / S).
//   draw        the row is cut into one contiguous segment per warp; each warp sums its kept mass,
//               the block finds the segment where the running mass passes u * kept_mass, and that
//               warp scans its segment 32 tokens at a time to find the token.
// Rules that are off cost nothing: plain temperature sampling reads the row three times, greedy
// twice; top-k and top-p each add four reads. Every p is recomputed from the logits on each read
// rather than stored (a [B, V] float buffer would cost more traffic than the recomputation).
//
// Determinism: masses are accumulated as unsigned 2^-62 fixed point, so histogram and segment
// sums use integer atomics/shuffles that are associative; S is a double sum in a fixed order. A
// row's result therefore never depends on scheduling, and it differs from the reference only where
// float expf (<= 2 ulp) or the fixed-point truncation (2^-62 per token) moves a decision, which
// the GPU test bounds (>= 99.9% identical tokens).
//
// Launch: grid = rows, block = 512 threads, ~6 KB static shared memory; the logits are read in
// their own dtype (bf16 stays bf16 in memory).

#include <cfloat>
#include <cmath>

#include "kernels/philox.h"
#include "kernels/sampling.cuh"

namespace gyre::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr unsigned kFull = 0xffffffffu;
constexpr double kFixedScale = 4611686018427387904.0;  // 2^62
using u64 = unsigned long long;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float Clean(float x) {
  if (isnan(x)) return -INFINITY;
  if (x > FLT_MAX) return FLT_MAX;
  return x;
}

// d = (clean - max) / T; -inf stays -inf.
__device__ __forceinline__ float Shifted(float clean, float max_logit, float tau) {
  if (clean == -INFINITY) return -INFINITY;
  return (clean - max_logit) / tau;
}

struct RowContext {
  float max_logit;
  float tau;
  double exp_sum;
};

template <typename T>
__device__ __forceinline__ float Prob(const T* row, int i, const RowContext& c) {
  const float d = Shifted(Clean(ToFloat(row[i])), c.max_logit, c.tau);
  return static_cast<float>(static_cast<double>(expf(d)) / c.exp_sum);
}

__device__ __forceinline__ u64 ToFixed(float p) {
  return static_cast<u64>(static_cast<double>(p) * kFixedScale);
}

struct Shared {
  u64 hist[kBins];
  double warp_sum[kWarps];
  float warp_val[kWarps];
  int warp_idx[kWarps];
  u64 seg_mass[kWarps];
  int seg_last[kWarps];
  // Values broadcast from one thread to the block.
  double exp_sum;
  float max_logit;
  int argmax;
  int bin;
  u64 before;
  u64 total;
  int seg;
  int token;
};

// Row argmax of the cleaned logits, ties -> lowest id; -1 when every logit is -inf or NaN.
template <typename T>
__device__ void ArgMax(const T* row, int V, Shared& sh) {
  float best = -INFINITY;
  int best_i = -1;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float v = Clean(ToFloat(row[i]));
    if (v > best) {  // ascending ids per thread: strict > keeps the lowest tied id
      best = v;
      best_i = i;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(kFull, best, off);
    const int oi = __shfl_down_sync(kFull, best_i, off);
    if (ov > best || (ov == best && oi >= 0 && (best_i < 0 || oi < best_i))) {
      best = ov;
      best_i = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh.warp_val[warp] = best;
    sh.warp_idx[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = -INFINITY;
    int bi = -1;
    for (int w = 0; w < kWarps; ++w) {
      const float v = sh.warp_val[w];
      const int vi = sh.warp_idx[w];
      if (v > b || (v == b && vi >= 0 && (bi < 0 || vi < bi))) {
        b = v;
        bi = vi;
      }
    }
    sh.max_logit = b;
    sh.argmax = bi;
  }
  __syncthreads();
}

// S = sum_i expf(d_i) in double: per-thread strided sums, a shuffle tree, then warps in order.
template <typename T>
__device__ double ExpSum(const T* row, int V, float max_logit, float tau, Shared& sh) {
  double s = 0.0;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    s += static_cast<double>(expf(Shifted(Clean(ToFloat(row[i])), max_logit, tau)));
  }
  for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(kFull, s, off);
  if (threadIdx.x % 32 == 0) sh.warp_sum[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kWarps; ++w) t += sh.warp_sum[w];
    sh.exp_sum = t;
  }
  __syncthreads();
  return sh.exp_sum;
}

// Run by warp 0 over sh.hist, bins visited from 255 down: finds the first bin at which the running
// total reaches `target` (>= 1) and stores it in sh.bin, with the total of the bins above it in
// sh.before. When the histogram holds less than `target` (only reachable through rounding), the
// lowest non-empty bin is chosen.
__device__ void FindCrossing(u64 target, Shared& sh) {
  const int lane = threadIdx.x % 32;
  const int top = kBins - 1 - 8 * lane;  // this lane's bins: top, top - 1, ..., top - 7
  u64 local = 0;
  for (int j = 0; j < 8; ++j) local += sh.hist[top - j];
  u64 incl = local;
  for (int off = 1; off < 32; off <<= 1) {
    const u64 o = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += o;
  }
  const u64 total = __shfl_sync(kFull, incl, 31);
  if (total < target) target = total;
  const u64 excl = incl - local;
  const unsigned hit = __ballot_sync(kFull, target > 0 && excl < target && target <= incl);
  if (hit == 0) {  // empty histogram: cannot happen for callers, which always have candidates
    if (lane == 0) {
      sh.bin = 0;
      sh.before = 0;
    }
    return;
  }
  if (lane == __ffs(hit) - 1) {
    u64 running = excl;
    for (int j = 0; j < 8; ++j) {
      const u64 v = sh.hist[top - j];
      if (running + v >= target) {
        sh.bin = top - j;
        sh.before = running;
        break;
      }
      running += v;
    }
  }
}

// Bits of the k-th largest p over the whole row (1 <= k <= V).
template <typename T>
__device__ uint32_t KthLargestBits(const T* row, int V, const RowContext& c, int k, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  u64 remaining = static_cast<u64>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += kThreads) {
      const uint32_t key = __float_as_uint(Prob(row, i, c));
      if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 0xffu], u64{1});
    }
    __syncthreads();
    if (threadIdx.x < 32) FindCrossing(remaining, sh);
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.bin) << shift;
    mask |= 0xffu << shift;
    remaining -= sh.before;
    __syncthreads();
  }
  return prefix;
}

// Bits of the top-p boundary among survivors (p > 0 and bits >= floor_bits).
template <typename T>
__device__ uint32_t TopPBoundaryBits(const T* row, int V, const RowContext& c, uint32_t floor_bits,
                                     float top_p, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  u64 target = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += kThreads) {
      const float p = Prob(row, i, c);
      const uint32_t key = __float_as_uint(p);
      if (p > 0.0f && key >= floor_bits && (key & mask) == prefix) {
        atomicAdd(&sh.hist[(key >> shift) & 0xffu], ToFixed(p));
      }
    }
    __syncthreads();
    if (shift == 24) {
      // M, the survivors' mass, is the first histogram's total; the target is top_p * M, and at
      // least one unit so that top_p <= 0 keeps the top token (and its ties) only.
      if (threadIdx.x == 0) {
        u64 m = 0;
        for (int b = 0; b < kBins; ++b) m += sh.hist[b];
        const double t = top_p > 0.0f ? static_cast<double>(top_p) * static_cast<double>(m) : 0.0;
        sh.total = t < 1.0 ? u64{1} : static_cast<u64>(t);
      }
      __syncthreads();
      target = sh.total;
    }
    if (threadIdx.x < 32) FindCrossing(target, sh);
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.bin) << shift;
    mask |= 0xffu << shift;
    target -= sh.before;
    __syncthreads();
  }
  return prefix;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SampleKernel(const T* logits, int V, const SamplingRowParams* params, int32_t* out_tokens,
                 float* out_logprobs, float* out_kept_mass) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * static_cast<int64_t>(V);
  const SamplingRowParams prm = params[r];

  ArgMax(row, V, sh);
  const int argmax = sh.argmax;
  const float max_logit = sh.max_logit;
  if (argmax < 0) {  // degenerate row: every logit -inf or NaN
    if (threadIdx.x == 0) {
      out_tokens[r] = 0;
      out_logprobs[r] = -INFINITY;
      out_kept_mass[r] = 0.0f;
    }
    return;
  }

  const bool greedy = !(prm.temperature > 0.0f);
  RowContext c;
  c.max_logit = max_logit;
  c.tau = greedy ? 1.0f : prm.temperature;
  c.exp_sum = ExpSum(row, V, max_logit, c.tau, sh);
  const double log_s = log(c.exp_sum);
  if (greedy) {
    if (threadIdx.x == 0) {
      out_tokens[r] = argmax;
      out_logprobs[r] =
          static_cast<float>(static_cast<double>(Shifted(max_logit, max_logit, 1.0f)) - log_s);
      out_kept_mass[r] = 1.0f;
    }
    return;
  }

  // Thresholds; a token is kept when p > 0 and its bits are >= every threshold's bits.
  uint32_t keep_bits = 0;
  if (prm.top_k > 0 && prm.top_k < V) keep_bits = KthLargestBits(row, V, c, prm.top_k, sh);
  if (prm.top_p < 1.0f) {
    const uint32_t b = TopPBoundaryBits(row, V, c, keep_bits, prm.top_p, sh);
    keep_bits = max(keep_bits, b);
  }
  if (prm.min_p > 0.0f) {
    const float p_max = static_cast<float>(1.0 / c.exp_sum);
    keep_bits = max(keep_bits, __float_as_uint(fminf(prm.min_p, 1.0f) * p_max));
  }

  // Kept mass per contiguous warp segment.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seg_len = (V + kWarps - 1) / kWarps;
  const int seg_begin = min(V, warp * seg_len), seg_end = min(V, seg_begin + seg_len);
  u64 mass = 0;
  int last = -1;
  for (int i = seg_begin + lane; i < seg_end; i += 32) {
    const float p = Prob(row, i, c);
    if (p > 0.0f && __float_as_uint(p) >= keep_bits) {
      mass += ToFixed(p);
      last = i;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    mass += __shfl_down_sync(kFull, mass, off);
    last = max(last, __shfl_down_sync(kFull, last, off));
  }
  if (lane == 0) {
    sh.seg_mass[warp] = mass;
    sh.seg_last[warp] = last;
  }
  __syncthreads();
  const float u = PhiloxUniform(prm.seed, prm.position);
  if (threadIdx.x == 0) {
    u64 total = 0;
    int last_kept = -1;
    for (int w = 0; w < kWarps; ++w) {
      total += sh.seg_mass[w];
      last_kept = max(last_kept, sh.seg_last[w]);
    }
    // The walk picks the first kept token whose running mass exceeds u * kept_mass.
    const u64 target = static_cast<u64>(static_cast<double>(u) * static_cast<double>(total));
    sh.total = total;
    sh.before = target;  // reused: the draw target
    sh.seg = -1;
    sh.token = last_kept;  // the reference's fallback when rounding ends the walk without a pick
    u64 running = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (running + sh.seg_mass[w] > target) {
        sh.seg = w;
        sh.bin = 0;
        sh.hist[0] = running;  // reused: mass before the chosen segment
        break;
      }
      running += sh.seg_mass[w];
    }
  }
  __syncthreads();
  if (warp == sh.seg) {
    const u64 target = sh.before;
    u64 running = sh.hist[0];
    for (int base = seg_begin; base < seg_end; base += 32) {
      const int i = base + lane;
      u64 v = 0;
      if (i < seg_end) {
        const float p = Prob(row, i, c);
        if (p > 0.0f && __float_as_uint(p) >= keep_bits) v = ToFixed(p);
      }
      u64 incl = v;
      for (int off = 1; off < 32; off <<= 1) {
        const u64 o = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += o;
      }
      const unsigned hit = __ballot_sync(kFull, running + incl > target);
      if (hit != 0) {
        if (lane == __ffs(hit) - 1) sh.token = i;
        break;
      }
      running += __shfl_sync(kFull, incl, 31);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int token = sh.token;
    const float d = Shifted(Clean(ToFloat(row[token])), max_logit, c.tau);
    out_tokens[r] = token;
    out_logprobs[r] = static_cast<float>(static_cast<double>(d) - log_s);
    out_kept_mass[r] = static_cast<float>(static_cast<double>(sh.total) / kFixedScale);
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchSampleRows(const T* logits, int64_t rows, int64_t vocab,
                             const SamplingRowParams* params, int32_t* out_tokens,
                             float* out_logprobs, float* out_kept_mass, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows < 0 || rows > 0x7fffffff || vocab < 1 || vocab > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  SampleKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, static_cast<int>(vocab), params, out_tokens, out_logprobs, out_kept_mass);
  return cudaGetLastError();
}

template cudaError_t LaunchSampleRows<float>(const float*, int64_t, int64_t,
                                             const SamplingRowParams*, int32_t*, float*, float*,
                                             cudaStream_t);
template cudaError_t LaunchSampleRows<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t,
                                                     const SamplingRowParams*, int32_t*, float*,
                                                     float*, cudaStream_t);

}  // namespace gyre::kernels
