// One field of the table: the builders config_schema.cc lists fields with, the checks of a value
// against the field's range or choices, and setting a field from a YAML value.

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/strings.h"
#include "config/config_internal.h"

namespace gyre::config::internal {
namespace {

FieldType TypeOf(Getter get) {
  static JobConfig probe;
  return static_cast<FieldType>(get(probe).index());
}

const char* Expected(FieldType t) {
  switch (t) {
    case FieldType::kInt:
    case FieldType::kInt64:
    case FieldType::kUint64:
      return "an integer";
    case FieldType::kDouble:
      return "a number";
    case FieldType::kBool:
      return "true or false";
    case FieldType::kString:
      return "a string";
    case FieldType::kStringList:
      return "a list of strings";
  }
  return "?";
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Decimal integer with optional sign; *overflow when it does not fit the parse type.
bool ParseSigned(const std::string& s, int64_t* out, bool* overflow) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j) {
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return false;
  }
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  *overflow = errno == ERANGE;
  *out = v;
  return true;
}

bool ParseUnsigned(const std::string& s, uint64_t* out, bool* out_of_range) {
  int64_t ignored;
  bool overflow;
  if (!ParseSigned(s, &ignored, &overflow)) return false;
  // strtoull would silently wrap "-1"; a negative number is a valid integer, just out of range.
  if (s[0] == '-') {
    *out_of_range = true;
    return true;
  }
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  *out_of_range = errno == ERANGE;
  *out = v;
  return true;
}

// Decimal or scientific notation only: strtod alone would also take "nan", "inf" and hex.
bool ParseDouble(const std::string& s, double* out) {
  if (s.empty() || s.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  if (s.find_first_of("0123456789") == std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);  // overflow gives +-HUGE_VAL, caught by the range check
  return end == s.c_str() + s.size();
}

bool ParseBool(const std::string& s, bool* out) {
  static const char* kTrue[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* kFalse[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (const char* t : kTrue) {
    if (s == t) {
      *out = true;
      return true;
    }
  }
  for (const char* t : kFalse) {
    if (s == t) {
      *out = false;
      return true;
    }
  }
  return false;
}

// A string list's value: a YAML sequence of scalars (each read as its text, like a string
// field); an empty value is the empty list. On error *error_at (if given and the culprit has a
// position) is moved to the offending entry.
StatusOr<std::vector<std::string>> ParseStringList(const Field& f, const YAML::Node& node,
                                                   YAML::Mark* error_at) {
  std::vector<std::string> v;
  if (node.IsNull()) return v;
  if (!node.IsSequence()) {
    return InvalidArgument(f.key + ": expected " + Expected(f.type) +
                           " such as [\"a\", \"b\"], got " + DescribeNode(node));
  }
  std::vector<YAML::Mark> marks;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node e = *it;
    if (!e.IsScalar()) {
      if (error_at != nullptr && !e.IsNull()) *error_at = e.Mark();
      return InvalidArgument(f.key + ": entry " + std::to_string(v.size() + 1) +
                             ": expected a string, got " + DescribeNode(e));
    }
    v.push_back(e.Scalar());
    marks.push_back(e.Mark());
  }
  size_t bad = 0;
  const std::string problem = CheckStringList(f, v, &bad);
  if (!problem.empty()) {
    if (error_at != nullptr) *error_at = marks[bad];
    return InvalidArgument(problem);
  }
  return v;
}

}  // namespace

Field Num(const char* key, Getter get, Range range, const char* doc) {
  Field f{key, get, TypeOf(get), range, {}, nullptr, false, doc};
  GYRE_CHECK(f.type == FieldType::kInt || f.type == FieldType::kInt64 ||
             f.type == FieldType::kDouble)
      << key << " is not an int or double field";
  if (f.type == FieldType::kInt) {
    GYRE_CHECK(range.lo >= INT_MIN && range.hi <= INT_MAX) << key << ": range exceeds int";
  }
  return f;
}
Field Seed(const char* key, Getter get, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, false, doc};
  GYRE_CHECK(f.type == FieldType::kUint64) << key << " is not a uint64 field";
  return f;
}
Field Flag(const char* key, Getter get, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, false, doc};
  GYRE_CHECK(f.type == FieldType::kBool) << key << " is not a bool field";
  return f;
}
Field Text(const char* key, Getter get, bool non_empty, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, non_empty, doc};
  GYRE_CHECK(f.type == FieldType::kString) << key << " is not a string field";
  return f;
}
Field TextList(const char* key, Getter get, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, true, doc};
  GYRE_CHECK(f.type == FieldType::kStringList) << key << " is not a string list field";
  return f;
}
Field Choice(const char* key, Getter get, std::vector<std::string> choices, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, std::move(choices), nullptr, true, doc};
  GYRE_CHECK(f.type == FieldType::kString) << key << " is not a string field";
  return f;
}
Field Registered(const char* key, Getter get, std::vector<std::string> (*names)(),
                 const char* doc) {
  Field f = Choice(key, get, {}, doc);
  f.choices_fn = names;
  return f;
}
std::vector<std::string> ChoicesOf(const Field& f) {
  return f.choices_fn != nullptr ? f.choices_fn() : f.choices;
}

