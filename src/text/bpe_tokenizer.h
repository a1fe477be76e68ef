#pragma once
// BpeTokenizer: a byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`, producing
// the same ids as HF `tokenizers` (`encode(text, add_special_tokens=False)`) for Qwen2/2.5/3 and
// Llama-3 style files. docs/tokenizers.md lists what is supported and what is rejected.
//
// Encode runs the same stages as HF: added tokens are split out first (leftmost-longest, with their
// lstrip/rstrip/single_word/normalized flags), each remaining piece is normalized (NFC etc.),
// pre-tokenized (Split regex and/or ByteLevel), and each pre-token goes through the BPE merges.
// No template post-processing is applied: BOS/EOS are never added.
//
// Thread-safety: immutable after construction except for the per-word BPE cache, which is guarded
// by a mutex; every const method may be called from any thread concurrently.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::text {

class BpeTokenizer {
 public:
  // Incremental decoding for streaming generation: Push returns the text that is complete so far
  // and holds back the bytes of a UTF-8 character that has not finished yet, so a multi-token
  // character (emoji, CJK split into byte tokens) is never emitted as U+FFFD halfway. Bytes that
  // can never become valid UTF-8 are emitted as U+FFFD immediately, as Decode does.
  // Borrows the tokenizer, which must outlive it. Not thread-safe: one stream per thread.
  class StreamDecoder {
   public:
    explicit StreamDecoder(const BpeTokenizer& tokenizer, bool skip_special = false)
        : tokenizer_(&tokenizer), skip_special_(skip_special) {}
    std::string Push(int32_t id);
    // Emits whatever is held back (an unfinished character becomes U+FFFD) and resets the stream.
    std::string Flush();

   private:
    const BpeTokenizer* tokenizer_;
    bool skip_special_;
    std::string pending_;  // bytes of an incomplete UTF-8 character (at most 3)
  };

  // Reads a plain (uncompressed) tokenizer.json.
  static StatusOr<std::unique_ptr<BpeTokenizer>> FromFile(const std::string& path);
  // Parses tokenizer.json text; `source_name` names it in error messages.
  static StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(const std::string& text,
                                                          const std::string& source_name);

  ~BpeTokenizer();
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // With allow_special=false, added tokens marked "special" are not recognized and are encoded as
  // plain text (HF's encode_special_tokens); non-special added tokens are still recognized.
  // Fails only on invalid UTF-8 input or a regex engine error.
  StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool allow_special = true) const;

  // Concatenates the tokens' bytes; invalid UTF-8 becomes U+FFFD per maximal invalid subpart (as
  // Rust's String::from_utf8_lossy, which HF uses). Unknown ids are skipped, as HF does.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Max id + 1 over the model vocab and the added tokens.
  int64_t vocab_size() const;
  // Looks up a token string (byte-level form, e.g. "Ġthe", or an added token's content).
  std::optional<int32_t> TokenToId(const std::string& token) const;
  // Empty string for an unknown id.
  std::string IdToToken(int32_t id) const;
  // True for added tokens flagged "special" in the file.
  bool IsSpecial(int32_t id) const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);

  // Appends the raw bytes token `id` stands for; false when the id is unknown or skipped.
  bool AppendTokenBytes(int32_t id, bool skip_special, std::string* out) const;

  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre::text
