#include "common/strings.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdio>

namespace gyre {

std::vector<std::string> SplitString(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.emplace_back(s.substr(start));
      return out;
    }
    out.emplace_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string TrimString(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r'))
    --e;
  return std::string(s.substr(b, e - b));
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

int EditDistance(std::string_view a, std::string_view b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string NearestWord(std::string_view word, const std::vector<std::string>& candidates) {
  const int limit = std::max<int>(2, static_cast<int>(word.size()) / 3);
  std::string best;
  int best_d = limit + 1;
  for (const auto& c : candidates) {
    int d = EditDistance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

namespace {

// True when the `n` bytes at `p` (1 to 3) begin a well-formed character, that is when some
// continuation bytes complete them to one. Past the first continuation byte any of 0x80..0xBF may
// follow, so 0x80 completes every prefix; the first one is restricted after E0, ED, F0 and F4,
// always to a range that contains 0x80 or 0xBF.
bool BeginsCharacter(const utf8proc_uint8_t* p, size_t n) {
  for (const utf8proc_uint8_t first : {0x80, 0xBF}) {
    utf8proc_uint8_t completed[4] = {p[0], first, 0x80, 0x80};
    std::copy(p, p + n, completed);
    for (utf8proc_ssize_t length = n + 1; length <= 4; ++length) {
      utf8proc_int32_t cp;
      if (utf8proc_iterate(completed, length, &cp) == length) return true;
    }
  }
  return false;
}

}  // namespace

Utf8Char DecodeUtf8(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos);
  const size_t available = std::min<size_t>(s.size() - pos, 4);
  utf8proc_int32_t cp = 0;
  const utf8proc_ssize_t n = utf8proc_iterate(p, static_cast<utf8proc_ssize_t>(available), &cp);
  if (n > 0) return {Utf8Char::kValid, static_cast<char32_t>(cp), static_cast<size_t>(n)};
  // The longest prefix that begins a character is the maximal subpart (at least the first byte),
  // or, when it runs to the end of the text, a character cut short.
  size_t prefix = 0;
  while (prefix < std::min<size_t>(available, 3) && BeginsCharacter(p, prefix + 1)) ++prefix;
  if (prefix == available) return {Utf8Char::kTruncated, 0, prefix};
  return {Utf8Char::kInvalid, 0, std::max<size_t>(prefix, 1)};
}

bool ParseHostPort(std::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view digits = address.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return false;
  int value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (value > 65535) return false;
  *host = std::string(address.substr(0, colon));
  *port = value;
  return true;
}

}  // namespace gyre
