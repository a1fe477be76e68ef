// Byte-level BPE compatible with Hugging Face `tokenizers`.
//
// The encode pipeline mirrors HF's TokenizerImpl::encode for one sequence without post-processing:
//   1. added tokens with normalized=false are matched on the raw text (leftmost-longest);
//   2. each remaining segment is normalized, then added tokens with normalized=true are matched on
//      the normalized text;
//   3. each remaining piece is pre-tokenized (Split regex / ByteLevel), independently of its
//      neighbours, which is why a regex never sees across an added token;
//   4. each pre-token is mapped to byte-level characters and merged by the BPE model.
//
// The merge loop keeps the word's symbols in a doubly linked list over a vector and the candidate
// pairs in a min-priority queue ordered by (merge rank, position). Stale queue entries (a side was
// merged away since the entry was pushed) are detected and skipped when popped. This gives the same
// result as repeatedly merging the lowest-rank, leftmost pair, in O(n log n) per word.

#include "text/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/strings.h"

namespace gyre::text {
namespace {

using json = nlohmann::json;

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD
// Per-word BPE cache: words up to this many bytes, at most this many entries. Once full it stops
// growing rather than evicting; the frequent words of a corpus are in it long before that.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;
// How far past twice the token count an id may lie (see Impl::Load).
constexpr int64_t kIdSlack = 1 << 16;

// GPT-2's pre-tokenizer regex, applied by ByteLevel when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers.

// The character at s[i] of text known to be valid UTF-8, and its length in *len.
char32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const Utf8Char c = DecodeUtf8(s, i);
  *len = c.length;
  return c.code_point;
}

// Start of the character that ends at s[end-1] (s validated).
size_t PrevCharStart(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Appends `in` to `out` with invalid UTF-8 replaced as Rust's String::from_utf8_lossy does. When
// `final` is false, a trailing character that is incomplete but could still become valid is left
// unconsumed. Returns the number of bytes consumed.
size_t AppendLossy(std::string_view in, bool final, std::string* out) {
  size_t i = 0;
  while (i < in.size()) {
    const Utf8Char c = DecodeUtf8(in, i);
    switch (c.status) {
      case Utf8Char::kValid:
        out->append(in.substr(i, c.length));
        break;
      case Utf8Char::kInvalid:
        out->append(kReplacementChar);
        break;
      case Utf8Char::kTruncated:
        if (!final) return i;
        out->append(kReplacementChar);
        break;
    }
    i += c.length;
  }
  return i;
}

// Offset of the first invalid byte, or npos when `s` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = DecodeUtf8(s, i);
    if (c.status != Utf8Char::kValid) return i;
    i += c.length;
  }
  return std::string_view::npos;
}

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// HF decides single_word with Rust's Unicode regex \w: Alphabetic, marks, decimal digits,
// connector punctuation and the joiners. Alphabetic is approximated by letters and letter numbers,
// which leaves out only a few symbols such as circled letters.
bool IsWordChar(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// GPT-2's reversible byte <-> printable-character mapping: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100 onwards in byte order.
struct ByteMap {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<char32_t, uint8_t> char_to_byte;

  ByteMap() {
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable[b] ? static_cast<char32_t>(b) : next++;
      AppendUtf8(cp, &byte_to_utf8[b]);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& GetByteMap() {
  static const ByteMap* map = new ByteMap();
  return *map;
}

// ---------------------------------------------------------------------------------------------
// PCRE2 wrapper.

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// A compiled pattern (UTF + Unicode properties), JIT-compiled when the platform supports it.
// Immutable after Compile: matching allocates its own match data, so it is thread-safe.
class Regex {
 public:
  static StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern, bool literal) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (literal) options |= PCRE2_LITERAL;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     options, &err, &offset, nullptr);
    if (code == nullptr) {
      return InvalidArgument("invalid regex '" + pattern + "': " + Pcre2ErrorMessage(err) +
                             " at offset " + std::to_string(offset));
    }
    auto re = std::unique_ptr<Regex>(new Regex());
    re->code_.reset(code);
    // JIT is an optimization: without it (unsupported CPU, no executable memory) the
    // interpreter gives the same matches.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return re;
  }

  // All non-overlapping matches as [start, end) byte ranges, iterated like the Oniguruma crate
  // HF uses: after an empty match the search resumes one character later. `s` is valid UTF-8.
  Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    out->clear();
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    if (md == nullptr) return Internal("out of memory allocating PCRE2 match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    size_t last_match_end = std::string_view::npos;
    while (pos <= s.size()) {
      int rc =
          pcre2_match(code_.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // The JIT stack is small and fixed; the interpreter keeps its backtracking state on the
        // heap, so long runs (e.g. thousands of spaces against \s+(?!\S)) still match.
        rc = pcre2_match(code_.get(), subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md.get(), nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) return Internal("regex match failed: " + Pcre2ErrorMessage(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t start = ov[0], end = ov[1];
      if (start == end) {
        if (start != last_match_end) out->emplace_back(start, end);
        if (start >= s.size()) break;
        size_t len = 0;
        DecodeAt(s, start, &len);
        pos = start + len;
        continue;
      }
      out->emplace_back(start, end);
      pos = end;
      last_match_end = end;
    }
    return Status::Ok();
  }

 private:
  Regex() = default;
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// ---------------------------------------------------------------------------------------------
// Pipeline pieces.

enum class NormForm { kNfc, kNfd, kNfkc, kNfkd };

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  // Split.
  std::shared_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // ByteLevel.
  bool add_prefix_space = false;
  bool use_regex = true;
};

struct AddedTokenRule {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Byte trie over added-token contents for leftmost-longest matching.
class TokenTrie {
 public:
  TokenTrie() : nodes_(1) {}

  void Insert(const std::string& key, int token_index) {
    int node = 0;
    for (unsigned char c : key) {
      auto& children = nodes_[node].children;
      auto it = std::find_if(children.begin(), children.end(),
                             [c](const auto& kv) { return kv.first == c; });
      if (it == children.end()) {
        children.emplace_back(c, static_cast<int>(nodes_.size()));
        node = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
      } else {
        node = it->second;
      }
    }
    // A later duplicate wins, as in HF where the last token with the same content is kept.
    nodes_[node].token = token_index;
  }

  bool empty() const { return nodes_[0].children.empty(); }

  // Longest key starting at s[pos]: returns its token index and sets *len, or -1.
  int LongestAt(std::string_view s, size_t pos, size_t* len) const {
    int node = 0, best = -1;
    for (size_t i = pos; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      const auto& children = nodes_[node].children;
      auto it = std::find_if(children.begin(), children.end(),
                             [c](const auto& kv) { return kv.first == c; });
      if (it == children.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        *len = i + 1 - pos;
      }
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;
    int token = -1;
  };
  std::vector<Node> nodes_;
};

// A piece of text, either an added token's id or text still to be tokenized (id < 0).
struct Segment {
  std::string text;
  int32_t id = -1;
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// ---------------------------------------------------------------------------------------------
// JSON helpers: every accessor names the field in its error.

Status FieldError(const std::string& field, const std::string& what) {
  return InvalidArgument(field + ": " + what);
}

StatusOr<bool> GetBool(const json& obj, const char* key, bool def, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) return FieldError(path + "." + key, "expected a boolean");
  return it->get<bool>();
}

StatusOr<std::string> GetString(const json& obj, const char* key, const std::string& def,
                                const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_string()) return FieldError(path + "." + key, "expected a string");
  return it->get<std::string>();
}

StatusOr<std::string> GetType(const json& obj, const std::string& path) {
  if (!obj.is_object()) return FieldError(path, "expected an object");
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string())
    return FieldError(path + ".type", "missing or not a string");
  return it->get<std::string>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct BpeTokenizer::Impl {
  // Model.
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // pair -> (rank, new id)
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;

  // Reverse lookup over vocab and added tokens; empty entries are unused ids.
  std::vector<std::string> id_to_token;
  std::vector<int> id_to_added;  // index into added, or -1

  std::vector<AddedTokenRule> added;
  TokenTrie raw_trie;         // added tokens with normalized=false
  TokenTrie normalized_trie;  // added tokens with normalized=true, keyed by normalized content

  std::vector<NormForm> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // GUARDED_BY(cache_mu)

  StatusOr<std::string> Normalize(std::string text) const;
  void SplitAdded(const std::string& text, const TokenTrie& trie, bool allow_special,
                  std::vector<Segment>* out) const;
  Status PreTokenize(const std::string& text, std::vector<std::string>* out) const;
  void EncodeWord(const std::string& word, std::vector<int32_t>* ids) const;
  void MergeWord(const std::string& word, std::vector<int32_t>* ids) const;
  // Fills the tables from a parsed tokenizer.json; errors name the offending field.
  Status Load(const nlohmann::json& root);
};

StatusOr<std::string> BpeTokenizer::Impl::Normalize(std::string text) const {
  for (NormForm form : normalizers) {
    int options = UTF8PROC_STABLE;
    switch (form) {
      case NormForm::kNfc:
        options |= UTF8PROC_COMPOSE;
        break;
      case NormForm::kNfd:
        options |= UTF8PROC_DECOMPOSE;
        break;
      case NormForm::kNfkc:
        options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
      case NormForm::kNfkd:
        options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    if (text.empty()) continue;
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            static_cast<utf8proc_ssize_t>(text.size()), &dst,
                                            static_cast<utf8proc_option_t>(options));
    if (n < 0) {
      return InvalidArgument(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
    }
    text.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    free(dst);
  }
  return text;
}

// HF's AddedVocabulary::find_matches: leftmost-longest matches, then the token's flags decide
// whether it applies (single_word) and how much surrounding whitespace it swallows (lstrip/rstrip).
void BpeTokenizer::Impl::SplitAdded(const std::string& text, const TokenTrie& trie,
                                    bool allow_special, std::vector<Segment>* out) const {
  std::string_view s(text);
  size_t start_offset = 0;
  if (!trie.empty()) {
    size_t pos = 0;
    while (pos < s.size()) {
      size_t len = 0;
      const int index = trie.LongestAt(s, pos, &len);
      if (index < 0) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + len;
      pos = stop;  // matches never overlap, even when the one found is then discarded
      const AddedTokenRule& tok = added[index];
      if (tok.special && !allow_special) continue;
      if (tok.single_word) {
        size_t l = 0;
        const bool word_before = start > 0 && IsWordChar(DecodeAt(s, PrevCharStart(s, start), &l));
        const bool word_after = stop < s.size() && IsWordChar(DecodeAt(s, stop, &l));
        if (word_before || word_after) continue;
      }
      if (tok.lstrip) {
        size_t new_start = start;
        while (new_start > 0) {
          size_t l = 0;
          const size_t prev = PrevCharStart(s, new_start);
          if (!IsWhitespace(DecodeAt(s, prev, &l))) break;
          new_start = prev;
        }
        // Whitespace already consumed by the previous token's rstrip stays with it.
        start = std::max(new_start, start_offset);
      }
      if (tok.rstrip) {
        while (stop < s.size()) {
          size_t l = 0;
          if (!IsWhitespace(DecodeAt(s, stop, &l))) break;
          stop += l;
        }
      }
      if (start_offset < start) out->push_back({text.substr(start_offset, start - start_offset)});
      out->push_back({"", tok.id});
      // The scan resumes at the match end, not after rstrip's whitespace, as HF's does.
      start_offset = stop;
    }
  }
  if (start_offset < s.size()) out->push_back({text.substr(start_offset)});
}

Status BpeTokenizer::Impl::PreTokenize(const std::string& text,
                                       std::vector<std::string>* out) const {
  std::vector<std::string> pieces{text};
  std::vector<std::string> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreTokenizerStep& step : pre_tokenizers) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
        if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
        std::vector<std::pair<size_t, size_t>> ranges;
        if (step.use_regex) {
          // ByteLevel's own regex splits Isolated: matches and the gaps between them.
          GYRE_RETURN_IF_ERROR(step.regex->FindAll(piece, &matches));
          size_t prev = 0;
          for (const auto& m : matches) {
            if (prev < m.first) ranges.emplace_back(prev, m.first);
            ranges.push_back(m);
            prev = m.second;
          }
          if (prev < piece.size()) ranges.emplace_back(prev, piece.size());
        } else {
          ranges.emplace_back(0, piece.size());
        }
        const ByteMap& map = GetByteMap();
        for (const auto& [b, e] : ranges) {
          if (b >= e) continue;
          std::string mapped;
          mapped.reserve((e - b) * 2);
          for (size_t i = b; i < e; ++i) mapped += map.byte_to_utf8[static_cast<uint8_t>(piece[i])];
          next.push_back(std::move(mapped));
        }
        continue;
      }
      // Split: alternate non-matching gaps and matches, flagging matches (flipped by invert).
      GYRE_RETURN_IF_ERROR(step.regex->FindAll(piece, &matches));
      std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
      size_t prev = 0;
      for (const auto& m : matches) {
        if (prev != m.first) parts.push_back({{prev, m.first}, step.invert});
        parts.push_back({m, !step.invert});
        prev = m.second;
      }
      if (prev != piece.size()) parts.push_back({{prev, piece.size()}, step.invert});

      std::vector<std::pair<size_t, size_t>> ranges;
      bool previous_match = false;
      switch (step.behavior) {
        case SplitBehavior::kIsolated:
          for (const auto& p : parts) ranges.push_back(p.first);
          break;
        case SplitBehavior::kRemoved:
          for (const auto& p : parts) {
            if (!p.second) ranges.push_back(p.first);
          }
          break;
        case SplitBehavior::kContiguous:
          for (const auto& p : parts) {
            if (p.second && previous_match && !ranges.empty()) {
              ranges.back().second = p.first.second;
            } else {
              ranges.push_back(p.first);
            }
            previous_match = p.second;
          }
          break;
        case SplitBehavior::kMergedWithPrevious:
          for (const auto& p : parts) {
            if (p.second && !previous_match && !ranges.empty()) {
              ranges.back().second = p.first.second;
            } else {
              ranges.push_back(p.first);
            }
            previous_match = p.second;
          }
          break;
        case SplitBehavior::kMergedWithNext:
          for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
            if (it->second && !previous_match && !ranges.empty()) {
              ranges.back().first = it->first.first;
            } else {
              ranges.push_back(it->first);
            }
            previous_match = it->second;
          }
          std::reverse(ranges.begin(), ranges.end());
          break;
      }
      for (const auto& [b, e] : ranges) {
        if (b < e) next.push_back(piece.substr(b, e - b));
      }
    }
    pieces.swap(next);
  }
  for (std::string& p : pieces) {
    if (!p.empty()) out->push_back(std::move(p));
  }
  return Status::Ok();
}

