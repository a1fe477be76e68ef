#include "text/tokenizer_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "text/tokenizer.h"

namespace gyre::text {

namespace {

bool PrintableByte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

constexpr const char* kCharSpecials[] = {"<pad>", "<s>", "</s>"};

}  // namespace

std::string ByteLevelSymbol(uint8_t byte) {
  int cp = byte;
  if (!PrintableByte(byte)) {
    int n = 0;
    for (int x = 0; x < byte; ++x) n += PrintableByte(x) ? 0 : 1;
    cp = 256 + n;
  }
  std::string out;
  AppendUtf8(static_cast<uint32_t>(cp), &out);
  return out;
}

std::string ByteLevelBpeTokenizerJson(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                      const std::vector<std::string>& merges,
                                      const std::vector<AddedToken>& added, bool split_digits) {
  using nlohmann::json;
  json vocab_json = json::object();
  for (const auto& [token, id] : vocab) vocab_json[token] = id;
  json added_json = json::array();
  for (const AddedToken& a : added) {
    added_json.push_back({{"id", a.id},
                          {"content", a.content},
                          {"single_word", false},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"normalized", false},
                          {"special", a.special}});
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  json pre = byte_level;
  if (split_digits) {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", "\\p{N}"}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             byte_level}}};
  }
  json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added_json;
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = pre;
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab_json},
                {"merges", merges}};
  return t.dump(2) + "\n";
}

std::string NoMergeByteLevelTokenizerJson(
    const std::vector<std::pair<uint8_t, int32_t>>& bytes,
    const std::vector<std::pair<std::string, int32_t>>& specials) {
  std::vector<std::pair<std::string, int32_t>> vocab;
  for (const auto& [b, id] : bytes) vocab.emplace_back(ByteLevelSymbol(b), id);
  // HF `tokenizers` keeps an added token's id only when the model's vocabulary has the token or
  // the id comes right after it; specials below the byte ids must be in the vocabulary too.
  int32_t max_byte_id = -1;
  for (const auto& [b, id] : bytes) max_byte_id = std::max(max_byte_id, id);
  std::vector<AddedToken> added;
  for (const auto& [content, id] : specials) {
    if (id < max_byte_id) vocab.emplace_back(content, id);
    added.push_back({content, id, true});
  }
  return ByteLevelBpeTokenizerJson(vocab, {}, added, /*split_digits=*/false);
}

std::string CharTokenizerJson() {
  std::vector<std::pair<uint8_t, int32_t>> bytes;
  for (int c = 0x20; c <= 0x7e; ++c) {
    bytes.emplace_back(static_cast<uint8_t>(c), CharTokenizer::kFirstChar + (c - 0x20));
  }
  return NoMergeByteLevelTokenizerJson(bytes, {{kCharSpecials[0], CharTokenizer::kPad},
                                               {kCharSpecials[1], CharTokenizer::kBos},
                                               {kCharSpecials[2], CharTokenizer::kEos}});
}

std::string CharTokenizerConfigJson() {
  nlohmann::json j = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                      {"pad_token", kCharSpecials[0]},
                      {"bos_token", kCharSpecials[1]},
                      {"eos_token", kCharSpecials[2]},
                      {"add_bos_token", false},
                      {"clean_up_tokenization_spaces", false},
                      {"model_max_length", 1000000}};
  return j.dump(2) + "\n";
}

}  // namespace gyre::text
