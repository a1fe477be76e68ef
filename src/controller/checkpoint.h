#pragma once
// Resumable checkpoints: the on-disk layout, the controller's part of the state, and the atomic
// commit (docs/checkpoints.md).
//
//   <run_dir>/checkpoints/step-000042/   one complete checkpoint, after GRPO step 42
//     controller.json     progress: GRPO step, policy version, next group id, problem stream
//                         position and generator state, results so far, data fingerprints, and
//                         the size, CRC-32 and counts of carried_groups.pb
//     carried_groups.pb   partial rollouts: the groups carried over to the next step;
//                         rollout.async: the admitted groups not yet trained
//                         (v1::CarriedGroups; empty otherwise)
//     config.yaml         the effective job config it was written under
//     metrics.jsonl       the run's metrics up to this checkpoint
//     trainer/            the trainer's state (trainer/trainer_state.h)
//
// A checkpoint is written into step-000042.tmp/, fsynced, and renamed: a directory named
// step-NNNNNN is complete, and a .tmp directory is an unfinished write that resuming ignores.
// The newest checkpoint is the one with the highest step. Functions here are plain file I/O with
// no shared state; the job runner calls them from its one thread.

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/sample_ledger.h"
#include "gyre/config.h"
#include "gyre/status.h"
#include "gyre/v1/checkpoint.pb.h"

namespace gyre::controller {

// What the controller needs to continue a job exactly where a checkpoint left it.
struct ControllerState {
  int grpo_step = 0;  // GRPO steps completed; 0 = after the warm-up and the first evaluation
  int64_t policy_version = 0;
  uint64_t next_group_id = 0;  // group ids, and with them the sampling seeds, continue from here
  std::string problem_stream;  // ProblemSource::SaveState
  double accuracy_before_rl = 0;
  double final_mean_reward = 0;
  double wall_seconds = 0;  // job time up to this checkpoint, summed over earlier resumes
  std::map<std::string, std::string> data_fingerprints;  // see DataFingerprints
  std::string config_yaml;                               // config::DumpJobConfig
  std::string metrics_jsonl;                             // the metrics file's content
  // Partial rollouts: the groups in flight between steps (launched, not finished by all their
  // samples), by group id, with everything needed to continue them exactly.
  std::vector<v1::CarriedGroup> carried_groups;
  // The sample ledger's LastSequence() when the checkpoint was written (what a resume rolls the
  // ledger back to); 0 = an empty ledger, -1 = the checkpoint predates the ledger (formats 1
  // and 2).
  int64_t ledger_sequence = 0;
  // rollout.async: groups ever admitted (the admission rule's count), -1 for a synchronous job
  // or a checkpoint from before format 4. carried_groups then holds the admitted groups not yet
  // trained: finished ones (all n samples) and ones never sent (no samples).
  int64_t async_admitted = -1;
  // rollout.budget: the sampling policy's state (SamplingPolicy::SaveState; null = none), and
  // the tokens generated over the GRPO steps so far (trainer.max_generated_tokens). Format 5.
  nlohmann::json sampling_policy;
  int64_t generated_tokens = 0;
  // The controller.json format the state was read from (WriteControllerState writes the
  // newest). Format 1 predates carried_groups and never has any.
  int format_version = 0;
};

// "step-000042".
std::string CheckpointName(int step);
// The step of a complete checkpoint's directory name ("step-000042" -> 42); false for anything
// else, such as "step-000042.tmp".
bool ParseCheckpointName(const std::string& name, int* step);

// The newest complete checkpoint in `checkpoints_dir` (a path), NotFound naming the directory when
// there is none.
StatusOr<std::string> FindLatestCheckpoint(const std::string& checkpoints_dir);

// Writes controller.json, carried_groups.pb, config.yaml and metrics.jsonl of `state` into `dir`
// (fsynced by CommitCheckpoint).
Status WriteControllerState(const std::string& dir, const ControllerState& state);
// Reads them back; a missing file, invalid JSON or a missing or mistyped field is an error naming
// the file. carried_groups.pb must have the size and CRC-32 controller.json records, parse, and
// hold consistent groups (see CheckCarriedGroups); otherwise the error names it and the problem.
StatusOr<ControllerState> ReadControllerState(const std::string& dir);

// Structural checks of carried groups against the rest of the state they were saved with: group
// ids increasing and below next_group_id; each group's samples belong to it (group id, sample id
// in its range, prompt, seed), have one log-prob, kept mass, loss mask and policy version (at
// most policy_version) per response token, finished ones with finish reason stop or length and
// unfinished ones abort, and together are all n samples (or none: a group never started). The
// error names `where` and the group.
Status CheckCarriedGroups(const std::vector<v1::CarriedGroup>& groups, int64_t policy_version,
                          uint64_t next_group_id, const std::string& where);

// Checks that carried groups can continue under `config`: only with rollout.partial_rollouts or
// rollout.async (then with no unfinished samples), with n = rollout.group_size, and unfinished
// responses shorter than rollout.max_new_tokens.
Status CheckCarriedGroupsFit(const std::vector<v1::CarriedGroup>& groups, const JobConfig& config,
                             const std::string& where);

// A fingerprint (size and FNV-1a 64 of the bytes) of each dataset file the job reads
// (data.train_path, data.eval_path), so a resume notices a dataset that changed under it.
StatusOr<std::map<std::string, std::string>> DataFingerprints(const DataSection& data);

// Checks that `current` resumes a checkpoint written under `saved` exactly: every setting that can
// change the results must be equal. Settings that cannot (job.name, job.output_dir,
// job.log_level, trainer.steps, trainer.checkpoint_*, metrics.file, cluster.*) may differ. The
// error names the setting, both values and `where` (the checkpoint's config.yaml).
Status CheckResumeCompatible(const JobConfig& saved, const JobConfig& current,
                             const std::string& where);

// Commits a fully written checkpoint: fsyncs `tmp_dir`, renames it to `final_dir`, fsyncs the
// parent directory, then prunes (PruneCheckpoints) so only the newest `keep_last` remain.
Status CommitCheckpoint(const std::string& tmp_dir, const std::string& final_dir, int keep_last);

// Deletes all but the newest `keep_last` complete checkpoints in `checkpoints_dir`, and any
// unfinished .tmp directory left by an interrupted write.
Status PruneCheckpoints(const std::string& checkpoints_dir, int keep_last);

// Rolls `ledger` back to a checkpoint's ledger_sequence (SampleLedger::RollbackTo), logging the
// events it forgot (those written after the checkpoint).
Status RollBackLedger(SampleLedger* ledger, int64_t sequence);

// The checkpoint a --resume continues from, checked against the job before any worker starts.
struct ResumePoint {
  std::string dir;        // <run_dir>/checkpoints/step-NNNNNN
  ControllerState state;  // its controller.json (and carried groups)
  // The run's ledger, opened and holding at least the events the checkpoint saw; null for a
  // checkpoint written before the ledger existed (the resume starts a new one).
  std::unique_ptr<SampleLedger> ledger;
};

// Finds the newest checkpoint under `run_dir`/checkpoints and checks that `config` can resume
// it exactly: compatible settings (CheckResumeCompatible), GRPO step within trainer.steps,
// unchanged data files, the trainer's part present, carried groups that fit the job, the
// asynchronous state when rollout.async, and a ledger at `ledger_path` no older than the
// checkpoint. Each error names the file and what to fix; nothing is changed on disk.
StatusOr<ResumePoint> OpenResumePoint(const std::string& run_dir, const std::string& ledger_path,
                                      const JobConfig& config);

}  // namespace gyre::controller
