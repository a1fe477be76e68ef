#pragma once
// CRC-32 with the zlib / gzip / PNG polynomial (reflected 0xEDB88320): the value zlib's crc32()
// returns, at memory speed. On x86-64 CPUs with carry-less multiply (PCLMULQDQ, every x86-64
// CPU since 2010) long inputs are folded 64 bytes at a time; elsewhere, and for short inputs and
// tails, a slice-by-8 table is used. Both give identical results (tests compare them with zlib).
//
// Thread-safe (pure function; the tables are built once, thread-safely).

#include <cstddef>
#include <cstdint>

namespace gyre {

// CRC-32 of `n` bytes at `data`. `crc` continues an earlier result over the bytes that came
// before (0 to start), so Crc32(b, nb, Crc32(a, na)) == CRC-32 of a followed by b.
uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);

// The table-only implementation (a reference for tests).
uint32_t Crc32Portable(const void* data, size_t n, uint32_t crc = 0);

// CRC-32C (Castagnoli, reflected 0x82F63B78), the checksum of TFRecord files (TensorBoard event
// files) among others: the SSE4.2 crc32 instruction where the CPU has it, a table elsewhere.
// `crc` continues an earlier result as for Crc32.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table-only implementation (a reference for tests).
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace gyre