std::string CheckNumber(const Field& f, double v, const std::string& shown) {
  if (!f.range) return "";
  const Range& r = *f.range;
  bool ok = !std::isnan(v) && v >= r.lo && v <= r.hi && !(r.lo_open && v == r.lo) &&
            !(r.hi_open && v == r.hi);
  if (ok) return "";
  return f.key + ": " + shown + " is out of range " + RangeText(f);
}

std::string CheckString(const Field& f, const std::string& v) {
  const std::vector<std::string> choices = ChoicesOf(f);
  if (!choices.empty()) {
    for (const std::string& c : choices) {
      if (v == c) return "";
    }
    std::string msg = f.key + ": '" + v + "' is not one of " + JoinChoices(choices);
    std::string near = NearestWord(Lower(v), choices);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    return msg;
  }
  if (f.non_empty && v.empty()) return f.key + ": must not be empty";
  return "";
}

std::string CheckStringList(const Field& f, const std::vector<std::string>& v, size_t* bad) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (f.non_empty && v[i].empty()) {
      if (bad != nullptr) *bad = i;
      return f.key + ": entry " + std::to_string(i + 1) + " must not be empty";
    }
  }
  return "";
}

std::string CheckCurrentValue(const Field& f, const JobConfig& cfg) {
  JobConfig copy = cfg;
  FieldPtr p = f.get(copy);
  const std::string shown = ValueText(f, cfg, false);
  switch (f.type) {
    case FieldType::kInt:
      return CheckNumber(f, *std::get<int*>(p), shown);
    case FieldType::kInt64:
      return CheckNumber(f, static_cast<double>(*std::get<int64_t*>(p)), shown);
    case FieldType::kDouble:
      return CheckNumber(f, *std::get<double*>(p), shown);
    case FieldType::kString:
      return CheckString(f, *std::get<std::string*>(p));
    case FieldType::kStringList:
      return CheckStringList(f, *std::get<std::vector<std::string>*>(p));
    case FieldType::kUint64:
    case FieldType::kBool:
      return "";
  }
  return "";
}

std::string DescribeNode(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Undefined:
      return "nothing";
  }
  return "?";
}

Status SetField(const Field& f, const YAML::Node& node, JobConfig* cfg, YAML::Mark* error_at) {
  if (f.type == FieldType::kStringList) {
    GYRE_ASSIGN_OR_RETURN(std::vector<std::string> v, ParseStringList(f, node, error_at));
    *std::get<std::vector<std::string>*>(f.get(*cfg)) = std::move(v);
    return Status::Ok();
  }
  // An empty value is the empty string for a string field ("path:" reads naturally as "none").
  bool empty_string = f.type == FieldType::kString && node.IsNull();
  if (!node.IsScalar() && !empty_string) {
    return InvalidArgument(f.key + ": expected " + Expected(f.type) + ", got " +
                           DescribeNode(node));
  }
  const std::string text = empty_string ? "" : node.Scalar();
  auto type_error = [&] {
    return InvalidArgument(f.key + ": expected " + Expected(f.type) + ", got '" + text + "'");
  };
  auto check = [](const std::string& problem) {
    return problem.empty() ? Status::Ok() : InvalidArgument(problem);
  };
  FieldPtr p = f.get(*cfg);
  switch (f.type) {
    case FieldType::kInt:
    case FieldType::kInt64: {
      int64_t v = 0;
      bool overflow = false;
      if (!ParseSigned(text, &v, &overflow)) return type_error();
      double as_double =
          overflow ? (text[0] == '-' ? -HUGE_VAL : HUGE_VAL) : static_cast<double>(v);
      GYRE_RETURN_IF_ERROR(check(CheckNumber(f, as_double, text)));
      if (f.type == FieldType::kInt) {
        *std::get<int*>(p) = static_cast<int>(v);
      } else {
        *std::get<int64_t*>(p) = v;
      }
      return Status::Ok();
    }
    case FieldType::kUint64: {
      uint64_t v = 0;
      bool out_of_range = false;
      if (!ParseUnsigned(text, &v, &out_of_range)) return type_error();
      if (out_of_range) {
        return InvalidArgument(f.key + ": " + text + " is out of range [0, " +
                               std::to_string(UINT64_MAX) + "]");
      }
      *std::get<uint64_t*>(p) = v;
      return Status::Ok();
    }
    case FieldType::kDouble: {
      double v = 0;
      if (!ParseDouble(text, &v)) return type_error();
      GYRE_RETURN_IF_ERROR(check(CheckNumber(f, v, text)));
      *std::get<double*>(p) = v;
      return Status::Ok();
    }
    case FieldType::kBool: {
      bool v = false;
      if (!ParseBool(text, &v)) return type_error();
      *std::get<bool*>(p) = v;
      return Status::Ok();
    }
    case FieldType::kString: {
      GYRE_RETURN_IF_ERROR(check(CheckString(f, text)));
      *std::get<std::string*>(p) = text;
      return Status::Ok();
    }
    case FieldType::kStringList:
      break;  // handled above
  }
  return Internal("unhandled field type");
}

}  // namespace gyre::config::internal
