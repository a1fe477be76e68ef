// A Jinja renderer for Hugging Face chat templates, in three stages:
//
//   1. Lex: the source (newlines normalised, one trailing newline dropped, as jinja2 does) is cut
//      into text and tags. Whitespace control is applied here exactly as jinja2's lexer does with
//      HF's environment: `{%-`/`-%}` (and `{{-`, `-}}`, `{#-`, `-#}`) strip all whitespace on that
//      side; trim_blocks drops the first newline after `%}`/`#}`; lstrip_blocks drops spaces and
//      tabs between a line start and `{%`/`{#`; `+` after `{%` or before `%}` disables either.
//      The inside of each tag is tokenised (names, numbers, Python string literals, operators).
//   2. Parse: recursive descent into statements (if/for/set/macro/...) and expressions, following
//      jinja2's parser precedence (or < and < not < comparisons < + - < ~ < * / // % < ** <
//      unary, postfix, filters and tests).
//   3. Render: a tree walk over JSON values (ordered objects, like Python dicts) with jinja2's
//      Undefined semantics and Python's truthiness, str(), repr(), comparison and string methods.
//
// Errors inside the engine are thrown as JinjaError and turned into a Status at the API edge: an
// interpreter threads failures through every expression, and a Status per node would double the
// code without making a failure path clearer. Nothing else throws across this file's boundary.

#include "text/jinja.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/strings.h"

namespace gyre::text {
namespace {

using Json = nlohmann::ordered_json;

// Limits that keep a hostile or broken template from exhausting the process.
constexpr size_t kMaxOutputBytes = 16u << 20;  // rendered text, and any one string value
constexpr int64_t kMaxIterations = 1000000;    // loop iterations over the whole render
constexpr size_t kMaxElements = 1u << 20;      // elements in one constructed list or range
constexpr int kMaxParseDepth = 200;            // nested expressions and blocks
constexpr int kMaxCallDepth = 64;              // nested macro calls
// Nested statements and expressions, all macros together. Each level is a few C++ frames; under
// AddressSanitizer a level takes about 6 KB of stack, and 1,500 levels overflowed 8 MB.
constexpr int kMaxRenderDepth = 256;
constexpr int kMaxValueDepth = 512;        // nesting of lists and dicts
constexpr uint64_t kMaxWork = 256u << 20;  // bytes and entries of all values produced

// `located` is false for errors from helpers that do not know the line; the renderer adds the
// line of the statement being rendered.
struct JinjaError {
  std::string message;
  bool located = false;
};

[[noreturn]] void Fail(int line, const std::string& what) {
  throw JinjaError{"chat template line " + std::to_string(line) + ": " + what, true};
}
[[noreturn]] void FailAt(int line, int col, const std::string& what) {
  throw JinjaError{"chat template line " + std::to_string(line) + ", column " +
                       std::to_string(col) + ": " + what,
                   true};
}

// ------------------------------------------------------------------------------------------------
// UTF-8 and Python string helpers

// Splits UTF-8 text into code points (each as its bytes); an invalid byte stands alone.
std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80             ? 1
                 : (b & 0xE0) == 0xC0 ? 2
                 : (b & 0xF0) == 0xE0 ? 3
                 : (b & 0xF8) == 0xF0 ? 4
                                      : 1;
    if (i + len > s.size()) len = 1;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        len = 1;
        break;
      }
    }
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t CodePointCount(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

char32_t Decode(const std::string& cp) {
  const auto b0 = static_cast<unsigned char>(cp[0]);
  if (cp.size() == 1) return b0;
  char32_t v = cp.size() == 2 ? (b0 & 0x1F) : cp.size() == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < cp.size(); ++i) v = (v << 6) | (static_cast<unsigned char>(cp[i]) & 0x3F);
  return v;
}

// Python's str.isspace() for one code point.
bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's str.strip/lstrip/rstrip: `chars` null strips whitespace, else any of its code points.
std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string> cps = CodePoints(s);
  std::vector<std::string> set;
  if (chars != nullptr) set = CodePoints(*chars);
  auto strip = [&](const std::string& cp) {
    if (chars == nullptr) return IsPySpace(Decode(cp));
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

std::vector<std::string> PySplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr) {
    const std::vector<std::string> cps = CodePoints(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPySpace(Decode(cps[i]))) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest;
        for (size_t k = i; k < cps.size(); ++k) rest += cps[k];
        // Python keeps the remainder as is, except trailing whitespace is not stripped.
        out.push_back(rest);
        return out;
      }
      std::string word;
      while (i < cps.size() && !IsPySpace(Decode(cps[i]))) word += cps[i++];
      out.push_back(word);
    }
    return out;
  }
  if (sep->empty()) throw JinjaError{"empty separator"};
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t pos = s.find(*sep, start);
    if (pos == std::string::npos) break;
    out.push_back(s.substr(start, pos - start));
    start = pos + sep->size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string PyReplace(const std::string& s, const std::string& old, const std::string& rep,
                      int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::vector<std::string> cps = CodePoints(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (i < cps.size()) out += cps[i];
      if (out.size() > kMaxOutputBytes) throw JinjaError{"string result over 16 MiB"};
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t pos = s.find(old, start);
    if (pos == std::string::npos) break;
    out.append(s, start, pos - start).append(rep);
    start = pos + old.size();
    ++done;
    if (out.size() > kMaxOutputBytes) throw JinjaError{"string result over 16 MiB"};
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Case mapping is ASCII-only (docs/chat_templates.md: non-ASCII letters keep their case).
std::string AsciiLower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}
std::string AsciiUpper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}
bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
std::string AsciiCapitalize(const std::string& s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}
std::string AsciiTitle(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    const bool alpha = IsAsciiAlpha(c);
    if (alpha) c = prev_alpha ? AsciiLower(std::string(1, c))[0] : AsciiUpper(std::string(1, c))[0];
    prev_alpha = alpha;
  }
  return out;
}

// jinja2's `title` filter (not str.title): words start after runs of whitespace, '-', '(', '{',
// '[' or '<'; each word's first character is upper-cased and the rest lower-cased.
std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const std::string& cp : CodePoints(s)) {
    const char32_t c = Decode(cp);
    const bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += cp;
      word_start = true;
      continue;
    }
    out += word_start ? AsciiUpper(cp) : AsciiLower(cp);
    word_start = false;
  }
  return out;
}

// Python's repr(float): the shortest text that reads back as the same double.
std::string PyFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    snprintf(buf, sizeof(buf), "%.*e", precision - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf is "[-]d.ddde[+-]XX": split into digits and decimal exponent.
  std::string text = buf;
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits = text.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) return out + "0." + std::string(-exponent - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= exponent + 1) {
    return out + digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
}

// Python's repr(str).
std::string PyStrRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

// Python's repr() of a JSON value (how Jinja prints lists and dicts).
std::string PyRepr(const Json& v, int depth = 0) {
  if (depth > kMaxValueDepth) throw JinjaError{"value nested more than 512 deep"};
  switch (v.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return std::to_string(v.get<int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case Json::value_t::number_float:
      return PyFloat(v.get<double>());
    case Json::value_t::string:
      return PyStrRepr(v.get<std::string>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + PyRepr(v[i], depth + 1);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.items()) {
        out += (first ? "" : ", ") + PyStrRepr(k) + ": " + PyRepr(item, depth + 1);
        first = false;
      }
      return out + "}";
    }
    default:
      throw JinjaError{"cannot print a binary value"};
  }
}

// Python's json.dumps string escaping with ensure_ascii=False.
void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          snprintf(b, sizeof(b), "\\u%04x", c);
          *out += b;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

struct DumpStyle {
  std::string indent;  // empty with has_indent=false: one line
  bool has_indent = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

// Python's json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
void PyJsonDump(const Json& v, const DumpStyle& style, int level, std::string* out) {
  if (level > kMaxValueDepth) throw JinjaError{"value nested more than 512 deep"};
  if (out->size() > kMaxOutputBytes) throw JinjaError{"tojson output over 16 MiB"};
  auto newline = [&](int l) {
    if (!style.has_indent) return;
    out->push_back('\n');
    for (int i = 0; i < l; ++i) *out += style.indent;
  };
  switch (v.type()) {
    case Json::value_t::null:
      *out += "null";
      return;
    case Json::value_t::boolean:
      *out += v.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_float: {
      const double d = v.get<double>();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : PyFloat(d);
      return;
    }
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      *out += PyRepr(v);
      return;
    case Json::value_t::string:
      JsonString(v.get<std::string>(), out);
      return;
    case Json::value_t::array: {
      if (v.empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) *out += style.item_sep;
        newline(level + 1);
        PyJsonDump(v[i], style, level + 1, out);
      }
      newline(level);
      out->push_back(']');
      return;
    }
    case Json::value_t::object: {
      if (v.empty()) {
        *out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Json*>> items;
      for (const auto& [k, item] : v.items()) items.emplace_back(k, &item);
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += style.item_sep;
        newline(level + 1);
        JsonString(items[i].first, out);
        *out += style.key_sep;
        PyJsonDump(*items[i].second, style, level + 1, out);
      }
      newline(level);
      out->push_back('}');
      return;
    }
    default:
      throw JinjaError{"cannot serialise a binary value"};
  }
}

// ------------------------------------------------------------------------------------------------
// Lexer

struct Token {
  enum Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type = kEnd;
  std::string text;  // name, decoded string, or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 0;
  int col = 0;
};

struct Segment {
  enum Kind { kText, kVar, kBlock };
  Kind kind = kText;
  std::string text;           // kText
  std::vector<Token> tokens;  // kVar/kBlock, ending with a kEnd token
  int line = 0;
  int col = 0;
};

class Lexer {
 public:
  explicit Lexer(const std::string& raw) {
    // Newlines become "\n" and one trailing newline is dropped (keep_trailing_newline=False).
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      } else {
        src_.push_back(raw[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Segment> Run() {
    std::vector<Segment> segments;
    size_t pos = 0;
    bool line_starting = true;
    bool strip_next = false;  // the previous tag ended with `-`: drop leading whitespace
    while (pos <= src_.size()) {
      size_t open = FindTagOpen(pos);
      std::string text = src_.substr(pos, (open == std::string::npos ? src_.size() : open) - pos);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && IsJinjaSpace(text[k])) ++k;
        text.erase(0, k);
      }
      if (open == std::string::npos) {
        AddText(&segments, text, pos);
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsJinjaSpace(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs between a line start and the tag go.
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            text.find_first_not_of(" \t\v\f", l_pos) == std::string::npos) {
          text.resize(l_pos);
        }
      }
      AddText(&segments, text, pos);
      size_t body = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      size_t after;
      if (kind == '#') {
        const size_t close = src_.find("#}", body);
        if (close == std::string::npos) {
          FailAt(Line(open), Col(open), "comment '{#' is never closed with '#}'");
        }
        const bool minus = close > body && src_[close - 1] == '-';
        after = close + 2;
        strip_next = minus;
        if (!minus && !(close > body && src_[close - 1] == '+')) after = TrimNewline(after);
      } else {
        Segment seg;
        seg.kind = kind == '{' ? Segment::kVar : Segment::kBlock;
        seg.line = Line(open);
        seg.col = Col(open);
        char end_sign = '\0';
        after = LexTag(body, kind == '{' ? '}' : '%', &seg.tokens, &end_sign, open);
        strip_next = end_sign == '-';
        if (seg.kind == Segment::kBlock && end_sign == '\0') after = TrimNewline(after);
        if (seg.kind == Segment::kBlock && IsRawTag(seg.tokens)) {
          FailAt(seg.line, seg.col, "unsupported tag 'raw'");
        }
        segments.push_back(std::move(seg));
      }
      if (strip_next) {
        // `\s*` after the close: consume here so line_starting sees the last newline.
        size_t k = after;
        while (k < src_.size() && IsJinjaSpace(src_[k])) ++k;
        line_starting = k > after && src_[k - 1] == '\n';
        after = k;
        strip_next = false;
      } else {
        line_starting = after > 0 && src_[after - 1] == '\n';
      }
      pos = after;
    }
    return segments;
  }

 private:
  static bool IsJinjaSpace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  }
  static bool IsRawTag(const std::vector<Token>& tokens) {
    return !tokens.empty() && tokens[0].type == Token::kName && tokens[0].text == "raw";
  }

