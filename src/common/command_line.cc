#include "common/command_line.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gyre {

namespace {

// CLI11's layout with the summary after the usage line rather than before it, so that every
// help text starts with "Usage: NAME ...".
class GyreHelpFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    if (mode != CLI::AppFormatMode::Normal) return CLI::Formatter::make_help(app, name, mode);
    std::string out = make_usage(app, name);
    const std::string summary = app->get_description();
    if (!summary.empty()) out += "\n" + summary + "\n";
    out += make_positionals(app);
    out += make_groups(app, mode);
    out += make_subcommands(app, mode);
    out += "\n" + make_footer(app);
    return out;
  }

  // An option without a default (an empty list) shows none, rather than "=[]".
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string text = CLI::Formatter::make_option_opts(opt);
    const size_t empty = text.find("=[]");
    if (empty != std::string::npos) text.erase(empty, 3);
    return text;
  }
};

}  // namespace

std::unique_ptr<CLI::App> NewCommand(const std::string& name, const std::string& summary,
                                     const std::string& details) {
  auto app = std::make_unique<CLI::App>(summary, name);
  app->formatter(std::make_shared<GyreHelpFormatter>());
  app->get_formatter()->column_width(30);
  app->option_defaults()->always_capture_default();
  if (!details.empty()) app->footer(details);
  return app;
}

namespace {

// "The following argument(s) were not expected: A B", in the order they were given (CLI11's own
// message lists them last-first when parsing a vector).
std::string NotExpected(const CLI::App& app) {
  const std::vector<std::string> extras = app.remaining();
  std::string what = extras.size() > 1 ? "The following arguments were not expected:"
                                       : "The following argument was not expected:";
  for (const std::string& extra : extras) what += " " + extra;
  return what;
}

}  // namespace

int ParseCommandLine(CLI::App& app, const std::vector<std::string>& args) {
  // CLI11 takes a vector of arguments last-first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::RequiredError& e) {
    // A misspelt option (--modle) leaves the one meant missing: name what was not understood.
    if (app.remaining().empty() || app.get_allow_extras()) return CommandLineError(app, e.what());
    return CommandLineError(app, NotExpected(app));
  } catch (const CLI::ExtrasError&) {
    return CommandLineError(app, NotExpected(app));
  } catch (const CLI::ParseError& e) {
    return CommandLineError(app, e.what());
  }
  return -1;
}

int CommandLineError(const CLI::App& app, const std::string& what) {
  const std::string& name = app.get_name();
  std::fprintf(stderr, "%s: %s (see %s --help)\n", name.c_str(), what.c_str(), name.c_str());
  return 2;
}

CLI::Validator NumberIn(double min, double max, bool min_open) {
  auto number = [](double x) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", x);
    return std::string(text);
  };
  std::string rule;
  if (std::isinf(max)) {
    rule = (min_open ? "> " : ">= ") + number(min);
  } else {
    rule = std::string("in ") + (min_open ? "(" : "[") + number(min) + ", " + number(max) + "]";
  }
  return CLI::Validator(
      [min, max, min_open, rule](std::string& text) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return "'" + text + "' is not a number";
        if (!std::isfinite(x)) return text + " is not a finite number";
        if (x < min || (min_open && x == min) || x > max) return text + " is not " + rule;
        return "";
      },
      "");
}

}  // namespace gyre
