#pragma once
// What the files of src/config share; private to the gyre_config library (config.h is the public
// interface). The module's parts:
//   config_schema.cc  the field table, one function per section of the job file
//   config_field.cc   one field: describing it, checking a value, setting it from YAML
//   config_rules.cc   cross-field rules (ValidateJobConfig)
//   config_parse.cc   reading a YAML job file, --set overrides, renamed keys, suggestions for
//                     misspelt keys
//   config_dump.cc    printing values and the whole config (DumpJobConfig, DescribeConfigKeys)
//
// Everything here is thread-compatible; the table is built once and never changes.

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "algorithm/registry.h"
#include "config/config.h"

namespace gyre::config::internal {

// ---------------------------------------------------------------------------------------------
// A field of the table (config_field.cc builds and checks them, config_schema.cc lists them).
// ---------------------------------------------------------------------------------------------

// A pointer to one field of a JobConfig. The variant's alternative *is* the field's type, so the
// table cannot claim a type that disagrees with the struct.
using FieldPtr = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*,
                              std::vector<std::string>*>;
using Getter = FieldPtr (*)(JobConfig&);

// Same order as FieldPtr's alternatives: FieldType(ptr.index()) is the field's type.
enum class FieldType { kInt, kInt64, kUint64, kDouble, kBool, kString, kStringList };

struct Range {
  double lo = 0;
  double hi = 0;
  bool lo_open = false;  // (lo, ...
  bool hi_open = false;  // ..., hi)
};

struct Field {
  std::string key;  // dotted: "rollout.sampling.top_p"
  Getter get = nullptr;
  FieldType type = FieldType::kInt;
  std::optional<Range> range;        // numbers; none = the type's full range
  std::vector<std::string> choices;  // strings; empty = any string
  // Choices read at each use (the algorithm registry, which an embedding program can extend);
  // replaces `choices` when set.
  std::vector<std::string> (*choices_fn)() = nullptr;
  bool non_empty = false;  // strings; for a string list, each of its entries
  std::string doc;         // one line
};

// Ranges for Num.
inline Range Closed(double lo, double hi) { return {lo, hi, false, false}; }
inline Range OpenLow(double lo, double hi) { return {lo, hi, true, false}; }   // (lo, hi]
inline Range OpenHigh(double lo, double hi) { return {lo, hi, false, true}; }  // [lo, hi)

// Field builders. Each checks (aborting: the table is code) that the getter's type suits it.
Field Num(const char* key, Getter get, Range range, const char* doc);  // int, int64, double
Field Seed(const char* key, Getter get, const char* doc);              // uint64, any value
Field Flag(const char* key, Getter get, const char* doc);              // bool
Field Text(const char* key, Getter get, bool non_empty, const char* doc);
// A YAML sequence of strings, each non-empty; an empty value or [] is the empty list.
Field TextList(const char* key, Getter get, const char* doc);
Field Choice(const char* key, Getter get, std::vector<std::string> choices, const char* doc);
// A choice among the names `names` returns when asked (the algorithm registry's).
Field Registered(const char* key, Getter get, std::vector<std::string> (*names)(), const char* doc);

// The names the algorithm registry holds for `kFamily` (algorithm/registry.h), for Registered.
template <algorithm::Family kFamily>
std::vector<std::string> RegistryNames() {
  return algorithm::NamesFor(kFamily);
}

// The field's allowed strings now; empty = any.
std::vector<std::string> ChoicesOf(const Field& f);

// ---------------------------------------------------------------------------------------------
// The table (config_schema.cc).
// ---------------------------------------------------------------------------------------------

// Every JobConfig field, once, in DumpJobConfig's order; each section's keys are contiguous.
const std::vector<Field>& Table();
// The field named `key` ("trainer.steps"), or null.
const Field* FindField(const std::string& key);

// ---------------------------------------------------------------------------------------------
// Checking and setting one field (config_field.cc).
// ---------------------------------------------------------------------------------------------

// "" when `v` is inside the field's range; otherwise the problem, showing the value as `shown`.
std::string CheckNumber(const Field& f, double v, const std::string& shown);
// "" when `v` is acceptable (one of the choices; non-empty where required), else the problem.
std::string CheckString(const Field& f, const std::string& v);
// "" when every entry of a string list is acceptable; otherwise the first problem. *bad (if
// given) receives the index of the offending entry.
std::string CheckStringList(const Field& f, const std::vector<std::string>& v,
                            size_t* bad = nullptr);
// The range check of the field's current value, for configs built in code.
std::string CheckCurrentValue(const Field& f, const JobConfig& cfg);

// How a YAML node reads in an error message: 'text', a list, a map, nothing.
std::string DescribeNode(const YAML::Node& n);

// Parses `node` as the field's value and stores it in `cfg`. On error (message without a
// location prefix) `cfg` is untouched; *error_at (if given) starts as the position of `node` and
// may be moved to a more precise one, such as a bad entry of a list.
Status SetField(const Field& f, const YAML::Node& node, JobConfig* cfg,
                YAML::Mark* error_at = nullptr);

// ---------------------------------------------------------------------------------------------
// Cross-field rules (config_rules.cc).
// ---------------------------------------------------------------------------------------------

struct Problem {
  std::vector<std::string> keys;  // the fields involved, to locate the error in a file
  std::string message;            // names the fields itself
};

// The first problem of `c`: a field out of its own range, then the cross-field rules in order.
std::optional<Problem> FindProblem(const JobConfig& c);

// ---------------------------------------------------------------------------------------------
// Printing values (config_dump.cc).
// ---------------------------------------------------------------------------------------------

// Shortest of %.15g / %.17g that reads back as exactly `v` (so 0.2 prints as 0.2).
std::string FormatDouble(double v);
// A YAML double-quoted scalar; yaml-cpp decodes these escapes back to the same bytes.
std::string QuoteYaml(const std::string& s);
// A YAML flow sequence of double-quoted strings: ["</answer>", "\n\nUser:"].
std::string ListText(const std::vector<std::string>& v);
// "a, b, c".
std::string JoinChoices(const std::vector<std::string>& v);
// The field's range as "[lo, hi]", "(lo, hi]", ...; "" for a field without one.
std::string RangeText(const Field& f);
// The field's current value in `cfg`, as DumpJobConfig writes it (strings quoted when
// `quote_strings` or empty; a list's entries always are).
std::string ValueText(const Field& f, const JobConfig& cfg, bool quote_strings);

}  // namespace gyre::config::internal