  int Line(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) -
                            line_starts_.begin());
  }
  int Col(size_t pos) const { return static_cast<int>(pos - line_starts_[Line(pos) - 1]) + 1; }

  size_t TrimNewline(size_t after) const {
    return after < src_.size() && src_[after] == '\n' ? after + 1 : after;
  }

  size_t FindTagOpen(size_t pos) const {
    while (true) {
      const size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char n = src_[p + 1];
      if (n == '{' || n == '%' || n == '#') return p;
      pos = p + 1;
    }
  }

  void AddText(std::vector<Segment>* segments, const std::string& text, size_t pos) const {
    if (text.empty()) return;
    Segment seg;
    seg.kind = Segment::kText;
    seg.text = text;
    seg.line = Line(pos);
    segments->push_back(std::move(seg));
  }

  // Tokenises from `pos` to the tag's close (`}}` or `%}`, optionally `-`/`+` before it, outside
  // brackets and strings). Returns the position after the close.
  size_t LexTag(size_t pos, char close, std::vector<Token>* tokens, char* end_sign, size_t open) {
    int depth = 0;
    while (true) {
      while (pos < src_.size() && IsJinjaSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        FailAt(Line(open), Col(open),
               std::string("tag opened here is never closed with '") + close + "}'");
      }
      const char c = src_[pos];
      if (depth == 0) {
        for (char sign : {'-', '+', '\0'}) {
          if (sign == '+' && close == '}') continue;
          const size_t at = pos + (sign ? 1 : 0);
          if ((sign == '\0' || c == sign) && at + 1 < src_.size() && src_[at] == close &&
              src_[at + 1] == '}') {
            Token end;
            end.type = Token::kEnd;
            end.line = Line(pos);
            end.col = Col(pos);
            tokens->push_back(end);
            *end_sign = sign == '-' ? '-' : (sign == '+' ? '+' : '\0');
            return at + 2;
          }
        }
      }
      Token t;
      t.line = Line(pos);
      t.col = Col(pos);
      if (IsAsciiAlpha(c) || c == '_') {
        size_t e = pos;
        while (e < src_.size() && (IsAsciiAlpha(src_[e]) || src_[e] == '_' ||
                                   std::isdigit(static_cast<unsigned char>(src_[e]))))
          ++e;
        t.type = Token::kName;
        t.text = src_.substr(pos, e - pos);
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = LexNumber(pos, &t);
      } else if (c == '\'' || c == '"') {
        pos = LexString(pos, &t);
      } else {
        static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                     "{",  "}",  ",",  ".",  ":",  "|",  "="};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::strlen(op);
          if (src_.compare(pos, n, op) == 0) {
            t.type = Token::kOp;
            t.text = op;
            pos += n;
            found = true;
            break;
          }
        }
        if (!found) FailAt(t.line, t.col, std::string("unexpected character '") + c + "'");
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if ((t.text == ")" || t.text == "]" || t.text == "}") && depth > 0) --depth;
      }
      tokens->push_back(std::move(t));
    }
  }

  size_t LexNumber(size_t pos, Token* t) {
    size_t e = pos;
    std::string digits;
    auto take_digits = [&]() {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
        if (src_[e] != '_') digits.push_back(src_[e]);
        ++e;
      }
    };
    take_digits();
    if (digits.size() > 1 && digits[0] == '0' &&
        !(e < src_.size() && (src_[e] == '.' || src_[e] == 'e' || src_[e] == 'E'))) {
      if (digits.find_first_not_of('0') != std::string::npos) {
        FailAt(t->line, t->col, "integer literal with a leading zero");
      }
    }
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      digits.push_back('.');
      ++e;
      take_digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        digits.append(src_, e, k - e);
        e = k;
        take_digits();
      }
    }
    if (is_float) {
      t->type = Token::kFloat;
      t->float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      t->type = Token::kInt;
      errno = 0;
      t->int_value = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) FailAt(t->line, t->col, "integer literal out of 64-bit range");
    }
    return e;
  }

  // A Python string literal with its escapes (jinja2 decodes them with 'unicode-escape').
  size_t LexString(size_t pos, Token* t) {
    const char quote = src_[pos];
    size_t i = pos + 1;
    std::string value;
    while (true) {
      if (i >= src_.size()) FailAt(t->line, t->col, "string literal is never closed");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        value.push_back(c);
        ++i;
        continue;
      }
      const char n = src_[i + 1];
      i += 2;
      auto hex = [&](int count) {
        uint32_t v = 0;
        for (int k = 0; k < count; ++k) {
          if (i >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[i]))) {
            FailAt(t->line, t->col, "truncated \\x/\\u escape in a string literal");
          }
          const char h = src_[i++];
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                    : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (n) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case '\\':
          value.push_back('\\');
          break;
        case '\'':
          value.push_back('\'');
          break;
        case '"':
          value.push_back('"');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
          AppendUtf8(hex(2), &value);
          break;
        case 'u':
          AppendUtf8(hex(4), &value);
          break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) FailAt(t->line, t->col, "\\U escape past U+10FFFF");
          AppendUtf8(cp, &value);
          break;
        }
        default:
          if (n >= '0' && n <= '7') {
            uint32_t v = n - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              v = v * 8 + (src_[i++] - '0');
            }
            AppendUtf8(v, &value);
          } else if (n == 'N') {
            FailAt(t->line, t->col, "unsupported \\N{...} escape in a string literal");
          } else {
            value.push_back('\\');
            value.push_back(n);
          }
      }
    }
    t->type = Token::kString;
    t->text = std::move(value);
    return i + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
};

// ------------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kList,
    kDict,
    kNeg,
    kPos,
    kBinary,
    kConcat,
    kCompare,
    kAnd,
    kOr,
    kNot,
    kCond,
    kFilter,
    kTest,
    kCall
  };
  Kind kind = kLiteral;
  int line = 0;
  Json literal;
  std::string name;           // variable, attribute, operator, filter or test name
  std::vector<ExprPtr> args;  // operands; args[0] is the subject of attr/item/filter/test/call
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: the operators between args
  bool negated = false;          // kTest: `is not`
  int height = 1;                // longest path to a leaf: bounds recursion in Eval
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kScope };
  Kind kind = kText;
  int line = 0;
  std::string text;                                     // kText
  ExprPtr expr;                                         // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf: conditions and bodies
  Body body;                                            // kFor, kSetBlock, kMacro, kScope
  Body else_body;                                       // kIf, kFor
  std::vector<std::string> targets;                     // kFor/kSet names; kSet `ns.attr`: {ns}
  std::string attr;                                     // kSet to a namespace attribute
  ExprPtr filter;                                       // kFor `if` condition
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: names and defaults
};

