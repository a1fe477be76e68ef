// Fuzzes the tokenizer.json loader, text::BpeTokenizer::FromJson (src/text/bpe_tokenizer.cc),
// and runs every tokenizer it accepts: Encode of fixed probes and of the input's first bytes
// (with and without special tokens), Decode, streaming decode and the id lookups. Input: the
// tokenizer.json text.
//
// Checks: every id Encode returns is in [0, vocab_size).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "fuzz/fuzz_util.h"
#include "text/bpe_tokenizer.h"

namespace {

void Exercise(const gyre::text::BpeTokenizer& tok, const std::string& text) {
  for (bool special : {true, false}) {
    auto ids = tok.Encode(text, special);
    if (!ids.ok()) continue;
    for (int32_t id : *ids) {
      GYRE_CHECK(id >= 0 && id < tok.vocab_size())
          << "Encode returned id " << id << " outside [0, " << tok.vocab_size() << ")";
    }
    (void)tok.Decode(*ids);
    (void)tok.Decode(*ids, /*skip_special=*/true);
    gyre::text::BpeTokenizer::StreamDecoder stream(tok, !special);
    for (int32_t id : *ids) (void)stream.Push(id);
    (void)stream.Flush();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = gyre::fuzz::AsString(data, size);
  auto tok = gyre::text::BpeTokenizer::FromJson(input, "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  static const char* const kProbes[] = {
      "Hello, world! It's 2024-06-01.",
      "  def f(x):\n\treturn x + 1\r\n\n",
      "\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd caf\x65\xcc\x81",
      "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
      "\xff\xfe not UTF-8",
  };
  for (const char* probe : kProbes) Exercise(**tok, probe);
  Exercise(**tok, input.substr(0, 64));
  const int64_t vocab = (*tok)->vocab_size();
  for (int64_t id : {int64_t{-1}, int64_t{0}, vocab / 2, vocab - 1, vocab}) {
    const std::string token = (*tok)->IdToToken(static_cast<int32_t>(id));
    (void)(*tok)->IsSpecial(static_cast<int32_t>(id));
    if (!token.empty()) (void)(*tok)->TokenToId(token);
  }
  return 0;
}
