#pragma once
// Writing tokenizer.json files that Hugging Face `tokenizers` (and Gyre's BpeTokenizer) load:
// byte-level BPE without merges, so each byte of the text is one token, plus special tokens.
// This is how Gyre saves its built-in character tokenizer with every model directory, and what
// `gyre init-model` writes for random models.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gyre::text {

// GPT-2's reversible byte -> printable code point mapping used by byte-level BPE, as UTF-8.
std::string ByteLevelSymbol(uint8_t byte);

// A token matched whole in the text before BPE (tokenizer.json's added_tokens).
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = true;
};

// tokenizer.json text of a byte-level BPE tokenizer: `vocab` (token in GPT-2's byte-level
// alphabet -> id), `merges` ("a b", in rank order) and `added` tokens. The pre-tokenizer is GPT-2's
// byte-level split, after one that makes every digit its own piece when `split_digits` is set (HF's
// Digits(individual_digits), as SmolLM2's tokenizer has).
std::string ByteLevelBpeTokenizerJson(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                      const std::vector<std::string>& merges,
                                      const std::vector<AddedToken>& added, bool split_digits);

// tokenizer.json text: `bytes` lists (byte, id) pairs, the only bytes the tokenizer can encode;
// `specials` lists (content, id) special added tokens.
std::string NoMergeByteLevelTokenizerJson(
    const std::vector<std::pair<uint8_t, int32_t>>& bytes,
    const std::vector<std::pair<std::string, int32_t>>& specials);

// The built-in CharTokenizer as tokenizer.json with the same ids (<pad> 0, <s> 1, </s> 2, then
// ' '..'~'), and tokenizer_config.json naming those special tokens, so that transformers'
// AutoTokenizer and `gyre generate` encode printable ASCII exactly as training did.
std::string CharTokenizerJson();
std::string CharTokenizerConfigJson();

}  // namespace gyre::text
