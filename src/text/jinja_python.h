#pragma once
// Internal to the Jinja engine (jinja_internal.h): Python's str methods, repr() and json.dumps
// over the engine's values, which templates see as Python objects. Strings are UTF-8; Python
// indexes them by code point.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "text/jinja_internal.h"

namespace gyre::text::jinja {

// Splits UTF-8 text into code points (each as its bytes); an invalid byte stands alone.
std::vector<std::string> CodePoints(const std::string& s);
// CodePoints(s).size(): len() of `s` as a Python str.
size_t CodePointCount(const std::string& s);
// The code point of one item of CodePoints.
char32_t Decode(const std::string& cp);

// Python's str.isspace() for one code point.
bool IsPySpace(char32_t c);
// Python's str.strip/lstrip/rstrip: `chars` null strips whitespace, else any of its code points.
std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right);
// Python's str.split: at runs of whitespace when `sep` is null, at most `maxsplit` times when that
// is not negative. Throws JinjaError when `sep` is empty.
std::vector<std::string> PySplit(const std::string& s, const std::string* sep, int64_t maxsplit);
// Python's str.replace, at most `count` times when that is not negative.
std::string PyReplace(const std::string& s, const std::string& old, const std::string& rep,
                      int64_t count);

// Case mapping is ASCII-only (docs/chat_templates.md: non-ASCII letters keep their case).
std::string AsciiLower(std::string s);
std::string AsciiUpper(std::string s);
bool IsAsciiAlpha(char c);
std::string AsciiCapitalize(const std::string& s);  // str.capitalize()
std::string AsciiTitle(const std::string& s);       // str.title()
// jinja2's `title` filter (not str.title): words start after runs of whitespace, '-', '(', '{',
// '[' or '<'; each word's first character is upper-cased and the rest lower-cased.
std::string JinjaTitle(const std::string& s);

// Python's repr() of a JSON value (how Jinja prints lists and dicts).
std::string PyRepr(const Json& v, int depth = 0);

struct DumpStyle {
  std::string indent;  // empty with has_indent=false: one line
  bool has_indent = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

// Python's json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
void PyJsonDump(const Json& v, const DumpStyle& style, int level, std::string* out);

}  // namespace gyre::text::jinja
