// The Jinja engine's first stage (jinja_internal.h): the source (newlines normalised, one trailing
// newline dropped, as jinja2 does) is cut into text and tags. Whitespace control is applied here
// exactly as jinja2's lexer does with HF's environment: `{%-`/`-%}` (and `{{-`, `-}}`, `{#-`,
// `-#}`) strip all whitespace on that side; trim_blocks drops the first newline after `%}`/`#}`;
// lstrip_blocks drops spaces and tabs between a line start and `{%`/`{#`; `+` after `{%` or before
// `%}` disables either. The inside of each tag is tokenised (names, numbers, Python string
// literals, operators).

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/strings.h"
#include "text/jinja_internal.h"
#include "text/jinja_python.h"

namespace gyre::text::jinja {
namespace {

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

}  // namespace

std::vector<Segment> Lex(const std::string& source) { return Lexer(source).Run(); }

}  // namespace gyre::text::jinja
