#include "model/cpu_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GYRE_GEMM_X86 1
#endif

namespace gyre::model {

namespace {

constexpr int kTileRows = 6;  // weight rows per register tile

#ifdef GYRE_GEMM_X86

#define GYRE_AVX512 __attribute__((target("avx512f,fma")))
#define GYRE_AVX2 __attribute__((target("avx2,fma")))

// Writes a finished tile: acc[j][c] for rows i0 + j < i0 + NB and columns c0 + c < c0 + width.
template <int NB>
void StoreTile(const CpuMatmulArgs& a, const float (*acc)[64], int64_t i0, int64_t c0,
               int64_t width) {
  if (a.transpose_out) {
    for (int64_t c = 0; c < width; ++c) {
      float* o = a.out + (c0 + c) * a.ldo + i0;
      for (int j = 0; j < NB; ++j) o[j] = a.accumulate ? o[j] + acc[j][c] : acc[j][c];
    }
    return;
  }
  for (int j = 0; j < NB; ++j) {
    float* o = a.out + (i0 + j) * a.ldo + c0;
    for (int64_t c = 0; c < width; ++c) o[c] = a.accumulate ? o[c] + acc[j][c] : acc[j][c];
  }
}

// One tile with AVX-512: NB weight rows x up to 16 * NV columns (the last vector masked to
// `width`). `prefetch`: the next tile's first weight row, or null.
template <int NB, int NV>
GYRE_AVX512 void TileAvx512(const CpuMatmulArgs& a, int64_t i0, int64_t c0, int64_t width,
                            const float* prefetch) {
  const __mmask16 last = static_cast<__mmask16>(
      width - 16 * (NV - 1) >= 16 ? 0xFFFF : (1u << (width - 16 * (NV - 1))) - 1);
  __m512 acc[NB][NV];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
  }
  // Locals, not a.*: loads through `a` inside the loop would keep the accumulators in memory.
  const int64_t depth = a.k, ldw = a.ldw, ldx = a.ldx;
  const float* w = a.w + i0 * ldw;
  const float* x = a.x + c0;
  for (int64_t k = 0; k < depth; ++k) {
    if (prefetch != nullptr && (k & 15) == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < kTileRows; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldw + k), _MM_HINT_T0);
      }
    }
    const float* xr = x + k * ldx;
    __m512 xv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      xv[v] = v + 1 < NV ? _mm512_loadu_ps(xr + 16 * v) : _mm512_maskz_loadu_ps(last, xr + 16 * v);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m512 wb = _mm512_set1_ps(w[j * ldw + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_fmadd_ps(wb, xv[v], acc[j][v]);
    }
  }
  alignas(64) float tile[NB][64];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_store_ps(&tile[j][16 * v], acc[j][v]);
  }
  StoreTile<NB>(a, tile, i0, c0, width);
}

// The same with AVX2: NB rows x up to 8 * NV columns (NV <= 2: 12 accumulators of 16 registers).
template <int NB, int NV>
GYRE_AVX2 void TileAvx2(const CpuMatmulArgs& a, int64_t i0, int64_t c0, int64_t width,
                        const float* prefetch) {
  alignas(32) int32_t mask_bits[8];
  const int64_t tail = width - 8 * (NV - 1);
  for (int i = 0; i < 8; ++i) mask_bits[i] = i < tail ? -1 : 0;
  const __m256i last = _mm256_load_si256(reinterpret_cast<const __m256i*>(mask_bits));
  __m256 acc[NB][NV];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm256_setzero_ps();
  }
  // Locals, not a.*: loads through `a` inside the loop would keep the accumulators in memory.
  const int64_t depth = a.k, ldw = a.ldw, ldx = a.ldx;
  const float* w = a.w + i0 * ldw;
  const float* x = a.x + c0;
  for (int64_t k = 0; k < depth; ++k) {
    if (prefetch != nullptr && (k & 15) == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < kTileRows; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldw + k), _MM_HINT_T0);
      }
    }
    const float* xr = x + k * ldx;
    __m256 xv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      xv[v] = v + 1 < NV ? _mm256_loadu_ps(xr + 8 * v) : _mm256_maskload_ps(xr + 8 * v, last);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m256 wb = _mm256_broadcast_ss(w + j * ldw + k);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm256_fmadd_ps(wb, xv[v], acc[j][v]);
    }
  }
  alignas(64) float tile[NB][64];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_store_ps(&tile[j][8 * v], acc[j][v]);
  }
  StoreTile<NB>(a, tile, i0, c0, width);
}

