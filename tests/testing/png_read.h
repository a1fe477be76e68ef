#pragma once
// Decodes an 8-bit, non-interlaced PNG (what Chromium's screenshots are) into RGBA pixels, for
// tests that check a rendered page is not blank. zlib inflates; the five row filters are undone.

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace gyre::testing {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgba;  // width * height * 4
  std::string error;          // non-empty: not decoded, and why
};

inline Image DecodePng(const std::string& bytes) {
  Image img;
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at])) << 24) |
           (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 3]));
  };
  if (bytes.size() < 8 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    img.error = "not a PNG file";
    return img;
  }
  int depth = 0, color = 0, interlace = 0;
  std::string idat;
  for (size_t at = 8; at + 12 <= bytes.size();) {
    const uint32_t len = be32(at);
    const std::string type = bytes.substr(at + 4, 4);
    if (at + 12 + len > bytes.size()) break;
    if (type == "IHDR") {
      img.width = static_cast<int>(be32(at + 8));
      img.height = static_cast<int>(be32(at + 12));
      depth = static_cast<uint8_t>(bytes[at + 16]);
      color = static_cast<uint8_t>(bytes[at + 17]);
      interlace = static_cast<uint8_t>(bytes[at + 20]);
    } else if (type == "IDAT") {
      idat += bytes.substr(at + 8, len);
    }
    at += 12 + len;
  }
  const int channels = color == 6 ? 4 : color == 2 ? 3 : color == 0 ? 1 : 0;
  if (depth != 8 || channels == 0 || interlace != 0 || img.width <= 0 || img.height <= 0) {
    img.error = "unsupported PNG (depth " + std::to_string(depth) + ", colour type " +
                std::to_string(color) + ", interlace " + std::to_string(interlace) + ")";
    return img;
  }
  const size_t stride = static_cast<size_t>(img.width) * channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      raw_len != raw.size()) {
    img.error = "the image data does not inflate to its size";
    return img;
  }
  std::vector<uint8_t> px(stride * img.height);
  for (int y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* row = &px[y * stride];
    const uint8_t* up = y > 0 ? &px[(y - 1) * stride] : nullptr;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? row[i - channels] : 0;
      const int b = up ? up[i] : 0;
      const int c = up && i >= static_cast<size_t>(channels) ? up[i - channels] : 0;
      int pred = 0;
      switch (filter) {
        case 0:
          pred = 0;
          break;
        case 1:
          pred = a;
          break;
        case 2:
          pred = b;
          break;
        case 3:
          pred = (a + b) / 2;
          break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default:
          img.error = "bad row filter " + std::to_string(filter);
          return img;
      }
      row[i] = static_cast<uint8_t>(in[i] + pred);
    }
  }
  img.rgba.resize(static_cast<size_t>(img.width) * img.height * 4);
  for (size_t p = 0; p < static_cast<size_t>(img.width) * img.height; ++p) {
    for (int k = 0; k < 4; ++k) {
      img.rgba[p * 4 + k] = channels == 1  ? (k < 3 ? px[p] : 255)
                            : k < channels ? px[p * channels + k]
                                           : 255;
    }
  }
  return img;
}

}  // namespace gyre::testing
