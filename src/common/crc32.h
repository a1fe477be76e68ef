#pragma once
// CRC-32 and CRC-32C of byte ranges, computed by Intel's ISA-L (Debian libisal-dev), which picks
// its fastest code for the CPU at run time: carry-less multiply folding (PCLMULQDQ, every x86-64
// CPU since 2010; VPCLMULQDQ on AVX-512 CPUs), the SSE4.2 crc32 instruction, a table elsewhere.
//
// Thread-safe (pure functions).

#include <cstddef>
#include <cstdint>

namespace gyre {

// CRC-32 with the zlib / gzip / PNG polynomial (reflected 0xEDB88320) of `n` bytes at `data`: the
// value zlib's crc32() returns. `crc` continues an earlier result over the bytes that came before
// (0 to start), so Crc32(b, nb, Crc32(a, na)) == CRC-32 of a followed by b.
uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);

// CRC-32C (Castagnoli, reflected 0x82F63B78), the checksum of TFRecord files (TensorBoard event
// files) among others. `crc` continues an earlier result as for Crc32.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace gyre