// ------------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body ParseTemplate() {
    std::string end;
    Body body = ParseBody({}, &end, 0, 0, "");
    return body;
  }

 private:
  // Parses nodes until a block tag whose first name is in `ends` (returned in *end, tokens
  // positioned after it). At the end of input with `ends` non-empty, fails naming the opener.
  Body ParseBody(const std::vector<std::string>& ends, std::string* end, int open_line, int depth,
                 const std::string& opener) {
    if (depth > kMaxParseDepth) Fail(open_line, "blocks nested too deeply");
    Body body;
    while (seg_ < segments_.size()) {
      Segment& s = segments_[seg_];
      if (s.kind == Segment::kText) {
        Node n;
        n.kind = Node::kText;
        n.line = s.line;
        n.text = s.text;
        body.push_back(std::move(n));
        ++seg_;
        continue;
      }
      tokens_ = &s.tokens;
      tok_ = 0;
      if (s.kind == Segment::kVar) {
        Node n;
        n.kind = Node::kOutput;
        n.line = s.line;
        n.expr = ParseExpression(0);
        ExpectEnd();
        body.push_back(std::move(n));
        ++seg_;
        continue;
      }
      const Token& first = Peek();
      if (first.type != Token::kName) FailAt(first.line, first.col, "expected a tag name");
      const std::string tag = first.text;
      if (std::find(ends.begin(), ends.end(), tag) != ends.end()) {
        ++tok_;
        *end = tag;
        ++seg_;
        return body;
      }
      ++tok_;
      ++seg_;
      body.push_back(ParseTag(tag, first, depth));
    }
    if (!ends.empty()) {
      Fail(open_line, "'" + opener + "' is never closed (expected '" + ends.back() + "')");
    }
    return body;
  }

  Node ParseTag(const std::string& tag, const Token& first, int depth) {
    Node n;
    n.line = first.line;
    if (tag == "if") {
      n.kind = Node::kIf;
      ExprPtr cond = ParseExpression(0, /*no_cond=*/true);
      ExpectEnd();
      while (true) {
        std::string end;
        Body body = ParseBody({"elif", "else", "endif"}, &end, n.line, depth + 1, "if");
        n.branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = ParseExpression(0, /*no_cond=*/true);
          ExpectEnd();
          continue;
        }
        if (end == "else") {
          ExpectEnd();
          n.else_body = ParseBody({"endif"}, &end, n.line, depth + 1, "if");
        }
        ExpectEnd();
        break;
      }
    } else if (tag == "for") {
      n.kind = Node::kFor;
      n.targets = ParseTargets();
      ExpectName("in");
      n.expr = ParseExpression(0, /*no_cond=*/true);
      if (PeekName("if")) {
        ++tok_;
        n.filter = ParseExpression(0, /*no_cond=*/true);
      }
      if (PeekName("recursive")) {
        FailAt(Peek().line, Peek().col, "unsupported: recursive for loops");
      }
      ExpectEnd();
      std::string end;
      n.body = ParseBody({"else", "endfor"}, &end, n.line, depth + 1, "for");
      if (end == "else") {
        ExpectEnd();
        n.else_body = ParseBody({"endfor"}, &end, n.line, depth + 1, "for");
      }
      ExpectEnd();
    } else if (tag == "set") {
      const Token& t = Peek();
      if (t.type != Token::kName) FailAt(t.line, t.col, "expected a name after 'set'");
      if (tok_ + 1 < tokens_->size() && (*tokens_)[tok_ + 1].text == "." &&
          (*tokens_)[tok_ + 1].type == Token::kOp) {
        n.targets = {t.text};
        tok_ += 2;
        const Token& a = Peek();
        if (a.type != Token::kName) FailAt(a.line, a.col, "expected an attribute name");
        n.attr = a.text;
        ++tok_;
      } else {
        n.targets = ParseTargets();
      }
      if (Peek().type == Token::kEnd) {
        if (n.targets.size() != 1 || !n.attr.empty()) {
          FailAt(t.line, t.col, "a block set takes one plain name");
        }
        ExpectEnd();
        n.kind = Node::kSetBlock;
        std::string end;
        n.body = ParseBody({"endset"}, &end, n.line, depth + 1, "set");
        ExpectEnd();
      } else {
        n.kind = Node::kSet;
        ExpectOp("=");
        n.expr = ParseTupleOrExpression();
        ExpectEnd();
      }
    } else if (tag == "macro") {
      n.kind = Node::kMacro;
      const Token& t = Peek();
      if (t.type != Token::kName) FailAt(t.line, t.col, "expected a macro name");
      n.name = t.text;
      ++tok_;
      ExpectOp("(");
      while (!PeekOp(")")) {
        const Token& p = Peek();
        if (p.type != Token::kName) FailAt(p.line, p.col, "expected a parameter name");
        ++tok_;
        ExprPtr def;
        if (PeekOp("=")) {
          ++tok_;
          def = ParseExpression(0);
        }
        n.params.emplace_back(p.text, std::move(def));
        if (!PeekOp(",")) break;
        ++tok_;
      }
      ExpectOp(")");
      ExpectEnd();
      std::string end;
      n.body = ParseBody({"endmacro"}, &end, n.line, depth + 1, "macro");
      if (Peek().type == Token::kName && Peek().text == n.name) ++tok_;
      ExpectEnd();
    } else if (tag == "break" || tag == "continue") {
      n.kind = tag == "break" ? Node::kBreak : Node::kContinue;
      ExpectEnd();
    } else if (tag == "generation") {
      // transformers' AssistantTracker: the body renders as is.
      n.kind = Node::kScope;
      ExpectEnd();
      std::string end;
      n.body = ParseBody({"endgeneration"}, &end, n.line, depth + 1, "generation");
      ExpectEnd();
    } else if (tag == "elif" || tag == "else" || tag == "endif" || tag == "endfor" ||
               tag == "endset" || tag == "endmacro" || tag == "endgeneration") {
      FailAt(first.line, first.col, "unexpected '" + tag + "': no open block here expects it");
    } else {
      FailAt(first.line, first.col, "unsupported tag '" + tag + "'");
    }
    return n;
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = PeekOp("(");
    if (paren) ++tok_;
    while (true) {
      const Token& t = Peek();
      if (t.type != Token::kName) FailAt(t.line, t.col, "expected a variable name");
      names.push_back(t.text);
      ++tok_;
      if (!PeekOp(",")) break;
      ++tok_;
    }
    if (paren) ExpectOp(")");
    return names;
  }

  const Token& Peek() const { return (*tokens_)[tok_]; }
  bool PeekOp(const char* op) const { return Peek().type == Token::kOp && Peek().text == op; }
  bool PeekName(const char* name) const {
    return Peek().type == Token::kName && Peek().text == name;
  }
  void ExpectOp(const char* op) {
    if (!PeekOp(op)) Unexpected(std::string("'") + op + "'");
    ++tok_;
  }
  void ExpectName(const char* name) {
    if (!PeekName(name)) Unexpected(std::string("'") + name + "'");
    ++tok_;
  }
  void ExpectEnd() {
    if (Peek().type != Token::kEnd) Unexpected("the end of the tag");
  }
  [[noreturn]] void Unexpected(const std::string& expected) const {
    const Token& t = Peek();
    const std::string got = t.type == Token::kEnd      ? "the end of the tag"
                            : t.type == Token::kString ? "a string"
                                                       : "'" + t.text + "'";
    FailAt(t.line, t.col, "expected " + expected + ", got " + got);
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // `a, b` as a list (set targets' right-hand side).
  ExprPtr ParseTupleOrExpression() {
    const int line = Peek().line;
    ExprPtr first = ParseExpression(0);
    if (!PeekOp(",")) return first;
    ExprPtr list = Make(Expr::kList, line);
    list->args.push_back(std::move(first));
    while (PeekOp(",")) {
      ++tok_;
      if (Peek().type == Token::kEnd) break;
      list->args.push_back(ParseExpression(0));
    }
    return list;
  }

  void Deeper(int depth) const {
    if (depth > kMaxParseDepth) FailAt(Peek().line, Peek().col, "expression nested too deeply");
  }

  ExprPtr ParseExpression(int depth, bool no_cond = false) {
    Deeper(depth);
    ExprPtr e = ParseOr(depth + 1);
    if (no_cond) return e;
    while (PeekName("if")) {
      const int line = Peek().line;
      ++tok_;
      ExprPtr cond = ParseOr(depth + 1);
      ExprPtr other;
      if (PeekName("else")) {
        ++tok_;
        other = ParseExpression(depth + 1);
      }
      ExprPtr c = Make(Expr::kCond, line);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = Seal(std::move(c));
    }
    return e;
  }

  ExprPtr ParseOr(int depth) {
    Deeper(depth);
    ExprPtr e = ParseAnd(depth + 1);
    while (PeekName("or")) {
      ExprPtr b = Make(Expr::kOr, Peek().line);
      ++tok_;
      b->args.push_back(std::move(e));
      b->args.push_back(ParseAnd(depth + 1));
      e = Seal(std::move(b));
    }
    return e;
  }

  ExprPtr ParseAnd(int depth) {
    Deeper(depth);
    ExprPtr e = ParseNot(depth + 1);
    while (PeekName("and")) {
      ExprPtr b = Make(Expr::kAnd, Peek().line);
      ++tok_;
      b->args.push_back(std::move(e));
      b->args.push_back(ParseNot(depth + 1));
      e = Seal(std::move(b));
    }
    return e;
  }

  ExprPtr ParseNot(int depth) {
    Deeper(depth);
    if (PeekName("not")) {
      ExprPtr n = Make(Expr::kNot, Peek().line);
      ++tok_;
      n->args.push_back(ParseNot(depth + 1));
      return Seal(std::move(n));
    }
    return ParseCompare(depth + 1);
  }

  ExprPtr ParseCompare(int depth) {
    Deeper(depth);
    const int line = Peek().line;
    ExprPtr first = ParseMath1(depth + 1);
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.type == Token::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                   t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = t.text;
        ++tok_;
      } else if (PeekName("in")) {
        op = "in";
        ++tok_;
      } else if (PeekName("not") && tok_ + 1 < tokens_->size() &&
                 (*tokens_)[tok_ + 1].type == Token::kName && (*tokens_)[tok_ + 1].text == "in") {
        op = "not in";
        tok_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(ParseMath1(depth + 1));
    }
    return cmp ? Seal(std::move(cmp)) : std::move(first);
  }

  // Records e's height and rejects trees deeper than the renderer may recurse: a chain such as
  // `1+1+...+1` is parsed by a loop, not recursion, so the parse depth alone does not bound it.
  ExprPtr Seal(ExprPtr e) {
    for (const ExprPtr& a : e->args) {
      if (a) e->height = std::max(e->height, a->height + 1);
    }
    for (const auto& kv : e->kwargs) e->height = std::max(e->height, kv.second->height + 1);
    if (e->height > kMaxParseDepth) {
      FailAt(Peek().line, Peek().col, "expression nested too deeply");
    }
    return e;
  }

  ExprPtr Binary(const std::string& op, int line, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(op == "~" ? Expr::kConcat : Expr::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseMath1(int depth) {
    Deeper(depth);
    ExprPtr e = ParseConcat(depth + 1);
    while (PeekOp("+") || PeekOp("-")) {
      const std::string op = Peek().text;
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary(op, line, std::move(e), ParseConcat(depth + 1)));
    }
    return e;
  }

  ExprPtr ParseConcat(int depth) {
    Deeper(depth);
    ExprPtr e = ParseMath2(depth + 1);
    while (PeekOp("~")) {
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary("~", line, std::move(e), ParseMath2(depth + 1)));
    }
    return e;
  }

  ExprPtr ParseMath2(int depth) {
    Deeper(depth);
    ExprPtr e = ParsePow(depth + 1);
    while (PeekOp("*") || PeekOp("/") || PeekOp("//") || PeekOp("%")) {
      const std::string op = Peek().text;
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary(op, line, std::move(e), ParsePow(depth + 1)));
    }
    return e;
  }

  ExprPtr ParsePow(int depth) {
    Deeper(depth);
    ExprPtr e = ParseUnary(depth + 1, true);
    while (PeekOp("**")) {
      const int line = Peek().line;
      ++tok_;
      e = Seal(Binary("**", line, std::move(e), ParseUnary(depth + 1, true)));
    }
    return e;
  }

  ExprPtr ParseUnary(int depth, bool with_filter) {
    Deeper(depth);
    ExprPtr e;
    if (PeekOp("-") || PeekOp("+")) {
      e = Make(PeekOp("-") ? Expr::kNeg : Expr::kPos, Peek().line);
      ++tok_;
      e->args.push_back(ParseUnary(depth + 1, false));
      e = Seal(std::move(e));
    } else {
      e = ParsePrimary(depth + 1);
    }
    e = ParsePostfix(std::move(e), depth + 1);
    if (with_filter) e = ParseFilterExpr(std::move(e), depth + 1);
    return e;
  }

  ExprPtr ParsePrimary(int depth) {
    Deeper(depth);
    const Token& t = Peek();
    switch (t.type) {
      case Token::kName: {
        ++tok_;
        ExprPtr e = Make(Expr::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->literal = true;
        } else if (t.text == "false" || t.text == "False") {
          e->literal = false;
        } else if (t.text == "none" || t.text == "None") {
          e->literal = nullptr;
        } else {
          e->kind = Expr::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::kString: {
        ExprPtr e = Make(Expr::kLiteral, t.line);
        std::string s;
        while (Peek().type == Token::kString) s += (*tokens_)[tok_++].text;
        e->literal = s;
        return e;
      }
      case Token::kInt: {
        ++tok_;
        ExprPtr e = Make(Expr::kLiteral, t.line);
        e->literal = t.int_value;
        return e;
      }
      case Token::kFloat: {
        ++tok_;
        ExprPtr e = Make(Expr::kLiteral, t.line);
        e->literal = t.float_value;
        return e;
      }
      case Token::kOp:
        if (t.text == "(") {
          ++tok_;
          if (PeekOp(")")) {
            ++tok_;
            ExprPtr e = Make(Expr::kList, t.line);  // the empty tuple
            return e;
          }
          ExprPtr e = ParseExpression(depth + 1);
          if (PeekOp(",")) {
            ExprPtr list = Make(Expr::kList, t.line);
            list->args.push_back(std::move(e));
            while (PeekOp(",")) {
              ++tok_;
              if (PeekOp(")")) break;
              list->args.push_back(ParseExpression(depth + 1));
            }
            e = Seal(std::move(list));
          }
          ExpectOp(")");
          return e;
        }
        if (t.text == "[") {
          ++tok_;
          ExprPtr e = Make(Expr::kList, t.line);
          while (!PeekOp("]")) {
            e->args.push_back(ParseExpression(depth + 1));
            if (!PeekOp(",")) break;
            ++tok_;
          }
          ExpectOp("]");
          return Seal(std::move(e));
        }
        if (t.text == "{") {
          ++tok_;
          ExprPtr e = Make(Expr::kDict, t.line);
          while (!PeekOp("}")) {
            e->args.push_back(ParseExpression(depth + 1));
            ExpectOp(":");
            e->args.push_back(ParseExpression(depth + 1));
            if (!PeekOp(",")) break;
            ++tok_;
          }
          ExpectOp("}");
          return Seal(std::move(e));
        }
        break;
      default:
        break;
    }
    Unexpected("an expression");
  }

  void ParseCallArgs(Expr* call, int depth) {
    ExpectOp("(");
    while (!PeekOp(")")) {
      if (PeekOp("*") || PeekOp("**")) {
        FailAt(Peek().line, Peek().col, "unsupported: *args/**kwargs in a call");
      }
      if (Peek().type == Token::kName && tok_ + 1 < tokens_->size() &&
          (*tokens_)[tok_ + 1].type == Token::kOp && (*tokens_)[tok_ + 1].text == "=") {
        const std::string key = Peek().text;
        tok_ += 2;
        call->kwargs.emplace_back(key, ParseExpression(depth + 1));
      } else {
        if (!call->kwargs.empty()) {
          FailAt(Peek().line, Peek().col, "positional argument after a keyword argument");
        }
        call->args.push_back(ParseExpression(depth + 1));
      }
      if (!PeekOp(",")) break;
      ++tok_;
    }
    ExpectOp(")");
  }

  ExprPtr ParsePostfix(ExprPtr e, int depth) {
    while (true) {
      Deeper(depth);
      const Token& t = Peek();
      if (PeekOp(".")) {
        ++tok_;
        const Token& a = Peek();
        ExprPtr g;
        if (a.type == Token::kName) {
          g = Make(Expr::kAttr, a.line);
          g->name = a.text;
        } else if (a.type == Token::kInt) {
          g = Make(Expr::kItem, a.line);
          ExprPtr idx = Make(Expr::kLiteral, a.line);
          idx->literal = a.int_value;
          g->args.push_back(nullptr);
          g->args.push_back(std::move(idx));
        } else {
          Unexpected("an attribute name");
        }
        ++tok_;
        if (g->kind == Expr::kAttr) {
          g->args.push_back(std::move(e));
        } else {
          g->args[0] = std::move(e);
        }
        e = Seal(std::move(g));
      } else if (PeekOp("[")) {
        ++tok_;
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!PeekOp(":") && !PeekOp("]")) parts[k] = ParseExpression(depth + 1);
          if (k < 2 && PeekOp(":")) {
            is_slice = true;
            ++tok_;
          } else {
            break;
          }
        }
        ExpectOp("]");
        ExprPtr g = Make(is_slice ? Expr::kSlice : Expr::kItem, t.line);
        if (!is_slice && !parts[0]) FailAt(t.line, t.col, "expected an index inside []");
        g->args.push_back(std::move(e));
        g->args.push_back(std::move(parts[0]));
        if (is_slice) {
          g->args.push_back(std::move(parts[1]));
          g->args.push_back(std::move(parts[2]));
        }
        e = Seal(std::move(g));
      } else if (PeekOp("(")) {
        ExprPtr c = Make(Expr::kCall, t.line);
        c->args.push_back(std::move(e));
        ParseCallArgs(c.get(), depth + 1);
        e = Seal(std::move(c));
      } else {
        return e;
      }
    }
  }

  std::string DottedName() {
    const Token& t = Peek();
    if (t.type != Token::kName) Unexpected("a filter or test name");
    std::string name = t.text;
    ++tok_;
    while (PeekOp(".") && tok_ + 1 < tokens_->size() && (*tokens_)[tok_ + 1].type == Token::kName) {
      name += "." + (*tokens_)[tok_ + 1].text;
      tok_ += 2;
    }
    return name;
  }

  ExprPtr ParseFilterExpr(ExprPtr e, int depth) {
    while (true) {
      Deeper(depth);
      if (PeekOp("|")) {
        const int line = Peek().line;
        ++tok_;
        ExprPtr f = Make(Expr::kFilter, line);
        f->name = DottedName();
        f->args.push_back(std::move(e));
        if (PeekOp("(")) ParseCallArgs(f.get(), depth + 1);
        e = Seal(std::move(f));
      } else if (PeekName("is")) {
        const int line = Peek().line;
        ++tok_;
        ExprPtr test = Make(Expr::kTest, line);
        if (PeekName("not")) {
          test->negated = true;
          ++tok_;
        }
        test->name = DottedName();
        test->args.push_back(std::move(e));
        // As jinja2: `x is none is number` is an error (a test cannot take `is` as argument).
        if (PeekName("is"))
          FailAt(Peek().line, Peek().col, "cannot chain multiple tests with 'is'");
        const Token& n = Peek();
        if (PeekOp("(")) {
          ParseCallArgs(test.get(), depth + 1);
        } else if ((n.type == Token::kName || n.type == Token::kString || n.type == Token::kInt ||
                    n.type == Token::kFloat || PeekOp("[") || PeekOp("{")) &&
                   !(n.type == Token::kName &&
                     (n.text == "else" || n.text == "or" || n.text == "and" || n.text == "if" ||
                      n.text == "in" || n.text == "is" || n.text == "not"))) {
          test->args.push_back(ParsePostfix(ParsePrimary(depth + 1), depth + 1));
        }
        e = Seal(std::move(test));
      } else if (PeekOp("(")) {
        ExprPtr c = Make(Expr::kCall, Peek().line);
        c->args.push_back(std::move(e));
        ParseCallArgs(c.get(), depth + 1);
        e = Seal(std::move(c));
      } else {
        return e;
      }
    }
  }

  std::vector<Segment> segments_;
  size_t seg_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t tok_ = 0;
};

