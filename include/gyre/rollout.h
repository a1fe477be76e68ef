#pragma once
// RolloutFleet: Gyre's rollout workers for a program that trains with its own loop
// (docs/embedding.md). The fleet starts local rollout worker processes or waits for external
// ones to connect, samples prompt groups on them (paged, continuous-batching engines; prefill
// shared within a group), and moves each new policy version from the caller's memory to every
// worker over the configured weight transport, accepting a worker only on a receipt whose
// per-bucket checksums match what was sent.
//
//   gyre::RolloutFleetOptions options;
//   options.config = *gyre::LoadJobConfig("job.yaml");   // model, rollout, cluster sections
//   auto fleet = gyre::RolloutFleet::Open(options);      // starts rollout.workers processes
//   (*fleet)->PublishWeights(0, my_weights);             // every worker now holds version 0
//   auto samples = (*fleet)->Generate(groups, (*fleet)->DefaultSampling());
//
// Local workers are started as `<worker_binary> worker --role rollout ...`; with an empty
// worker_binary (and cluster.worker_binary empty) the running executable is used, so the program
// calls gyre::MaybeRunWorker(argc, argv, &code) first thing in main() (gyre/job.h).
//
// Thread contract: Generate, PublishWeights and Close are called by one thread at a time (the
// fleet's owner); the accessors may be called from any thread. A worker that dies or misbehaves
// is handled per cluster.on_worker_failure: its groups are re-run on the others, and with
// `restart` it is started again and brought to the current version before it gets work.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gyre/cancel.h"
#include "gyre/config.h"
#include "gyre/sample.h"
#include "gyre/status.h"

namespace gyre {

// How responses are drawn (docs/design.md, "Sampling"). DefaultSampling() gives the job's.
struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  double min_p = 0.0;        // 0 = off
  int max_new_tokens = 8;
  std::vector<int32_t> stop_token_ids;    // a response ends after generating one of these
  std::vector<std::string> stop_strings;  // ... or once its decoded text contains one of these
};

// One tensor of a policy version, as the caller holds it. The rollout model's parameters are
// named as in a Hugging Face checkpoint ("model.layers.0.self_attn.q_proj.weight").
struct TensorView {
  std::string name;
  // The rollout model's dtype (model.dtype: "float32", "bfloat16" or "float16"): versions travel
  // in it, so a caller training in float32 for a bfloat16 rollout hands out bfloat16 copies.
  std::string dtype = "float32";
  std::vector<int64_t> shape;
  const void* data = nullptr;  // contiguous, row-major
  uint64_t bytes = 0;          // = 4 (float32) or 2 (bfloat16, float16) * product(shape)
  int device = -1;             // -1 = host memory, d >= 0 = CUDA device d
};

// Where PublishWeights reads a version from. The views must stay valid, and the tensors
// unchanged, until PublishWeights returns.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Every parameter of the rollout model exactly once, in any order.
  virtual std::vector<TensorView> Tensors() const = 0;
};

// What one worker confirmed for a version: the CRC-32 it computed of every bucket it received,
// which matched what was sent (ok), or why it does not hold the version.
struct WeightReceipt {
  std::string worker;  // "rollout-0"
  bool ok = false;
  std::string error;  // when !ok
  int64_t version = -1;
  uint64_t bytes = 0;
  std::vector<uint32_t> bucket_crc32;
};

struct PublishReport {
  int64_t version = 0;
  std::string transport;                // cluster.weight_transport
  uint64_t bytes = 0;                   // one copy of the version
  double seconds = 0;                   // from the call to the last receipt
  std::vector<WeightReceipt> receipts;  // one per worker the version was sent to
};

// One parameter of the rollout workers' model, as a WeightSource must provide it (float32).
struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;
};

struct GenerateStats {
  int64_t generated_tokens = 0;
  int64_t prefill_tokens = 0;        // context positions prefilled
  int64_t prefix_shared_tokens = 0;  // prompt positions a group's samples did not prefill again
  double seconds = 0;
};

