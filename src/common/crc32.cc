// CRC-32 by folding (carry-less multiply) with a slice-by-8 table for the rest.
//
// Terms: the CRC register r starts at ~crc and ends inverted. A reflected CRC register value is
// equivalent to XOR-ing it into the next four message bytes and starting from a zero register,
// which is how the folding path takes the incoming CRC.
//
// Folding (the PCLMULQDQ method): four 128-bit accumulators each hold a stretch of the message
// that is congruent, modulo the CRC polynomial P, to everything read so far. Moving an
// accumulator forward by D bits multiplies its low and high 64-bit halves by x^(D+32) mod P and
// x^(D-32) mod P (bit-reflected; these are the 33-bit constants below, D = 512 in the main loop,
// D = 128 when the four accumulators are merged and for 16-byte steps) and XORs in the message
// bytes found at the new position. Congruent messages of equal length have equal CRCs, so once a
// single accumulator is left its 16 bytes, followed by the unread tail (< 16 bytes), are run
// through the table from a zero register to give the result.

#include "common/crc32.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gyre {
namespace {

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s) {
      for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

// Advances the raw register `r` over `n` bytes (no inversion).
uint32_t UpdateTable(uint32_t r, const uint8_t* p, size_t n) {
  const auto& t = GetTables().t;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    r = t[0][(r ^ *p++) & 0xff] ^ (r >> 8);
    --n;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian: the first byte is the lowest
    v ^= r;
    r = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    r = t[0][(r ^ *p++) & 0xff] ^ (r >> 8);
    --n;
  }
  return r;
}

#if defined(__x86_64__)
constexpr size_t kFoldMinBytes = 256;

__attribute__((target("pclmul,sse2"))) inline __m128i Fold(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// Requires n >= 64.
__attribute__((target("pclmul,sse2"))) uint32_t UpdateFold(uint32_t r, const uint8_t* p, size_t n) {
  // {low, high} halves: x^(512+32), x^(512-32) and x^(128+32), x^(128-32), mod P, reflected.
  const __m128i k512 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
  const __m128i k128 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  auto load = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(r)));
  __m128i x2 = load(p + 16);
  __m128i x3 = load(p + 32);
  __m128i x4 = load(p + 48);
  p += 64;
  n -= 64;
  while (n >= 64) {
    x1 = _mm_xor_si128(Fold(x1, k512), load(p));
    x2 = _mm_xor_si128(Fold(x2, k512), load(p + 16));
    x3 = _mm_xor_si128(Fold(x3, k512), load(p + 32));
    x4 = _mm_xor_si128(Fold(x4, k512), load(p + 48));
    p += 64;
    n -= 64;
  }
  x1 = _mm_xor_si128(Fold(x1, k128), x2);
  x1 = _mm_xor_si128(Fold(x1, k128), x3);
  x1 = _mm_xor_si128(Fold(x1, k128), x4);
  while (n >= 16) {
    x1 = _mm_xor_si128(Fold(x1, k128), load(p));
    p += 16;
    n -= 16;
  }
  alignas(16) uint8_t rest[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(rest), x1);
  return UpdateTable(UpdateTable(0, rest, 16), p, n);
}

bool HaveClmul() {
  static const bool have = __builtin_cpu_supports("pclmul");
  return have;
}
#endif

}  // namespace

uint32_t Crc32Portable(const void* data, size_t n, uint32_t crc) {
  return ~UpdateTable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (n >= kFoldMinBytes && HaveClmul()) return ~UpdateFold(~crc, p, n);
#endif
  return ~UpdateTable(~crc, p, n);
}

}  // namespace gyre

namespace gyre {
namespace {

const uint32_t* CastagnoliTable() {
  static const auto* table = [] {
    static uint32_t t[256];
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t UpdateCastagnoliTable(uint32_t r, const uint8_t* p, size_t n) {
  const uint32_t* t = CastagnoliTable();
  for (size_t i = 0; i < n; ++i) r = t[(r ^ p[i]) & 0xff] ^ (r >> 8);
  return r;
}

#if defined(__x86_64__)
// The crc32 instruction computes exactly the reflected Castagnoli register update.
__attribute__((target("sse4.2"))) uint32_t UpdateCastagnoliSse42(uint32_t r, const uint8_t* p,
                                                                 size_t n) {
  uint64_t r64 = r;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    r64 = _mm_crc32_u64(r64, v);
    p += 8;
    n -= 8;
  }
  r = static_cast<uint32_t>(r64);
  while (n-- > 0) r = _mm_crc32_u8(r, *p++);
  return r;
}
#endif

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  return ~UpdateCastagnoliTable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("sse4.2");
  if (have) return ~UpdateCastagnoliSse42(~crc, static_cast<const uint8_t*>(data), n);
#endif
  return Crc32cPortable(data, n, crc);
}

}  // namespace gyre
