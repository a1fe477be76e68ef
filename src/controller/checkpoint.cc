#include "controller/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/crc32.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "config/config.h"

namespace gyre::controller {

namespace {

constexpr char kFormat[] = "gyre.controller_state";
// 2 added carried_groups (partial rollouts); 1 is still read, as a state with none.
// 3 added ledger_sequence (the sample ledger); 1 and 2 are read as states without a ledger.
// 4 added async_admitted (rollout.async); older ones are read with -1.
constexpr int kFormatVersion = 5;
constexpr int kOldestFormatVersion = 1;
constexpr char kCarriedFile[] = "carried_groups.pb";
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
      "trainer.overlap_grad_reduce",    // same buckets, same order: the same sums
      "trainer.reshard_after_forward",  // the same gathered values either way
      // The same global mini-batches and update up to summation order: a checkpoint loads onto
      // any number of trainers, sharded or not (trainer/trainer_state.h reshards the moments).
      "trainer.workers",
      "trainer.shard",
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

std::string Hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", static_cast<unsigned>(v));
  return buf;
}

// Unfinished samples, and their response tokens, over all carried groups.
void CountUnfinished(const std::vector<v1::CarriedGroup>& groups, int64_t* samples,
                     int64_t* tokens) {
  *samples = *tokens = 0;
  for (const v1::CarriedGroup& g : groups) {
    *samples += g.unfinished_size();
    for (const v1::Sample& u : g.unfinished()) *tokens += u.response_ids_size();
  }
}

// Reads carried_groups.pb of a checkpoint in `dir` and checks it against the manifest in
// controller.json (`manifest`, its "carried_groups" object) and against the rest of the state.
StatusOr<std::vector<v1::CarriedGroup>> ReadCarriedGroups(const std::string& dir,
                                                          const nlohmann::json& manifest,
                                                          const ControllerState& state) {
  const std::string json_path = dir + "/controller.json";
  const std::string path = dir + "/" + kCarriedFile;
  if (!manifest.is_object()) {
    return InvalidArgument(json_path + ": \"carried_groups\" must be an object");
  }
  std::map<std::string, int64_t> want;
  for (const char* key : {"groups", "unfinished_samples", "unfinished_tokens", "bytes"}) {
    if (!manifest.contains(key) || !manifest[key].is_number_integer() ||
        manifest[key].get<int64_t>() < 0) {
      return InvalidArgument(json_path + ": \"carried_groups." + key +
                             "\" must be a non-negative integer");
    }
    want[key] = manifest[key].get<int64_t>();
  }
  if (!manifest.contains("crc32") || !manifest["crc32"].is_string() ||
      manifest["crc32"].get<std::string>().size() != 8) {
    return InvalidArgument(json_path + ": \"carried_groups.crc32\" must be 8 hex digits");
  }
  const std::string want_crc = manifest["crc32"].get<std::string>();
  GYRE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  if (static_cast<int64_t>(bytes.size()) != want["bytes"]) {
    return InvalidArgument(path + ": " + std::to_string(bytes.size()) +
                           " bytes, but controller.json records " + std::to_string(want["bytes"]) +
                           " (a truncated or replaced file)");
  }
  const std::string crc = Hex32(Crc32(bytes.data(), bytes.size()));
  if (crc != want_crc) {
    return InvalidArgument(path + ": CRC-32 " + crc + ", but controller.json records " + want_crc +
                           " (the file is corrupt)");
  }
  v1::CarriedGroups parsed;
  if (!parsed.ParseFromString(bytes)) {
    return InvalidArgument(path + ": not a valid gyre.v1.CarriedGroups record");
  }
  std::vector<v1::CarriedGroup> groups(parsed.groups().begin(), parsed.groups().end());
  int64_t samples = 0, tokens = 0;
  CountUnfinished(groups, &samples, &tokens);
  if (static_cast<int64_t>(groups.size()) != want["groups"] ||
      samples != want["unfinished_samples"] || tokens != want["unfinished_tokens"]) {
    return InvalidArgument(path + ": holds " + std::to_string(groups.size()) + " groups with " +
                           std::to_string(samples) + " unfinished samples of " +
                           std::to_string(tokens) + " tokens, but controller.json records " +
                           std::to_string(want["groups"]) + ", " +
                           std::to_string(want["unfinished_samples"]) + " and " +
                           std::to_string(want["unfinished_tokens"]));
  }
  GYRE_RETURN_IF_ERROR(CheckCarriedGroups(groups, state.policy_version, state.next_group_id, path));
  return groups;
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
  v1::CarriedGroups carried;
  for (const v1::CarriedGroup& g : s.carried_groups) *carried.add_groups() = g;
  std::string carried_bytes;
  if (!carried.SerializeToString(&carried_bytes)) {
    return Internal("cannot serialize the carried groups of " + dir);
  }
  int64_t unfinished_samples = 0, unfinished_tokens = 0;
  CountUnfinished(s.carried_groups, &unfinished_samples, &unfinished_tokens);
  const nlohmann::json manifest = {
      {"groups", s.carried_groups.size()},
      {"unfinished_samples", unfinished_samples},
      {"unfinished_tokens", unfinished_tokens},
      {"bytes", carried_bytes.size()},
      {"crc32", Hex32(Crc32(carried_bytes.data(), carried_bytes.size()))}};
  nlohmann::json j = {{"format", kFormat},
                      {"format_version", kFormatVersion},
                      {"grpo_step", s.grpo_step},
                      {"policy_version", s.policy_version},
                      {"next_group_id", s.next_group_id},
                      {"problem_stream", s.problem_stream},
                      {"accuracy_before_rl", s.accuracy_before_rl},
                      {"final_mean_reward", s.final_mean_reward},
                      {"wall_seconds", s.wall_seconds},
                      {"data_fingerprints", s.data_fingerprints},
                      {"carried_groups", manifest},
                      {"ledger_sequence", s.ledger_sequence},
                      {"async_admitted", s.async_admitted},
                      {"sampling_policy", s.sampling_policy},
                      {"generated_tokens", s.generated_tokens}};
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kCarriedFile, carried_bytes));
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
  // Not value("format", ""), which throws when "format" is there but is no string.
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
    return bad(std::string("not a controller state (expected \"format\": \"") + kFormat + "\")");
  }
  if (!j["format_version"].is_number_integer() ||
      j["format_version"].get<int64_t>() < kOldestFormatVersion ||
      j["format_version"].get<int64_t>() > kFormatVersion) {
    return bad("unsupported format_version " + j["format_version"].dump() + " (this build reads " +
               std::to_string(kOldestFormatVersion) + " to " + std::to_string(kFormatVersion) +
               ")");
  }
  ControllerState s;
  s.format_version = j["format_version"].get<int>();
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
  if (s.format_version >= 3) {
    GYRE_RETURN_IF_ERROR(need_int("ledger_sequence"));
    s.ledger_sequence = j["ledger_sequence"].get<int64_t>();
  } else {
    s.ledger_sequence = -1;
  }
  if (s.format_version >= 4) {
    if (!j.contains("async_admitted") || !j["async_admitted"].is_number_integer() ||
        j["async_admitted"].get<int64_t>() < -1) {
      return bad("\"async_admitted\" must be -1 (a synchronous job) or a group count");
    }
    s.async_admitted = j["async_admitted"].get<int64_t>();
  } else {
    s.async_admitted = -1;
  }
  if (s.format_version >= 5) {
    // The sampling policy's own state (rollout.budget), checked by the policy on resume.
    if (!j.contains("sampling_policy")) return bad("\"sampling_policy\" is missing");
    s.sampling_policy = j["sampling_policy"];
    GYRE_RETURN_IF_ERROR(need_int("generated_tokens"));
    s.generated_tokens = j["generated_tokens"].get<int64_t>();
  }
  if (s.format_version >= 2) {
    if (!j.contains("carried_groups")) return bad("\"carried_groups\" is missing");
    GYRE_ASSIGN_OR_RETURN(s.carried_groups, ReadCarriedGroups(dir, j["carried_groups"], s));
  }
  GYRE_ASSIGN_OR_RETURN(s.config_yaml, ReadFileToString(dir + "/config.yaml"));
  GYRE_ASSIGN_OR_RETURN(s.metrics_jsonl, ReadFileToString(dir + "/metrics.jsonl"));
  return s;
}

