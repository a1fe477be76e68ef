// Float32 matmul of the paged engine's CPU forward, for the shape decoding has: a weight W
// [N, K] (row-major, as nn.Linear keeps it) times feature-major activations X [K, C] with a few
// dozen columns C (one per sequence of the batch).
//
// Why not ATen's mm: at C = 64 every weight element is used 64 times and the weights stream from
// memory once per step, which the FMA units can keep up with; a general GEMM (MKL, oneDNN) first
// copies each weight panel into its packed layout, on every call, and reaches about 0.6 of the
// machine's matmul peak on SmolLM2's shapes. This kernel reads W in place: a tile of 6 weight
// rows x 64 columns held in registers (24 AVX-512 accumulators, or 6 x 16 with AVX2), the
// activations' row k loaded once per k and each weight broadcast from memory, the next tile's
// rows prefetched. On the 2-core dev host it reaches about 0.97 of the square-matmul peak over
// SmolLM2's 30 layers and LM head (docs/rollout.md).
//
// Each output is a plain sum over k in order, so results do not depend on the thread count; they
// differ from ATen's only in the order of the float sums. No libtorch in this header.
#pragma once

#include <cstdint>

namespace gyre::model {

struct CpuMatmulArgs {
  const float* w = nullptr;  // [n, k], row i at w + i * ldw
  int64_t ldw = 0;
  const float* x = nullptr;  // [k, cols], row j at x + j * ldx
  int64_t ldx = 0;
  float* out = nullptr;  // [n, cols] at out + i * ldo (or [cols, n] with transpose_out)
  int64_t ldo = 0;
  int64_t n = 0, k = 0, cols = 0;
  bool accumulate = false;     // out += W X instead of out = W X
  bool transpose_out = false;  // write out[c * ldo + i] instead of out[i * ldo + c]
};

// The SIMD level the kernel runs at: 2 for AVX-512, 1 for AVX2 with FMA, 0 when neither is
// available or ATEN_CPU_CAPABILITY asks for less ("default": none, "avx2": at most AVX2), in
// which case CpuMatmul returns false and the caller uses ATen.
int CpuMatmulLevel();

// out (+)= W X on ATen's intra-op threads, at min(level, CpuMatmulLevel()) (level < 0: the best
// available; tests pass 1 to run the AVX2 path on an AVX-512 CPU). False, with nothing written,
// when that level is 0. `out` may not alias `w` or `x`.
bool CpuMatmul(const CpuMatmulArgs& a, int level = -1);

}  // namespace gyre::model
