#pragma once
// Decodes a PNG file (such as Chromium's screenshots) into 8-bit RGBA pixels with libpng, for
// tests that check a rendered page is not blank.

#include <png.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gyre::testing {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgba;  // width * height * 4
  std::string error;          // non-empty: not decoded, and why
};

inline Image DecodePng(const std::string& bytes) {
  Image img;
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()) == 0) {
    img.error = std::string("not a PNG file: ") + png.message;
    return img;
  }
  png.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(png));
  if (png_image_finish_read(&png, nullptr, rgba.data(), 0, nullptr) == 0) {
    img.error = std::string("cannot decode the PNG: ") + png.message;
    png_image_free(&png);
    return img;
  }
  img.width = static_cast<int>(png.width);
  img.height = static_cast<int>(png.height);
  img.rgba = std::move(rgba);
  return img;
}

}  // namespace gyre::testing