// ------------------------------------------------------------------------------------------------
// Values

struct Value;
using NamespaceMap = std::map<std::string, Value>;

struct Value {
  enum Kind { kUndefined, kJson, kNamespace, kMacro, kMethod, kFunction };
  Kind kind = kUndefined;
  Json json;                    // kJson; kMethod: the receiver
  NamespaceMap* ns = nullptr;   // kNamespace (owned by the Renderer, shared by every copy)
  const Node* macro = nullptr;  // kMacro
  std::string name;             // kUndefined: what was missing; kMethod/kFunction: which
  // A list that Python holds as a lazy object: a generator (select, map, items filter, reverse)
  // or a dict view (dict.items/keys/values). Iterating one works like a list; the operations
  // where Python's object behaves differently (printing, len or truthiness of a generator,
  // indexing) follow Python or fail.
  enum Lazy { kList, kGenerator, kView };
  Lazy lazy = kList;

  static Value Lazily(Json list, Lazy lazy) {
    Value v = Of(std::move(list));
    v.lazy = lazy;
    return v;
  }

  static Value Of(Json j) {
    Value v;
    v.kind = kJson;
    v.json = std::move(j);
    return v;
  }
  static Value Undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  bool defined() const { return kind != kUndefined; }
  bool is_string() const { return kind == kJson && json.is_string(); }
};

bool IsNumber(const Json& j) { return j.is_number() || j.is_boolean(); }
bool IsInt(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
int64_t AsInt(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) throw JinjaError{"integer out of 64-bit range"};
    return static_cast<int64_t>(u);
  }
  return j.get<int64_t>();
}
double AsDouble(const Json& j) {
  return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
}

bool Truthy(const Value& v) {
  if (v.kind == Value::kUndefined) return false;
  if (v.lazy == Value::kGenerator) return true;  // a Python generator is always true
  if (v.kind != Value::kJson) return true;
  const Json& j = v.json;
  switch (j.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return AsInt(j) != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0.0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !j.empty();
    default:
      return true;
  }
}

