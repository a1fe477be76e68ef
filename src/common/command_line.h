#pragma once
// Command-line parsing for every `gyre` command and subcommand, on CLI11. Each command builds a
// CLI::App with NewCommand, declares its options (with their defaults, which --help shows), and
// calls ParseCommandLine, so that help, errors and exit statuses read the same everywhere:
//
//   gyre bench memory --vocab 1
//   gyre bench memory: --vocab: Value 1 not in range 2 to 4194304 (see gyre bench memory --help)
//
// Exit statuses follow the tool's: 0 after --help, 2 for a usage error.

#include <CLI/CLI.hpp>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace gyre {

// A command named `name` as the user types it ("gyre bench memory"), with a one-line `summary`
// shown above its usage line and `details` (paragraphs, may be empty) shown after its options.
// Every option's default is shown in --help.
std::unique_ptr<CLI::App> NewCommand(const std::string& name, const std::string& summary,
                                     const std::string& details = "");

// Parses `args` (the words after the command's name, in order). Returns -1 when the command
// goes on; 0 after printing the help on stdout (--help, -h); 2 after a usage error, reported as
// one line "NAME: WHAT (see NAME --help)" on stderr. An unknown option is reported before a
// missing required one (which a misspelt option usually explains).
int ParseCommandLine(CLI::App& app, const std::vector<std::string>& args);

// The same for a usage error found after parsing (a combination of options the command
// refuses): prints "NAME: WHAT (see NAME --help)" on stderr and returns 2.
int CommandLineError(const CLI::App& app, const std::string& what);

// A check for a number option: min <= x <= max, or min < x with `min_open`; max may be
// infinity. Its message states the rule as written here ("--top-p: 0 is not in (0, 1]"), where
// CLI::Range and CLI::PositiveNumber print their type's whole extent. NaN and text that is not
// a number fail it. It adds nothing to the option's type in --help, so the option's description
// should give the range.
CLI::Validator NumberIn(double min, double max, bool min_open = false);

// NumberIn's `max` for a number without an upper bound.
inline constexpr double kNoUpperBound = std::numeric_limits<double>::infinity();

}  // namespace gyre
