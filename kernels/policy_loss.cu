// Fused forward and backward of the clipped policy-gradient loss, matching
// kernels/reference/policy_loss_ref.cc (per-token math in double, gradient rounded once to float).
// The per-token math itself (policy term, behaviour weight, KL, aggregation scale) is not written
// here: both call kernels/policy_loss_terms.h.
//
// Parallel decomposition and launch configuration (four kernels on one stream, no host sync):
//  1. SeqTokensKernel, grid = S blocks x 256 threads: block s sums sequence s's mask (double, tree
//     reduction in shared memory) into seq_tokens[s], and for the kSeqTis correction the masked sum
//     of logp_old - logp_rollout into seq_d[s], and for the sequence kinds (kGspo, kGmpo) the
//     masked mean X into seq_x[s] (terms::SequenceLogRatio). Seq-mean modes need these per-sequence
//     denominators (and seq-tis its weight) before any token's gradient can be scaled.
//  2. ScalesKernel, 1 block x 1024 threads: reduces seq_tokens into the local token count and the
//     number of sequences with a token, picks the mode's denominators (global ones when given),
//     and writes scale[s], the factor turning sequence s's masked token sum into its share of the
//     loss (0 for a zero denominator), plus the kStatTokens slot.
//  3. TokenKernel, grid = S blocks x 256 threads: block s strides over its T tokens; each token's
//     loss and gradient is elementwise given scale[s] (and kGspo's seq_x[s]), with the same policy
//     term by kind / clamp / PPO clip / dual clip /
//     behaviour weight / KL branches and tie rules as the reference. Masked-out tokens (m == 0) are
//     skipped before any input is read, so padding may hold NaN. The block reduces its
//     per-sequence sums (and the weight's max) and writes them to partials[s][0..8].
//  4. FinalizeKernel, 1 block x 1024 threads: reduces partials over sequences into stats_device.
// Every reduction has a fixed shape, so results are deterministic run to run (no atomics).
// Scratch: seq_tokens[S], seq_d[S], seq_x[S], scale[S] and partials[S * 9] doubles in one
// cudaMallocAsync block.
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cstdint>

#include "kernels/policy_loss.cuh"
#include "kernels/policy_loss_terms.h"

namespace gyre::kernels {
namespace {

constexpr int kSeqThreads = 256;
constexpr int kOneBlockThreads = 1024;
constexpr int kFillThreads = 256;
constexpr int64_t kFillMaxBlocks = 65536;

// Per-sequence partial sums written by TokenKernel (all but kPartTisMax already include the mask).
enum PartialSlot : int {
  kPartLoss = 0,  // scale[s] * sum_t m * (w * L + kl_coef * k)
  kPartPg,        // scale[s] * sum_t m * w * L
  kPartKl,        // scale[s] * sum_t m * k
  kPartClipped,
  kPartDualClipped,
  kPartApproxKl,
  kPartTisSum,
  kPartTisMax,
  kPartCorrMasked,
  kNumPartials
};

using terms::Max;

// Sum (or, with kMax, std::max-style maximum) of `value` over the block (blockDim.x == kThreads, a
// power of two), returned to every thread. `scratch` is kThreads doubles of shared memory, free
// again on return. Every thread of the block must call it.
template <int kThreads, bool kMax = false>
__device__ double BlockReduce(double value, double* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    const int t = threadIdx.x;
    if (t < stride) {
      scratch[t] = kMax ? Max(scratch[t], scratch[t + stride]) : scratch[t] + scratch[t + stride];
    }
    __syncthreads();
  }
  const double result = scratch[0];
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kSeqThreads)
    SeqTokensKernel(PolicyLossInputs in, PolicyLossParams p, double* __restrict__ seq_tokens,
                    double* __restrict__ seq_d, double* __restrict__ seq_x) {
  __shared__ double scratch[kSeqThreads];
  const int64_t T = in.T;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * T;
  const bool seq_weight = p.correction == Correction::kSeqTis;
  const bool seq_ratio = terms::UsesSequenceRatio(p.kind);
  double sum = 0.0, dsum = 0.0, xsum = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const double m = in.mask[base + t];
    sum += m;
    if (seq_weight && m != 0.0) {
      dsum += m * (static_cast<double>(in.logp_old[base + t]) - in.logp_rollout[base + t]);
    }
    if (seq_ratio && m != 0.0) {
      xsum += m * terms::SequenceLogRatio(
                      static_cast<double>(in.logp[base + t]) - in.logp_old[base + t],
                      in.advantages[base + t], p);
    }
  }
  sum = BlockReduce<kSeqThreads>(sum, scratch);
  dsum = BlockReduce<kSeqThreads>(dsum, scratch);
  xsum = BlockReduce<kSeqThreads>(xsum, scratch);
  if (threadIdx.x == 0) {
    seq_tokens[blockIdx.x] = sum;
    seq_d[blockIdx.x] = dsum;
    seq_x[blockIdx.x] = seq_ratio && sum != 0.0 ? xsum / sum : 0.0;
  }
}

