// Philox4x32-10 counter-based random numbers, callable from host and device code.
//
// Gyre's sampler draws its uniform for a token from (request seed, token position) alone, so a
// sample does not depend on which other rows share its batch, nor on whether the CPU reference or
// the CUDA kernel drew it. A counter-based generator gives exactly that: the output is a pure
// function of (counter, key), with no state to carry between calls or threads.
//
// The rounds and constants follow Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"
// (SC'11) and the Random123 library, whose known-answer vectors the unit test checks.
#pragma once

#include <cstdint>

#ifndef GYRE_HD
#if defined(__CUDACC__)
#define GYRE_HD __host__ __device__
#else
#define GYRE_HD
#endif
#endif

namespace gyre::kernels {

namespace philox_internal {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

GYRE_HD inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

}  // namespace philox_internal

// Ten Philox rounds over `ctr` under `key`; writes four 32-bit outputs. `out` may alias `ctr`.
GYRE_HD inline void Philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_internal::MulHiLo(philox_internal::kMul0, c0, &hi0, &lo0);
    philox_internal::MulHiLo(philox_internal::kMul1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    // The key bump after the last round is unused; Random123 also skips it.
    k0 += philox_internal::kWeyl0;
    k1 += philox_internal::kWeyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// A uniform float in [0, 1) that is a pure function of (seed, position, lane).
// key = {seed low 32 bits, seed high 32 bits}; counter = {position low, position high, lane, 0}.
// The first output word keeps its top 24 bits, so every value is an exact multiple of 2^-24 and
// 1.0f is unreachable.
GYRE_HD inline float PhiloxUniform(uint64_t seed, uint64_t position, uint32_t lane = 0) {
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t ctr[4] = {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                           lane, 0u};
  uint32_t out[4];
  Philox4x32_10(ctr, key, out);
  return static_cast<float>(out[0] >> 8) * 0x1p-24f;
}

}  // namespace gyre::kernels
