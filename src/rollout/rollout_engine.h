#pragma once
// RolloutEngine: continuous-batching generation over a paged KV cache (docs/rollout.md).
//
// Requests wait in a FIFO queue and join the running batch whenever sequence slots and KV
// blocks allow; a sequence leaves the batch the step it finishes, and its blocks go back to the
// pool. Each step is one model forward over a flattened batch: one token for every decoding
// sequence (decodes are always scheduled first, so prefills never starve them) plus prefill
// chunks up to a per-step token budget. The KV cache is a fixed pool of blocks sized by a memory
// budget; blocks are reserved before a step runs, and when the pool is exhausted the most
// recently admitted sequence is preempted (its blocks are freed and it is recomputed later), so
// a step never runs out of cache memory.
//
// The n samples of one prompt are prefilled once: the prompt's blocks are shared by reference
// count and the last, partially filled block is copied on the first write after the samples
// diverge (copy-on-write). Sampling goes through ops::SampleRows with the stream of (sample seed,
// response position), so a token does not depend on batch mates, preemption or prefix sharing.
//
// Run() can stop once a target number of groups has finished and hand back the others as
// partial responses (tokens, log-probs, per-token policy versions); their KV blocks stay parked
// in the pool (evicted first when space is needed), so a later resume request for the same
// sample continues without recomputing its context. UpdateWeights() swaps weights between steps
// and either keeps the KV of unfinished sequences (computed by the old version) or recomputes it.
//
// Tensor parallelism (rollout.tensor_parallel; docs/rollout.md): over a model that is a
// tensor-parallel slice (model::Transformer::TensorParallelSlice), T engines, one a rank, act as
// one. Rank 0 leads: it takes requests, schedules and returns results exactly as a whole-model
// engine does, and broadcasts each step's batch (with its sampling rows and copy-on-write block
// copies) to the other ranks, which run Follow(): the same forward on their slices (each cache
// holds its key/value heads; blocks are the same on every rank) and the same vocabulary-parallel
// draw (vocab_parallel_sampling.h). Weight updates reach every rank through the leader's
// UpdateWeights, which has each follower call its own swap.
//
// Static batching (the benchmark baseline) is the same engine with admission only when the batch
// is empty. `gyre generate`, the rollout workers, the library's fleet and the benchmarks all
// generate through this engine. Not thread-safe: one thread drives an engine and the model it
// uses.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "ops/ops.h"
#include "rollout/block_allocator.h"
#include "rollout/decode_graphs.h"

namespace gyre::rollout {

// Why a response ended: a stop token or string, its length limit, or taken out unfinished.
enum class Finish { kStop, kLength, kAbort };

enum class Scheduling { kContinuous, kStatic };
enum class WeightUpdateKv { kKeep, kRecompute };

struct EngineConfig {
  int64_t block_size = 16;        // token positions per KV block
  int64_t num_blocks = 256;       // KV blocks in the pool (see BlocksForBudget)
  int64_t max_running = 64;       // sequences in the running batch at once
  int64_t max_step_tokens = 512;  // tokens one forward may process (decodes + prefill chunks)
  bool prefix_sharing = true;     // a group's n samples share one prefill of the prompt
  Scheduling scheduling = Scheduling::kContinuous;
  WeightUpdateKv weight_update_kv = WeightUpdateKv::kRecompute;
  // Model on a GPU: decode-only steps of up to cuda_graph_max_batch sequences replay CUDA graphs
  // (decode_graphs.h); the cache then holds one extra, scratch block for padding rows.
  bool cuda_graphs = true;
  int64_t cuda_graph_max_batch = 256;
};

// Blocks a budget of `bytes` holds for `model`, or an error naming the figures when it cannot
// hold one block.
StatusOr<int64_t> BlocksForBudget(const model::Transformer& model, int64_t bytes,
                                  int64_t block_size);

struct SamplingOptions {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t max_new_tokens = 16;  // response length limit (resumed tokens included)
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;  // need a decoder (RolloutEngine::SetDecoder)
};

// A response so far: one entry per generated token.
struct Response {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;    // log softmax(logits / T) over the full vocabulary
  std::vector<float> kept_mass;   // probability mass the truncation kept
  std::vector<int64_t> versions;  // policy version that produced each token
};

struct Request {
  uint64_t id = 0;     // the caller's key, echoed in results
  uint64_t group = 0;  // groups are what Run() counts toward its target
  std::vector<int32_t> prompt;
  int32_t n = 1;  // samples of this prompt; sample i draws with seed + i
  uint64_t seed = 0;
  SamplingOptions sampling;
  // Optional per-sample response limits (size n, each in [1, sampling.max_new_tokens]).
  std::vector<int32_t> sample_max_new_tokens;
  // n == 1 only: continue this partial response (its tokens are not generated again). Its
  // tokens need not all be the model's: a multi-turn continuation appends what an environment
  // returned (log-prob 0), and the engine treats them as context.
  Response resume;
  // Keep the sample's KV parked when it finishes (as Run() does for unfinished ones), so that a
  // continuation whose tokens extend this sample's (same seed) computes only the new tokens.
  bool park_on_finish = false;
  // Stop strings are searched in response tokens from this index on: a continuation sets it to
  // the length of its resumed response, so text inserted by an environment never stops it.
  int32_t stop_scan_from = 0;
};

struct SampleResult {
  uint64_t id = 0;
  uint64_t group = 0;
  int32_t index = 0;  // sample index within its request
  uint64_t seed = 0;
  Response response;
  bool finished = false;  // false: stopped early by Run()'s target; resume it later
  Finish finish = Finish::kLength;
  // Oldest policy version whose keys/values the sample's context still used when it left the
  // engine: older than the newest token's version only when KV was kept across a weight update.
  int64_t kv_version = 0;
};

// Counters since construction (or ResetStats). Token counts are positions whose keys/values
// were computed, split by kind.
struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;        // prompt / context positions computed in prefill chunks
  int64_t decode_tokens = 0;         // positions computed one per sequence per step
  int64_t generated_tokens = 0;      // tokens sampled
  int64_t prefix_shared_tokens = 0;  // prompt positions not prefilled thanks to group sharing
  int64_t parked_reused_tokens = 0;  // context positions a resume took from parked KV
  int64_t cow_copies = 0;            // shared blocks copied at divergence
  int64_t preemptions = 0;
  int64_t finished_samples = 0;
  double block_steps = 0;  // sum over steps of blocks in use (mean utilisation = / steps)
  double forward_seconds = 0;
  double sample_seconds = 0;
  int64_t graph_steps = 0;  // decode steps replayed from a CUDA graph
};

