#pragma once
// CharTokenizer: one token per printable ASCII character plus three specials. Used by the
// built-in tasks; real BPE tokenizers share this interface (Encode/Decode/special ids).
// Immutable after construction: safe to share between threads.

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::text {

class CharTokenizer {
 public:
  static constexpr int32_t kPad = 0;
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;
  static constexpr int32_t kFirstChar = 3;  // ' ' (0x20) .. '~' (0x7e) follow

  int64_t vocab_size() const { return kFirstChar + 95; }
  int32_t pad_id() const { return kPad; }
  int32_t bos_id() const { return kBos; }
  int32_t eos_id() const { return kEos; }

  // Fails on characters outside printable ASCII, naming the character and its offset.
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  // Special tokens decode to nothing; ids out of range to U+FFFD.
  std::string Decode(const std::vector<int32_t>& ids) const;
};

}  // namespace gyre::text
