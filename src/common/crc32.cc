#include "common/crc32.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace gyre {

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  // Takes and returns finished (inverted) values, as zlib's crc32() does.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  // crc32_iscsi advances the raw register (no inversion in or out) over at most INT_MAX bytes a
  // call. It only reads the buffer, though its pointer parameter is not const.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t reg = ~crc;
  while (n > 0) {
    const size_t step = std::min<size_t>(n, size_t{1} << 30);
    reg = crc32_iscsi(p, static_cast<int>(step), reg);
    p += step;
    n -= step;
  }
  return ~reg;
}

}  // namespace gyre
