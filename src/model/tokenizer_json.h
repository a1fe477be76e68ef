#pragma once
// Writing tokenizer.json files that Hugging Face `tokenizers` (and Gyre's BpeTokenizer) load:
// byte-level BPE without merges, so each byte of the text is one token, plus special tokens.
// This is how Gyre saves its built-in character tokenizer with every model directory, and what
// `gyre init-model` writes for random models.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gyre::model {

// GPT-2's reversible byte -> printable code point mapping used by byte-level BPE, as UTF-8.
std::string ByteLevelSymbol(uint8_t byte);

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

}  // namespace gyre::model