using TileFn = void (*)(const CpuMatmulArgs&, int64_t, int64_t, int64_t, const float*);

template <int NB>
TileFn PickAvx512(int nv) {
  switch (nv) {
    case 1:
      return &TileAvx512<NB, 1>;
    case 2:
      return &TileAvx512<NB, 2>;
    case 3:
      return &TileAvx512<NB, 3>;
    default:
      return &TileAvx512<NB, 4>;
  }
}

template <int NB>
TileFn PickAvx2(int nv) {
  return nv == 1 ? &TileAvx2<NB, 1> : &TileAvx2<NB, 2>;
}

// The tile function for `rows` weight rows (1..6) and `vectors` column vectors.
TileFn Pick(int level, int rows, int vectors) {
  switch (rows) {
    case 1:
      return level == 2 ? PickAvx512<1>(vectors) : PickAvx2<1>(vectors);
    case 2:
      return level == 2 ? PickAvx512<2>(vectors) : PickAvx2<2>(vectors);
    case 3:
      return level == 2 ? PickAvx512<3>(vectors) : PickAvx2<3>(vectors);
    case 4:
      return level == 2 ? PickAvx512<4>(vectors) : PickAvx2<4>(vectors);
    case 5:
      return level == 2 ? PickAvx512<5>(vectors) : PickAvx2<5>(vectors);
    default:
      return level == 2 ? PickAvx512<6>(vectors) : PickAvx2<6>(vectors);
  }
}

#endif  // GYRE_GEMM_X86

}  // namespace

int CpuMatmulLevel() {
#ifdef GYRE_GEMM_X86
  static const int level = [] {
    int allowed = 2;
    if (const char* cap = std::getenv("ATEN_CPU_CAPABILITY")) {
      if (std::strcmp(cap, "default") == 0) allowed = 0;
      if (std::strcmp(cap, "avx2") == 0) allowed = 1;
    }
    __builtin_cpu_init();
    const int hw = __builtin_cpu_supports("avx512f")                                 ? 2
                   : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1
                                                                                     : 0;
    return std::min(allowed, hw);
  }();
  return level;
#else
  return 0;
#endif
}

bool CpuMatmul(const CpuMatmulArgs& a, int level) {
  level = level < 0 ? CpuMatmulLevel() : std::min(level, CpuMatmulLevel());
  if (level <= 0) return false;
  if (a.n <= 0 || a.cols <= 0) return true;
#ifdef GYRE_GEMM_X86
  if (a.k == 0) {  // an empty sum
    if (!a.accumulate) {
      for (int64_t i = 0; i < a.n; ++i) {
        for (int64_t c = 0; c < a.cols; ++c) {
          (a.transpose_out ? a.out[c * a.ldo + i] : a.out[i * a.ldo + c]) = 0.0f;
        }
      }
    }
    return true;
  }
  const int64_t strip = level == 2 ? 64 : 16;  // columns per tile
  const int64_t lanes = level == 2 ? 16 : 8;
  const int64_t blocks = (a.n + kTileRows - 1) / kTileRows;
  // Tasks of at least ~256K multiply-adds, so that small matmuls stay on one thread.
  const int64_t per_block = kTileRows * a.k * a.cols;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, per_block));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i0 = b * kTileRows;
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, a.n - i0));
      // The next tile's rows are prefetched while this one computes, if it is a full tile.
      const float* next = i0 + 2 * kTileRows <= a.n ? a.w + (i0 + kTileRows) * a.ldw : nullptr;
      for (int64_t c0 = 0; c0 < a.cols; c0 += strip) {
        const int64_t width = std::min(strip, a.cols - c0);
        const int vectors = static_cast<int>((width + lanes - 1) / lanes);
        Pick(level, rows, vectors)(a, i0, c0, width, c0 == 0 ? next : nullptr);
      }
    }
  });
  return true;
#else
  return false;
#endif
}

}  // namespace gyre::model
