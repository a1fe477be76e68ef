// Parallel CRC-32 (the zlib / gzip polynomial, the value gyre::Crc32 returns) as pieces that run
// independently: the CPU reference (kernels/reference/crc32_ref.h) and the CUDA kernel
// (kernels/crc32.cuh) call the same functions, so the GPU checksum of a bucket equals the host
// CRC-32 of the same bytes and receipts compare across transports.
//
// The algebra. Bit-reflected CRC registers are polynomials over GF(2) modulo the CRC polynomial
// P, with bit 31 the coefficient of x^0 and bit 0 that of x^31. Let raw(M) be the register after
// feeding the bytes M into a register that starts at 0, with no final inversion. raw is linear,
// and appending n zero bytes multiplies a register by x^(8n) mod P, so for M = A followed by B:
//     raw(A B) = raw(A) * x^(8|B|)  xor  raw(B).
// Cutting a bucket into chunks, every chunk contributes raw(chunk) * x^(8 * bytes after it),
// independently of the others, and the contributions are combined by xor (which is associative
// and commutative: the order in which threads finish does not change the result). The standard
// CRC starts from 0xFFFFFFFF and inverts at the end, which adds one more term:
//     crc32(M) = ~( raw(M) xor 0xFFFFFFFF * x^(8|M|) ).
//
// Header-only, no CUDA runtime dependency; compiled as host code by C++ and as host+device code
// by nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GYRE_CRC_HD __host__ __device__ inline
#else
#define GYRE_CRC_HD inline
#endif

namespace gyre::kernels::crc32 {

// P, bit-reflected.
constexpr uint32_t kPolynomial = 0xEDB88320u;
// The polynomial 1 (x^0) and x^8, bit-reflected.
constexpr uint32_t kOne = 0x80000000u;
constexpr uint32_t kXPow8 = 0x00800000u;

// One step of the byte-at-a-time table: the register for byte value `i` fed into a zero register.
GYRE_CRC_HD uint32_t TableEntry(uint32_t i) {
  uint32_t c = i;
  for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
  return c;
}

// a * b mod P. Walks the coefficients of `a` from x^0 upwards, adding b * x^k for each one set.
GYRE_CRC_HD uint32_t MulMod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  while (a != 0) {
    if (a & kOne) product ^= b;
    a <<= 1;
    // b *= x: one degree up; x^32 folds back as P's lower terms.
    b = (b & 1u) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// x^(8 n) mod P, by square-and-multiply over the bits of n.
GYRE_CRC_HD uint32_t XPow8N(uint64_t n) {
  uint32_t result = kOne;
  uint32_t square = kXPow8;
  while (n != 0) {
    if (n & 1u) result = MulMod(result, square);
    square = MulMod(square, square);
    n >>= 1;
  }
  return result;
}

// A chunk's contribution: raw(chunk) moved past the `bytes_after` bytes that follow it.
GYRE_CRC_HD uint32_t ShiftRaw(uint32_t raw, uint64_t bytes_after) {
  return bytes_after == 0 ? raw : MulMod(raw, XPow8N(bytes_after));
}

// The standard CRC-32 of a message of `length` bytes whose raw register is `raw`.
GYRE_CRC_HD uint32_t Finish(uint32_t raw, uint64_t length) {
  return ~(raw ^ MulMod(0xFFFFFFFFu, XPow8N(length)));
}

}  // namespace gyre::kernels::crc32

#undef GYRE_CRC_HD