// Python ==.
bool JsonEqual(const Json& a, const Json& b) {
  if (IsNumber(a) && IsNumber(b)) {
    if (IsInt(a) && IsInt(b)) return AsInt(a) == AsInt(b);
    return AsDouble(a) == AsDouble(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!JsonEqual(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !JsonEqual(v, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool ValueEqual(const Value& a, const Value& b) {
  if (a.lazy != Value::kList || b.lazy != Value::kList) return false;
  if (a.kind == Value::kJson && b.kind == Value::kJson) return JsonEqual(a.json, b.json);
  if (a.kind != b.kind) return false;
  if (a.kind == Value::kUndefined) return true;
  if (a.kind == Value::kNamespace) return a.ns == b.ns;
  if (a.kind == Value::kMacro) return a.macro == b.macro;
  return false;
}

// Number of JSON nodes in `j`, counting stops past `limit`.
size_t CountNodes(const Json& j, size_t limit, int depth = 0) {
  if (depth > kMaxValueDepth) throw JinjaError{"value nested more than 512 deep"};
  size_t n = 1;
  if (j.is_array() || j.is_object()) {
    for (const auto& item : j) {
      n += CountNodes(item, limit - std::min(n, limit), depth + 1);
      if (n > limit) return n;
    }
  }
  return n;
}

// ------------------------------------------------------------------------------------------------
// Renderer

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr.
  const Value* Get(size_t index, const char* name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  explicit Renderer(const Body* root) : root_(root) {}

  std::string Run(const Json& context) {
    for (const char* fn : {"raise_exception", "strftime_now", "namespace", "dict", "range"}) {
      Value f;
      f.kind = Value::kFunction;
      f.name = fn;
      globals_.vars[fn] = f;
    }
    for (const auto& [k, v] : context.items()) globals_.vars[k] = Value::Of(v);
    std::string out;
    if (RenderBody(*root_, &globals_, &out) != Flow::kNormal) {
      throw JinjaError{"chat template: 'break' or 'continue' outside a loop", true};
    }
    return out;
  }

 private:
  void Append(std::string* out, const std::string& s, int line) {
    if (out->size() + s.size() > kMaxOutputBytes) Fail(line, "output over 16 MiB");
    work_ += s.size();
    if (work_ > kMaxWork) Fail(line, "template does too much work (over 256M value bytes)");
    out->append(s);
  }

  Flow RenderBody(const Body& body, Scope* scope, std::string* out) {
    for (const Node& n : body) {
      const Flow f = RenderNode(n, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  // Counts nested RenderNode/Eval frames so the C++ stack stays bounded.
  struct DepthGuard {
    DepthGuard(int* depth, int line) : depth_(depth) {
      if (++*depth_ > kMaxRenderDepth) {
        --*depth_;
        Fail(line, "template nests too deeply while rendering (macro recursion?)");
      }
    }
    ~DepthGuard() { --*depth_; }
    int* depth_;
  };

  Flow RenderNode(const Node& n, Scope* scope, std::string* out) {
    DepthGuard guard(&render_depth_, n.line);
    try {
      return RenderNodeUnlocated(n, scope, out);
    } catch (const JinjaError& e) {
      if (e.located) throw;
      Fail(n.line, e.message);
    }
  }

  Flow RenderNodeUnlocated(const Node& n, Scope* scope, std::string* out) {
    switch (n.kind) {
      case Node::kText:
        Append(out, n.text, n.line);
        return Flow::kNormal;
      case Node::kOutput:
        Append(out, Str(Eval(*n.expr, scope), n.line), n.line);
        return Flow::kNormal;
      case Node::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (Truthy(Eval(*cond, scope))) return RenderBody(body, scope, out);
        }
        return RenderBody(n.else_body, scope, out);
      case Node::kFor:
        return RenderFor(n, scope, out);
      case Node::kSet: {
        Value v = Eval(*n.expr, scope);
        if (!n.attr.empty()) {
          const Value* target = scope->Find(n.targets[0]);
          if (target == nullptr || target->kind != Value::kNamespace) {
            Fail(n.line, "cannot assign attribute '" + n.attr + "' on '" + n.targets[0] +
                             "', which is not a namespace()");
          }
          (*target->ns)[n.attr] = std::move(v);
        } else {
          Assign(n.targets, std::move(v), scope, n.line);
        }
        return Flow::kNormal;
      }
      case Node::kSetBlock: {
        std::string captured;
        Scope inner{{}, scope};
        RenderBody(n.body, &inner, &captured);
        scope->vars[n.targets[0]] = Value::Of(captured);
        return Flow::kNormal;
      }
      case Node::kMacro: {
        Value m;
        m.kind = Value::kMacro;
        m.macro = &n;
        m.name = n.name;
        scope->vars[n.name] = m;
        return Flow::kNormal;
      }
      case Node::kBreak:
        return Flow::kBreak;
      case Node::kContinue:
        return Flow::kContinue;
      case Node::kScope:
        return RenderBody(n.body, scope, out);
    }
    return Flow::kNormal;
  }

  void Assign(const std::vector<std::string>& targets, Value v, Scope* scope, int line) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = std::move(v);
      return;
    }
    std::vector<Value> items = Iterate(v, line);
    if (items.size() != targets.size()) {
      Fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = std::move(items[i]);
  }

  // The items a for loop visits: list items, dict keys, string characters; Undefined is empty.
  std::vector<Value> Iterate(const Value& v, int line) {
    std::vector<Value> items;
    if (v.kind == Value::kUndefined) return items;
    if (v.kind == Value::kNamespace) Fail(line, "a namespace is not iterable");
    if (v.kind != Value::kJson) Fail(line, "'" + v.name + "' is not iterable");
    if (v.json.is_array()) {
      for (const Json& j : v.json) items.push_back(Value::Of(j));
    } else if (v.json.is_object()) {
      for (const auto& [k, item] : v.json.items()) items.push_back(Value::Of(k));
    } else if (v.json.is_string()) {
      for (std::string& cp : CodePoints(v.json.get<std::string>())) items.push_back(Value::Of(cp));
    } else {
      Fail(line, TypeName(v) + " object is not iterable");
    }
    return items;
  }

  Flow RenderFor(const Node& n, Scope* scope, std::string* out) {
    std::vector<Value> all = Iterate(Eval(*n.expr, scope), n.line);
    std::vector<Value> items;
    if (n.filter) {
      for (Value& v : all) {
        Scope probe{{}, scope};
        Assign(n.targets, v, &probe, n.line);
        if (Truthy(Eval(*n.filter, &probe))) items.push_back(std::move(v));
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return RenderBody(n.else_body, scope, out);
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      if (++iterations_ > kMaxIterations) Fail(n.line, "more than 1000000 loop iterations");
      Scope inner{{}, scope};
      Assign(n.targets, items[i], &inner, n.line);
      Json loop = Json::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = length - i;
      loop["revindex0"] = length - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i == length - 1;
      loop["length"] = length;
      loop["depth"] = 1;
      loop["depth0"] = 0;
      Value lv = Value::Of(std::move(loop));
      if (i > 0 && items[i - 1].kind == Value::kJson) lv.json["previtem"] = items[i - 1].json;
      if (i + 1 < length && items[i + 1].kind == Value::kJson) {
        lv.json["nextitem"] = items[i + 1].json;
      }
      inner.vars["loop"] = std::move(lv);
      const Flow f = RenderBody(n.body, &inner, out);
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  static std::string TypeName(const Value& v) {
    switch (v.kind) {
      case Value::kUndefined:
        return "Undefined";
      case Value::kNamespace:
        return "'Namespace'";
      case Value::kMacro:
        return "'Macro'";
      case Value::kMethod:
      case Value::kFunction:
        return "'function'";
      case Value::kJson:
        break;
    }
    switch (v.json.type()) {
      case Json::value_t::null:
        return "'NoneType'";
      case Json::value_t::boolean:
        return "'bool'";
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        return "'int'";
      case Json::value_t::number_float:
        return "'float'";
      case Json::value_t::string:
        return "'str'";
      case Json::value_t::array:
        return "'list'";
      case Json::value_t::object:
        return "'dict'";
      default:
        return "'bytes'";
    }
  }

  std::string Str(const Value& v, int line) {
    if (v.lazy != Value::kList) {
      Fail(line, std::string("unsupported: printing a ") +
                     (v.lazy == Value::kGenerator ? "generator" : "dict view") +
                     " (Python prints an object, not its items); add |list");
    }
    switch (v.kind) {
      case Value::kUndefined:
        return "";
      case Value::kJson:
        if (v.json.is_string()) return v.json.get<std::string>();
        return PyRepr(v.json);
      default:
        Fail(line, "unsupported: printing a " + TypeName(v) + " value");
    }
  }

  Json ToJson(const Value& v, int line) {
    if (v.lazy != Value::kList) Fail(line, "unsupported: a generator or dict view inside a value");
    if (v.kind == Value::kJson) return v.json;
    if (v.kind == Value::kUndefined) {
      Fail(line, "unsupported: an undefined value ('" + v.name + "') inside a list or dict");
    }
    Fail(line, "unsupported: a " + TypeName(v) + " value inside a list or dict");
  }

  const std::string& AsString(const Value& v, int line, const char* what) {
    if (!v.is_string()) Fail(line, std::string(what) + " expects a string, got " + TypeName(v));
    return v.json.get_ref<const std::string&>();
  }

  int64_t AsIntArg(const Value& v, int line, const char* what) {
    if (v.kind != Value::kJson || !IsInt(v.json)) {
      Fail(line, std::string(what) + " expects an integer, got " + TypeName(v));
    }
    return AsInt(v.json);
  }

  void CheckSize(const Json& j, int line) {
    if (j.is_string() && j.get_ref<const std::string&>().size() > kMaxOutputBytes) {
      Fail(line, "string value over 16 MiB");
    }
    if ((j.is_array() || j.is_object()) && CountNodes(j, kMaxElements) > kMaxElements) {
      Fail(line, "value with more than 1048576 elements");
    }
  }

  [[noreturn]] void UndefinedError(const Value& v, int line) {
    Fail(line, "'" + v.name + "' is undefined");
  }

  // Every value an expression produces is charged to the render's work budget (string bytes,
  // list and dict entries), so loops over large values end with an error instead of running for
  // hours within the other limits.
  Value Eval(const Expr& e, Scope* scope) {
    DepthGuard guard(&render_depth_, e.line);
    Value v = EvalUncharged(e, scope);
    if (v.kind == Value::kJson) {
      work_ += v.json.is_string() ? v.json.get_ref<const std::string&>().size() : 1;
      if (v.json.is_array() || v.json.is_object()) work_ += v.json.size();
      if (work_ > kMaxWork) Fail(e.line, "template does too much work (over 256M value bytes)");
    }
    return v;
  }

  // The value of `e` without copying it when `e` names a variable (templates read `messages` in
  // every iteration); otherwise evaluates into *storage.
  const Value& EvalView(const Expr& e, Scope* scope, Value* storage) {
    if (e.kind == Expr::kName) {
      const Value* v = scope->Find(e.name);
      if (v != nullptr) return *v;
    }
    *storage = Eval(e, scope);
    return *storage;
  }

  Value EvalUncharged(const Expr& e, Scope* scope) {
    switch (e.kind) {
      case Expr::kLiteral:
        return Value::Of(e.literal);
      case Expr::kName: {
        const Value* v = scope->Find(e.name);
        if (v == nullptr) return Value::Undefined(e.name);
        return *v;
      }
      case Expr::kAttr: {
        Value storage;
        return GetAttr(EvalView(*e.args[0], scope, &storage), e.name, e.line);
      }
      case Expr::kItem: {
        Value storage;
        const Value& obj = EvalView(*e.args[0], scope, &storage);
        return GetItem(obj, Eval(*e.args[1], scope), e.line);
      }
      case Expr::kSlice:
        return Slice(e, scope);
      case Expr::kList: {
        Json list = Json::array();
        for (const ExprPtr& a : e.args) list.push_back(ToJson(Eval(*a, scope), e.line));
        CheckSize(list, e.line);
        return Value::Of(std::move(list));
      }
      case Expr::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = Eval(*e.args[i], scope);
          if (!k.is_string()) Fail(e.line, "unsupported: dict keys other than strings");
          dict[k.json.get<std::string>()] = ToJson(Eval(*e.args[i + 1], scope), e.line);
        }
        CheckSize(dict, e.line);
        return Value::Of(std::move(dict));
      }
      case Expr::kNeg:
      case Expr::kPos: {
        const Value v = Eval(*e.args[0], scope);
        if (v.kind == Value::kUndefined) UndefinedError(v, e.line);
        if (v.kind != Value::kJson || !IsNumber(v.json)) {
          Fail(e.line, "bad operand type for unary " +
                           std::string(e.kind == Expr::kNeg ? "-" : "+") + ": " + TypeName(v));
        }
        if (e.kind == Expr::kPos) return Value::Of(IsInt(v.json) ? Json(AsInt(v.json)) : v.json);
        if (IsInt(v.json)) {
          const int64_t i = AsInt(v.json);
          if (i == INT64_MIN) Fail(e.line, "integer overflow");
          return Value::Of(-i);
        }
        return Value::Of(-v.json.get<double>());
      }
      case Expr::kBinary:
        return Arith(e.name, Eval(*e.args[0], scope), Eval(*e.args[1], scope), e.line);
      case Expr::kConcat: {
        std::string s = Str(Eval(*e.args[0], scope), e.line) + Str(Eval(*e.args[1], scope), e.line);
        if (s.size() > kMaxOutputBytes) Fail(e.line, "string value over 16 MiB");
        return Value::Of(std::move(s));
      }
      case Expr::kCompare: {
        Value left = Eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.args[i + 1], scope);
          if (!Compare(e.ops[i], left, right, e.line)) return Value::Of(false);
          left = std::move(right);
        }
        return Value::Of(true);
      }
      case Expr::kAnd: {
        Value a = Eval(*e.args[0], scope);
        return Truthy(a) ? Eval(*e.args[1], scope) : a;
      }
      case Expr::kOr: {
        Value a = Eval(*e.args[0], scope);
        return Truthy(a) ? a : Eval(*e.args[1], scope);
      }
      case Expr::kNot:
        return Value::Of(!Truthy(Eval(*e.args[0], scope)));
      case Expr::kCond:
        if (Truthy(Eval(*e.args[1], scope))) return Eval(*e.args[0], scope);
        if (e.args[2]) return Eval(*e.args[2], scope);
        return Value::Undefined("the else branch of a conditional expression");
      case Expr::kFilter: {
        Value storage;
        const Value& subject = EvalView(*e.args[0], scope, &storage);
        return Filter(e.name, subject, EvalArgs(e, scope), e.line, scope);
      }
      case Expr::kTest: {
        Value storage;
        const Value& subject = EvalView(*e.args[0], scope, &storage);
        const bool r = Test(e.name, subject, EvalArgs(e, scope), e.line);
        return Value::Of(e.negated ? !r : r);
      }
      case Expr::kCall: {
        Value callee = Eval(*e.args[0], scope);
        return Call(callee, EvalArgs(e, scope), e.line);
      }
    }
    Fail(e.line, "unknown expression");
  }

  Args EvalArgs(const Expr& e, Scope* scope) {
    Args a;
    for (size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(Eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, Eval(*v, scope));
    return a;
  }

  static bool IsStringMethod(const std::string& n) {
    static const char* kNames[] = {"strip",      "lstrip",  "rstrip",  "split",   "startswith",
                                   "endswith",   "replace", "upper",   "lower",   "title",
                                   "capitalize", "find",    "rfind",   "count",   "join",
                                   "rsplit",     "isdigit", "isalpha", "isspace", "islower",
                                   "isupper",    "format"};
    for (const char* k : kNames) {
      if (n == k) return true;
    }
    return false;
  }

  Value Method(const Json& receiver, const std::string& name) {
    Value m;
    m.kind = Value::kMethod;
    m.json = receiver;
    m.name = name;
    return m;
  }

  // jinja2's getattr: attribute (a method) first, then item.
  Value GetAttr(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Value::kUndefined) {
      Fail(line, "'" + obj.name + "' is undefined (reading its attribute '" + name + "')");
    }
    if (obj.kind == Value::kNamespace) {
      auto it = obj.ns->find(name);
      return it == obj.ns->end() ? Value::Undefined(name) : it->second;
    }
    if (obj.kind != Value::kJson) return Value::Undefined(name);
    const Json& j = obj.json;
    if (j.is_object()) {
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        return Method(j, name);
      }
      auto it = j.find(name);
      if (it != j.end()) return Value::Of(*it);
      return Value::Undefined(name);
    }
    if (j.is_string() && IsStringMethod(name)) return Method(j, name);
    return Value::Undefined(name);
  }

  Value GetItem(const Value& obj, const Value& key, int line) {
    if (obj.kind == Value::kUndefined) {
      Fail(line, "'" + obj.name + "' is undefined (reading an item of it)");
    }
    if (obj.lazy != Value::kList) return Value::Undefined("item of a generator or dict view");
    if (obj.kind == Value::kNamespace && key.is_string()) {
      return GetAttr(obj, key.json.get<std::string>(), line);
    }
    if (obj.kind != Value::kJson || key.kind != Value::kJson) return Value::Undefined("item");
    const Json& j = obj.json;
    if (j.is_object()) {
      if (!key.json.is_string()) return Value::Undefined("item");
      auto it = j.find(key.json.get<std::string>());
      if (it != j.end()) return Value::Of(*it);
      return GetAttr(obj, key.json.get<std::string>(), line);
    }
    if ((j.is_array() || j.is_string()) && IsInt(key.json)) {
      int64_t i = AsInt(key.json);
      if (j.is_array()) {
        const int64_t n = static_cast<int64_t>(j.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::Undefined("index " + std::to_string(AsInt(key.json)));
        return Value::Of(j[static_cast<size_t>(i)]);
      }
      const std::vector<std::string> cps = CodePoints(j.get<std::string>());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("index " + std::to_string(AsInt(key.json)));
      return Value::Of(cps[static_cast<size_t>(i)]);
    }
    if (key.is_string()) return GetAttr(obj, key.json.get<std::string>(), line);
    return Value::Undefined("item");
  }

  Value Slice(const Expr& e, Scope* scope) {
    Value storage;
    const Value& obj = EvalView(*e.args[0], scope, &storage);
    if (obj.kind == Value::kUndefined) UndefinedError(obj, e.line);
    if (obj.lazy != Value::kList) return Value::Undefined("slice of a generator or dict view");
    int64_t bounds[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      const Value v = Eval(*e.args[k + 1], scope);
      if (v.kind == Value::kJson && v.json.is_null()) continue;
      bounds[k] = AsIntArg(v, e.line, "a slice bound");
      given[k] = true;
    }
    const int64_t step = bounds[2];
    if (step == 0) Fail(e.line, "slice step cannot be zero");
    if (obj.kind != Value::kJson || !(obj.json.is_array() || obj.json.is_string())) {
      Fail(e.line, TypeName(obj) + " object is not subscriptable with a slice");
    }
    std::vector<std::string> cps;
    const bool is_string = obj.json.is_string();
    if (is_string) cps = CodePoints(obj.json.get<std::string>());
    const int64_t n = static_cast<int64_t>(is_string ? cps.size() : obj.json.size());
    // Python's PySlice_AdjustIndices.
    auto adjust = [&](int64_t v, bool has, int64_t def_pos, int64_t def_neg) {
      if (!has) return step > 0 ? def_pos : def_neg;
      if (v < 0) {
        v += n;
        if (v < 0) v = step < 0 ? -1 : 0;
      } else if (v >= n) {
        v = step < 0 ? n - 1 : n;
      }
      return v;
    };
    const int64_t start = adjust(bounds[0], given[0], 0, n - 1);
    const int64_t stop = adjust(bounds[1], given[1], n, -1);
    Json out = is_string ? Json("") : Json::array();
    std::string text;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (is_string) {
        text += cps[static_cast<size_t>(i)];
      } else {
        out.push_back(obj.json[static_cast<size_t>(i)]);
      }
    }
    if (is_string) out = text;
    return Value::Of(std::move(out));
  }

  bool Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return ValueEqual(a, b);
    if (op == "!=") return !ValueEqual(a, b);
    if (op == "in" || op == "not in") {
      const bool r = Contains(b, a, line);
      return op == "in" ? r : !r;
    }
    if (a.kind != Value::kJson || b.kind != Value::kJson) {
      if (a.kind == Value::kUndefined) UndefinedError(a, line);
      if (b.kind == Value::kUndefined) UndefinedError(b, line);
      Fail(line, "'" + op + "' not supported between " + TypeName(a) + " and " + TypeName(b));
    }
    if (a.lazy != Value::kList || b.lazy != Value::kList) {
      Fail(line, "'" + op + "' not supported for generators or dict views");
    }
    const int c = Order(a.json, b.json, op, line);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  int Order(const Json& a, const Json& b, const std::string& op, int line) {
    if (IsNumber(a) && IsNumber(b)) {
      if (IsInt(a) && IsInt(b)) return AsInt(a) < AsInt(b) ? -1 : AsInt(a) > AsInt(b);
      const double x = AsDouble(a), y = AsDouble(b);
      return x < y ? -1 : x > y;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
      return c < 0 ? -1 : c > 0;
    }
    if (a.is_array() && b.is_array()) {
      for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (!JsonEqual(a[i], b[i])) return Order(a[i], b[i], op, line);
      }
      return a.size() < b.size() ? -1 : a.size() > b.size();
    }
    Fail(line, "'" + op + "' not supported between " + TypeName(Value::Of(a)) + " and " +
                   TypeName(Value::Of(b)));
  }

  bool Contains(const Value& container, const Value& item, int line) {
    if (container.kind == Value::kUndefined) return false;
    if (container.kind != Value::kJson) Fail(line, "'in' needs a string, list or dict");
    const Json& c = container.json;
    if (c.is_string()) {
      if (!item.is_string()) {
        Fail(line, "'in <string>' requires string as left operand, not " + TypeName(item));
      }
      return c.get_ref<const std::string&>().find(item.json.get_ref<const std::string&>()) !=
             std::string::npos;
    }
    if (c.is_array()) {
      for (const Json& j : c) {
        if (ValueEqual(Value::Of(j), item)) return true;
      }
      return false;
    }
    if (c.is_object()) return item.is_string() && c.contains(item.json.get<std::string>());
    Fail(line, "argument of type " + TypeName(container) + " is not iterable");
  }

  Value Arith(const std::string& op, const Value& a, const Value& b, int line) {
    if (a.kind == Value::kUndefined) UndefinedError(a, line);
    if (b.kind == Value::kUndefined) UndefinedError(b, line);
    auto unsupported = [&]() {
      Fail(line,
           "unsupported operand types for " + op + ": " + TypeName(a) + " and " + TypeName(b));
    };
    if (a.kind != Value::kJson || b.kind != Value::kJson) unsupported();
    if (a.lazy != Value::kList || b.lazy != Value::kList) unsupported();
    const Json& x = a.json;
    const Json& y = b.json;
    if (op == "+") {
      if (x.is_string() && y.is_string()) {
        if (x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size() >
            kMaxOutputBytes) {
          Fail(line, "string value over 16 MiB");
        }
        return Value::Of(x.get<std::string>() + y.get<std::string>());
      }
      if (x.is_array() && y.is_array()) {
        Json r = x;
        for (const Json& j : y) r.push_back(j);
        CheckSize(r, line);
        return Value::Of(std::move(r));
      }
    }
    if (op == "*" && (((x.is_string() || x.is_array()) && IsInt(y)) ||
                      ((y.is_string() || y.is_array()) && IsInt(x)))) {
      const Json& seq = IsInt(y) ? x : y;
      const int64_t times = std::max<int64_t>(0, AsInt(IsInt(y) ? y : x));
      const size_t unit = seq.is_string() ? seq.get_ref<const std::string&>().size() : seq.size();
      if (unit > 0 && static_cast<uint64_t>(times) > kMaxOutputBytes / unit) {
        Fail(line, "repeated value too large");
      }
      if (seq.is_string()) {
        std::string r;
        for (int64_t i = 0; i < times; ++i) r += seq.get_ref<const std::string&>();
        return Value::Of(std::move(r));
      }
      Json r = Json::array();
      for (int64_t i = 0; i < times; ++i) {
        for (const Json& j : seq) r.push_back(j);
      }
      CheckSize(r, line);
      return Value::Of(std::move(r));
    }
    if (!IsNumber(x) || !IsNumber(y)) {
      if (op == "%" && x.is_string()) Fail(line, "unsupported: '%' string formatting");
      unsupported();
    }
    const bool ints = IsInt(x) && IsInt(y);
    if (op == "/") {
      if (AsDouble(y) == 0) Fail(line, "division by zero");
      return Value::Of(AsDouble(x) / AsDouble(y));
    }
    if (ints) {
      const int64_t i = AsInt(x), j = AsInt(y);
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(i, j, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(i, j, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(i, j, &r);
      } else if (op == "//" || op == "%") {
        if (j == 0) Fail(line, "integer division or modulo by zero");
        if (i == INT64_MIN && j == -1) Fail(line, "integer overflow");
        int64_t q = i / j, m = i % j;
        if (m != 0 && ((m < 0) != (j < 0))) {
          --q;
          m += j;
        }
        r = op == "//" ? q : m;
      } else if (op == "**") {
        if (j < 0) return Value::Of(std::pow(static_cast<double>(i), static_cast<double>(j)));
        r = 1;
        for (int64_t k = 0; k < j && !overflow; ++k) {
          overflow = __builtin_mul_overflow(r, i, &r);
          if (r == 0 || r == 1) break;
        }
        if (i == -1) r = (j % 2) ? -1 : 1;
      }
      if (overflow)
        Fail(line, "integer overflow (Python integers are unbounded; Gyre's are 64-bit)");
      return Value::Of(r);
    }
    const double p = AsDouble(x), q = AsDouble(y);
    if (op == "+") return Value::Of(p + q);
    if (op == "-") return Value::Of(p - q);
    if (op == "*") return Value::Of(p * q);
    if (op == "**") return Value::Of(std::pow(p, q));
    if (q == 0) Fail(line, "float division or modulo by zero");
    const double fl = std::floor(p / q);
    if (op == "//") return Value::Of(fl);
    double m = std::fmod(p, q);
    if (m != 0 && ((m < 0) != (q < 0))) m += q;
    return Value::Of(m);
  }

  Value Call(const Value& callee, const Args& args, int line) {
    switch (callee.kind) {
      case Value::kUndefined:
        Fail(line, "'" + callee.name + "' is undefined (called as a function)");
      case Value::kMethod:
        return CallMethod(callee.json, callee.name, args, line);
      case Value::kFunction:
        return CallGlobal(callee.name, args, line);
      case Value::kMacro:
        return CallMacro(*callee.macro, args, line);
      default:
        Fail(line, TypeName(callee) + " object is not callable");
    }
  }

  Value CallGlobal(const std::string& name, const Args& args, int line) {
    if (name == "raise_exception") {
      const Value* msg = args.Get(0, "message");
      throw JinjaError{"chat template raised an exception: " + (msg ? Str(*msg, line) : ""), true};
    }
    if (name == "strftime_now") {
      const Value* fmt = args.Get(0, "format");
      if (fmt == nullptr) Fail(line, "strftime_now() needs a format");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n =
          std::strftime(buf, sizeof(buf), AsString(*fmt, line, "strftime_now").c_str(), &tm);
      return Value::Of(std::string(buf, n));
    }
    if (name == "namespace" || name == "dict") {
      NamespaceMap map;
      for (const Value& p : args.positional) {
        if (p.kind != Value::kJson || !p.json.is_object()) {
          Fail(line, name + "() takes keyword arguments or a dict");
        }
        for (const auto& [k, v] : p.json.items()) map[k] = Value::Of(v);
      }
      for (const auto& [k, v] : args.keyword) map[k] = v;
      if (name == "dict") {
        Json d = Json::object();
        for (const auto& [k, v] : map) d[k] = ToJson(v, line);
        CheckSize(d, line);
        return Value::Of(std::move(d));
      }
      namespaces_.push_back(std::make_unique<NamespaceMap>(std::move(map)));
      Value ns;
      ns.kind = Value::kNamespace;
      ns.ns = namespaces_.back().get();
      return ns;
    }
    if (name == "range") {
      int64_t start = 0, stop = 0, step = 1;
      const size_t n = args.positional.size();
      if (n == 1) {
        stop = AsIntArg(args.positional[0], line, "range()");
      } else if (n == 2 || n == 3) {
        start = AsIntArg(args.positional[0], line, "range()");
        stop = AsIntArg(args.positional[1], line, "range()");
        if (n == 3) step = AsIntArg(args.positional[2], line, "range()");
      } else {
        Fail(line, "range() takes 1 to 3 integers");
      }
      if (step == 0) Fail(line, "range() step must not be zero");
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= kMaxElements) Fail(line, "range() over 1048576 elements");
        out.push_back(i);
        if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
      }
      return Value::Of(std::move(out));
    }
    Fail(line, "unknown function '" + name + "'");
  }

  Value CallMacro(const Node& macro, const Args& args, int line) {
    if (++call_depth_ > kMaxCallDepth) Fail(line, "macro calls nested more than 64 deep");
    if (args.positional.size() > macro.params.size()) {
      Fail(line, "macro '" + macro.name + "' takes " + std::to_string(macro.params.size()) +
                     " arguments");
    }
    Scope scope{{}, &globals_};
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [pname, def] = macro.params[i];
      const Value* given = args.Get(i, pname.c_str());
      if (given != nullptr) {
        scope.vars[pname] = *given;
      } else if (def) {
        scope.vars[pname] = Eval(*def, &scope);
      } else {
        scope.vars[pname] = Value::Undefined(pname);
      }
    }
    for (const auto& [k, v] : args.keyword) {
      bool known = false;
      for (const auto& p : macro.params) known = known || p.first == k;
      if (!known) Fail(line, "macro '" + macro.name + "' has no parameter '" + k + "'");
    }
    std::string out;
    RenderBody(macro.body, &scope, &out);
    --call_depth_;
    return Value::Of(std::move(out));
  }

  Value CallMethod(const Json& self, const std::string& name, const Args& args, int line) {
    if (self.is_object()) {
      if (name == "items") {
        Json out = Json::array();
        for (const auto& [k, v] : self.items()) out.push_back(Json::array({k, v}));
        CheckSize(out, line);
        return Value::Lazily(std::move(out), Value::kView);
      }
      if (name == "keys" || name == "values") {
        Json out = Json::array();
        for (const auto& [k, v] : self.items()) out.push_back(name == "keys" ? Json(k) : v);
        return Value::Lazily(std::move(out), Value::kView);
      }
      // get
      const Value* key = args.Get(0, "key");
      if (key == nullptr) Fail(line, "get() needs a key");
      if (key->is_string()) {
        auto it = self.find(key->json.get<std::string>());
        if (it != self.end()) return Value::Of(*it);
      }
      const Value* def = args.Get(1, "default");
      return def ? *def : Value::Of(nullptr);
    }
    const std::string& s = self.get_ref<const std::string&>();
    const Value* a0 = args.Get(0, "");
    const Value* a1 = args.Get(1, "");
    auto opt_string = [&](const Value* v, const char* what) -> const std::string* {
      if (v == nullptr || (v->kind == Value::kJson && v->json.is_null())) return nullptr;
      return &AsString(*v, line, what);
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return Value::Of(
          PyStrip(s, opt_string(a0, name.c_str()), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      const Value* sep = args.Get(0, "sep");
      const Value* maxv = args.Get(1, "maxsplit");
      const int64_t maxsplit = maxv ? AsIntArg(*maxv, line, "split()") : -1;
      if (name == "rsplit" && maxsplit >= 0) Fail(line, "unsupported: rsplit with maxsplit");
      std::vector<std::string> parts;
      try {
        parts = PySplit(s, opt_string(sep, "split()"), maxsplit);
      } catch (const JinjaError&) {
        Fail(line, "split(): empty separator");
      }
      Json out = Json::array();
      for (std::string& p : parts) out.push_back(std::move(p));
      return Value::Of(std::move(out));
    }
    if (name == "startswith" || name == "endswith") {
      if (a0 == nullptr) Fail(line, name + "() needs an argument");
      std::vector<std::string> options;
      if (a0->kind == Value::kJson && a0->json.is_array()) {
        for (const Json& j : a0->json) {
          if (!j.is_string()) Fail(line, name + "() takes strings");
          options.push_back(j.get<std::string>());
        }
      } else {
        options.push_back(AsString(*a0, line, name.c_str()));
      }
      if (args.positional.size() > 1) Fail(line, "unsupported: " + name + "() with start/end");
      for (const std::string& o : options) {
        if (name == "startswith"
                ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0) {
          return Value::Of(true);
        }
      }
      return Value::Of(false);
    }
    if (name == "replace") {
      if (a0 == nullptr || a1 == nullptr) Fail(line, "replace() needs two arguments");
      const Value* count = args.Get(2, "count");
      return Value::Of(PyReplace(s, AsString(*a0, line, "replace()"),
                                 AsString(*a1, line, "replace()"),
                                 count ? AsIntArg(*count, line, "replace()") : -1));
    }
    if (name == "upper") return Value::Of(AsciiUpper(s));
    if (name == "lower") return Value::Of(AsciiLower(s));
    if (name == "title") return Value::Of(AsciiTitle(s));
    if (name == "capitalize") return Value::Of(AsciiCapitalize(s));
    if (name == "find" || name == "rfind" || name == "count") {
      if (a0 == nullptr) Fail(line, name + "() needs an argument");
      if (args.positional.size() > 1) Fail(line, "unsupported: " + name + "() with start/end");
      const std::string& sub = AsString(*a0, line, name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::Of(static_cast<int64_t>(CodePointCount(s) + 1));
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::Of(n);
      }
      const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) return Value::Of(-1);
      return Value::Of(static_cast<int64_t>(CodePointCount(s.substr(0, p))));
    }
    if (name == "join") {
      if (a0 == nullptr) Fail(line, "join() needs an argument");
      std::string out;
      bool first = true;
      for (const Value& v : Iterate(*a0, line)) {
        if (!first) out += s;
        out += AsString(v, line, "str.join()");
        first = false;
        if (out.size() > kMaxOutputBytes) Fail(line, "string value over 16 MiB");
      }
      return Value::Of(std::move(out));
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "islower" ||
        name == "isupper") {
      bool any_cased = false, ok = !s.empty();
      for (const std::string& cp : CodePoints(s)) {
        const char32_t c = Decode(cp);
        if (c >= 0x80 && name != "isspace")
          Fail(line, "unsupported: " + name + "() on non-ASCII text");
        if (name == "isdigit") ok = ok && c >= '0' && c <= '9';
        if (name == "isalpha") ok = ok && IsAsciiAlpha(static_cast<char>(c));
        if (name == "isspace") ok = ok && IsPySpace(c);
        if (name == "islower") {
          ok = ok && !(c >= 'A' && c <= 'Z');
          any_cased = any_cased || (c >= 'a' && c <= 'z');
        }
        if (name == "isupper") {
          ok = ok && !(c >= 'a' && c <= 'z');
          any_cased = any_cased || (c >= 'A' && c <= 'Z');
        }
      }
      if (name == "islower" || name == "isupper") ok = ok && any_cased;
      return Value::Of(ok);
    }
    Fail(line, "unsupported string method '" + name + "'");
  }

  // ---- tests

  bool Test(const std::string& name, const Value& v, const Args& args, int line) {
    const bool is_json = v.kind == Value::kJson;
    const Json& j = v.json;
    static const char* kNoArgs[] = {"defined",  "undefined", "none",   "string",   "mapping",
                                    "iterable", "sequence",  "number", "integer",  "float",
                                    "boolean",  "true",      "false",  "callable", "odd",
                                    "even",     "lower",     "upper"};
    for (const char* k : kNoArgs) {
      if (name == k && (!args.positional.empty() || !args.keyword.empty())) {
        Fail(line, "test '" + name + "' takes no arguments");
      }
    }
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return is_json && j.is_null();
    if (name == "string") return is_json && j.is_string();
    if (name == "mapping") return (is_json && j.is_object()) || v.kind == Value::kNamespace;
    if (name == "iterable") {
      return v.kind == Value::kUndefined ||
             (is_json && (j.is_array() || j.is_object() || j.is_string()));
    }
    if (name == "sequence") {
      return is_json && v.lazy == Value::kList && (j.is_array() || j.is_object() || j.is_string());
    }
    if (name == "number") return is_json && IsNumber(j);
    if (name == "integer") return is_json && j.is_number_integer();
    if (name == "float") return is_json && j.is_number_float();
    if (name == "boolean") return is_json && j.is_boolean();
    if (name == "true") return is_json && j.is_boolean() && j.get<bool>();
    if (name == "false") return is_json && j.is_boolean() && !j.get<bool>();
    if (name == "callable") {
      return v.kind == Value::kMacro || v.kind == Value::kMethod || v.kind == Value::kFunction;
    }
    if (name == "odd" || name == "even") {
      const int64_t i = AsIntArg(v, line, "the odd/even test");
      return name == "odd" ? (i % 2 != 0) : (i % 2 == 0);
    }
    if (name == "divisibleby") {
      const Value* d = args.Get(0, "num");
      if (d == nullptr) Fail(line, "divisibleby needs a number");
      const int64_t n = AsIntArg(*d, line, "divisibleby");
      if (n == 0) Fail(line, "divisibleby 0");
      return AsIntArg(v, line, "divisibleby") % n == 0;
    }
    if (name == "lower" || name == "upper") {
      const std::string& s = Str(v, line);
      return name == "lower" ? AsciiLower(s) == s : AsciiUpper(s) == s;
    }
    static const std::map<std::string, std::string> kCompareTests = {
        {"eq", "=="}, {"equalto", "=="}, {"==", "=="},        {"ne", "!="}, {"!=", "!="},
        {"lt", "<"},  {"lessthan", "<"}, {"le", "<="},        {"gt", ">"},  {"greaterthan", ">"},
        {"ge", ">="}, {"in", "in"},      {"sameas", "sameas"}};
    auto it = kCompareTests.find(name);
    if (it != kCompareTests.end()) {
      const Value* other = args.Get(0, "other");
      if (other == nullptr) Fail(line, "test '" + name + "' needs an argument");
      if (it->second == "sameas") {
        // Python `is`: identity holds for None/True/False, which is what templates compare.
        return v.kind == Value::kJson && other->kind == Value::kJson &&
               ((j.is_null() && other->json.is_null()) ||
                (j.is_boolean() && other->json.is_boolean() && j == other->json));
      }
      if (it->second == "in") return Contains(*other, v, line);
      return Compare(it->second, v, *other, line);
    }
    Fail(line, "unsupported test '" + name + "'");
  }

  // ---- filters

  // The keyword parameters of each filter with fixed parameters, in positional order (jinja2's
  // signatures); passing another keyword or too many positional arguments fails as in Python.
  static void CheckFilterArgs(const std::string& name, const Args& args, int line) {
    static const std::map<std::string, std::vector<std::string>> kParams = {
        {"safe", {}},
        {"default", {"default_value", "boolean"}},
        {"d", {"default_value", "boolean"}},
        {"length", {}},
        {"count", {}},
        {"tojson", {"indent", "ensure_ascii", "separators", "sort_keys"}},
        {"string", {}},
        {"trim", {"chars"}},
        {"lower", {}},
        {"upper", {}},
        {"capitalize", {}},
        {"title", {}},
        {"replace", {"old", "new", "count"}},
        {"e", {}},
        {"escape", {}},
        {"first", {}},
        {"last", {}},
        {"list", {}},
        {"reverse", {}},
        {"join", {"d", "attribute"}},
        {"items", {}},
        {"int", {"default", "base"}},
        {"float", {"default"}},
        {"abs", {}},
    };
    auto it = kParams.find(name);
    if (it == kParams.end()) {
      if (name == "map") {
        for (const auto& kv : args.keyword) {
          if (kv.first != "attribute" && kv.first != "default") {
            Fail(line, "filter 'map' got an unexpected keyword argument '" + kv.first + "'");
          }
        }
      } else if (!args.keyword.empty()) {
        Fail(line, "filter '" + name + "' takes no keyword arguments");
      }
      return;
    }
    const std::vector<std::string>& params = it->second;
    if (args.positional.size() > params.size()) {
      Fail(line,
           "filter '" + name + "' takes at most " + std::to_string(params.size()) + " arguments");
    }
    for (const auto& kv : args.keyword) {
      auto p = std::find(params.begin(), params.end(), kv.first);
      if (p == params.end()) {
        Fail(line, "filter '" + name + "' got an unexpected keyword argument '" + kv.first + "'");
      }
      if (static_cast<size_t>(p - params.begin()) < args.positional.size()) {
        Fail(line, "filter '" + name + "' got multiple values for '" + kv.first + "'");
      }
    }
  }

  Value Filter(const std::string& name, const Value& v, const Args& args, int line, Scope* scope) {
    CheckFilterArgs(name, args, line);
    if (name == "safe") return v;
    if (name == "default" || name == "d") {
      const Value* def = args.Get(0, "default_value");
      const Value* boolean = args.Get(1, "boolean");
      const bool use_default = !v.defined() || (boolean && Truthy(*boolean) && !Truthy(v));
      if (use_default) return def ? *def : Value::Of("");
      return v;
    }
    if (name == "length" || name == "count") {
      if (v.kind == Value::kUndefined) return Value::Of(0);
      if (v.lazy == Value::kGenerator) Fail(line, "object of type 'generator' has no len()");
      if (v.kind == Value::kNamespace) Fail(line, "object of type 'Namespace' has no len()");
      if (v.kind == Value::kJson && v.json.is_string()) {
        return Value::Of(static_cast<int64_t>(CodePointCount(v.json.get<std::string>())));
      }
      if (v.kind == Value::kJson && (v.json.is_array() || v.json.is_object())) {
        return Value::Of(static_cast<int64_t>(v.json.size()));
      }
      Fail(line, "object of type " + TypeName(v) + " has no len()");
    }
    if (name == "tojson") {
      if (v.lazy != Value::kList) Fail(line, "Object of type generator is not JSON serializable");
      return Value::Of(ToJsonText(v, args, line));
    }
    if (name == "string") return Value::Of(Str(v, line));
    if (name == "trim") {
      const Value* chars = args.Get(0, "chars");
      const std::string s = Str(v, line);
      if (chars && !(chars->kind == Value::kJson && chars->json.is_null())) {
        return Value::Of(PyStrip(s, &AsString(*chars, line, "trim"), true, true));
      }
      return Value::Of(PyStrip(s, nullptr, true, true));
    }
    if (name == "lower") return Value::Of(AsciiLower(Str(v, line)));
    if (name == "upper") return Value::Of(AsciiUpper(Str(v, line)));
    if (name == "capitalize") return Value::Of(AsciiCapitalize(Str(v, line)));
    if (name == "title") return Value::Of(JinjaTitle(Str(v, line)));
    if (name == "replace") {
      const Value* old = args.Get(0, "old");
      const Value* rep = args.Get(1, "new");
      const Value* count = args.Get(2, "count");
      if (old == nullptr || rep == nullptr) Fail(line, "replace needs two arguments");
      return Value::Of(PyReplace(Str(v, line), Str(*old, line), Str(*rep, line),
                                 count ? AsIntArg(*count, line, "replace") : -1));
    }
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : Str(v, line)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out.push_back(c);
        }
      }
      return Value::Of(std::move(out));
    }
    if (name == "first" || name == "last") {
      if (name == "last" && v.lazy == Value::kGenerator) {
        Fail(line, "'generator' object is not reversible");
      }
      std::vector<Value> items = Iterate(v, line);
      if (items.empty()) return Value::Undefined(name + " of an empty sequence");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      Json out = Json::array();
      for (const Value& item : Iterate(v, line)) out.push_back(ToJson(item, line));
      return Value::Of(std::move(out));
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::vector<std::string> cps = CodePoints(v.json.get<std::string>());
        std::string out;
        for (size_t i = cps.size(); i-- > 0;) out += cps[i];
        return Value::Of(std::move(out));
      }
      std::vector<Value> items = Iterate(v, line);
      Json out = Json::array();
      for (size_t i = items.size(); i-- > 0;) out.push_back(ToJson(items[i], line));
      return Value::Lazily(std::move(out), Value::kGenerator);
    }
    if (name == "join") {
      const Value* sep = args.Get(0, "d");
      const Value* attribute = args.Get(1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& item : Iterate(v, line)) {
        if (!first) out += sep ? Str(*sep, line) : "";
        out += Str(attribute ? Attribute(item, *attribute, line) : item, line);
        first = false;
        if (out.size() > kMaxOutputBytes) Fail(line, "string value over 16 MiB");
      }
      return Value::Of(std::move(out));
    }
    if (name == "items") {
      if (v.kind == Value::kUndefined) return Value::Of(Json::array());
      if (!(v.kind == Value::kJson && v.json.is_object())) {
        Fail(line, "items filter expects a mapping, got " + TypeName(v));
      }
      Value items = CallMethod(v.json, "items", Args{}, line);
      items.lazy = Value::kGenerator;
      return items;
    }
    if (name == "int") {
      const Value* def = args.Get(0, "default");
      const Value* base = args.Get(1, "base");
      if (base != nullptr &&
          !(base->kind == Value::kJson && IsInt(base->json) && AsInt(base->json) == 10)) {
        Fail(line, "unsupported: int filter with a base other than 10");
      }
      const Value fallback = def ? *def : Value::Of(0);
      if (v.kind != Value::kJson) return fallback;
      if (IsInt(v.json)) return Value::Of(AsInt(v.json));
      if (v.json.is_number_float()) {
        const double d = v.json.get<double>();
        if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
        return Value::Of(static_cast<int64_t>(d));
      }
      if (v.json.is_string()) {
        const std::string s = PyStrip(v.json.get<std::string>(), nullptr, true, true);
        char* end = nullptr;
        errno = 0;
        const long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end == s.c_str() + s.size() && errno == 0)
          return Value::Of(static_cast<int64_t>(i));
        errno = 0;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && errno == 0 && std::isfinite(d) &&
            std::fabs(d) < 9.2e18) {
          return Value::Of(static_cast<int64_t>(d));
        }
      }
      return fallback;
    }
    if (name == "float") {
      const Value* def = args.Get(0, "default");
      const Value fallback = def ? *def : Value::Of(0.0);
      if (v.kind != Value::kJson) return fallback;
      if (IsNumber(v.json)) return Value::Of(AsDouble(v.json));
      if (v.json.is_string()) {
        const std::string s = PyStrip(v.json.get<std::string>(), nullptr, true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value::Of(d);
      }
      return fallback;
    }
    if (name == "abs") {
      if (v.kind != Value::kJson || !IsNumber(v.json)) Fail(line, "abs expects a number");
      if (IsInt(v.json)) {
        const int64_t i = AsInt(v.json);
        if (i == INT64_MIN) Fail(line, "integer overflow");
        return Value::Of(i < 0 ? -i : i);
      }
      return Value::Of(std::fabs(v.json.get<double>()));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep = name == "selectattr" || name == "select";
      size_t next = 0;
      const Value* attribute = nullptr;
      if (by_attr) {
        attribute = args.Get(next++, "");
        if (attribute == nullptr) Fail(line, name + " needs an attribute name");
      }
      const Value* test = args.Get(next++, "");
      Args test_args;
      for (size_t i = next; i < args.positional.size(); ++i) {
        test_args.positional.push_back(args.positional[i]);
      }
      Json out = Json::array();
      for (const Value& item : Iterate(v, line)) {
        const Value subject = by_attr ? Attribute(item, *attribute, line) : item;
        const bool r = test ? Test(AsString(*test, line, name.c_str()), subject, test_args, line)
                            : Truthy(subject);
        if (r == keep) out.push_back(ToJson(item, line));
      }
      return Value::Lazily(std::move(out), Value::kGenerator);
    }
    if (name == "map") {
      const Value* attribute = nullptr;
      for (const auto& [k, val] : args.keyword) {
        if (k == "attribute") attribute = &val;
      }
      const Value* def = nullptr;
      for (const auto& [k, val] : args.keyword) {
        if (k == "default") def = &val;
      }
      Json out = Json::array();
      for (const Value& item : Iterate(v, line)) {
        Value r;
        if (attribute != nullptr) {
          r = Attribute(item, *attribute, line);
          if (!r.defined() && def != nullptr) r = *def;
        } else {
          if (args.positional.empty()) Fail(line, "map needs a filter name or attribute=");
          Args rest;
          for (size_t i = 1; i < args.positional.size(); ++i)
            rest.positional.push_back(args.positional[i]);
          r = Filter(AsString(args.positional[0], line, "map"), item, rest, line, scope);
        }
        out.push_back(ToJson(r, line));
      }
      return Value::Lazily(std::move(out), Value::kGenerator);
    }
    Fail(line, "unsupported filter '" + name + "'");
  }

  // jinja2's attribute lookup for filters: dotted path, integers index lists.
  Value Attribute(const Value& item, const Value& attribute, int line) {
    if (attribute.kind == Value::kJson && IsInt(attribute.json))
      return GetItem(item, attribute, line);
    Value cur = item;
    const std::string& path = AsString(attribute, line, "attribute");
    size_t start = 0;
    while (true) {
      const size_t dot = path.find('.', start);
      const std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (cur.kind == Value::kUndefined) return cur;
      cur = GetItem(cur, Value::Of(part), line);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return cur;
  }

  std::string ToJsonText(const Value& v, const Args& args, int line) {
    if (v.kind != Value::kJson) {
      Fail(line, "Object of type " + TypeName(v) + " is not JSON serializable");
    }
    DumpStyle style;
    const Value* indent = args.Get(0, "indent");
    if (indent != nullptr && !(indent->kind == Value::kJson && indent->json.is_null())) {
      style.has_indent = true;
      style.item_sep = ",";
      if (indent->is_string()) {
        style.indent = indent->json.get<std::string>();
      } else {
        const int64_t n = AsIntArg(*indent, line, "tojson indent");
        style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 64)), ' ');
      }
    }
    for (const auto& [k, val] : args.keyword) {
      if (k == "separators" && !(val.kind == Value::kJson && val.json.is_null())) {
        if (!(val.kind == Value::kJson && val.json.is_array() && val.json.size() == 2 &&
              val.json[0].is_string() && val.json[1].is_string())) {
          Fail(line, "tojson separators must be a pair of strings");
        }
        style.item_sep = val.json[0].get<std::string>();
        style.key_sep = val.json[1].get<std::string>();
      } else if (k == "sort_keys") {
        style.sort_keys = Truthy(val);
      } else if (k == "ensure_ascii") {
        if (Truthy(val)) Fail(line, "unsupported: tojson(ensure_ascii=True)");
      } else if (k != "indent") {
        Fail(line, "tojson has no argument '" + k + "'");
      }
    }
    std::string out;
    PyJsonDump(v.json, style, 0, &out);
    return out;
  }

  const Body* root_;
  Scope globals_;
  std::vector<std::unique_ptr<NamespaceMap>> namespaces_;
  int64_t iterations_ = 0;
  uint64_t work_ = 0;
  int call_depth_ = 0;
  int render_depth_ = 0;
};

}  // namespace

