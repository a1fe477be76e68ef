#pragma once
// Readable renderings of strings and token ids for test failure messages.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gyre::testing {

// Printable ASCII as is, every other byte as \xHH.
inline std::string Escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02X", c);
      out += b;
    }
  }
  return out;
}

// Control characters escaped and each newline shown as \n then kept, so a failing comparison
// of rendered text shows where the lines differ.
inline std::string Visible(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n\n";
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02X", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// "[1,2,3]".
inline std::string Ids(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

}  // namespace gyre::testing
