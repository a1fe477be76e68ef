#include "kernels/reference/crc32_ref.h"

#include <algorithm>
#include <array>

#include "kernels/crc32_parallel.h"

namespace gyre::kernels {
namespace {

const std::array<uint32_t, 256>& Table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) t[i] = crc32::TableEntry(i);
    return t;
  }();
  return table;
}

}  // namespace

uint32_t Crc32RawRef(const uint8_t* data, uint64_t n) {
  const auto& table = Table();
  uint32_t reg = 0;
  for (uint64_t i = 0; i < n; ++i) reg = table[(reg ^ data[i]) & 0xFFu] ^ (reg >> 8);
  return reg;
}

uint32_t Crc32ChunkedRef(const uint8_t* data, uint64_t n, uint64_t chunk_bytes) {
  if (chunk_bytes == 0) chunk_bytes = kCrc32ChunkBytes;
  uint32_t raw = 0;
  for (uint64_t start = 0; start < n; start += chunk_bytes) {
    const uint64_t end = std::min(n, start + chunk_bytes);
    raw ^= crc32::ShiftRaw(Crc32RawRef(data + start, end - start), n - end);
  }
  return crc32::Finish(raw, n);
}

std::vector<uint32_t> BucketCrc32Ref(const uint8_t* data, uint64_t total, uint64_t bucket_bytes,
                                     uint64_t chunk_bytes) {
  std::vector<uint32_t> out;
  if (bucket_bytes == 0) return out;
  const uint64_t buckets = std::max<uint64_t>(1, (total + bucket_bytes - 1) / bucket_bytes);
  out.reserve(buckets);
  for (uint64_t b = 0; b < buckets; ++b) {
    const uint64_t off = std::min(total, b * bucket_bytes);
    const uint64_t n = std::min(bucket_bytes, total - off);
    out.push_back(Crc32ChunkedRef(data + off, n, chunk_bytes));
  }
  return out;
}

}  // namespace gyre::kernels
