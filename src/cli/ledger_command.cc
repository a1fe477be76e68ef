// `gyre ledger`: where a sample is, and which prompts were trained how often, from the run's
// sample ledger. Read-only; safe while the job runs (SQLite WAL readers do not block it).

#include "cli/ledger_command.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "controller/sample_ledger.h"

namespace gyre::cli {

namespace {

using controller::SampleLedger;
using controller::SampleState;
using controller::SampleStateName;

constexpr char kUsage[] =
    "usage: gyre ledger RUN_DIR [--sample ID | --prompts | --state STATE] [--top N] [--json]\n"
    "\n"
    "Reads the sample ledger of a run (RUN_DIR/ledger.db; RUN_DIR is job.output_dir/job.name,\n"
    "or the ledger file itself). Every training sample moves queued -> generating -> finished\n"
    "-> scored -> trained, or ends filtered or dropped with a reason (docs/checkpoints.md).\n"
    "\n"
    "  (no option)     how many samples are in each state, and the newest event\n"
    "  --sample ID     where sample ID is, and every move it made (step, version, worker)\n"
    "  --prompts       which prompts were trained how often, most trained first\n"
    "  --state STATE   the samples in STATE (queued, generating, finished, scored, trained,\n"
    "                  filtered, dropped), with their last move's reason\n"
    "  --top N         at most N rows for --prompts and --state (default 20; 0 = all)\n"
    "  --json          one JSON document instead of a table\n"
    "\n"
    "Exit status: 0, 1 when the ledger cannot be read or the sample is unknown, 2 on a usage\n"
    "error.\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "gyre ledger: %s (see gyre ledger --help)\n", msg.c_str());
  return 2;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "gyre ledger: %s\n", s.message().c_str());
  return 1;
}

bool ParseState(const std::string& name, SampleState* out) {
  for (int i = 0; i <= static_cast<int>(SampleState::kDropped); ++i) {
    if (name == SampleStateName(static_cast<SampleState>(i))) {
      *out = static_cast<SampleState>(i);
      return true;
    }
  }
  return false;
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
  std::string run_dir, sample_arg, state_arg;
  bool prompts = false, json = false;
  int64_t top = 20;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--sample") {
      if (!value(&sample_arg)) return Usage("--sample needs an ID");
    } else if (a == "--state") {
      if (!value(&state_arg)) return Usage("--state needs a STATE");
    } else if (a == "--prompts") {
      prompts = true;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--top") {
      std::string v;
      if (!value(&v)) return Usage("--top needs N");
      char* end = nullptr;
      top = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || top < 0) return Usage("--top needs N >= 0, not '" + v + "'");
    } else if (!a.empty() && a[0] == '-') {
      return Usage("unknown option '" + a + "'");
    } else if (run_dir.empty()) {
      run_dir = a;
    } else {
      return Usage("unexpected argument '" + a + "'");
    }
  }
  if (run_dir.empty()) return Usage("missing RUN_DIR");
  if (static_cast<int>(!sample_arg.empty()) + static_cast<int>(prompts) +
          static_cast<int>(!state_arg.empty()) >
      1) {
    return Usage("--sample, --prompts and --state are alternatives");
  }
  SampleState state = SampleState::kQueued;
  if (!state_arg.empty() && !ParseState(state_arg, &state)) {
    return Usage("unknown state '" + state_arg +
                 "' (queued, generating, finished, scored, trained, filtered, dropped)");
  }
  uint64_t sample_id = 0;
  if (!sample_arg.empty()) {
    char* end = nullptr;
    sample_id = std::strtoull(sample_arg.c_str(), &end, 10);
    if (*end != '\0' || sample_arg[0] == '-') {
      return Usage("--sample needs a sample id (a number), not '" + sample_arg + "'");
    }
  }
  const std::string path = IsDirectory(run_dir) ? run_dir + "/ledger.db" : run_dir;
  if (!PathExists(path)) {
    return Fail(NotFound(path + ": no sample ledger here (a run directory holds ledger.db once "
                                "its job has started)"));
  }
  auto opened = SampleLedger::Open(path, false);
  if (!opened.ok()) return Fail(opened.status());
  SampleLedger& ledger = **opened;
  const auto limit = [&](size_t n) { return top == 0 ? n : std::min<size_t>(n, top); };

  if (!sample_arg.empty()) {
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

  if (!state_arg.empty()) {
    auto recs = ledger.InState(state);
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
                  nlohmann::json({{"state", state_arg}, {"samples", recs->size()}, {"rows", rows}})
                      .dump(2)
                      .c_str());
      return 0;
    }
    std::printf("%zu samples %s\n", recs->size(), state_arg.c_str());
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