__global__ void __launch_bounds__(kOneBlockThreads)
    ScalesKernel(const double* __restrict__ seq_tokens, int64_t S, int64_t T, PolicyLossParams p,
                 double* __restrict__ scale, double* __restrict__ stats) {
  __shared__ double scratch[kOneBlockThreads];
  double tokens = 0.0, seqs = 0.0;
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
    tokens += seq_tokens[s];
    if (seq_tokens[s] != 0.0) seqs += 1.0;
  }
  const double local_tokens = BlockReduce<kOneBlockThreads>(tokens, scratch);
  const double local_seqs = BlockReduce<kOneBlockThreads>(seqs, scratch);
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
    scale[s] =
        terms::AggregationScale(p, local_tokens, local_seqs, seq_tokens[s], static_cast<double>(T));
  }
  if (threadIdx.x == 0) stats[kStatTokens] = local_tokens;
}

__global__ void __launch_bounds__(kSeqThreads)
    TokenKernel(PolicyLossInputs in, PolicyLossParams p, const double* __restrict__ scale,
                const double* __restrict__ seq_d, const double* __restrict__ seq_x,
                float* __restrict__ grad_logp, double* __restrict__ partials) {
  __shared__ double scratch[kSeqThreads];
  const int64_t s = blockIdx.x;
  const int64_t T = in.T;
  const double seq_scale = scale[s];
  const double sequence_d = seq_d[s];
  const double sequence_x = seq_x[s];
  const double kl_coef = p.kl_coef;

  double seq_loss = 0.0, seq_pg = 0.0, seq_kl = 0.0;
  double clipped = 0.0, dual_clipped = 0.0, approx_kl = 0.0, tis_sum = 0.0, tis_max = 0.0;
  double corr_masked = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const int64_t i = s * T + t;
    const double m = in.mask[i];
    if (m == 0.0) {
      if (grad_logp != nullptr) grad_logp[i] = 0.0f;
      continue;
    }
    const double logp = in.logp[i];
    const double logp_old = in.logp_old[i];
    const terms::PgTerm pg = terms::PolicyTerm(logp - logp_old, sequence_x, in.advantages[i], p);
    const double w = p.correction == Correction::kNone
                         ? 1.0
                         : terms::BehaviourWeight(
                               p, logp_old - static_cast<double>(in.logp_rollout[i]), sequence_d);
    double kl = 0.0, kl_grad = 0.0;
    if (p.kl != KlKind::kNone) terms::KlTerm(p.kl, logp, in.logp_ref[i], &kl, &kl_grad);

    seq_pg += m * w * pg.loss;
    seq_kl += m * kl;
    seq_loss += m * (w * pg.loss + kl_coef * kl);
    if (grad_logp != nullptr) {
      grad_logp[i] = static_cast<float>(seq_scale * m * (w * pg.grad + kl_coef * kl_grad));
    }

    const double log_ratio = logp - logp_old;
    approx_kl += m * 0.5 * log_ratio * log_ratio;
    if (pg.clipped) clipped += m;
    if (pg.dual_clipped) dual_clipped += m;
    tis_sum += m * w;
    tis_max = Max(tis_max, w);
    if (w == 0.0) corr_masked += m;
  }

  double* out = partials + s * kNumPartials;
  const double values[kNumPartials] = {seq_loss,  seq_pg,  seq_kl,  clipped,    dual_clipped,
                                       approx_kl, tis_sum, tis_max, corr_masked};
#pragma unroll
  for (int k = 0; k < kNumPartials; ++k) {
    const double total = k == kPartTisMax ? BlockReduce<kSeqThreads, true>(values[k], scratch)
                                          : BlockReduce<kSeqThreads>(values[k], scratch);
    if (threadIdx.x != 0) continue;
    const bool scaled = k == kPartLoss || k == kPartPg || k == kPartKl;
    out[k] = scaled ? seq_scale * total : total;
  }
}

