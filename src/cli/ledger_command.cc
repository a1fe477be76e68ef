// `gyre ledger`: where a sample is, and which prompts were trained how often, from the run's
// sample ledger. Read-only; safe while the job runs (SQLite WAL readers do not block it).

#include "cli/ledger_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/command_line.h"
#include "common/file_util.h"
#include "controller/sample_ledger.h"

namespace gyre::cli {

namespace {

using controller::SampleLedger;
using controller::SampleState;
using controller::SampleStateName;

constexpr char kLedgerSummary[] =
    "Reads the sample ledger of a run (RUN_DIR/ledger.db; RUN_DIR is job.output_dir/job.name,\n"
    "or the ledger file itself): without an option, how many samples are in each state and the\n"
    "newest event. Every training sample moves queued -> generating -> finished -> scored ->\n"
    "trained, or ends filtered or dropped with a reason (docs/checkpoints.md).";

constexpr char kLedgerDetails[] =
    "Exit status: 0, 1 when the ledger cannot be read or the sample is unknown, 2 on a usage\n"
    "error.";

int Fail(const Status& s) {
  std::fprintf(stderr, "gyre ledger: %s\n", s.message().c_str());
  return 1;
}

// The state named `name`, one of SampleStateName's.
SampleState StateNamed(const std::string& name) {
  int i = 0;
  while (i < static_cast<int>(SampleState::kDropped) &&
         name != SampleStateName(static_cast<SampleState>(i))) {
    ++i;
  }
  return static_cast<SampleState>(i);
}

nlohmann::json ContextJson(const controller::MoveContext& c) {
  nlohmann::json j = nlohmann::json::object();
  if (c.step >= 0) j["step"] = c.step;
  if (c.version >= 0) j["version"] = c.version;
  if (!c.worker.empty()) j["worker"] = c.worker;
  if (!c.reason.empty()) j["reason"] = c.reason;
  return j;
}

std::string ContextText(const controller::MoveContext& c) {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (c.step >= 0) add("step " + std::to_string(c.step));
  if (c.version >= 0) add("policy v" + std::to_string(c.version));
  if (!c.worker.empty()) add(c.worker);
  if (!c.reason.empty()) add(c.reason);
  return out;
}

}  // namespace

int RunLedger(const std::vector<std::string>& args) {
  std::string run_dir, state_name;
  uint64_t sample_id = 0;
  bool prompts = false, json = false;
  int64_t top = 20;
  std::vector<std::string> states;
  for (int i = 0; i <= static_cast<int>(SampleState::kDropped); ++i) {
    states.push_back(SampleStateName(static_cast<SampleState>(i)));
  }
  auto app = NewCommand("gyre ledger", kLedgerSummary, kLedgerDetails);
  app->add_option("RUN_DIR", run_dir, "the run directory, or its ledger.db")->required();
  CLI::Option* sample = app->add_option("--sample", sample_id,
                                        "where sample ID is, and every move it made (step, "
                                        "version, worker)")
                            ->type_name("ID")
                            ->default_str("")
                            ->check(NumberIn(0, kNoUpperBound));
  CLI::Option* prompts_flag =
      app->add_flag("--prompts", prompts, "which prompts were trained how often, most first");
  CLI::Option* state =
      app->add_option("--state", state_name, "the samples in STATE, with their last move's reason")
          ->type_name("STATE")
          ->check(CLI::IsMember(states));
  sample->excludes(prompts_flag)->excludes(state);
  prompts_flag->excludes(state);
  app->add_option("--top", top, "at most N rows for --prompts and --state (0: all)")
      ->type_name("N")
      ->check(NumberIn(0, kNoUpperBound));
  app->add_flag("--json", json, "one JSON document instead of a table");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const std::string path = IsDirectory(run_dir) ? run_dir + "/ledger.db" : run_dir;
  if (!PathExists(path)) {
    return Fail(NotFound(path + ": no sample ledger here (a run directory holds ledger.db once "
                                "its job has started)"));
  }
  auto opened = SampleLedger::Open(path, false);
  if (!opened.ok()) return Fail(opened.status());
  SampleLedger& ledger = **opened;
  const auto limit = [&](size_t n) { return top == 0 ? n : std::min<size_t>(n, top); };

  if (sample->count() > 0) {
    auto rec = ledger.Find(sample_id);
    if (!rec.ok()) return Fail(rec.status());
    auto history = ledger.History(sample_id);
    if (!history.ok()) return Fail(history.status());
    if (json) {
      nlohmann::json events = nlohmann::json::array();
      for (const auto& e : *history) {
        nlohmann::json ej = {{"sequence", e.sequence},
                             {"to", SampleStateName(e.to)},
                             {"context", ContextJson(e.context)}};
        if (e.has_from) ej["from"] = SampleStateName(e.from);
        events.push_back(ej);
      }
      std::printf("%s\n", nlohmann::json({{"sample_id", rec->sample_id},
                                          {"group_id", rec->group_id},
                                          {"prompt", rec->prompt},
                                          {"state", SampleStateName(rec->state)},
                                          {"events", events}})
                              .dump(2)
                              .c_str());
      return 0;
    }
    std::printf("sample %llu (group %llu, prompt %s): %s\n",
                static_cast<unsigned long long>(rec->sample_id),
                static_cast<unsigned long long>(rec->group_id), rec->prompt.c_str(),
                SampleStateName(rec->state));
    for (const auto& e : *history) {
      std::printf("  #%-8lld %-10s -> %-10s %s\n", static_cast<long long>(e.sequence),
                  e.has_from ? SampleStateName(e.from) : "", SampleStateName(e.to),
                  ContextText(e.context).c_str());
    }
    return 0;
  }

  if (prompts) {
    auto usage = ledger.PromptUsage();
    if (!usage.ok()) return Fail(usage.status());
    const size_t n = limit(usage->size());
    if (json) {
      nlohmann::json rows = nlohmann::json::array();
      for (size_t i = 0; i < n; ++i) {
        const auto& u = (*usage)[i];
        rows.push_back({{"prompt", u.prompt},
                        {"samples", u.samples},
                        {"trained", u.trained},
                        {"filtered", u.filtered},
                        {"dropped", u.dropped}});
      }
      std::printf("%s\n",
                  nlohmann::json({{"prompts", usage->size()}, {"rows", rows}}).dump(2).c_str());
      return 0;
    }
    std::printf("%zu prompts; %s\n", usage->size(),
                n < usage->size() ? ("the " + std::to_string(n) + " most trained").c_str()
                                  : "most trained first");
    std::printf("  %8s %8s %8s %8s  %s\n", "samples", "trained", "filtered", "dropped", "prompt");
    for (size_t i = 0; i < n; ++i) {
      const auto& u = (*usage)[i];
      std::printf("  %8lld %8lld %8lld %8lld  %s\n", static_cast<long long>(u.samples),
                  static_cast<long long>(u.trained), static_cast<long long>(u.filtered),
                  static_cast<long long>(u.dropped), u.prompt.c_str());
    }
    return 0;
  }

  if (state->count() > 0) {
    auto recs = ledger.InState(StateNamed(state_name));
    if (!recs.ok()) return Fail(recs.status());
    const size_t n = limit(recs->size());
    if (json) {
      nlohmann::json rows = nlohmann::json::array();
      for (size_t i = 0; i < n; ++i) {
        const auto& r = (*recs)[i];
        rows.push_back({{"sample_id", r.sample_id},
                        {"group_id", r.group_id},
                        {"prompt", r.prompt},
                        {"sequence", r.sequence},
                        {"last", ContextJson(r.last)}});
      }
      std::printf("%s\n",
                  nlohmann::json({{"state", state_name}, {"samples", recs->size()}, {"rows", rows}})
                      .dump(2)
                      .c_str());
      return 0;
    }
    std::printf("%zu samples %s\n", recs->size(), state_name.c_str());
    for (size_t i = 0; i < n; ++i) {
      const auto& r = (*recs)[i];
      std::printf("  sample %-10llu group %-8llu %-24s %s\n",
                  static_cast<unsigned long long>(r.sample_id),
                  static_cast<unsigned long long>(r.group_id), r.prompt.c_str(),
                  ContextText(r.last).c_str());
    }
    if (n < recs->size()) std::printf("  ... %zu more (--top 0 lists all)\n", recs->size() - n);
    return 0;
  }

  auto counts = ledger.Counts();
  if (!counts.ok()) return Fail(counts.status());
  auto last = ledger.LastSequence();
  if (!last.ok()) return Fail(last.status());
  if (json) {
    nlohmann::json by_state = nlohmann::json::object();
    for (int i = 0; i <= static_cast<int>(SampleState::kDropped); ++i) {
      by_state[SampleStateName(static_cast<SampleState>(i))] = counts->by_state[i];
    }
    std::printf("%s\n", nlohmann::json({{"ledger", path},
                                        {"samples", counts->total},
                                        {"last_sequence", *last},
                                        {"by_state", by_state}})
                            .dump(2)
                            .c_str());
    return 0;
  }
  std::printf("%s: %lld samples, newest event #%lld\n", path.c_str(),
              static_cast<long long>(counts->total), static_cast<long long>(*last));
  for (int i = 0; i <= static_cast<int>(SampleState::kDropped); ++i) {
    std::printf("  %-10s %lld\n", SampleStateName(static_cast<SampleState>(i)),
                static_cast<long long>(counts->by_state[i]));
  }
  return 0;
}

}  // namespace gyre::cli