void BpeTokenizer::Impl::EncodeWord(const std::string& word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> result;
  MergeWord(word, &result);
  ids->insert(ids->end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() < kMaxCacheEntries) cache.emplace(word, std::move(result));
  }
}

void BpeTokenizer::Impl::MergeWord(const std::string& word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  // Split into characters; unknown characters become unk (fused if asked) or are dropped, as HF.
  std::string_view s(word);
  bool last_was_unk = false;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    DecodeAt(s, i, &len);
    std::string piece;
    if (i > 0) piece += continuing_subword_prefix;
    piece.append(s.substr(i, len));
    if (i + len == s.size()) piece += end_of_word_suffix;
    i += len;
    auto it = vocab.find(piece);
    if (it != vocab.end()) {
      symbols.push_back({it->second, 0, 0, true});
      last_was_unk = false;
    } else if (unk_id.has_value()) {
      if (!(fuse_unk && last_was_unk)) symbols.push_back({*unk_id, 0, 0, true});
      last_was_unk = true;
    }
  }
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int left) {
    const int right = symbols[left].next;
    if (right < 0) return;
    auto it = merges.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges.end()) queue.push({it->second.first, left, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const int right_pos = left.next;
    auto it = merges.find(PairKey(left.id, symbols[right_pos].id));
    // Stale: one side changed since this candidate was queued.
    if (it == merges.end() || it->second.second != top.new_id) continue;
    left.id = top.new_id;
    symbols[right_pos].alive = false;
    left.next = symbols[right_pos].next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0 && i < n; i = symbols[i].next) ids->push_back(symbols[i].id);
}

