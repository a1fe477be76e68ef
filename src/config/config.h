#pragma once
// Job config loading: YAML text -> validated gyre::JobConfig, plus the reverse (DumpJobConfig)
// and `--set key=value` overrides.
//
// Every field is described once, in a table in config_schema.cc (dotted key, type, allowed
// values, a one-line doc). Parsing, overrides, dumping, key listing and DescribeConfigKeys all read
// that table, so adding a field to gyre::JobConfig means adding one table row (and a docs row,
// which config_test checks). A renamed key can stay readable as a deprecated alias (kAliases in
// config_parse.cc: rollout.stop_string, a single string, sets the list rollout.stop_strings).
//
// Errors are kInvalidArgument Status values whose message starts with where the problem is:
// "jobs/x.yaml:12:3: ..." for a file (1-based line and column) or "--set: ..." for an override.
// A failed load returns no config at all, never a partially filled one.
//
// All functions are thread-compatible and keep no state besides the immutable table.
// yaml-cpp is a private dependency: nothing here exposes its types.

#include <string>
#include <utility>
#include <vector>

#include "gyre/config.h"
#include "gyre/status.h"

namespace gyre::config {

// Reads the YAML job file at `path`, applies `overrides` ("a.b=c", in order) and validates.
// A missing or unreadable file is kNotFound naming `path`; an empty file means all defaults.
StatusOr<JobConfig> LoadJobConfigFile(const std::string& path,
                                      const std::vector<std::string>& overrides = {});

// Like LoadJobConfigFile for text already in memory; `source_name` (usually the path) prefixes
// error messages.
StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides = {});

// Applies one `--set` override, e.g. "trainer.steps=10" or "rollout.sampling.top_p=0.9". The
// value is parsed as a YAML scalar and checked like a value in a file. On error `cfg` is left
// unchanged. Cross-field checks are not run here (an override may be one of several that only
// make sense together); call ValidateJobConfig after the last one.
Status ApplyOverride(JobConfig* cfg, const std::string& key_eq_value);

// Cross-field checks that a single field's range cannot express, e.g. min_digits <= max_digits
// or num_heads dividing hidden_size. Also re-checks every field's own range, so a config built
// in code gets the same guarantees as a parsed one.
Status ValidateJobConfig(const JobConfig& cfg);

// The effective config as YAML, with every field and a comment per field. ParseJobConfig of the
// result gives back exactly `cfg` (doubles are printed with enough digits to round-trip).
std::string DumpJobConfig(const JobConfig& cfg);

// Every field's dotted name and its value as DumpJobConfig writes it (exact: doubles round-trip),
// in table order. Two configs are equal exactly when these lists are.
std::vector<std::pair<std::string, std::string>> ConfigValues(const JobConfig& cfg);

// Dotted names of every field, in table (and DumpJobConfig) order: "job.name", ...
std::vector<std::string> AllConfigKeys();

// One row of the field table in printable form, for `--help`-style listings and doc checks.
struct ConfigKeyInfo {
  std::string key;            // "rollout.sampling.top_p"
  std::string type;           // int, int64, uint64, double, bool or string
  std::string default_value;  // as a user would write it: 0.2, true, gyre-job, "" (empty string)
  std::string allowed;  // "[1, 4096]", "(0, 1]", "grpo, grpo_no_std, rloo", "non-empty", "any"
  std::string doc;      // one line
};
std::vector<ConfigKeyInfo> DescribeConfigKeys();

}  // namespace gyre::config
