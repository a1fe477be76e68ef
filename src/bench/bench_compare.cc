// gyre bench compare A.json B.json: which figures of a later run (B) got worse than a reference
// run's (A), beyond noise. Torch-free.

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "bench/bench.h"
#include "common/command_line.h"
#include "common/file_util.h"

namespace gyre::bench {

namespace {

constexpr char kCompareDetails[] =
    "A and B are results of the same benchmark (gyre bench SUBCOMMAND --json FILE; reference\n"
    "results are in bench/baselines/). Rows are matched by the benchmark's key fields; each\n"
    "metric the benchmark declares is compared in the direction that is better for it. A\n"
    "change worse than --threshold (relative; runs on a busy machine vary by several per cent)\n"
    "is a regression. Speedups are measured against a baseline in the same run, so they move\n"
    "less with the machine than absolute times do.\n"
    "\n"
    "Exit status: 0 no regression, 1 regressions (listed), 2 bad input.\n";

StatusOr<nlohmann::json> Load(const std::string& path) {
  GYRE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + " is not JSON");
  if (j.value("schema", "") != "gyre-bench/1") {
    return InvalidArgument(path + " is not a gyre bench result (schema gyre-bench/1; written by " +
                           "gyre bench SUBCOMMAND --json FILE)");
  }
  for (const char* field : {"keys", "metrics", "results"}) {
    if (!j.contains(field)) return InvalidArgument(path + " has no \"" + field + "\"");
  }
  if (!j["results"].is_array() || !j["metrics"].is_object() || !j["keys"].is_array()) {
    return InvalidArgument(path + ": \"results\", \"metrics\" or \"keys\" has the wrong type");
  }
  return j;
}

std::string RowId(const nlohmann::json& row, const nlohmann::json& keys) {
  std::string id;
  for (const auto& k : keys) {
    const std::string key = k.get<std::string>();
    if (!id.empty()) id += " ";
    id +=
        key + "=" +
        (row.contains(key) ? (row[key].is_string() ? row[key].get<std::string>() : row[key].dump())
                           : "?");
  }
  return id.empty() ? "(all)" : id;
}

}  // namespace

int RunBenchCompare(const std::vector<std::string>& args) {
  std::vector<std::string> files(2);
  double threshold = 0.10;
  auto app = NewCommand("gyre bench compare",
                        "The metrics of a later result (B) that are worse than a reference's (A).",
                        kCompareDetails);
  app->add_option("A.json", files[0], "the reference result")->required();
  app->add_option("B.json", files[1], "the later result")->required();
  app->add_option("--threshold", threshold, "the relative change that is a regression")
      ->check(RealRange(0, 100));
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  auto a = Load(files[0]);
  auto b = Load(files[1]);
  for (const auto* r : {&a, &b}) {
    if (!r->ok()) {
      std::fprintf(stderr, "gyre bench compare: %s\n", r->status().message().c_str());
      return 2;
    }
  }
  if ((*a)["benchmark"] != (*b)["benchmark"]) {
    std::fprintf(stderr,
                 "gyre bench compare: %s is benchmark %s, %s is %s: compare like with like\n",
                 files[0].c_str(), (*a)["benchmark"].dump().c_str(), files[1].c_str(),
                 (*b)["benchmark"].dump().c_str());
    return 2;
  }
  const nlohmann::json& keys = (*b)["keys"];
  const nlohmann::json& metrics = (*b)["metrics"];
  std::printf("gyre bench compare: %s (A) -> %s (B), benchmark %s, threshold %.0f%%\n",
              files[0].c_str(), files[1].c_str(), (*b)["benchmark"].get<std::string>().c_str(),
              100 * threshold);
  const std::string cpu_a = (*a)["host"].value("cpu", ""), cpu_b = (*b)["host"].value("cpu", "");
  if (cpu_a != cpu_b) {
    std::printf(
        "note: different CPUs (A: %s; B: %s): absolute figures are not comparable, "
        "speedups against same-run baselines are\n",
        cpu_a.c_str(), cpu_b.c_str());
  }
  // Each file's rows must be told apart by the keys, or rows would be matched arbitrarily.
  for (size_t f = 0; f < 2; ++f) {
    std::map<std::string, int> seen;
    for (const auto& row : (f == 0 ? *a : *b)["results"]) {
      if (++seen[RowId(row, keys)] == 2) {
        std::fprintf(stderr,
                     "gyre bench compare: %s has two rows with %s: its keys do not identify a "
                     "row\n",
                     files[f].c_str(), RowId(row, keys).c_str());
        return 2;
      }
    }
  }
  std::map<std::string, const nlohmann::json*> rows_a;
  for (const auto& row : (*a)["results"]) rows_a[RowId(row, keys)] = &row;
  int regressions = 0, compared = 0, unmatched = 0;
  std::printf("%-44s %-22s %14s %14s %9s  %s\n", "row", "metric", "A", "B", "change", "verdict");
  for (const auto& row : (*b)["results"]) {
    const std::string id = RowId(row, keys);
    auto it = rows_a.find(id);
    if (it == rows_a.end()) {
      ++unmatched;
      continue;
    }
    for (const auto& [metric, direction] : metrics.items()) {
      const nlohmann::json& ra = *it->second;
      if (!ra.contains(metric) || !row.contains(metric) || !ra[metric].is_number() ||
          !row[metric].is_number()) {
        continue;
      }
      const double va = ra[metric].get<double>(), vb = row[metric].get<double>();
      if (!std::isfinite(va) || !std::isfinite(vb) || va == 0) continue;
      ++compared;
      const double change = (vb - va) / std::abs(va);
      const bool higher = direction == "higher";
      const bool worse = higher ? change < -threshold : change > threshold;
      const bool better = higher ? change > threshold : change < -threshold;
      regressions += worse;
      std::printf("%-44s %-22s %14.6g %14.6g %+8.1f%%  %s\n", id.c_str(), metric.c_str(), va, vb,
                  100 * change,
                  worse    ? "REGRESSION"
                  : better ? "improved"
                           : "within noise");
    }
  }
  if (unmatched > 0) std::printf("%d row(s) of B have no match in A\n", unmatched);
  if (compared == 0) {
    std::fprintf(stderr, "gyre bench compare: no row and metric in common\n");
    return 2;
  }
  std::printf("%d comparison(s), %d regression(s) beyond %.0f%%\n", compared, regressions,
              100 * threshold);
  return regressions > 0 ? 1 : 0;
}

}  // namespace gyre::bench
