// Python's str methods, repr() and json.dumps for the Jinja engine (jinja_python.h).

#include "text/jinja_python.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/strings.h"

namespace gyre::text::jinja {
namespace {

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

// The length of the item of CodePoints that starts at s[i].
size_t CodePointLength(const std::string& s, size_t i) {
  const Utf8Char c = DecodeUtf8(s, i);
  return c.status == Utf8Char::kValid ? c.length : 1;
}

}  // namespace

std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = CodePointLength(s, i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t CodePointCount(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += CodePointLength(s, i)) ++n;
  return n;
}

char32_t Decode(const std::string& cp) {
  const Utf8Char c = DecodeUtf8(cp, 0);
  // An invalid byte, which CodePoints leaves on its own, reads as the code point of its value.
  return c.status == Utf8Char::kValid ? c.code_point : static_cast<unsigned char>(cp[0]);
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

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

std::string PyRepr(const Json& v, int depth) {
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

}  // namespace gyre::text::jinja
