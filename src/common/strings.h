#pragma once
// Small string helpers shared by the modules.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gyre {

std::vector<std::string> SplitString(std::string_view s, char sep);
std::string TrimString(std::string_view s);
bool StartsWith(std::string_view s, std::string_view prefix);

// Levenshtein distance (insert, delete, substitute each cost 1).
int EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `word` by edit distance, or "" when none is within
// max(2, word.size() / 3) edits. Used for "did you mean" suggestions.
std::string NearestWord(std::string_view word, const std::vector<std::string>& candidates);

// Splits "HOST:PORT" at its last colon (so "[::1]:80" and "0.0.0.0:9400" work): true when the
// host is not empty and the port is a decimal number from 0 to 65535.
bool ParseHostPort(std::string_view address, std::string* host, int* port);

// "1.5 GiB", "12 KiB", "512 B".
std::string HumanBytes(double bytes);

// UTF-8, on utf8proc. Well-formed UTF-8 is Unicode's (table 3-7): no overlong forms, surrogates
// or code points past U+10FFFF.

// Appends the UTF-8 encoding of `code_point` (at most U+10FFFF) to *out.
void AppendUtf8(uint32_t code_point, std::string* out);

// One step of decoding UTF-8 text (DecodeUtf8).
struct Utf8Char {
  enum Status {
    kValid,      // a well-formed character
    kInvalid,    // bytes that no well-formed character begins with
    kTruncated,  // the start of a well-formed character that the text ends in
  };
  Status status = kInvalid;
  char32_t code_point = 0;  // kValid only
  // Bytes: the character's (kValid, 1 to 4); the maximal subpart of the ill-formed sequence
  // (kInvalid, 1 to 3), which a lossy decoder replaces with one U+FFFD as Unicode recommends and
  // Python, Rust's String::from_utf8_lossy and browsers do; or the rest of the text (kTruncated, 1
  // to 3).
  size_t length = 0;
};

// Decodes the character that starts at s[pos] (pos < s.size()).
Utf8Char DecodeUtf8(std::string_view s, size_t pos);

}  // namespace gyre
