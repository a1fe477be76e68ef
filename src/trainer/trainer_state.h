#pragma once
// The trainer's resumable state as files in one directory: the trainer's part of a checkpoint
// (docs/checkpoints.md).
//
//   model.safetensors       the weights, float32 (with config.json and, for a Hugging Face model,
//                           its tokenizer files: the directory loads like any HF model)
//   optimizer.safetensors   AdamW moments "exp_avg/<param>" and "exp_avg_sq/<param>", float32,
//                           for every parameter the optimizer has updated (format_version 1)
//   optimizer-rank-R-of-N.safetensors
//                           instead, for a sharded trainer (trainer.shard; format_version 2):
//                           rank R's slice "exp_avg" and "exp_avg_sq" of the flat moment vectors
//                           (sharded_adamw.h), written by that rank; trainer_state.json's
//                           "optimizer_shards" gives N and the element count
//   trainer_state.json      format and version, policy version, each parameter's name, shape and
//                           AdamW step count, and the RNG states (torch's default CPU generator)
//
// With these, a trainer built from the same job config continues bit for bit as the one that
// wrote them. Either layout loads into a sharded or an unsharded trainer, on any number of ranks:
// each rank reads the part of the moments its layout owns (resharding). Not thread-safe: the caller
// serialises access to the trainer (TrainerService's mutex).

#include <string>

#include "gyre/status.h"
#include "trainer/policy_trainer.h"

namespace gyre::trainer {

// Writes the model as a Hugging Face directory into `dir` (which must exist): model.safetensors
// (or shards) and config.json; for a model loaded from `model_path` (non-empty), that
// directory's config.json, generation config and tokenizer files are copied instead of a
// generated config.json, so the result is a drop-in replacement for it. Files are not fsynced.
Status WriteModelDirectory(const std::string& dir, const model::Transformer& model,
                           const std::string& model_path);
// The same for a trainer whose parameters are split (trainer.shard: parameters): every rank
// gathers the model unit by unit (a collective: every rank calls it) and rank 0 streams each
// unit into model.safetensors (one file), so no rank holds the whole model. The other ranks
// write nothing.
Status WriteModelDirectoryFromSlices(const std::string& dir, PolicyTrainer& trainer,
                                     const std::string& model_path);
// WriteModelDirectory without the weights: config.json (or the model's own files) and the
// tokenizer.
Status WriteModelFiles(const std::string& dir, const model::ModelSpec& spec,
                       const std::string& model_path);

// Writes `trainer`'s state into `dir` (created if missing; files of the same names replaced),
// then fsyncs the files and the directory. A trainer whose parameters are split
// (trainer.shard: parameters) writes format 1 (whole tensors, layout-free): every rank gathers
// unit by unit and rank 0 streams the units to the files, never holding the whole model. Data
// parallel: rank 0 writes everything but the other ranks' moment slices; a sharded trainer's other
// ranks write their slice only (every rank must be called, and the checkpoint is complete once all
// returned); an unsharded trainer's other ranks write nothing. `model_path` is the job's
// model.path: a Hugging Face model's config.json and tokenizer files are copied next to the
// weights.
Status SaveTrainerState(const std::string& dir, PolicyTrainer& trainer,
                        const std::string& model_path);

// Restores what SaveTrainerState wrote into `trainer`. Every file is read and checked first
// (format, parameter names, shapes, dtypes, step counts, RNG state size); on any problem nothing
// changes and the error names the file and, where it applies, the tensor.
Status LoadTrainerState(const std::string& dir, PolicyTrainer* trainer);

}  // namespace gyre::trainer