Status CheckCarriedGroups(const std::vector<v1::CarriedGroup>& groups, int64_t policy_version,
                          uint64_t next_group_id, const std::string& where) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const v1::CarriedGroup& cg = groups[i];
    const v1::PromptGroup& g = cg.group();
    const uint64_t gid = g.group_id();
    auto bad = [&](const std::string& why) {
      return InvalidArgument(where + ": carried group " + std::to_string(gid) + ": " + why);
    };
    if (i > 0 && gid <= groups[i - 1].group().group_id()) {
      return InvalidArgument(where + ": carried groups out of order (group " +
                             std::to_string(groups[i - 1].group().group_id()) + " before " +
                             std::to_string(gid) + "; they are kept by increasing group id)");
    }
    if (gid >= next_group_id) {
      return bad("its id is not below next_group_id " + std::to_string(next_group_id));
    }
    if (g.n() < 1) return bad("n is " + std::to_string(g.n()));
    if (g.prompt_ids_size() == 0) return bad("empty prompt");
    const int total = cg.finished_size() + cg.unfinished_size();
    if (total != 0 && total != g.n()) {
      return bad(std::to_string(cg.finished_size()) + " finished and " +
                 std::to_string(cg.unfinished_size()) + " unfinished samples; a started group " +
                 "has all n = " + std::to_string(g.n()));
    }
    std::set<uint64_t> seen;
    auto check = [&](const v1::Sample& s, bool finished, const v1::Sample* before) -> Status {
      const uint64_t sid = s.sample_id();
      const std::string what = "sample " + std::to_string(sid);
      if (s.group_id() != gid) {
        return bad(what + " belongs to group " + std::to_string(s.group_id()));
      }
      if (sid < g.first_sample_id() || sid - g.first_sample_id() >= static_cast<uint64_t>(g.n())) {
        return bad(what + " is outside the group's sample ids " +
                   std::to_string(g.first_sample_id()) + " + [0, " + std::to_string(g.n()) + ")");
      }
      if (!seen.insert(sid).second) return bad(what + " appears twice");
      if (before != nullptr && sid <= before->sample_id()) {
        return bad(what + " after sample " + std::to_string(before->sample_id()) +
                   " (samples are kept by increasing id)");
      }
      if (s.seed() != g.seed() + (sid - g.first_sample_id())) {
        return bad(what + " has seed " + std::to_string(s.seed()) + ", its group gives " +
                   std::to_string(g.seed() + (sid - g.first_sample_id())));
      }
      if (!std::equal(s.prompt_ids().begin(), s.prompt_ids().end(), g.prompt_ids().begin(),
                      g.prompt_ids().end())) {
        return bad(what + " has another prompt than its group");
      }
      const int t = s.response_ids_size();
      if (s.logprobs_size() != t || s.kept_mass_size() != t || s.versions_size() != t ||
          s.loss_mask_size() != t) {
        return bad(what + " has " + std::to_string(t) + " response tokens but " +
                   std::to_string(s.logprobs_size()) + " log-probs, " +
                   std::to_string(s.kept_mass_size()) + " kept masses, " +
                   std::to_string(s.versions_size()) + " versions and " +
                   std::to_string(s.loss_mask_size()) + " loss-mask entries");
      }
      for (int32_t id : s.response_ids()) {
        if (id < 0) return bad(what + " has token id " + std::to_string(id));
      }
      for (int64_t v : s.versions()) {
        if (v < 0 || v > policy_version) {
          return bad(what + " has a token of policy version " + std::to_string(v) +
                     ", outside [0, " + std::to_string(policy_version) + "]");
        }
      }
      const v1::FinishReason r = s.finish_reason();
      if (finished && r != v1::FINISH_REASON_STOP && r != v1::FINISH_REASON_LENGTH) {
        return bad("finished " + what + " has finish reason " + v1::FinishReason_Name(r));
      }
      if (!finished && r != v1::FINISH_REASON_ABORT) {
        return bad("unfinished " + what + " has finish reason " + v1::FinishReason_Name(r));
      }
      return Status::Ok();
    };
    for (int k = 0; k < cg.finished_size(); ++k) {
      GYRE_RETURN_IF_ERROR(check(cg.finished(k), true, k > 0 ? &cg.finished(k - 1) : nullptr));
    }
    for (int k = 0; k < cg.unfinished_size(); ++k) {
      GYRE_RETURN_IF_ERROR(check(cg.unfinished(k), false, k > 0 ? &cg.unfinished(k - 1) : nullptr));
    }
  }
  return Status::Ok();
}