struct ChatTemplate::Impl {
  std::string source;
  Body body;
};

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string source) {
  auto impl = std::make_shared<Impl>();
  try {
    Lexer lexer(source);
    Parser parser(lexer.Run());
    impl->body = parser.ParseTemplate();
  } catch (const JinjaError& e) {
    return InvalidArgument(e.message);
  }
  impl->source = std::move(source);
  return ChatTemplate(std::move(impl));
}

const std::string& ChatTemplate::source() const { return impl_->source; }

StatusOr<std::string> ChatTemplate::Render(const std::string& context_json) const {
  Json context = Json::parse(context_json, nullptr, /*allow_exceptions=*/false);
  if (context.is_discarded() || !context.is_object()) {
    return InvalidArgument("chat template context: expected a JSON object");
  }
  try {
    Renderer renderer(&impl_->body);
    return renderer.Run(context);
  } catch (const JinjaError& e) {
    return InvalidArgument(e.message);
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("chat template: ") + e.what());
  }
}

StatusOr<std::string> MakeChatTemplateContext(const std::string& messages_json,
                                              const std::string& tools_json,
                                              bool add_generation_prompt,
                                              const std::string& kwargs_json) {
  Json context = Json::object();
  Json messages = Json::parse(messages_json, nullptr, false);
  if (messages.is_discarded() || !messages.is_array()) {
    return InvalidArgument("chat template context: messages must be a JSON array");
  }
  // transformers drops the keys whose value is None from each message before rendering.
  for (Json& m : messages) {
    if (!m.is_object()) continue;
    Json kept = Json::object();
    for (auto& [k, v] : m.items()) {
      if (!v.is_null()) kept[k] = v;
    }
    m = std::move(kept);
  }
  context["messages"] = std::move(messages);
  if (tools_json.empty()) {
    context["tools"] = nullptr;
  } else {
    Json tools = Json::parse(tools_json, nullptr, false);
    if (tools.is_discarded() || !(tools.is_array() || tools.is_null())) {
      return InvalidArgument("chat template context: tools must be a JSON array");
    }
    context["tools"] = std::move(tools);
  }
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (!kwargs_json.empty()) {
    Json kwargs = Json::parse(kwargs_json, nullptr, false);
    if (kwargs.is_discarded() || !kwargs.is_object()) {
      return InvalidArgument("chat template context: kwargs must be a JSON object");
    }
    for (auto& [k, v] : kwargs.items()) context[k] = v;
  }
  return context.dump();
}

StatusOr<std::string> LoadChatTemplate(const std::string& model_dir) {
  auto read = [](const std::string& path, std::string* out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::stringstream ss;
    ss << in.rdbuf();
    *out = ss.str();
    return true;
  };
  std::string text;
  if (read(model_dir + "/chat_template.jinja", &text)) return text;
  const std::string config_path = model_dir + "/tokenizer_config.json";
  if (!read(config_path, &text)) {
    return NotFound("no chat template in " + model_dir +
                    ": neither chat_template.jinja nor tokenizer_config.json exists");
  }
  const Json config = Json::parse(text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return InvalidArgument(config_path + ": not a JSON object");
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return NotFound(config_path +
                    " has no \"chat_template\" (and there is no chat_template.jinja)");
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const Json& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return InvalidArgument(config_path +
                           ": \"chat_template\" is a list without an entry named \"default\"");
  }
  return InvalidArgument(config_path +
                         ": \"chat_template\" must be a string or a list of "
                         "{\"name\", \"template\"} objects");
}

}  // namespace gyre::text
