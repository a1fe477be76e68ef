// Reading a job file: the YAML documents, walking their maps into a JobConfig, --set overrides,
// and suggestions for misspelt keys. Errors carry where the problem is (file:line:column or
// "--set"); see config.h.

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/check.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/strings.h"
#include "config/config_internal.h"

namespace gyre::config {
namespace {

using internal::DescribeNode;
using internal::Field;
using internal::FieldType;
using internal::FindField;
using internal::FindProblem;
using internal::ListText;
using internal::Problem;
using internal::SetField;
using internal::Table;

// ---------------------------------------------------------------------------------------------
// Renamed keys and sections.
// ---------------------------------------------------------------------------------------------

// The old spelling of a renamed field, still read from files and --set. Each old key took a single
// string and its field is now a string list: "" reads as the empty list, anything else as a
// one-element list.
struct Alias {
  const char* key;     // the deprecated spelling
  const char* target;  // the string-list field it sets
};
constexpr Alias kAliases[] = {
    {"rollout.stop_string", "rollout.stop_strings"},
};

const Alias* FindAlias(const std::string& key) {
  for (const Alias& a : kAliases) {
    if (key == a.key) return &a;
  }
  return nullptr;
}

// Sets the list field an alias stands for from the alias's single string.
Status SetAlias(const Alias& a, const YAML::Node& node, JobConfig* cfg) {
  const Field* f = FindField(a.target);
  GYRE_CHECK(f != nullptr && f->type == FieldType::kStringList) << a.key << " -> " << a.target;
  if (!node.IsNull() && !node.IsScalar()) {
    return InvalidArgument(std::string(a.key) + ": expected a string, got " + DescribeNode(node) +
                           " (" + a.key + " is the deprecated single-string spelling; write a " +
                           "list as " + a.target + ")");
  }
  std::vector<std::string> v;
  if (node.IsScalar() && !node.Scalar().empty()) v.push_back(node.Scalar());
  *std::get<std::vector<std::string>*>(f->get(*cfg)) = std::move(v);
  return Status::Ok();
}

// Sections are the proper dotted prefixes of keys: "rollout", "rollout.sampling", ...
const std::vector<std::string>& Sections() {
  static const std::vector<std::string>* sections = [] {
    auto* out = new std::vector<std::string>;
    std::set<std::string> seen;
    for (const Field& f : Table()) {
      for (size_t dot = f.key.find('.'); dot != std::string::npos; dot = f.key.find('.', dot + 1)) {
        std::string prefix = f.key.substr(0, dot);
        if (seen.insert(prefix).second) out->push_back(prefix);
      }
    }
    return out;
  }();
  return *sections;
}

bool IsSection(const std::string& name) {
  for (const std::string& s : Sections()) {
    if (s == name) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Unknown-key suggestions.
// ---------------------------------------------------------------------------------------------

std::string LastComponent(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// The nearest candidate by whole dotted name, else by last component ("tmperature" finds
// "rollout.sampling.temperature" even though the dotted names are far apart).
std::string NearestKey(const std::string& key, const std::vector<std::string>& candidates) {
  std::string near = NearestWord(key, candidates);
  if (!near.empty()) return near;
  std::vector<std::string> lasts;
  lasts.reserve(candidates.size());
  for (const std::string& c : candidates) lasts.push_back(LastComponent(c));
  std::string last = NearestWord(LastComponent(key), lasts);
  if (last.empty()) return "";
  for (size_t i = 0; i < lasts.size(); ++i) {
    if (lasts[i] == last) return candidates[i];
  }
  return "";
}

// "; did you mean 'x'?" or "". Looks in the innermost known section of `key` first, then
// everywhere.
std::string Suggestion(const std::string& key) {
  std::string parent;
  for (const std::string& s : Sections()) {
    if (StartsWith(key, s + ".") && s.size() > parent.size()) parent = s;
  }
  // The sections that contain `key` are never a useful answer ("rollout.lr" is not a typo of
  // "rollout"), though they are close by edit distance.
  std::vector<std::string> all;
  for (const std::string& s : Sections()) {
    if (!StartsWith(key, s + ".")) all.push_back(s);
  }
  for (const Field& f : Table()) all.push_back(f.key);
  std::string near;
  if (!parent.empty()) {
    std::vector<std::string> local;
    for (const std::string& c : all) {
      if (StartsWith(c, parent + ".")) local.push_back(c);
    }
    near = NearestKey(key, local);
  }
  if (near.empty()) near = NearestKey(key, all);
  return near.empty() ? "" : "; did you mean '" + near + "'?";
}

// ---------------------------------------------------------------------------------------------
// YAML walking.
// ---------------------------------------------------------------------------------------------

std::string LineCol(const YAML::Mark& m) {
  return std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::string Where(const std::string& source, const YAML::Mark& m) {
  if (m.is_null() || m.line < 0) return source;
  return source + ":" + LineCol(m);
}

// Where each document of a YAML stream starts and where its root node is. Used to count
// documents instead of YAML::LoadAll, which in yaml-cpp 0.7 (Debian 12) loops forever, allocating,
// on input such as a lone "," (jbeder/yaml-cpp#1040, fixed upstream by #1319): the parser reports
// the same empty document again and again without consuming anything.
class DocumentMarks final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts, roots;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnMapEnd() override {}

 private:
  void Node(const YAML::Mark& mark) {
    if (roots.size() < starts.size()) roots.push_back(mark);
  }
};

struct ParseState {
  std::string source;
  JobConfig cfg;
  std::map<std::string, YAML::Mark> seen;  // every dotted key set in the file -> its key's mark
  std::map<std::string, std::string> spelled_as;  // field key -> the alias that set it
};

Status WalkMap(const YAML::Node& map, const std::string& prefix, ParseState* st) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    // Copies, not references: yaml-cpp's `it->` returns a temporary proxy.
    const YAML::Node k = it->first;
    const YAML::Node v = it->second;
    if (!k.IsScalar()) {
      return InvalidArgument(Where(st->source, k.Mark()) + ": expected a key name, got " +
                             DescribeNode(k));
    }
    // Dotted keys ("sampling.top_p: 0.9") are accepted too, like in --set.
    const std::string key = prefix.empty() ? k.Scalar() : prefix + "." + k.Scalar();
    const Alias* alias = FindAlias(key);
    // An alias and its field are one setting: setting both is a duplicate too.
    const std::string field_key = alias != nullptr ? alias->target : key;
    // yaml-cpp keeps duplicate keys; YAML forbids them, and silently taking one would hide a typo.
    auto [prev, inserted] = st->seen.emplace(field_key, k.Mark());
    if (!inserted) {
      auto first = st->spelled_as.find(field_key);
      const std::string first_key = first != st->spelled_as.end() ? first->second : field_key;
      if (first_key == key) {
        return InvalidArgument(Where(st->source, k.Mark()) + ": duplicate key '" + key +
                               "' (first set at " + LineCol(prev->second) + ")");
      }
      return InvalidArgument(Where(st->source, k.Mark()) + ": duplicate key '" + key + "': '" +
                             first_key + "' (set at " + LineCol(prev->second) +
                             ") is the same setting; keep only " + field_key);
    }
    // A null value has no useful mark of its own (yaml-cpp points at the next token).
    YAML::Mark at = v.IsNull() ? k.Mark() : v.Mark();
    if (alias != nullptr) {
      st->spelled_as[field_key] = key;
      Status s = SetAlias(*alias, v, &st->cfg);
      if (!s.ok()) return s.WithContext(Where(st->source, at));
      if (v.IsScalar() && !v.Scalar().empty()) {
        GYRE_LOG_WARN("{}: {} is deprecated; write {}: {}", Where(st->source, k.Mark()), key,
                      field_key, ListText({v.Scalar()}));
      }
    } else if (const Field* f = FindField(key)) {
      Status s = SetField(*f, v, &st->cfg, &at);
      if (!s.ok()) return s.WithContext(Where(st->source, at));
    } else if (IsSection(key)) {
      if (v.IsNull()) continue;  // "sampling:" with nothing under it keeps the defaults
      if (!v.IsMap()) {
        return InvalidArgument(Where(st->source, v.Mark()) + ": " + key +
                               ": expected a map of settings, got " + DescribeNode(v));
      }
      GYRE_RETURN_IF_ERROR(WalkMap(v, key, st));
    } else {
      return InvalidArgument(Where(st->source, k.Mark()) + ": unknown key '" + key + "'" +
                             Suggestion(key));
    }
  }
  return Status::Ok();
}

Status ApplyOverrideImpl(JobConfig* cfg, const std::string& key_eq_value, std::string* key_out) {
  size_t eq = key_eq_value.find('=');
  std::string key = TrimString(key_eq_value.substr(0, eq));
  if (eq == std::string::npos || key.empty()) {
    return InvalidArgument("--set: expected key=value (e.g. trainer.steps=10), got '" +
                           key_eq_value + "'");
  }
  const std::string text = key_eq_value.substr(eq + 1);
  YAML::Node value;
  auto load = [&]() -> Status {
    try {
      value = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return InvalidArgument("--set: " + key + ": cannot read '" + text +
                             "' as a YAML value: " + e.msg);
    }
    return Status::Ok();
  };
  if (const Alias* alias = FindAlias(key)) {
    *key_out = alias->target;
    GYRE_RETURN_IF_ERROR(load());
    GYRE_RETURN_IF_ERROR(SetAlias(*alias, value, cfg).WithContext("--set"));
    if (value.IsScalar() && !value.Scalar().empty()) {
      GYRE_LOG_WARN("--set: {} is deprecated; write {}={}", key, alias->target,
                    ListText({value.Scalar()}));
    }
    return Status::Ok();
  }
  *key_out = key;
  const Field* f = FindField(key);
  if (f == nullptr) {
    if (IsSection(key)) {
      for (const Field& g : Table()) {
        if (StartsWith(g.key, key + ".")) {
          return InvalidArgument("--set: '" + key + "' is a section; set one of its keys, e.g. '" +
                                 g.key + "'");
        }
      }
    }
    return InvalidArgument("--set: unknown key '" + key + "'" + Suggestion(key));
  }
  GYRE_RETURN_IF_ERROR(load());
  return SetField(*f, value, cfg).WithContext("--set");
}

}  // namespace

Status ApplyOverride(JobConfig* cfg, const std::string& key_eq_value) {
  std::string key;
  return ApplyOverrideImpl(cfg, key_eq_value, &key);
}

StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text, const std::string& source_name,
                                   const std::vector<std::string>& overrides) {
  ParseState st;
  st.source = source_name;
  try {
    // Count the documents (up to two) first; then load the first one.
    std::istringstream stream(yaml_text);
    YAML::Parser parser(stream);
    DocumentMarks marks;
    while (marks.starts.size() < 2 && parser.HandleNextDocument(marks)) {
    }
    if (marks.starts.size() > 1 && marks.starts[1].pos == marks.starts[0].pos) {
      const size_t pos = marks.starts[0].pos > 0 ? static_cast<size_t>(marks.starts[0].pos) : 0;
      return InvalidArgument(Where(source_name, marks.starts[0]) + ": invalid YAML: unexpected '" +
                             yaml_text.substr(pos, 1) + "'");
    }
    if (marks.starts.size() > 1) {
      const YAML::Mark& second = marks.roots.size() > 1 ? marks.roots[1] : marks.starts[1];
      return InvalidArgument(Where(source_name, second) +
                             ": a job file holds one YAML document; found a second one here");
    }
    std::vector<YAML::Node> docs;
    if (!marks.starts.empty()) docs.push_back(YAML::Load(yaml_text));
    // No document (empty or comments only) or an explicit null: all defaults.
    if (!docs.empty() && !docs[0].IsNull()) {
      if (!docs[0].IsMap()) {
        return InvalidArgument(Where(source_name, docs[0].Mark()) +
                               ": expected a map of sections (job, model, data, ...), got " +
                               DescribeNode(docs[0]));
      }
      GYRE_RETURN_IF_ERROR(WalkMap(docs[0], "", &st));
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(Where(source_name, e.mark) + ": invalid YAML: " + e.msg);
  }

  std::set<std::string> overridden;
  for (const std::string& o : overrides) {
    std::string key;
    GYRE_RETURN_IF_ERROR(ApplyOverrideImpl(&st.cfg, o, &key));
    overridden.insert(key);
  }

  if (std::optional<Problem> p = FindProblem(st.cfg)) {
    // Point at whoever set one of the conflicting fields: a --set wins (it was applied last),
    // then the first of them found in the file; all defaults leaves just the file name.
    std::string where = source_name;
    bool found = false;
    for (const std::string& k : p->keys) {
      if (overridden.count(k)) {
        where = "--set";
        found = true;
        break;
      }
    }
    for (size_t i = 0; !found && i < p->keys.size(); ++i) {
      auto it = st.seen.find(p->keys[i]);
      if (it != st.seen.end()) {
        where = Where(source_name, it->second);
        found = true;
      }
    }
    return InvalidArgument(where + ": " + p->message);
  }
  return std::move(st.cfg);
}

StatusOr<JobConfig> LoadJobConfigFile(const std::string& path,
                                      const std::vector<std::string>& overrides) {
  if (!PathExists(path)) {
    return NotFound("job config file '" + path + "' does not exist");
  }
  if (IsDirectory(path)) {
    return InvalidArgument("job config '" + path + "' is a directory, not a YAML file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFound("cannot open job config file '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return NotFound("cannot read job config file '" + path + "': " + std::strerror(errno));
  }
  return ParseJobConfig(text.str(), path, overrides);
}

}  // namespace gyre::config