Status CheckCarriedGroupsFit(const std::vector<v1::CarriedGroup>& groups, const JobConfig& config,
                             const std::string& where) {
  if (groups.empty()) return Status::Ok();
  if (!config.rollout.partial_rollouts && !config.rollout.async) {
    return FailedPrecondition(where + ": holds " + std::to_string(groups.size()) +
                              " carried groups, but rollout.partial_rollouts and rollout.async "
                              "are off");
  }
  if (config.rollout.async) {
    // Asynchronous checkpoints hold whole groups: finished, or never sent to a worker.
    for (const v1::CarriedGroup& cg : groups) {
      if (cg.unfinished_size() > 0) {
        return FailedPrecondition(where + ": carried group " +
                                  std::to_string(cg.group().group_id()) + " has " +
                                  std::to_string(cg.unfinished_size()) +
                                  " unfinished samples, which rollout.async cannot continue");
      }
    }
  }
  for (const v1::CarriedGroup& cg : groups) {
    const std::string group = "carried group " + std::to_string(cg.group().group_id());
    if (cg.group().n() != config.rollout.group_size) {
      return FailedPrecondition(
          where + ": " + group + " has n = " + std::to_string(cg.group().n()) +
          ", rollout.group_size is " + std::to_string(config.rollout.group_size));
    }
    for (const v1::Sample& u : cg.unfinished()) {
      if (u.response_ids_size() >= config.rollout.max_new_tokens) {
        return FailedPrecondition(
            where + ": " + group + ": unfinished sample " + std::to_string(u.sample_id()) +
            " already has " + std::to_string(u.response_ids_size()) +
            " tokens, rollout.max_new_tokens is " + std::to_string(config.rollout.max_new_tokens));
      }
    }
  }
  return Status::Ok();
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
  // A cosine schedule spans trainer.steps, so there the step count changes the results too.
  if (saved.trainer.lr_schedule == "cosine" && saved.trainer.steps != current.trainer.steps) {
    return FailedPrecondition(where + ": the checkpoint was written with trainer.steps: " +
                              std::to_string(saved.trainer.steps) + ", this job has " +
                              std::to_string(current.trainer.steps) +
                              "; with trainer.lr_schedule: cosine the learning rate of every "
                              "step depends on it, so a resume must keep it (docs/checkpoints.md)");
  }
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

Status RollBackLedger(SampleLedger* ledger, int64_t sequence) {
  GYRE_ASSIGN_OR_RETURN(const int64_t last, ledger->LastSequence());
  GYRE_RETURN_IF_ERROR(ledger->RollbackTo(sequence));
  if (last > sequence) {
    GYRE_LOG_INFO("ledger: forgot events {}..{}, written after the checkpoint", sequence + 1, last);
  }
  return Status::Ok();
}

StatusOr<ResumePoint> OpenResumePoint(const std::string& run_dir, const std::string& ledger_path,
                                      const JobConfig& cfg) {
  ResumePoint point;
  auto latest = FindLatestCheckpoint(run_dir + "/checkpoints");
  if (!latest.ok()) {
    return Status(latest.status().code(),
                  latest.status().message() +
                      (cfg.trainer.checkpoint_every > 0
                           ? " (the first checkpoint is written after the warm-up)"
                           : " (checkpoints are written with trainer.checkpoint_every > 0)"));
  }
  point.dir = *latest;
  GYRE_ASSIGN_OR_RETURN(point.state, ReadControllerState(point.dir));
  const std::string where = point.dir + "/config.yaml";
  GYRE_ASSIGN_OR_RETURN(JobConfig saved, config::ParseJobConfig(point.state.config_yaml, where));
  GYRE_RETURN_IF_ERROR(CheckResumeCompatible(saved, cfg, where));
  if (point.state.grpo_step > cfg.trainer.steps) {
    return FailedPrecondition(point.dir + " is after GRPO step " +
                              std::to_string(point.state.grpo_step) + ", beyond trainer.steps " +
                              std::to_string(cfg.trainer.steps));
  }
  GYRE_ASSIGN_OR_RETURN(auto fingerprints, DataFingerprints(cfg.data));
  if (fingerprints != point.state.data_fingerprints) {
    return FailedPrecondition(point.dir +
                              "/controller.json: the dataset files changed since the checkpoint "
                              "was written (size or content of data.train_path / data.eval_path)");
  }
  if (!IsDirectory(point.dir + "/trainer")) {
    return NotFound(point.dir + "/trainer: missing (the trainer's part of the checkpoint)");
  }
  if (cfg.rollout.partial_rollouts && point.state.format_version < 2) {
    return FailedPrecondition(point.dir +
                              "/controller.json: written by a Gyre that did not save "
                              "partial-rollout groups (format_version " +
                              std::to_string(point.state.format_version) +
                              "); a job with rollout.partial_rollouts cannot resume it exactly");
  }
  GYRE_RETURN_IF_ERROR(
      CheckCarriedGroupsFit(point.state.carried_groups, cfg, point.dir + "/carried_groups.pb"));
  if (cfg.rollout.async && point.state.async_admitted < 0) {
    return FailedPrecondition(point.dir +
                              "/controller.json: holds no asynchronous rollout state "
                              "(async_admitted), so a job with rollout.async cannot resume it");
  }
  // The ledger must hold at least the events the checkpoint saw; Resume forgets the later ones.
  const int64_t seq = point.state.ledger_sequence;
  if (seq < 0) return point;  // a checkpoint from before the ledger: Resume starts one
  if (!PathExists(ledger_path)) {
    return NotFound(ledger_path + ": missing, but " + point.dir +
                    "/controller.json refers to its event " + std::to_string(seq) +
                    " (the sample ledger is kept beside checkpoints/)");
  }
  GYRE_ASSIGN_OR_RETURN(point.ledger, SampleLedger::Open(ledger_path, false));
  GYRE_ASSIGN_OR_RETURN(const int64_t last, point.ledger->LastSequence());
  if (last < seq) {
    return FailedPrecondition(ledger_path + " ends at event " + std::to_string(last) + ", but " +
                              point.dir + " was written at event " + std::to_string(seq) +
                              " (the ledger is older than the checkpoint)");
  }
  return point;
}

}  // namespace gyre::controller