class RolloutEngine {
 public:
  // Validates `config` and allocates the KV pool on the model's device. `model` must outlive
  // the engine.
  static StatusOr<std::unique_ptr<RolloutEngine>> Create(const model::Transformer* model,
                                                         const EngineConfig& config);
  ~RolloutEngine();
  RolloutEngine(const RolloutEngine&) = delete;
  RolloutEngine& operator=(const RolloutEngine&) = delete;

  // Decodes response tokens to text, for stop strings. Without one, requests with stop strings
  // are rejected.
  using Decoder = std::function<std::string(const std::vector<int32_t>&)>;
  void SetDecoder(Decoder decoder) { decoder_ = std::move(decoder); }

  // Called on the stepping thread for every token sampled, as it is sampled (request id, sample
  // index, token): for streaming output. Tokens of a resumed response are not repeated.
  using TokenCallback = std::function<void(uint64_t id, int32_t index, int32_t token)>;
  void SetTokenCallback(TokenCallback on_token) { on_token_ = std::move(on_token); }

  // Queues requests. All are validated first; on any error nothing is queued.
  Status Add(const std::vector<Request>& requests);

  // One scheduling step and model forward. Returns the samples that finished in it.
  StatusOr<std::vector<SampleResult>> Step();

  // Steps until nothing is left or, with target_groups > 0, until that many groups (by
  // Request::group, counted when their last queued sample finishes) have finished in this call.
  // Then every sample still in the engine is returned unfinished (finished = false) and removed;
  // its computed KV is parked for a resume. Results come in completion order. If a step fails,
  // every queued and running sample is dropped (the engine is idle again) and the error returned.
  StatusOr<std::vector<SampleResult>> Run(int64_t target_groups = 0);

  // Add + Run on an idle engine, results ordered by request then sample index.
  StatusOr<std::vector<SampleResult>> Generate(const std::vector<Request>& requests);

  // Pauses between steps, calls `swap` (which replaces the model's weights in place) and labels
  // later tokens with `version`. Tensor-parallel: every follower calls the swap given to its
  // Follow, and when any rank's swap fails every rank's call fails (the ranks that did swap hold
  // the new weights: send the update again). With WeightUpdateKv::kRecompute the KV of every
  // unfinished sequence (running, waiting with computed context, or parked) is dropped and
  // recomputed with the new weights before it continues; with kKeep it is kept. If `swap` fails its
  // error is returned and the engine is unchanged.
  Status UpdateWeights(int64_t version, const std::function<Status()>& swap);

  // Tensor parallelism, ranks other than 0: serves the leader's steps until the leader calls
  // StopFollowers (Ok) or a collective fails (its error). `swap(version)` replaces this rank's
  // slice when the leader updates weights. `idle_timeout_s` bounds the wait for the leader's
  // next message. Everything else (Add, Step, Run, UpdateWeights) is refused on a follower.
  Status Follow(const std::function<Status(int64_t version)>& swap, double idle_timeout_s);
  // Rank 0: ends the followers' Follow (nothing for a whole-model engine).
  Status StopFollowers();
  // Whether this engine takes requests: a whole-model engine, or rank 0 of a tensor-parallel one.
  bool leads() const { return tp_ == nullptr || tp_->rank() == 0; }

  void set_version(int64_t version) { version_ = version; }
  int64_t version() const { return version_; }
  const EngineConfig& config() const { return config_; }
  const EngineStats& stats() const { return stats_; }
  // Why CUDA graphs were turned off after a failed capture (empty if they were not).
  const std::string& graph_error() const { return graph_error_; }
  void ResetStats();
  const BlockAllocator& allocator() const { return allocator_; }