__global__ void __launch_bounds__(kOneBlockThreads)
    FinalizeKernel(const double* __restrict__ partials, int64_t S, double* __restrict__ stats) {
  __shared__ double scratch[kOneBlockThreads];
  // partial slot -> stats slot
  constexpr int kTarget[kNumPartials] = {kStatLoss,    kStatPgLoss,      kStatKl,
                                         kStatClipped, kStatDualClipped, kStatApproxKl,
                                         kStatTisSum,  kStatTisMax,      kStatCorrMasked};
  for (int k = 0; k < kNumPartials; ++k) {
    const bool is_max = k == kPartTisMax;
    double acc = 0.0;
    for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
      const double v = partials[s * kNumPartials + k];
      acc = is_max ? Max(acc, v) : acc + v;
    }
    const double total = is_max ? BlockReduce<kOneBlockThreads, true>(acc, scratch)
                                : BlockReduce<kOneBlockThreads>(acc, scratch);
    if (threadIdx.x == 0) stats[kTarget[k]] = total;
  }
}

template <typename Scalar>
__global__ void FillNanKernel(Scalar* __restrict__ out, int64_t count) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    out[i] = static_cast<Scalar>(CUDART_NAN);
  }
}

template <typename Scalar>
cudaError_t FillNan(Scalar* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int64_t blocks = std::min((count + kFillThreads - 1) / kFillThreads, kFillMaxBlocks);
  FillNanKernel<Scalar><<<static_cast<unsigned int>(blocks), kFillThreads, 0, stream>>>(out, count);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPolicyLoss(const PolicyLossInputs& in, const PolicyLossParams& p,
                             float* grad_logp, double* stats_device, cudaStream_t stream) {
  const int64_t S = in.S, T = in.T;
  if (S < 0 || T < 0 || stats_device == nullptr) return cudaErrorInvalidValue;
  if (S * T > 0 && (in.logp == nullptr || in.logp_old == nullptr || in.advantages == nullptr ||
                    in.mask == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (S > 0x7fffffff) return cudaErrorInvalidValue;  // one block per sequence

  // Misuse is loud, as in the reference: every stat and gradient entry is NaN.
  if ((p.correction != Correction::kNone && in.logp_rollout == nullptr) ||
      (p.kl != KlKind::kNone && in.logp_ref == nullptr)) {
    cudaError_t err = FillNan(stats_device, kPolicyLossStatSlots, stream);
    if (err == cudaSuccess && grad_logp != nullptr) err = FillNan(grad_logp, S * T, stream);
    return err;
  }
  if (S == 0) {
    return cudaMemsetAsync(stats_device, 0, sizeof(double) * kPolicyLossStatSlots, stream);
  }

  double* scratch = nullptr;
  cudaError_t err = cudaMallocAsync(
      &scratch, sizeof(double) * static_cast<size_t>(S) * (4 + kNumPartials), stream);
  if (err != cudaSuccess) return err;
  double* seq_tokens = scratch;
  double* seq_d = scratch + S;
  double* seq_x = scratch + 2 * S;
  double* scale = scratch + 3 * S;
  double* partials = scratch + 4 * S;
  const unsigned int seq_blocks = static_cast<unsigned int>(S);

  SeqTokensKernel<<<seq_blocks, kSeqThreads, 0, stream>>>(in, p, seq_tokens, seq_d, seq_x);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    ScalesKernel<<<1, kOneBlockThreads, 0, stream>>>(seq_tokens, S, T, p, scale, stats_device);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    TokenKernel<<<seq_blocks, kSeqThreads, 0, stream>>>(in, p, scale, seq_d, seq_x, grad_logp,
                                                        partials);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    FinalizeKernel<<<1, kOneBlockThreads, 0, stream>>>(partials, S, stats_device);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(scratch, stream);
  return err != cudaSuccess ? err : free_err;
}

PolicyLossStats FinishPolicyLossStats(const double* stats_host, const PolicyLossParams& /*p*/) {
  PolicyLossStats stats{};
  stats.loss = stats_host[kStatLoss];
  stats.pg_loss = stats_host[kStatPgLoss];
  stats.kl = stats_host[kStatKl];
  stats.tokens = stats_host[kStatTokens];
  if (stats.tokens != 0.0) {
    stats.clip_frac = stats_host[kStatClipped] / stats.tokens;
    stats.dual_clip_frac = stats_host[kStatDualClipped] / stats.tokens;
    stats.approx_kl = stats_host[kStatApproxKl] / stats.tokens;
    stats.tis_mean = stats_host[kStatTisSum] / stats.tokens;
    stats.tis_max = stats_host[kStatTisMax];
    stats.corr_masked_frac = stats_host[kStatCorrMasked] / stats.tokens;
  }
  return stats;
}

}  // namespace gyre::kernels
