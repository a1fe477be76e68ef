#include "controller/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/file_util.h"
#include "config/config.h"

namespace gyre::controller {

namespace {

constexpr char kFormat[] = "gyre.controller_state";
constexpr int kFormatVersion = 1;
constexpr char kPrefix[] = "step-";
constexpr size_t kDigits = 6;

// Settings that change where or how a run is recorded or connected, never what it computes.
bool ResultNeutral(const std::string& key) {
  static const std::set<std::string> kKeys = {
      "job.name",
      "job.output_dir",
      "job.log_level",
      "trainer.steps",
      "trainer.checkpoint_every",
      "trainer.checkpoint_keep_last",
      "trainer.collective_timeout_s",
      "trainer.overlap_grad_reduce",  // same buckets, same order: the same sums
      "metrics.file",
  };
  return kKeys.count(key) > 0 || key.rfind("cluster.", 0) == 0;
}

// Complete checkpoints in `dir`, sorted by step.
StatusOr<std::vector<std::pair<int, std::string>>> ListCheckpoints(const std::string& dir) {
  GYRE_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::vector<std::pair<int, std::string>> out;
  for (const auto& name : names) {
    int step = 0;
    if (ParseCheckpointName(name, &step) && IsDirectory(dir + "/" + name)) {
      out.emplace_back(step, name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string CheckpointName(int step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%0*d", kPrefix, static_cast<int>(kDigits), step);
  return buf;
}

bool ParseCheckpointName(const std::string& name, int* step) {
  const size_t p = std::string(kPrefix).size();
  if (name.size() < p + kDigits || name.compare(0, p, kPrefix) != 0 || name.size() > p + 9) {
    return false;
  }
  int v = 0;
  for (size_t i = p; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

StatusOr<std::string> FindLatestCheckpoint(const std::string& checkpoints_dir) {
  if (!IsDirectory(checkpoints_dir)) {
    return NotFound("no checkpoints to resume from: " + checkpoints_dir + " does not exist");
  }
  GYRE_ASSIGN_OR_RETURN(auto all, ListCheckpoints(checkpoints_dir));
  if (all.empty()) {
    return NotFound("no complete checkpoint to resume from in " + checkpoints_dir);
  }
  return checkpoints_dir + "/" + all.back().second;
}

Status WriteControllerState(const std::string& dir, const ControllerState& s) {
  nlohmann::json j = {{"format", kFormat},
                      {"format_version", kFormatVersion},
                      {"grpo_step", s.grpo_step},
                      {"policy_version", s.policy_version},
                      {"next_group_id", s.next_group_id},
                      {"problem_stream", s.problem_stream},
                      {"accuracy_before_rl", s.accuracy_before_rl},
                      {"final_mean_reward", s.final_mean_reward},
                      {"wall_seconds", s.wall_seconds},
                      {"data_fingerprints", s.data_fingerprints}};
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/controller.json", j.dump(1) + "\n"));
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.yaml", s.config_yaml));
  return WriteFileAtomic(dir + "/metrics.jsonl", s.metrics_jsonl);
}

StatusOr<ControllerState> ReadControllerState(const std::string& dir) {
  const std::string path = dir + "/controller.json";
  GYRE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": not valid JSON: " + e.what());
  }
  auto bad = [&](const std::string& why) { return InvalidArgument(path + ": " + why); };
  if (!j.is_object() || j.value("format", "") != kFormat) {
    return bad(std::string("not a controller state (expected \"format\": \"") + kFormat + "\")");
  }
  if (!j["format_version"].is_number_integer() ||
      j["format_version"].get<int>() != kFormatVersion) {
    return bad("unsupported format_version " + j["format_version"].dump() + " (this build reads " +
               std::to_string(kFormatVersion) + ")");
  }
  ControllerState s;
  auto need_int = [&](const char* key) -> Status {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0) {
      return bad(std::string("\"") + key + "\" must be a non-negative integer");
    }
    return Status::Ok();
  };
  auto need_number = [&](const char* key) -> Status {
    if (!j.contains(key) || !j[key].is_number()) {
      return bad(std::string("\"") + key + "\" must be a number");
    }
    return Status::Ok();
  };
  for (const char* key : {"grpo_step", "policy_version", "next_group_id"}) {
    GYRE_RETURN_IF_ERROR(need_int(key));
  }
  for (const char* key : {"accuracy_before_rl", "final_mean_reward", "wall_seconds"}) {
    GYRE_RETURN_IF_ERROR(need_number(key));
  }
  if (!j.contains("problem_stream") || !j["problem_stream"].is_string()) {
    return bad("\"problem_stream\" must be a string");
  }
  if (!j.contains("data_fingerprints") || !j["data_fingerprints"].is_object()) {
    return bad("\"data_fingerprints\" must be an object");
  }
  if (j["grpo_step"].get<int64_t>() > 1000000000) return bad("\"grpo_step\" is out of range");
  s.grpo_step = j["grpo_step"].get<int>();
  s.policy_version = j["policy_version"].get<int64_t>();
  s.next_group_id = j["next_group_id"].get<uint64_t>();
  s.problem_stream = j["problem_stream"].get<std::string>();
  s.accuracy_before_rl = j["accuracy_before_rl"].get<double>();
  s.final_mean_reward = j["final_mean_reward"].get<double>();
  s.wall_seconds = j["wall_seconds"].get<double>();
  for (const auto& [k, v] : j["data_fingerprints"].items()) {
    if (!v.is_string()) return bad("data_fingerprints." + k + " must be a string");
    s.data_fingerprints[k] = v.get<std::string>();
  }
  GYRE_ASSIGN_OR_RETURN(s.config_yaml, ReadFileToString(dir + "/config.yaml"));
  GYRE_ASSIGN_OR_RETURN(s.metrics_jsonl, ReadFileToString(dir + "/metrics.jsonl"));
  return s;
}

StatusOr<std::map<std::string, std::string>> DataFingerprints(const DataSection& data) {
  std::map<std::string, std::string> out;
  for (const auto& [key, path] :
       {std::make_pair("data.train_path", data.train_path), {"data.eval_path", data.eval_path}}) {
    if (path.empty()) continue;
    GYRE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
    uint64_t h = 14695981039346656037ULL;  // FNV-1a 64
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    out[key] = std::to_string(bytes.size()) + " bytes, fnv1a64 " + Hex64(h);
  }
  return out;
}

Status CheckResumeCompatible(const JobConfig& saved, const JobConfig& current,
                             const std::string& where) {
  const auto a = config::ConfigValues(saved);
  const auto b = config::ConfigValues(current);
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (ResultNeutral(a[i].first) || a[i].second == b[i].second) continue;
    return FailedPrecondition(where + ": the checkpoint was written with " + a[i].first + ": " +
                              a[i].second + ", this job has " + b[i].second +
                              "; resuming must keep every setting that changes the results "
                              "(docs/checkpoints.md)");
  }
  return Status::Ok();
}

Status CommitCheckpoint(const std::string& tmp_dir, const std::string& final_dir, int keep_last) {
  GYRE_RETURN_IF_ERROR(SyncDirectory(tmp_dir));
  if (PathExists(final_dir)) GYRE_RETURN_IF_ERROR(RemoveTree(final_dir));
  GYRE_RETURN_IF_ERROR(RenamePath(tmp_dir, final_dir));
  const std::string parent = final_dir.substr(0, final_dir.rfind('/'));
  GYRE_RETURN_IF_ERROR(SyncPath(parent));
  return PruneCheckpoints(parent, keep_last);
}

Status PruneCheckpoints(const std::string& checkpoints_dir, int keep_last) {
  GYRE_ASSIGN_OR_RETURN(auto all, ListCheckpoints(checkpoints_dir));
  for (size_t i = 0; i + static_cast<size_t>(std::max(keep_last, 1)) < all.size(); ++i) {
    GYRE_RETURN_IF_ERROR(RemoveTree(checkpoints_dir + "/" + all[i].second));
  }
  GYRE_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(checkpoints_dir));
  for (const auto& name : names) {
    int step = 0;
    const size_t n = name.size();
    if (n > 4 && name.compare(n - 4, 4, ".tmp") == 0 &&
        ParseCheckpointName(name.substr(0, n - 4), &step)) {
      GYRE_RETURN_IF_ERROR(RemoveTree(checkpoints_dir + "/" + name));
    }
  }
  return SyncPath(checkpoints_dir);
}

}  // namespace gyre::controller