struct RolloutFleetOptions {
  // The fleet reads the model section (the rollout workers' model and its tokenizer: model.path
  // or the built-in spec), rollout (workers, max_new_tokens, sampling, stop_strings and the
  // engine settings), data.chat_template (EncodePrompt), job (name, output_dir, seed, log_level)
  // and cluster (mode, bind_host, controller_port, weight_transport, weight_bucket_bytes,
  // timeouts, on_worker_failure, max_worker_restarts). Other sections are ignored. It must pass
  // LoadJobConfig's validation.
  JobConfig config;
  // The executable local workers run; "" = cluster.worker_binary, else this executable.
  std::string worker_binary;
  // The workers' logs (<logs_dir>/rollout-<i>.log); "" = <job.output_dir>/<job.name>/logs.
  std::string logs_dir;
  // Cancels the fleet's calls from any thread: Generate and PublishWeights return
  // Aborted("cancelled: <reason>") at their next waiting point. Null = no token.
  std::shared_ptr<CancellationToken> cancel;
  bool print_progress = false;  // worker restarts on stdout
};

class RolloutFleet {
 public:
  // Starts the fleet and waits until every worker registered (local: spawned; external: the
  // workers dial controller_address(), which Open logs). Errors name the worker and its log.
  static StatusOr<std::unique_ptr<RolloutFleet>> Open(const RolloutFleetOptions& options);
  // Stops every worker the fleet started (Close).
  ~RolloutFleet();
  RolloutFleet(const RolloutFleet&) = delete;
  RolloutFleet& operator=(const RolloutFleet&) = delete;

  // Samples every group to completion and returns the samples n per group, in group order.
  // Each group runs on one worker that holds the current version; the groups of a worker that
  // fails are run again on the others. Needs a PublishWeights first (FailedPrecondition
  // otherwise). Group and sample ids are the caller's; each prompt plus max_new_tokens must fit
  // model.max_seq_len (InvalidArgument names the group).
  StatusOr<std::vector<Sample>> Generate(const std::vector<PromptGroup>& groups,
                                         const SamplingOptions& sampling,
                                         GenerateStats* stats = nullptr);

  // Sends `source` to every worker as policy `version` (greater than the last one published)
  // over cluster.weight_transport and returns their receipts. A worker whose transfer failed or
  // whose receipt does not match is stopped and dropped (or restarted, per
  // cluster.on_worker_failure); the call fails when no worker holds the version. The tensors
  // are checked against the workers' model (names, shapes, float32) before anything is sent.
  StatusOr<PublishReport> PublishWeights(int64_t version, const WeightSource& source);

  // The rollout model's parameters (from model.path's config.json, or the built-in spec), in
  // the order a checkpoint lists them: what a custom trainer's model must match by name and
  // shape.
  std::vector<ParameterSpec> Parameters() const;

  // The last version published (-1 before the first).
  int64_t version() const;
  // The ids of the workers that get work ("rollout-0", ...).
  std::vector<std::string> Workers() const;
  // Where workers register (host:port); external workers are started with --controller this.
  std::string controller_address() const;

  // The model's tokenizer, as a job uses it: a prompt rendered with data.chat_template and
  // encoded after the tokenizer's BOS; plain text; ids back to text (special tokens dropped).
  StatusOr<std::vector<int32_t>> EncodePrompt(const std::string& prompt) const;
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The ids that end a response; the first ends supervised targets.
  std::vector<int32_t> StopTokenIds() const;
  // rollout.sampling with rollout.max_new_tokens, the stop ids and rollout.stop_strings.
  SamplingOptions DefaultSampling() const;

  // Stops every worker the fleet started; later calls fail with FailedPrecondition.
  // Idempotent.
  void Close();

 private:
  class Impl;
  explicit RolloutFleet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre
