// gyre bench docs [--check] FILE.md...: the benchmark tables of the documentation are generated
// from result files (bench/baselines/*.json), so a figure in the docs always has a file, a
// command line and a host behind it. Torch-free.
//
// A block in a Markdown file:
//   <!-- gyre-bench: ../bench/baselines/train.json [columns=batch,mode,median_s] -->
//   ... generated ...
//   <!-- /gyre-bench -->
// The path is relative to the Markdown file (as a link would be). Everything between the two
// markers is replaced.

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "common/strings.h"

namespace gyre::bench {

namespace {

constexpr char kDocsDetails[] =
    "The result files are written by gyre bench SUBCOMMAND --json FILE; the project's reference\n"
    "results are in bench/baselines/. A table is the text between\n"
    "  <!-- gyre-bench: RESULT.json [columns=KEY,KEY,...] -->\n"
    "  <!-- /gyre-bench -->\n"
    "where RESULT.json is relative to the Markdown file. It becomes: the command that measured\n"
    "the figures, the host and date, the run's context, and a table of every row with the\n"
    "columns the benchmark printed (or the listed result fields).\n"
    "\n"
    "Exit status: 0 written or up to date, 1 stale blocks (--check), 2 bad input (nothing is\n"
    "written then).\n";

constexpr char kOpen[] = "<!-- gyre-bench:";
constexpr char kClose[] = "<!-- /gyre-bench -->";

// The non-empty, trimmed items of `s` split at `sep`.
std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  for (const std::string& item : SplitString(s, sep)) {
    if (!TrimString(item).empty()) out.push_back(TrimString(item));
  }
  return out;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Markdown-safe cell text: a '|' would end the cell.
std::string Cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\";
    out += c;
  }
  return out;
}

struct Directive {
  std::string path;                  // as written in the marker
  std::vector<std::string> columns;  // empty: the benchmark's own
};

StatusOr<Directive> ParseDirective(const std::string& line) {
  const size_t start = line.find(kOpen);
  const size_t end = line.find("-->", start);
  if (end == std::string::npos) return InvalidArgument("the marker does not end with -->");
  std::vector<std::string> words =
      Split(line.substr(start + sizeof(kOpen) - 1, end - start - (sizeof(kOpen) - 1)), ' ');
  if (words.empty()) return InvalidArgument("the marker names no result file");
  Directive d;
  d.path = words[0];
  for (size_t i = 1; i < words.size(); ++i) {
    if (words[i].rfind("columns=", 0) == 0) {
      d.columns = Split(words[i].substr(8), ',');
      if (d.columns.empty()) return InvalidArgument("columns= lists no column");
    } else {
      return InvalidArgument("unknown marker option '" + words[i] + "' (known: columns=)");
    }
  }
  return d;
}

StatusOr<nlohmann::json> LoadResult(const std::string& path) {
  GYRE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("schema", "") != "gyre-bench/1") {
    return InvalidArgument(path + " is not a gyre bench result (schema gyre-bench/1)");
  }
  if (!j.contains("results") || !j["results"].is_array() || j["results"].empty()) {
    return InvalidArgument(path + " has no results");
  }
  return j;
}

// The block's generated lines (without the markers).
StatusOr<std::string> Render(const Directive& d, const nlohmann::json& j,
                             const std::string& shown_path) {
  struct Col {
    std::string key, header;
    int decimals;
  };
  std::vector<Col> printed;
  if (j.contains("columns") && j["columns"].is_array()) {
    for (const auto& c : j["columns"]) {
      if (!c.is_object() || !c.contains("key") || !c["key"].is_string()) continue;
      printed.push_back({c["key"].get<std::string>(),
                         c.value("header", c["key"].get<std::string>()), c.value("decimals", 3)});
    }
  }
  if (printed.empty()) {  // a file from before "columns": its keys, then its metrics
    for (const auto& k : j.value("keys", nlohmann::json::array())) {
      if (k.is_string()) printed.push_back({k.get<std::string>(), k.get<std::string>(), 3});
    }
    for (const auto& [m, dir] : j.value("metrics", nlohmann::json::object()).items()) {
      printed.push_back({m, m, 3});
    }
  }
  std::vector<Col> cols;
  if (d.columns.empty()) {
    cols = printed;
  } else {
    for (const auto& key : d.columns) {
      Col c{key, key, 3};
      for (const auto& p : printed) {
        if (p.key == key) c = p;
      }
      bool present = false;
      for (const auto& row : j["results"])
        present = present || (row.is_object() && row.contains(key));
      if (!present) {
        return InvalidArgument("no row of " + shown_path + " has a field '" + key + "'");
      }
      cols.push_back(c);
    }
  }
  if (cols.empty()) return InvalidArgument(shown_path + " names no columns");

  std::string out;
  std::string command = "gyre bench";
  for (const auto& a : j.value("options", nlohmann::json::array())) {
    if (a.is_string()) command += " " + a.get<std::string>();
  }
  const nlohmann::json host = j.value("host", nlohmann::json::object());
  std::string machine = host.value("cpu", std::string("unknown CPU"));
  if (host.contains("cpus")) machine += ", " + host["cpus"].dump() + " CPUs";
  if (host.contains("simd") && host["simd"].is_array() && !host["simd"].empty()) {
    std::string simd;
    for (const auto& f : host["simd"]) simd += (simd.empty() ? "" : " ") + f.get<std::string>();
    machine += " (" + simd + ")";
  }
  if (host.contains("memory_gib")) {
    machine += ", " + FormatBenchCell(host["memory_gib"], 1) + " GiB";
  }
  const std::string created = j.value("created", std::string("?"));
  out +=
      "<!-- generated by `gyre bench docs` from the file named above: change the file, not "
      "this text -->\n";
  out += "Measured by `" + command + "` on " + machine + ", " + created.substr(0, 10) + " (gyre " +
         j.value("gyre_version", std::string("?")) + "; [" + shown_path + "](" + shown_path +
         ")).\n";
  const nlohmann::json context = j.value("context", nlohmann::json::object());
  if (!context.empty()) {
    std::string ctx;
    for (const auto& [k, v] : context.items()) {
      ctx += (ctx.empty() ? "" : ", ") + k + " " + FormatBenchCell(v, 3);
    }
    out += "Context: " + ctx + ".\n";
  }
  out += "\n|";
  for (const auto& c : cols) out += " " + Cell(c.header) + " |";
  out += "\n|";
  for (size_t i = 0; i < cols.size(); ++i) out += i == 0 ? "---|" : "---:|";
  out += "\n";
  for (const auto& row : j["results"]) {
    out += "|";
    for (const auto& c : cols) {
      const bool has = row.is_object() && row.contains(c.key);
      out += " " + Cell(has ? FormatBenchCell(row[c.key], c.decimals) : "-") + " |";
    }
    out += "\n";
  }
  return out;
}

// A marker is a line of its own (leading spaces allowed); prose that quotes one is not.
bool IsOpen(const std::string& line) { return StartsWith(TrimString(line), kOpen); }
bool IsClose(const std::string& line) { return TrimString(line) == kClose; }

// Rewrites the blocks of one file's text; *stale counts the blocks that changed.
StatusOr<std::string> Regenerate(const std::string& md_path, const std::string& text, int* stale,
                                 int* blocks) {
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    out += lines[i] + "\n";
    if (IsClose(lines[i])) {
      return InvalidArgument(md_path + ":" + std::to_string(i + 1) + ": " + kClose +
                             " without an opening <!-- gyre-bench: FILE --> marker");
    }
    if (!IsOpen(lines[i])) continue;
    const std::string where = md_path + ":" + std::to_string(i + 1);
    auto d = ParseDirective(lines[i]);
    if (!d.ok()) return InvalidArgument(where + ": " + d.status().message());
    size_t close = i + 1;
    while (close < lines.size() && !IsClose(lines[close]) && !IsOpen(lines[close])) ++close;
    if (close >= lines.size() || !IsClose(lines[close])) {
      return InvalidArgument(where + ": the block has no closing " + kClose + " line");
    }
    auto j = LoadResult(d->path[0] == '/' ? d->path : Dirname(md_path) + "/" + d->path);
    if (!j.ok()) return InvalidArgument(where + ": " + j.status().message());
    auto body = Render(*d, *j, d->path);
    if (!body.ok()) return InvalidArgument(where + ": " + body.status().message());
    std::string old;
    for (size_t k = i + 1; k < close; ++k) old += lines[k] + "\n";
    if (old != *body) {
      ++*stale;
      std::printf("%s: %s\n", where.c_str(), d->path.c_str());
    }
    ++*blocks;
    out += *body + lines[close] + "\n";
    i = close;
  }
  if (!text.empty() && text.back() != '\n') out.pop_back();
  return out;
}

}  // namespace

int RunBenchDocs(const std::vector<std::string>& args) {
  bool check = false;
  std::vector<std::string> files;
  auto app = NewCommand("gyre bench docs",
                        "Regenerates the benchmark tables of Markdown files from result files.",
                        kDocsDetails);
  app->add_option("FILE.md", files, "the Markdown files")->required()->default_str("");
  app->add_flag("--check", check, "change nothing; list the blocks that differ from their files");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  // Every file is regenerated in memory first: one bad block writes nothing anywhere.
  std::vector<std::pair<std::string, std::string>> updates;
  int stale = 0, blocks = 0;
  for (const auto& f : files) {
    auto text = ReadFileToString(f);
    if (!text.ok()) {
      std::fprintf(stderr, "gyre bench docs: %s\n", text.status().message().c_str());
      return 2;
    }
    const int before = stale;
    auto out = Regenerate(f, *text, &stale, &blocks);
    if (!out.ok()) {
      std::fprintf(stderr, "gyre bench docs: %s (nothing written)\n",
                   out.status().message().c_str());
      return 2;
    }
    if (stale > before) updates.emplace_back(f, *out);
  }
  if (check) {
    std::printf("%d block(s) in %zu file(s), %d stale%s\n", blocks, files.size(), stale,
                stale > 0 ? ": run gyre bench docs without --check to regenerate them" : "");
    return stale > 0 ? 1 : 0;
  }
  for (const auto& [path, text] : updates) {
    if (Status s = WriteFileAtomic(path, text); !s.ok()) {
      std::fprintf(stderr, "gyre bench docs: %s\n", s.message().c_str());
      return 2;
    }
  }
  std::printf("%d block(s) in %zu file(s), %d regenerated\n", blocks, files.size(), stale);
  return 0;
}

}  // namespace gyre::bench
