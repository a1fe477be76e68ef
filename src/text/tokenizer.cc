#include "text/tokenizer.h"

#include <cstdio>

namespace gyre::text {

StatusOr<std::vector<int32_t>> CharTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c > 0x7e) {
      char buf[96];
      std::snprintf(buf, sizeof(buf),
                    "character 0x%02x at byte %zu is not printable ASCII (char tokenizer)", c, i);
      return InvalidArgument(buf);
    }
    ids.push_back(kFirstChar + (c - 0x20));
  }
  return ids;
}

std::string CharTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < kFirstChar) continue;
    if (id >= vocab_size()) {
      out += "\xef\xbf\xbd";
      continue;
    }
    out.push_back(static_cast<char>(0x20 + (id - kFirstChar)));
  }
  return out;
}

}  // namespace gyre::text