  bool idle() const { return waiting_.empty() && running_.empty(); }
  // Sequence slots in use (a group still prefilling holds n).
  int64_t running_slots() const;
  int64_t waiting_requests() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t parked_sequences() const { return static_cast<int64_t>(parked_.size()); }
  // Drops all parked KV.
  void ClearParked();
  // Drops every queued and running sample and frees its blocks (parked KV stays).
  void DropAll();
  // Drops the queued and running samples of the requests whose id `drop(id)` picks, and frees
  // their blocks; the others go on as if those had never been added. Returns how many sequence
  // slots it freed (a group still prefilling counts n).
  int64_t Drop(const std::function<bool(uint64_t id)>& drop);
  // Takes the queued and running samples that `take(id, index)` picks out of the engine and
  // returns them unfinished (finished = false, with their response so far), by request id and
  // sample index; their blocks are freed and the others go on. A group still waiting for its
  // prefill is taken only when every one of its samples is picked.
  std::vector<SampleResult> Preempt(const std::function<bool(uint64_t id, int32_t index)>& take);

 private:
  struct Seq;
  // The cached context of a sample that left the engine unfinished, kept for its resume.
  struct Parked {
    uint64_t seed = 0;
    std::vector<int32_t> tokens;
    int64_t computed = 0;
    int64_t kv_version = 0;
    std::vector<int32_t> blocks;
  };
  RolloutEngine(const model::Transformer* model, const EngineConfig& config);

  // Step()'s stages, in order. StepWork: the context positions [first, first + count) of one
  // sequence computed this step.
  struct StepWork {
    Seq* seq;
    int64_t first;
    int64_t count;
  };
  // Decodes (preempting the newest sequence when blocks run out), prefill chunks, then
  // admissions, within the step's token budget. Empty when nothing could make progress.
  std::vector<StepWork> ScheduleStep();
  // The step's host inputs (rollout_engine.cc); *sampled gets the sequences whose last context
  // token is computed, in the order of the logits' rows.
  struct StepInputs;
  StepInputs BuildStep(const std::vector<StepWork>& work, std::vector<Seq*>* sampled);
  // One forward over the flattened work (a CUDA graph replay when it fits).
  at::Tensor ForwardStep(const StepInputs& in);
  // One token per sample (a fork parent's row serves each of its samples); vocabulary-parallel
  // under tensor parallelism.
  StatusOr<ops::SampleOutput> SampleStep(const at::Tensor& logits, const StepInputs& in);
  // Tensor parallelism: the leader's step message and its receipt by a follower (collectives
  // throw on failure), and every rank's agreement on a weight swap.
  void SendStep(const StepInputs& in);
  StepInputs ReceiveStep(const at::Tensor& header);
  Status AgreeOnSwap(const Status& own);
  // Appends the drawn tokens, forks groups into their samples, retires finished samples (which
  // it returns).
  std::vector<SampleResult> AdvanceStep(const std::vector<Seq*>& sampled,
                                        const ops::SampleOutput& drawn);
  void ReplaceForkParents(std::vector<std::unique_ptr<Seq>>* children);
  std::vector<SampleResult> RetireFinished(const std::vector<Seq*>& finished);

  Status Validate(const Request& r, size_t index) const;
  bool TryAdmit(Seq* s);
  bool AdoptParked(Seq* s);
  // Moves s's computed KV to the parked list (frees its blocks when nothing is computed).
  void Park(Seq* s);
  bool EnsureWritable(Seq* s, int64_t first, int64_t count);
  int64_t BlocksNeeded(const Seq& s, int64_t first, int64_t count) const;
  bool PreemptOne(const Seq* keep);
  void ReleaseBlocks(Seq* s);
  void CopyBlock(int32_t from, int32_t to);  // and records it for the followers
  void CopyCache(int32_t from, int32_t to);
  bool EvictParked();
  bool CheckStop(Seq* s);
  SampleResult MakeResult(Seq* s, bool finished);
  // The samples of a group still waiting for its prefill (a fork parent), unfinished and
  // without tokens.
  void AppendForkResults(const Seq& parent, std::vector<SampleResult>* out);
  void CountGroupDone(const Seq& s);

  const model::Transformer* model_;
  model::TensorParallelGroup* tp_;       // the model's group; null for a whole model
  std::vector<int64_t> pending_copies_;  // (from, to) block copies since the last step message
  EngineConfig config_;
  model::PagedKvCache cache_;
  // CUDA graphs for decode-only steps (null on the CPU, or when disabled or unavailable); block
  // config_.num_blocks of cache_ is their scratch block.
  std::unique_ptr<DecodeGraphs> graphs_;
  std::string graph_error_;  // why graphs were turned off mid-run (empty while they work)
  BlockAllocator allocator_;
  Decoder decoder_;
  TokenCallback on_token_;
  int64_t version_ = 0;
  uint64_t next_order_ = 0;
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order
  std::deque<Parked> parked_;                  // oldest first
  std::map<uint64_t, int64_t> group_pending_;  // group -> samples not yet finished
  int64_t groups_finished_ = 0;
  EngineStats stats_;
};

}  // namespace gyre::rollout