// ---------------------------------------------------------------------------------------------
// Loading.

namespace {

Status ParseNormalizer(const json& node, const std::string& path, std::vector<NormForm>* out) {
  if (node.is_null()) return Status::Ok();
  GYRE_ASSIGN_OR_RETURN(std::string type, GetType(node, path));
  if (type == "NFC") {
    out->push_back(NormForm::kNfc);
  } else if (type == "NFD") {
    out->push_back(NormForm::kNfd);
  } else if (type == "NFKC") {
    out->push_back(NormForm::kNfkc);
  } else if (type == "NFKD") {
    out->push_back(NormForm::kNfkd);
  } else if (type == "Sequence") {
    auto it = node.find("normalizers");
    if (it == node.end() || !it->is_array()) {
      return FieldError(path + ".normalizers", "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      GYRE_RETURN_IF_ERROR(
          ParseNormalizer((*it)[i], path + ".normalizers[" + std::to_string(i) + "]", out));
    }
  } else {
    return FieldError(path + ".type", "normalizer type '" + type +
                                          "' is not supported (supported: NFC, NFD, NFKC, NFKD, "
                                          "Sequence)");
  }
  return Status::Ok();
}

Status ParsePreTokenizer(const json& node, const std::string& path,
                         std::vector<PreTokenizerStep>* out) {
  if (node.is_null()) return Status::Ok();
  GYRE_ASSIGN_OR_RETURN(std::string type, GetType(node, path));
  if (type == "Sequence") {
    auto it = node.find("pretokenizers");
    if (it == node.end() || !it->is_array()) {
      return FieldError(path + ".pretokenizers", "missing or not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      GYRE_RETURN_IF_ERROR(
          ParsePreTokenizer((*it)[i], path + ".pretokenizers[" + std::to_string(i) + "]", out));
    }
    return Status::Ok();
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    GYRE_ASSIGN_OR_RETURN(step.add_prefix_space, GetBool(node, "add_prefix_space", true, path));
    GYRE_ASSIGN_OR_RETURN(step.use_regex, GetBool(node, "use_regex", true, path));
    if (step.use_regex) {
      GYRE_ASSIGN_OR_RETURN(auto re, Regex::Compile(kGpt2Pattern, /*literal=*/false));
      step.regex = std::move(re);
    }
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    auto pat = node.find("pattern");
    if (pat == node.end() || !pat->is_object()) {
      return FieldError(path + ".pattern", "missing or not an object");
    }
    bool literal = false;
    std::string pattern;
    if (pat->contains("Regex") && (*pat)["Regex"].is_string()) {
      pattern = (*pat)["Regex"].get<std::string>();
    } else if (pat->contains("String") && (*pat)["String"].is_string()) {
      pattern = (*pat)["String"].get<std::string>();
      literal = true;
    } else {
      return FieldError(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    auto re = Regex::Compile(pattern, literal);
    if (!re.ok()) return re.status().WithContext(path + ".pattern");
    step.regex = std::move(re).value();
    GYRE_ASSIGN_OR_RETURN(std::string behavior, GetString(node, "behavior", "", path));
    if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return FieldError(path + ".behavior", "unknown split behavior '" + behavior + "'");
    }
    GYRE_ASSIGN_OR_RETURN(step.invert, GetBool(node, "invert", false, path));
  } else {
    return FieldError(path + ".type", "pre_tokenizer type '" + type +
                                          "' is not supported (supported: Sequence, Split, "
                                          "ByteLevel)");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

}  // namespace

Status BpeTokenizer::Impl::Load(const json& root) {
  if (!root.is_object()) return InvalidArgument("top level: expected a JSON object");
  auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object()) {
    return FieldError("model", "missing or not an object");
  }
  const json& model = *model_it;
  // Old files omit model.type; a vocab plus merges can only be BPE.
  std::string type = "BPE";
  if (model.contains("type")) {
    GYRE_ASSIGN_OR_RETURN(type, GetType(model, "model"));
  }
  if (type != "BPE") {
    return FieldError("model.type", "model type '" + type + "' is not supported (only BPE)");
  }
  GYRE_ASSIGN_OR_RETURN(bool byte_fallback, GetBool(model, "byte_fallback", false, "model"));
  if (byte_fallback) {
    return FieldError("model.byte_fallback",
                      "byte_fallback BPE (SentencePiece style) is not "
                      "supported; only byte-level BPE is");
  }
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null()) {
    if (!dropout->is_number()) return FieldError("model.dropout", "expected a number or null");
    if (dropout->get<double>() != 0.0) {
      return FieldError("model.dropout",
                        "BPE dropout is not supported (encoding must be "
                        "deterministic)");
    }
  }
  GYRE_ASSIGN_OR_RETURN(continuing_subword_prefix,
                        GetString(model, "continuing_subword_prefix", "", "model"));
  GYRE_ASSIGN_OR_RETURN(end_of_word_suffix, GetString(model, "end_of_word_suffix", "", "model"));
  GYRE_ASSIGN_OR_RETURN(fuse_unk, GetBool(model, "fuse_unk", false, "model"));
  GYRE_ASSIGN_OR_RETURN(ignore_merges, GetBool(model, "ignore_merges", false, "model"));

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return FieldError("model.vocab", "missing or not an object");
  }
  int32_t max_id = -1;
  vocab.reserve(vocab_it->size());
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return FieldError("model.vocab[\"" + it.key() + "\"]", "expected a non-negative 32-bit id");
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    vocab[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  GYRE_ASSIGN_OR_RETURN(std::string unk, GetString(model, "unk_token", "", "model"));
  if (!unk.empty()) {
    auto it = vocab.find(unk);
    if (it == vocab.end()) {
      return FieldError("model.unk_token", "token '" + unk + "' is not in model.vocab");
    }
    unk_id = it->second;
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return FieldError("model.merges", "missing or not an array");
  }
  merges.reserve(merges_it->size());
  for (size_t rank = 0; rank < merges_it->size(); ++rank) {
    const json& m = (*merges_it)[rank];
    const std::string field = "model.merges[" + std::to_string(rank) + "]";
    std::string a, b;
    if (m.is_string()) {
      // Legacy form "a b": byte-level tokens never contain a literal space.
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return FieldError(field, "legacy merge '" + line +
                                     "' is not two tokens separated by "
                                     "one space");
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return FieldError(field, "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab.find(a);
    if (ia == vocab.end()) return FieldError(field, "token '" + a + "' is not in model.vocab");
    auto ib = vocab.find(b);
    if (ib == vocab.end()) return FieldError(field, "token '" + b + "' is not in model.vocab");
    std::string merged = a;
    if (!continuing_subword_prefix.empty() &&
        b.compare(0, continuing_subword_prefix.size(), continuing_subword_prefix) == 0) {
      merged += b.substr(continuing_subword_prefix.size());
    } else {
      merged += b;
    }
    auto im = vocab.find(merged);
    if (im == vocab.end()) {
      return FieldError(field, "merged token '" + merged + "' is not in model.vocab");
    }
    // A repeated pair keeps its last rank, as HF's map construction does.
    merges[PairKey(ia->second, ib->second)] = {static_cast<int32_t>(rank), im->second};
  }

  auto added_it = root.find("added_tokens");
  if (added_it != root.end() && !added_it->is_null()) {
    if (!added_it->is_array()) return FieldError("added_tokens", "expected an array");
    for (size_t i = 0; i < added_it->size(); ++i) {
      const json& t = (*added_it)[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object()) return FieldError(field, "expected an object");
      AddedTokenRule tok;
      auto id = t.find("id");
      if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() > INT32_MAX) {
        return FieldError(field + ".id", "missing or not a non-negative 32-bit id");
      }
      tok.id = static_cast<int32_t>(id->get<int64_t>());
      GYRE_ASSIGN_OR_RETURN(tok.content, GetString(t, "content", "", field));
      if (tok.content.empty()) return FieldError(field + ".content", "missing or empty");
      if (FindInvalidUtf8(tok.content) != std::string::npos) {
        return FieldError(field + ".content", "not valid UTF-8");
      }
      GYRE_ASSIGN_OR_RETURN(tok.single_word, GetBool(t, "single_word", false, field));
      GYRE_ASSIGN_OR_RETURN(tok.lstrip, GetBool(t, "lstrip", false, field));
      GYRE_ASSIGN_OR_RETURN(tok.rstrip, GetBool(t, "rstrip", false, field));
      GYRE_ASSIGN_OR_RETURN(tok.special, GetBool(t, "special", false, field));
      // HF's default: special tokens are matched on raw text, others on normalized text.
      GYRE_ASSIGN_OR_RETURN(tok.normalized, GetBool(t, "normalized", !tok.special, field));
      max_id = std::max(max_id, tok.id);
      added.push_back(std::move(tok));
    }
  }

  auto norm_it = root.find("normalizer");
  if (norm_it != root.end())
    GYRE_RETURN_IF_ERROR(ParseNormalizer(*norm_it, "normalizer", &normalizers));
  auto pre_it = root.find("pre_tokenizer");
  if (pre_it != root.end()) {
    GYRE_RETURN_IF_ERROR(ParsePreTokenizer(*pre_it, "pre_tokenizer", &pre_tokenizers));
  }
  const bool has_byte_level = std::any_of(
      pre_tokenizers.begin(), pre_tokenizers.end(),
      [](const PreTokenizerStep& s) { return s.kind == PreTokenizerStep::Kind::kByteLevel; });
  if (!has_byte_level) {
    return FieldError("pre_tokenizer", "no ByteLevel step; only byte-level BPE is supported");
  }
  auto dec_it = root.find("decoder");
  if (dec_it != root.end() && !dec_it->is_null()) {
    GYRE_ASSIGN_OR_RETURN(std::string dec_type, GetType(*dec_it, "decoder"));
    if (dec_type != "ByteLevel") {
      return FieldError("decoder.type",
                        "decoder type '" + dec_type + "' is not supported (only ByteLevel)");
    }
  }

  // The id tables are dense, sized by the largest id. Real vocabularies are dense too (ids
  // 0..N-1, added tokens just past them, small holes at most), so an id far beyond the number
  // of tokens is a damaged or hostile file, not something to allocate gigabytes for.
  const int64_t tokens = static_cast<int64_t>(vocab.size() + added.size());
  const int64_t id_limit = 2 * tokens + kIdSlack;
  if (static_cast<int64_t>(max_id) >= id_limit) {
    std::string field;
    for (size_t i = 0; i < added.size() && field.empty(); ++i) {
      if (added[i].id == max_id) field = "added_tokens[" + std::to_string(i) + "].id";
    }
    for (auto it = vocab.begin(); it != vocab.end() && field.empty(); ++it) {
      if (it->second == max_id) field = "model.vocab[\"" + it->first + "\"]";
    }
    return FieldError(field, "id " + std::to_string(max_id) + " is implausibly large for " +
                                 std::to_string(tokens) + " tokens (ids must be below " +
                                 std::to_string(id_limit) + ", twice the token count plus " +
                                 std::to_string(kIdSlack) + ")");
  }
  id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  id_to_added.assign(static_cast<size_t>(max_id + 1), -1);
  for (const auto& [token, id] : vocab) id_to_token[id] = token;
  for (size_t i = 0; i < added.size(); ++i) {
    AddedTokenRule& tok = added[i];
    id_to_added[tok.id] = static_cast<int>(i);
    if (tok.normalized) {
      GYRE_ASSIGN_OR_RETURN(std::string key, Normalize(tok.content));
      normalized_trie.Insert(key, static_cast<int>(i));
      // HF reports (and decodes) a normalized token by its normalized form.
      id_to_token[tok.id] = key;
    } else {
      raw_trie.Insert(tok.content, static_cast<int>(i));
      id_to_token[tok.id] = tok.content;
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Public API.

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open tokenizer file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLoss("error reading tokenizer file '" + path + "'");
  return FromJson(text.str(), path);
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(const std::string& text,
                                                               const std::string& source_name) {
  const std::string context = "tokenizer '" + source_name + "'";
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgument(context + ": malformed JSON: " + e.what());
  }
  auto impl = std::make_unique<Impl>();
  Status status;
  try {
    status = impl->Load(root);
  } catch (const json::exception& e) {
    // The accessors check types, so this is a field shape they did not anticipate.
    status = InvalidArgument(std::string("unexpected JSON structure: ") + e.what());
  }
  if (!status.ok()) return status.WithContext(context);
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(const std::string& text,
                                                    bool allow_special) const {
  const size_t bad = FindInvalidUtf8(text);
  if (bad != std::string::npos) {
    return InvalidArgument("text is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  }
  std::vector<int32_t> ids;
  std::vector<Segment> raw_segments, segments;
  std::vector<std::string> words;
  impl_->SplitAdded(text, impl_->raw_trie, allow_special, &raw_segments);
  for (Segment& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    GYRE_ASSIGN_OR_RETURN(std::string normalized, impl_->Normalize(std::move(raw.text)));
    segments.clear();
    impl_->SplitAdded(normalized, impl_->normalized_trie, allow_special, &segments);
    for (const Segment& seg : segments) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      words.clear();
      GYRE_RETURN_IF_ERROR(impl_->PreTokenize(seg.text, &words));
      for (const std::string& w : words) impl_->EncodeWord(w, &ids);
    }
  }
  return ids;
}

bool BpeTokenizer::AppendTokenBytes(int32_t id, bool skip_special, std::string* out) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) return false;
  const std::string& token = impl_->id_to_token[id];
  if (token.empty()) return false;
  const int added = impl_->id_to_added[id];
  if (skip_special && added >= 0 && impl_->added[added].special) return false;
  // ByteLevel decoding: each character maps back to its byte; a token with any character
  // outside the mapping (e.g. an added token containing a space) is emitted as its own UTF-8.
  const ByteMap& map = GetByteMap();
  std::string bytes;
  std::string_view s(token);
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    auto it = map.char_to_byte.find(DecodeAt(s, i, &len));
    if (it == map.char_to_byte.end()) {
      out->append(token);
      return true;
    }
    bytes.push_back(static_cast<char>(it->second));
    i += len;
  }
  out->append(bytes);
  return true;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) AppendTokenBytes(id, skip_special, &bytes);
  std::string out;
  AppendLossy(bytes, /*final=*/true, &out);
  return out;
}

std::string BpeTokenizer::StreamDecoder::Push(int32_t id) {
  tokenizer_->AppendTokenBytes(id, skip_special_, &pending_);
  std::string out;
  const size_t consumed = AppendLossy(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string BpeTokenizer::StreamDecoder::Flush() {
  std::string out;
  AppendLossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int32_t> BpeTokenizer::TokenToId(const std::string& token) const {
  // An added token is found by its content or, for normalized ones, its normalized form.
  for (const AddedTokenRule& tok : impl_->added) {
    if (tok.content == token || impl_->id_to_token[tok.id] == token) return tok.id;
  }
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) return std::string();
  return impl_->id_to_token[id];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_added.size()) return false;
  const int added = impl_->id_to_added[id];
  return added >= 0 && impl_->added[added].special;
}

}  // namespace gyre::text
