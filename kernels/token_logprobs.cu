// Fused log-softmax + gather (+ entropy) over the vocabulary, forward and backward.
//
// Decomposition: one thread block (256 threads) per row of logits [rows, V]. Each thread walks
// the row with a stride of blockDim.x, reading logits in their own dtype (bf16 stays bf16 in
// memory), and keeps an online triple (m, s, w): the running max of z = logit / tau,
// s = sum exp(z - m) and w = sum exp(z - m) * z, rescaled whenever m grows. Triples are merged
// across the warp with shuffles, then across warps through shared memory. From the row's triple:
// logsumexp = m + log s, logp = z[y] - logsumexp, entropy = logsumexp - w / s.
// The backward kernel recomputes the row's triple (one extra read of the row, no [rows, V]
// float32 buffer kept between passes) and writes
//   grad[j] = (g_logp (1[j = y] - p_j) - g_entropy p_j (log p_j + H)) / tau
// in the logits' dtype. Memory traffic: forward reads the logits once; backward reads them
// twice and writes the gradient once. Launch: grid = rows, block = 256, no dynamic shared memory.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/token_logprobs.cuh"

namespace gyre::kernels {

namespace {

constexpr int kThreads = 256;

struct Triple {
  float m, s, w;
};

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

__device__ __forceinline__ Triple Merge(Triple a, Triple b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  const float ea = __expf(a.m - m), eb = __expf(b.m - m);
  return {m, a.s * ea + b.s * eb, a.w * ea + b.w * eb};
}

// The block-wide triple of one row, returned to every thread.
template <typename T>
__device__ Triple RowTriple(const T* row, int64_t V, float inv_tau) {
  Triple t{-INFINITY, 0.f, 0.f};
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float z = ToFloat(row[j]) * inv_tau;
    if (z == -INFINITY) continue;
    if (z > t.m) {
      const float scale = t.m == -INFINITY ? 0.f : __expf(t.m - z);
      t.s *= scale;
      t.w *= scale;
      t.m = z;
    }
    const float e = __expf(z - t.m);
    t.s += e;
    t.w += e * z;
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    Triple o{__shfl_xor_sync(0xffffffffu, t.m, offset), __shfl_xor_sync(0xffffffffu, t.s, offset),
             __shfl_xor_sync(0xffffffffu, t.w, offset)};
    t = Merge(t, o);
  }
  __shared__ Triple warp_totals[kThreads / 32];
  __shared__ Triple total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_totals[warp] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    Triple acc = warp_totals[0];
    for (int i = 1; i < static_cast<int>(blockDim.x / 32); ++i) acc = Merge(acc, warp_totals[i]);
    total = acc;
  }
  __syncthreads();
  return total;
}

template <typename T>
__global__ void ForwardKernel(const T* logits, const int64_t* targets, int64_t V, float inv_tau,
                              float* logp, float* entropy) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * V;
  const Triple t = RowTriple(row, V, inv_tau);
  if (threadIdx.x == 0) {
    const float lse = t.m + __logf(t.s);
    logp[r] = ToFloat(row[targets[r]]) * inv_tau - lse;
    if (entropy != nullptr) entropy[r] = lse - t.w / t.s;
  }
}

template <typename T>
__global__ void BackwardKernel(const T* logits, const int64_t* targets, int64_t V, float inv_tau,
                               const float* grad_logp, const float* grad_entropy, T* grad_logits) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * V;
  const Triple t = RowTriple(row, V, inv_tau);
  const float lse = t.m + __logf(t.s);
  const float h = lse - t.w / t.s;
  const float g_lp = grad_logp[r];
  const float g_h = grad_entropy != nullptr ? grad_entropy[r] : 0.f;
  const int64_t y = targets[r];
  T* out = grad_logits + r * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float log_p = ToFloat(row[j]) * inv_tau - lse;
    const float p = __expf(log_p);
    float g = -g_lp * p;
    if (j == y) g += g_lp;
    if (g_h != 0.f && p > 0.f) g -= g_h * p * (log_p + h);
    Store(out + j, g * inv_tau);
  }
}

float InvTau(float temperature) { return temperature > 0 ? 1.0f / temperature : 1.0f; }

}  // namespace

template <typename T>
cudaError_t LaunchTokenLogprobsForward(const T* logits, const int64_t* targets, int64_t rows,
                                       int64_t V, float temperature, float* logp, float* entropy,
                                       cudaStream_t stream) {
  if (rows <= 0 || V <= 0) return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  ForwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, V, InvTau(temperature), logp, entropy);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchTokenLogprobsBackward(const T* logits, const int64_t* targets, int64_t rows,
                                        int64_t V, float temperature, const float* grad_logp,
                                        const float* grad_entropy, T* grad_logits,
                                        cudaStream_t stream) {
  if (rows <= 0 || V <= 0) return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  BackwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, V, InvTau(temperature), grad_logp, grad_entropy, grad_logits);
  return cudaGetLastError();
}

template cudaError_t LaunchTokenLogprobsForward<float>(const float*, const int64_t*, int64_t,
                                                       int64_t, float, float*, float*,
                                                       cudaStream_t);
template cudaError_t LaunchTokenLogprobsForward<__nv_bfloat16>(const __nv_bfloat16*, const int64_t*,
                                                               int64_t, int64_t, float, float*,
                                                               float*, cudaStream_t);
template cudaError_t LaunchTokenLogprobsBackward<float>(const float*, const int64_t*, int64_t,
                                                        int64_t, float, const float*, const float*,
                                                        float*, cudaStream_t);
template cudaError_t LaunchTokenLogprobsBackward<__nv_bfloat16>(const __nv_bfloat16*,
                                                                const int64_t*, int64_t, int64_t,
                                                                float, const float*, const float*,
                                                                __nv_bfloat16*, cudaStream_t);

}  // namespace gyre::kernels
