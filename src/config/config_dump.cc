// Printing: field values as YAML text, the whole effective config (DumpJobConfig), and the
// listings of keys that --help and the docs checks read.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/strings.h"
#include "config/config_internal.h"

namespace gyre::config {
namespace internal {
namespace {

// As FormatDouble, but an integral value keeps a ".0" so a dump reads as a float field.
std::string FormatDoubleValue(double v) {
  std::string s = FormatDouble(v);
  if (std::isfinite(v) && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

const char* TypeName(FieldType t) {
  switch (t) {
    case FieldType::kInt:
      return "int";
    case FieldType::kInt64:
      return "int64";
    case FieldType::kUint64:
      return "uint64";
    case FieldType::kDouble:
      return "double";
    case FieldType::kBool:
      return "bool";
    case FieldType::kString:
      return "string";
    case FieldType::kStringList:
      return "string list";
  }
  return "?";
}

}  // namespace

std::string FormatDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string QuoteYaml(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02X", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string RangeText(const Field& f) {
  if (!f.range) return "";
  const Range& r = *f.range;
  auto num = [&](double v) {
    if (f.type == FieldType::kDouble) return FormatDouble(v);
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return std::string(buf);
  };
  return std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) +
         (r.hi_open ? ")" : "]");
}

std::string JoinChoices(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string ListText(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + QuoteYaml(v[i]);
  return out + "]";
}

std::string ValueText(const Field& f, const JobConfig& cfg, bool quote_strings) {
  JobConfig copy = cfg;  // getters need a mutable config; a copy keeps `cfg` const
  FieldPtr p = f.get(copy);
  switch (f.type) {
    case FieldType::kInt:
      return std::to_string(*std::get<int*>(p));
    case FieldType::kInt64:
      return std::to_string(*std::get<int64_t*>(p));
    case FieldType::kUint64:
      return std::to_string(*std::get<uint64_t*>(p));
    case FieldType::kDouble:
      return FormatDoubleValue(*std::get<double*>(p));
    case FieldType::kBool:
      return *std::get<bool*>(p) ? "true" : "false";
    case FieldType::kString: {
      const std::string& s = *std::get<std::string*>(p);
      if (quote_strings || s.empty()) return QuoteYaml(s);
      return s;
    }
    case FieldType::kStringList:
      return ListText(*std::get<std::vector<std::string>*>(p));
  }
  return "";
}

}  // namespace internal

using internal::ChoicesOf;
using internal::Field;
using internal::FieldType;
using internal::JoinChoices;
using internal::RangeText;
using internal::Table;
using internal::TypeName;
using internal::ValueText;

std::string DumpJobConfig(const JobConfig& cfg) {
  std::string out =
      "# Effective Gyre job config: every field, after --set overrides.\n"
      "# Field reference: docs/config.md.\n";
  std::vector<std::string> open;  // section path of the previous key
  for (const Field& f : Table()) {
    std::vector<std::string> parts = SplitString(f.key, '.');
    std::string leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (size_t i = common; i < parts.size(); ++i) {
      out += std::string(2 * i, ' ') + parts[i] + ":\n";
    }
    open = parts;
    // A choice lists its values (for the algorithm keys, the registry's names).
    const std::vector<std::string> choices = ChoicesOf(f);
    out += std::string(2 * parts.size(), ' ') + leaf + ": " + ValueText(f, cfg, true) + "  # " +
           f.doc + (choices.empty() ? "" : " (one of: " + JoinChoices(choices) + ")") + "\n";
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ConfigValues(const JobConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : Table()) out.emplace_back(f.key, ValueText(f, cfg, true));
  return out;
}

std::vector<std::string> AllConfigKeys() {
  std::vector<std::string> keys;
  for (const Field& f : Table()) keys.push_back(f.key);
  return keys;
}

std::vector<ConfigKeyInfo> DescribeConfigKeys() {
  const JobConfig defaults;
  std::vector<ConfigKeyInfo> out;
  for (const Field& f : Table()) {
    ConfigKeyInfo info;
    info.key = f.key;
    info.type = TypeName(f.type);
    info.default_value = ValueText(f, defaults, false);
    if (f.range) {
      info.allowed = RangeText(f);
    } else if (!ChoicesOf(f).empty()) {
      info.allowed = JoinChoices(ChoicesOf(f));
    } else if (f.type == FieldType::kBool) {
      info.allowed = "true, false";
    } else if (f.type == FieldType::kStringList) {
      info.allowed = f.non_empty ? "non-empty strings" : "any strings";
    } else if (f.non_empty) {
      info.allowed = "non-empty";
    } else {
      info.allowed = "any";
    }
    info.doc = f.doc;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace gyre::config
