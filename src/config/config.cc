#include "config/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <variant>

#include "algorithm/registry.h"
#include "common/check.h"
#include "common/file_util.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/strings.h"

namespace gyre::config {
namespace {

// ---------------------------------------------------------------------------------------------
// The field table.
// ---------------------------------------------------------------------------------------------

// A pointer to one field of a JobConfig. The variant's alternative *is* the field's type, so the
// table cannot claim a type that disagrees with the struct.
using FieldPtr = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*,
                              std::vector<std::string>*>;
using Getter = FieldPtr (*)(JobConfig&);

// Same order as FieldPtr's alternatives: FieldType(ptr.index()) is the field's type.
enum class FieldType { kInt, kInt64, kUint64, kDouble, kBool, kString, kStringList };

struct Range {
  double lo = 0;
  double hi = 0;
  bool lo_open = false;  // (lo, ...
  bool hi_open = false;  // ..., hi)
};

struct Field {
  std::string key;  // dotted: "rollout.sampling.top_p"
  Getter get = nullptr;
  FieldType type = FieldType::kInt;
  std::optional<Range> range;        // numbers; none = the type's full range
  std::vector<std::string> choices;  // strings; empty = any string
  // Choices read at each use (the algorithm registry, which an embedding program can extend);
  // replaces `choices` when set.
  std::vector<std::string> (*choices_fn)() = nullptr;
  bool non_empty = false;  // strings; for a string list, each of its entries
  std::string doc;         // one line
};

// Gives both the dotted key and its accessor from one spelling of the member path, so a key can
// never drift from the field it names: GYRE_CONFIG_KEY(trainer.steps).
#define GYRE_CONFIG_KEY(path) #path, [](JobConfig & c) -> FieldPtr { return &c.path; }

FieldType TypeOf(Getter get) {
  static JobConfig probe;
  return static_cast<FieldType>(get(probe).index());
}

Range Closed(double lo, double hi) { return {lo, hi, false, false}; }
Range OpenLow(double lo, double hi) { return {lo, hi, true, false}; }   // (lo, hi]
Range OpenHigh(double lo, double hi) { return {lo, hi, false, true}; }  // [lo, hi)

Field Num(const char* key, Getter get, Range range, const char* doc) {
  Field f{key, get, TypeOf(get), range, {}, nullptr, false, doc};
  GYRE_CHECK(f.type == FieldType::kInt || f.type == FieldType::kInt64 ||
             f.type == FieldType::kDouble)
      << key << " is not an int or double field";
  if (f.type == FieldType::kInt) {
    GYRE_CHECK(range.lo >= INT_MIN && range.hi <= INT_MAX) << key << ": range exceeds int";
  }
  return f;
}
// Seeds: any uint64.
Field Seed(const char* key, Getter get, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, false, doc};
  GYRE_CHECK(f.type == FieldType::kUint64) << key << " is not a uint64 field";
  return f;
}
Field Flag(const char* key, Getter get, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, false, doc};
  GYRE_CHECK(f.type == FieldType::kBool) << key << " is not a bool field";
  return f;
}
Field Text(const char* key, Getter get, bool non_empty, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, non_empty, doc};
  GYRE_CHECK(f.type == FieldType::kString) << key << " is not a string field";
  return f;
}
// A YAML sequence of strings, each non-empty; an empty value or [] is the empty list.
Field TextList(const char* key, Getter get, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, {}, nullptr, true, doc};
  GYRE_CHECK(f.type == FieldType::kStringList) << key << " is not a string list field";
  return f;
}
Field Choice(const char* key, Getter get, std::vector<std::string> choices, const char* doc) {
  Field f{key, get, TypeOf(get), std::nullopt, std::move(choices), nullptr, true, doc};
  GYRE_CHECK(f.type == FieldType::kString) << key << " is not a string field";
  return f;
}
// A choice among the registry's names of `family` (algorithm/registry.h).
template <algorithm::Family kFamily>
std::vector<std::string> RegistryNames() {
  return algorithm::NamesFor(kFamily);
}
Field Registered(const char* key, Getter get, std::vector<std::string> (*names)(),
                 const char* doc) {
  Field f = Choice(key, get, {}, doc);
  f.choices_fn = names;
  return f;
}
std::vector<std::string> ChoicesOf(const Field& f) {
  return f.choices_fn != nullptr ? f.choices_fn() : f.choices;
}

constexpr bool kNonEmpty = true;
constexpr bool kAnyText = false;
constexpr double kMaxCount = 1 << 20;    // sizes and batch counts
constexpr double kMaxSteps = 100000000;  // step counts and cadences
constexpr double kDay = 86400;           // seconds

// Every JobConfig field, once. Order is DumpJobConfig's order; each section's keys must be
// contiguous (checked below).
std::vector<Field> BuildTable() {
  std::vector<Field> t = {
      // job
      Text(GYRE_CONFIG_KEY(job.name), kNonEmpty, "run name; the run directory is output_dir/name"),
      Seed(GYRE_CONFIG_KEY(job.seed), "seeds model init, prompt order and sampling"),
      Text(GYRE_CONFIG_KEY(job.output_dir), kNonEmpty, "parent directory of run directories"),
      Choice(GYRE_CONFIG_KEY(job.log_level),
             {"trace", "debug", "info", "warn", "error", "critical", "off"}, "log verbosity"),
      // model
      Text(GYRE_CONFIG_KEY(model.path), kAnyText,
           "Hugging Face model directory (config.json, safetensors, tokenizer.json); empty = the "
           "built-in tiny decoder below"),
      Choice(GYRE_CONFIG_KEY(model.dtype), {"float32", "bfloat16", "float16"},
             "rollout and training compute dtype (training keeps float32 master weights and "
             "optimizer state; weights are published in this dtype)"),
      Choice(GYRE_CONFIG_KEY(model.device), {"cpu", "cuda", "auto"},
             "where workers keep the model: cpu, cuda, or auto (cuda when usable)"),
      Num(GYRE_CONFIG_KEY(model.hidden_size), Closed(1, 65536), "model width"),
      Num(GYRE_CONFIG_KEY(model.num_layers), Closed(1, 1024), "decoder layers"),
      Num(GYRE_CONFIG_KEY(model.num_heads), Closed(1, 1024), "query heads"),
      Num(GYRE_CONFIG_KEY(model.num_kv_heads), Closed(1, 1024),
          "key/value heads (grouped-query attention)"),
      Num(GYRE_CONFIG_KEY(model.intermediate_size), Closed(1, kMaxCount), "MLP hidden width"),
      Num(GYRE_CONFIG_KEY(model.max_seq_len), Closed(2, kMaxCount),
          "longest prompt + completion, in tokens"),
      Num(GYRE_CONFIG_KEY(model.rope_theta), OpenLow(0, 1e9), "rotary embedding base"),
      Num(GYRE_CONFIG_KEY(model.rms_norm_eps), OpenLow(0, 1), "RMSNorm epsilon"),
      Flag(GYRE_CONFIG_KEY(model.tie_embeddings), "share the input embedding and output head"),
      Num(GYRE_CONFIG_KEY(model.init_std), OpenLow(0, 10), "std of the normal weight init"),
      // data
      Choice(GYRE_CONFIG_KEY(data.task), {"addition", "copy", "word_problems"},
             "built-in task (prompts and verifier)"),
      Text(GYRE_CONFIG_KEY(data.train_path), kAnyText,
           "JSONL of {\"prompt\", \"answer\"}; empty = generated by the task"),
      Text(GYRE_CONFIG_KEY(data.eval_path), kAnyText,
           "JSONL for held-out evaluation; empty = generated by the task"),
      Num(GYRE_CONFIG_KEY(data.min_digits), Closed(1, 18), "addition: fewest operand digits"),
      Num(GYRE_CONFIG_KEY(data.max_digits), Closed(1, 18), "addition: most operand digits"),
      Num(GYRE_CONFIG_KEY(data.eval_size), Closed(1, 1000000), "held-out prompts"),
      Seed(GYRE_CONFIG_KEY(data.eval_seed),
           "seed of the held-out prompts (kept apart from job.seed)"),
      Choice(GYRE_CONFIG_KEY(data.chat_template), {"none", "qwen2.5", "qwen3", "llama3", "smollm2"},
             "wrap each prompt as a user turn in this chat format; none = raw text"),
      // rollout
      Num(GYRE_CONFIG_KEY(rollout.workers), Closed(1, 4096), "rollout worker processes"),
      Num(GYRE_CONFIG_KEY(rollout.group_size), Closed(1, 4096), "samples per prompt (GRPO's n)"),
      Num(GYRE_CONFIG_KEY(rollout.prompts_per_step), Closed(1, kMaxCount),
          "prompt groups per GRPO step"),
      Num(GYRE_CONFIG_KEY(rollout.max_new_tokens), Closed(1, kMaxCount),
          "completion length limit, in tokens"),
      Num(GYRE_CONFIG_KEY(rollout.sampling.temperature), Closed(0, 100),
          "softmax temperature; 0 = greedy"),
      Num(GYRE_CONFIG_KEY(rollout.sampling.top_k), Closed(0, kMaxCount),
          "keep the k most likely tokens; 0 = off"),
      Num(GYRE_CONFIG_KEY(rollout.sampling.top_p), OpenLow(0, 1), "nucleus sampling mass; 1 = off"),
      Num(GYRE_CONFIG_KEY(rollout.sampling.min_p), Closed(0, 1),
          "drop tokens below min_p * the top probability; 0 = off"),
      Registered(GYRE_CONFIG_KEY(rollout.budget.policy),
                 RegistryNames<algorithm::Family::kSamplingPolicy>,
                 "sampling policy: how many samples each prompt of a step gets"),
      Num(GYRE_CONFIG_KEY(rollout.budget.pilot_samples), Closed(1, 4096),
          "pilot and variance: first-round samples per prompt"),
      Num(GYRE_CONFIG_KEY(rollout.budget.pilot_low), Closed(0, 1),
          "pilot: lowest pilot accuracy that earns the rest of the group"),
      Num(GYRE_CONFIG_KEY(rollout.budget.pilot_high), Closed(0, 1),
          "pilot: highest pilot accuracy that earns the rest of the group"),
      Num(GYRE_CONFIG_KEY(rollout.budget.topup_chunk), Closed(1, 4096),
          "variance: samples per top-up grant"),
      Num(GYRE_CONFIG_KEY(rollout.budget.topup_max_group), Closed(0, 65536),
          "variance: most samples one group may reach; 0 = 2 * group_size"),
      Num(GYRE_CONFIG_KEY(rollout.budget.greso_streak), Closed(1, 1000),
          "greso: equal-reward groups in a row before a prompt may be skipped"),
      Num(GYRE_CONFIG_KEY(rollout.budget.greso_target), Closed(0, 1),
          "greso: target share of zero-variance groups"),
      Num(GYRE_CONFIG_KEY(rollout.budget.greso_step), Closed(0, 1),
          "greso: change of the skip probability per step"),
      Num(GYRE_CONFIG_KEY(rollout.budget.greso_initial), Closed(0, 1),
          "greso: skip probability at the first step"),
      TextList(GYRE_CONFIG_KEY(rollout.stop_strings),
               "responses also stop once their text contains any of these; [] = none"),
      Num(GYRE_CONFIG_KEY(rollout.kv_cache_bytes), Closed(0, 1099511627776.0),
          "KV cache budget per rollout worker in bytes; 0 = kv_cache_fraction of memory"),
      Num(GYRE_CONFIG_KEY(rollout.kv_cache_fraction), OpenLow(0, 1),
          "KV cache budget as a fraction of device memory, when kv_cache_bytes is 0"),
      Num(GYRE_CONFIG_KEY(rollout.block_size), Closed(1, 4096), "positions per KV cache block"),
      Num(GYRE_CONFIG_KEY(rollout.max_running), Closed(1, kMaxCount),
          "sequences in a worker's running batch"),
      Num(GYRE_CONFIG_KEY(rollout.max_step_tokens), Closed(1, kMaxCount),
          "tokens per engine step (decodes + prefill chunks)"),
      Flag(GYRE_CONFIG_KEY(rollout.prefix_sharing),
           "a group's samples share one prefill of their prompt"),
      Flag(GYRE_CONFIG_KEY(rollout.cuda_graphs),
           "decode steps run as CUDA graphs (model on a GPU, CUDA-enabled libtorch)"),
      Num(GYRE_CONFIG_KEY(rollout.cuda_graph_max_batch), Closed(1, 65536),
          "largest decode batch run as a CUDA graph"),
      Choice(GYRE_CONFIG_KEY(rollout.scheduling), {"continuous", "static"},
             "continuous batching, or static batches (a new batch when the last has finished)"),
      Choice(GYRE_CONFIG_KEY(rollout.weight_update_kv), {"keep", "recompute"},
             "on a weight update, keep or recompute the KV cache of unfinished sequences"),
      Flag(GYRE_CONFIG_KEY(rollout.partial_rollouts),
           "stop each step at prompts_per_step finished groups and resume the rest later"),
      Num(GYRE_CONFIG_KEY(rollout.over_provision), Closed(1, 16),
          "partial rollouts: groups in flight per step, as a multiple of prompts_per_step"),
      Flag(GYRE_CONFIG_KEY(rollout.async),
           "asynchronous rollout: generate ahead of training by up to max_staleness versions"),
      Num(GYRE_CONFIG_KEY(rollout.async_chunk_groups), Closed(0, 1000000),
          "asynchronous rollout: groups per generate call; 0 = prompts_per_step / workers"),
      Choice(GYRE_CONFIG_KEY(rollout.dispatch), {"least_loaded", "idle"},
             "asynchronous rollout: chunks go to the least loaded worker, or to idle ones only"),
      Flag(GYRE_CONFIG_KEY(rollout.work_stealing),
           "asynchronous rollout: idle workers take over unfinished samples of the busiest one"),
      Num(GYRE_CONFIG_KEY(rollout.split_groups), Closed(0, 1000000),
          "asynchronous rollout: samples per piece of a group sent to one worker; 0 = whole"),
      Choice(GYRE_CONFIG_KEY(rollout.weight_updates),
             {"lockstep", "repack", "between_steps", "between_steps_repack"},
             "asynchronous rollout: publish with generation paused (after the calls in flight "
             "end, or taking their unfinished samples out), or between engine steps (and "
             "repacking the long tails onto a few workers)"),
      Num(GYRE_CONFIG_KEY(rollout.tail_batch), Closed(1, kMaxCount),
          "between_steps_repack: long-tail samples per tail worker call"),
      // algorithm
      Registered(GYRE_CONFIG_KEY(algorithm.advantage), RegistryNames<algorithm::Family::kAdvantage>,
                 "group-relative advantage estimator (docs/algorithms.md)"),
      Registered(GYRE_CONFIG_KEY(algorithm.policy_loss),
                 RegistryNames<algorithm::Family::kPolicyLoss>,
                 "policy term of each token (docs/algorithms.md)"),
      Registered(GYRE_CONFIG_KEY(algorithm.loss_agg), RegistryNames<algorithm::Family::kLossAgg>,
                 "how per-token losses are averaged"),
      Num(GYRE_CONFIG_KEY(algorithm.loss_norm_len), Closed(0, kMaxCount),
          "seq-mean-token-sum-norm: the constant length denominator; 0 = rollout.max_new_tokens"),
      Num(GYRE_CONFIG_KEY(algorithm.entropy_coef), Closed(0, 10),
          "entropy bonus: subtracts entropy_coef times the aggregated token entropy from the loss"),
      Registered(GYRE_CONFIG_KEY(algorithm.kl), RegistryNames<algorithm::Family::kKl>,
                 "KL penalty against the frozen reference policy: none, k1, k2, k3"),
      Num(GYRE_CONFIG_KEY(algorithm.kl_coef), Closed(0, 100), "weight of the KL penalty"),
      Choice(GYRE_CONFIG_KEY(algorithm.kl_in), {"loss", "reward"},
             "where the KL penalty goes: a term of the loss, or subtracted from each reward"),
      Num(GYRE_CONFIG_KEY(algorithm.overlong_buffer), Closed(0, kMaxCount),
          "DAPO overlong shaping: tokens before rollout.max_new_tokens where the length penalty "
          "starts; 0 = off"),
      Num(GYRE_CONFIG_KEY(algorithm.overlong_penalty), Closed(0, 1000),
          "DAPO overlong shaping: penalty at rollout.max_new_tokens (linear from 0 over the "
          "buffer)"),
      Num(GYRE_CONFIG_KEY(algorithm.clip_eps_low), Closed(0, 1), "PPO ratio clip below 1"),
      Num(GYRE_CONFIG_KEY(algorithm.clip_eps_high), Closed(0, 10),
          "PPO ratio clip above 1 (clip-higher)"),
      Num(GYRE_CONFIG_KEY(algorithm.dual_clip_c), Closed(0, 1000),
          "dual-clip bound for negative advantages; 0 = off, else > 1"),
      Flag(GYRE_CONFIG_KEY(algorithm.tis),
           "truncated importance weight against the rollout log-probs"),
      Num(GYRE_CONFIG_KEY(algorithm.tis_cap), OpenLow(0, 1e6),
          "truncation cap of the tis and seq-tis weights"),
      Choice(GYRE_CONFIG_KEY(algorithm.proximal), {"recompute", "loglinear", "behaviour"},
             "policy the clipped ratio is taken against"),
      Registered(GYRE_CONFIG_KEY(algorithm.correction),
                 RegistryNames<algorithm::Family::kCorrection>,
                 "detached behaviour-policy weight of each token's policy term"),
      Num(GYRE_CONFIG_KEY(algorithm.icepop_low), OpenLow(0, 1),
          "icepop: smallest behaviour weight kept"),
      Num(GYRE_CONFIG_KEY(algorithm.icepop_high), Closed(1, 1e6),
          "icepop: largest behaviour weight kept"),
      Num(GYRE_CONFIG_KEY(algorithm.m2po_tau), OpenLow(0, 1e6),
          "m2po: bound on the mean squared log weight of the kept tokens"),
      Num(GYRE_CONFIG_KEY(algorithm.max_staleness), Closed(0, 1000),
          "policy versions a rollout may lag; 0 = synchronous on-policy"),
      Flag(GYRE_CONFIG_KEY(algorithm.filter_zero_variance),
           "dynamic sampling: leave out groups whose rewards are all equal"),
      Num(GYRE_CONFIG_KEY(algorithm.max_filter_rounds), Closed(0, 100),
          "dynamic sampling: extra generation rounds per step to replace filtered groups"),
      // trainer
      Num(GYRE_CONFIG_KEY(trainer.workers), Closed(1, 64), "trainer worker processes"),
      Num(GYRE_CONFIG_KEY(trainer.steps), Closed(0, kMaxSteps), "GRPO optimizer steps"),
      Num(GYRE_CONFIG_KEY(trainer.lr), OpenLow(0, 10), "AdamW learning rate"),
      Num(GYRE_CONFIG_KEY(trainer.max_generated_tokens), Closed(0, 1e15),
          "stop GRPO after the step that brings the generated tokens to this many; 0 = off"),
      Registered(GYRE_CONFIG_KEY(trainer.lr_schedule),
                 RegistryNames<algorithm::Family::kLrSchedule>,
                 "GRPO learning-rate schedule after the warm-up: constant, or cosine decay to "
                 "lr * lr_min_ratio at the last step"),
      Num(GYRE_CONFIG_KEY(trainer.lr_warmup_steps), Closed(0, kMaxSteps),
          "GRPO steps of linear learning-rate warm-up from 0; 0 = none"),
      Num(GYRE_CONFIG_KEY(trainer.lr_min_ratio), Closed(0, 1),
          "cosine schedule: the last step's learning rate as a share of trainer.lr"),
      Num(GYRE_CONFIG_KEY(trainer.weight_decay), Closed(0, 10), "AdamW weight decay"),
      Num(GYRE_CONFIG_KEY(trainer.beta1), OpenHigh(0, 1), "AdamW beta1"),
      Num(GYRE_CONFIG_KEY(trainer.beta2), OpenHigh(0, 1), "AdamW beta2"),
      Num(GYRE_CONFIG_KEY(trainer.grad_clip), Closed(0, 1e6), "max global grad norm; 0 = off"),
      Num(GYRE_CONFIG_KEY(trainer.micro_batch_size), Closed(1, kMaxCount),
          "sequences per forward/backward"),
      Num(GYRE_CONFIG_KEY(trainer.mini_batches), Closed(1, 1024),
          "optimizer steps per GRPO batch (PPO-style mini-batches)"),
      Num(GYRE_CONFIG_KEY(trainer.publish_every), Closed(1, 1000),
          "rollout.async: publish new weights after every N-th GRPO step; 1 = every step"),
      Num(GYRE_CONFIG_KEY(trainer.warmup_sft_steps), Closed(0, kMaxSteps),
          "supervised warm-up steps before GRPO; 0 = none"),
      Num(GYRE_CONFIG_KEY(trainer.warmup_sft_batch), Closed(1, kMaxCount),
          "sequences per warm-up step"),
      Num(GYRE_CONFIG_KEY(trainer.warmup_sft_lr), OpenLow(0, 10), "warm-up learning rate"),
      Num(GYRE_CONFIG_KEY(trainer.warmup_stop_token_accuracy), Closed(0, 1),
          "end the warm-up once the training token accuracy (20-step mean) reaches this; 0 = off"),
      Choice(GYRE_CONFIG_KEY(trainer.warmup_optimizer_state), {"keep", "reset"},
             "keep = GRPO continues the warm-up's AdamW moments and step counts; reset = GRPO "
             "starts from a fresh optimizer state"),
      Num(GYRE_CONFIG_KEY(trainer.checkpoint_every), Closed(0, kMaxSteps),
          "GRPO steps between resumable checkpoints; 0 = none, only the final model"),
      Num(GYRE_CONFIG_KEY(trainer.checkpoint_keep_last), Closed(1, kMaxSteps),
          "resumable checkpoints kept; older ones are deleted after a new one is in place"),
      Num(GYRE_CONFIG_KEY(trainer.torch_threads), Closed(0, 1024),
          "intra-op threads per worker process; 0 = from the cores available"),
      Num(GYRE_CONFIG_KEY(trainer.grad_bucket_mb), Closed(1, 4096),
          "data-parallel gradient all-reduce bucket size in MiB"),
      Flag(GYRE_CONFIG_KEY(trainer.overlap_grad_reduce),
           "data parallel: all-reduce gradient buckets during the last micro-batch's backward"),
      Choice(GYRE_CONFIG_KEY(trainer.shard), {"none", "optimizer", "gradients"},
             "data parallel: optimizer = each trainer keeps only its slice of the AdamW moments "
             "(ZeRO-1); gradients = also reduce-scatters the gradients and keeps only their slice "
             "(ZeRO-2); the update is the same, per-rank memory for that state falls as 1/N"),
      Flag(GYRE_CONFIG_KEY(trainer.sequence_packing),
           "pack samples end to end into rows with block-diagonal causal attention (no pad "
           "tokens computed); false: one right-padded row per sample"),
      Choice(GYRE_CONFIG_KEY(trainer.prompt_sharing), {"auto", "on", "off"},
             "with sequence_packing: samples with the same prompt (a GRPO group) share one copy "
             "of it in a row, each response attending to it, so the prompt is computed once per "
             "group; auto = when the estimated forward cost is lower that way"),
      Num(GYRE_CONFIG_KEY(trainer.logprob_chunk_tokens), Closed(0, 1 << 24),
          "packed micro-batches: log-probs and entropies this many tokens at a time, never "
          "holding [tokens, vocabulary] logits; 0 = materialise the logits"),
      Flag(GYRE_CONFIG_KEY(trainer.activation_checkpointing),
           "keep only each decoder layer's input during the training forward and recompute the "
           "layer in the backward: less activation memory for about one more forward"),
      Num(GYRE_CONFIG_KEY(trainer.collective_timeout_s), OpenLow(0, 86400),
          "deadline of each data-parallel collective in seconds"),
      // reward
      Choice(GYRE_CONFIG_KEY(reward.type), {"builtin", "math", "service", "env", "custom"},
             "builtin = the task's verifier; math = the final number equals the answer; "
             "service = a reward server (docs/agents.md); env = the sum of the environment's "
             "step rewards (an env job); custom = a library user's RewardFn"),
      Text(GYRE_CONFIG_KEY(reward.address), kAnyText,
           "type service: host:port of a running reward server (or set reward.command)"),
      TextList(GYRE_CONFIG_KEY(reward.command),
               "type service: the command that serves, started and restarted by Gyre; {port} "
               "in an argument becomes the port to listen on"),
      Num(GYRE_CONFIG_KEY(reward.timeout_s), OpenLow(0, kDay),
          "type service: deadline of one Score request in seconds"),
      Num(GYRE_CONFIG_KEY(reward.item_timeout_s), OpenLow(0, kDay),
          "type service: the server's time budget per item in seconds"),
      Num(GYRE_CONFIG_KEY(reward.batch_size), Closed(1, 65536),
          "type service: items per Score request"),
      Num(GYRE_CONFIG_KEY(reward.concurrency), Closed(1, 1024),
          "type service: Score requests in flight"),
      Num(GYRE_CONFIG_KEY(reward.max_restarts), Closed(0, 1000),
          "type service: times a started server that died is restarted"),
      Num(GYRE_CONFIG_KEY(reward.ready_timeout_s), OpenLow(0, kDay),
          "type service: seconds from a start until the server must answer"),
      Choice(GYRE_CONFIG_KEY(reward.on_failure), {"drop_sample", "drop_group", "zero"},
             "a failed reward: leave its sample out, leave its whole group out, or count it as 0 "
             "(reported as reward_zeroed)"),
      Num(GYRE_CONFIG_KEY(reward.retries), Closed(0, 100),
          "times failed rewards are computed again before reward.on_failure applies"),
      // env
      Text(GYRE_CONFIG_KEY(env.address), kAnyText,
           "host:port of a running environment server (or set env.command); either turns "
           "multi-turn episodes on"),
      TextList(GYRE_CONFIG_KEY(env.command),
               "the command that serves the environment, started and restarted by Gyre; {port} "
               "in an argument becomes the port to listen on"),
      Num(GYRE_CONFIG_KEY(env.max_restarts), Closed(0, 1000),
          "times a started environment server that died is restarted"),
      Num(GYRE_CONFIG_KEY(env.ready_timeout_s), OpenLow(0, kDay),
          "seconds from a start until the environment server must answer"),
      Num(GYRE_CONFIG_KEY(env.concurrency), Closed(1, 4096),
          "environment calls in flight per rollout worker"),
      Num(GYRE_CONFIG_KEY(env.reset_timeout_s), OpenLow(0, kDay),
          "deadline of one Reset in seconds"),
      Num(GYRE_CONFIG_KEY(env.step_timeout_s), OpenLow(0, kDay),
          "deadline of one Step in seconds (never past the episode's deadline)"),
      Num(GYRE_CONFIG_KEY(env.close_timeout_s), OpenLow(0, kDay),
          "deadline of one Close in seconds"),
      Num(GYRE_CONFIG_KEY(env.retries), Closed(0, 100),
          "times a call is sent again after the server was unavailable"),
      Num(GYRE_CONFIG_KEY(env.max_turns), Closed(1, 1000), "model turns per episode"),
      Num(GYRE_CONFIG_KEY(env.episode_timeout_s), OpenLow(0, kDay),
          "wall time per episode in seconds, from its Reset"),
      Choice(GYRE_CONFIG_KEY(env.tool_format), {"hermes", "llama3"},
             "how the model writes tool calls: hermes = <tool_call>{json}</tool_call> (Qwen, "
             "SmolLM2); llama3 = the reply is one JSON object"),
      Text(GYRE_CONFIG_KEY(env.chat_template), kAnyText,
           "a Jinja chat template file for episodes; empty = the model's own (model.path)"),
      Text(GYRE_CONFIG_KEY(env.template_kwargs), kAnyText,
           "extra chat template variables as a JSON object, e.g. {\"enable_thinking\": false}"),
      Text(GYRE_CONFIG_KEY(env.end_of_turn_text), kAnyText,
           "the text the template writes where the model's stop token ends a turn (e.g. "
           "<|im_end|>); empty when the stop token has no text"),
      // cluster
      Choice(GYRE_CONFIG_KEY(cluster.mode), {"local", "external"},
             "local = the controller spawns its workers; external = workers connect to it"),
      Text(GYRE_CONFIG_KEY(cluster.bind_host), kNonEmpty, "address the controller listens on"),
      Num(GYRE_CONFIG_KEY(cluster.controller_port), Closed(0, 65535),
          "controller port; 0 = any free port"),
      Num(GYRE_CONFIG_KEY(cluster.register_timeout_s), OpenLow(0, kDay),
          "how long to wait for all workers to register"),
      Num(GYRE_CONFIG_KEY(cluster.heartbeat_interval_s), OpenLow(0, 3600),
          "seconds between worker heartbeats"),
      Num(GYRE_CONFIG_KEY(cluster.heartbeat_timeout_s), OpenLow(0, kDay),
          "silence after which a worker is declared dead"),
      Num(GYRE_CONFIG_KEY(cluster.rpc_timeout_s), OpenLow(0, kDay), "deadline of one worker RPC"),
      Num(GYRE_CONFIG_KEY(cluster.weight_sync_timeout_s), OpenLow(0, kDay),
          "deadline of one weight broadcast"),
      Num(GYRE_CONFIG_KEY(cluster.weight_bucket_bytes), Closed(1024, 17179869184.0),
          "weight-sync bucket size in bytes"),
      Choice(GYRE_CONFIG_KEY(cluster.weight_transport), {"grpc", "gloo", "nccl", "cuda_ipc"},
             "grpc = gRPC streams; gloo = bucketed Gloo broadcast over TCP; nccl = bucketed NCCL "
             "broadcast between GPUs; cuda_ipc = device-to-device copy on one host"),
      Num(GYRE_CONFIG_KEY(cluster.weight_relay_fanout), Closed(0, 64),
          "peer relay of weights (grpc): copies each holder sends per round; 0 = off"),
      Choice(GYRE_CONFIG_KEY(cluster.placement), {"colocated", "disaggregated"},
             "colocated = worker i of each role on GPU i; disaggregated = trainers on the first "
             "GPUs, rollout workers on the next ones"),
      Choice(GYRE_CONFIG_KEY(cluster.on_worker_failure), {"continue", "fail"},
             "continue = re-queue a dead worker's work on survivors; fail = stop the job"),
      Num(GYRE_CONFIG_KEY(cluster.max_worker_restarts), Closed(0, 1000),
          "times a dead rollout worker is respawned (local mode); 0 = never"),
      Text(GYRE_CONFIG_KEY(cluster.worker_binary), kAnyText,
           "worker executable; empty = this executable"),
      Text(GYRE_CONFIG_KEY(cluster.tls_cert), kAnyText,
           "PEM certificate of this process (mutual TLS on every gRPC channel)"),
      Text(GYRE_CONFIG_KEY(cluster.tls_key), kAnyText, "PEM private key of cluster.tls_cert"),
      Text(GYRE_CONFIG_KEY(cluster.tls_ca), kAnyText,
           "PEM CA bundle that signed every process's certificate"),
      Text(GYRE_CONFIG_KEY(cluster.tls_server_name), kNonEmpty,
           "name (subject alternative name) every server certificate carries"),
      Text(GYRE_CONFIG_KEY(cluster.auth_token_file), kAnyText,
           "file whose first line is the shared token every call carries (needs TLS)"),
      // metrics
      Text(GYRE_CONFIG_KEY(metrics.file), kNonEmpty, "metrics JSONL, inside the run directory"),
      Num(GYRE_CONFIG_KEY(metrics.eval_every), Closed(0, kMaxSteps),
          "GRPO steps between held-out evals; 0 = before and after training only"),
      Flag(GYRE_CONFIG_KEY(metrics.tensorboard), "TensorBoard event files in <run>/tensorboard/"),
      Text(GYRE_CONFIG_KEY(metrics.endpoint), kAnyText,
           "HOST:PORT serving /metrics and /health; empty = none"),
  };

  // Invariants that DumpJobConfig and the key lookup rely on.
  std::set<std::string> keys;
  std::set<std::string> closed_sections;
  std::vector<std::string> open;  // section path of the previous key
  for (const Field& f : t) {
    GYRE_CHECK(keys.insert(f.key).second) << "duplicate config key " << f.key;
    GYRE_CHECK(f.doc.find('\n') == std::string::npos) << f.key << ": doc must be one line";
    std::vector<std::string> parts = SplitString(f.key, '.');
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (size_t i = common; i < open.size(); ++i) {
      std::string prefix;
      for (size_t j = 0; j <= i; ++j) prefix += (j ? "." : "") + open[j];
      closed_sections.insert(prefix);
    }
    std::string prefix;
    for (const std::string& p : parts) {
      prefix += (prefix.empty() ? "" : ".") + p;
      GYRE_CHECK(!closed_sections.count(prefix))
          << "keys of section " << prefix << " must be contiguous in the table";
    }
    open = parts;
  }
  return t;
}

#undef GYRE_CONFIG_KEY

const std::vector<Field>& Table() {
  static const std::vector<Field>* table = new std::vector<Field>(BuildTable());
  return *table;
}

const Field* FindField(const std::string& key) {
  for (const Field& f : Table()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

// Old spellings of renamed fields, still read from files and --set. Each old key took a single
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
// Formatting.
// ---------------------------------------------------------------------------------------------

// Shortest of %.15g / %.17g that reads back as exactly `v` (so 0.2 prints as 0.2).
std::string FormatDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// As FormatDouble, but an integral value keeps a ".0" so a dump reads as a float field.
std::string FormatDoubleValue(double v) {
  std::string s = FormatDouble(v);
  if (std::isfinite(v) && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// A YAML double-quoted scalar; yaml-cpp decodes these escapes back to the same bytes.
std::string QuoteYaml(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02X", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

const char* TypeName(FieldType t) {
  switch (t) {
    case FieldType::kInt:
      return "int";
    case FieldType::kInt64:
      return "int64";
    case FieldType::kUint64:
      return "uint64";
    case FieldType::kDouble:
      return "double";
    case FieldType::kBool:
      return "bool";
    case FieldType::kString:
      return "string";
    case FieldType::kStringList:
      return "string list";
  }
  return "?";
}

const char* Expected(FieldType t) {
  switch (t) {
    case FieldType::kInt:
    case FieldType::kInt64:
    case FieldType::kUint64:
      return "an integer";
    case FieldType::kDouble:
      return "a number";
    case FieldType::kBool:
      return "true or false";
    case FieldType::kString:
      return "a string";
    case FieldType::kStringList:
      return "a list of strings";
  }
  return "?";
}

std::string RangeText(const Field& f) {
  if (!f.range) return "";
  const Range& r = *f.range;
  auto num = [&](double v) {
    if (f.type == FieldType::kDouble) return FormatDouble(v);
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return std::string(buf);
  };
  return std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) +
         (r.hi_open ? ")" : "]");
}

std::string JoinChoices(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// A YAML flow sequence of double-quoted strings: ["</answer>", "\n\nUser:"].
std::string ListText(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + QuoteYaml(v[i]);
  return out + "]";
}

// The field's current value in `cfg`, as DumpJobConfig writes it (strings quoted; a list's
// entries always are).
std::string ValueText(const Field& f, const JobConfig& cfg, bool quote_strings) {
  JobConfig copy = cfg;  // getters need a mutable config; a copy keeps `cfg` const
  FieldPtr p = f.get(copy);
  switch (f.type) {
    case FieldType::kInt:
      return std::to_string(*std::get<int*>(p));
    case FieldType::kInt64:
      return std::to_string(*std::get<int64_t*>(p));
    case FieldType::kUint64:
      return std::to_string(*std::get<uint64_t*>(p));
    case FieldType::kDouble:
      return FormatDoubleValue(*std::get<double*>(p));
    case FieldType::kBool:
      return *std::get<bool*>(p) ? "true" : "false";
    case FieldType::kString: {
      const std::string& s = *std::get<std::string*>(p);
      if (quote_strings || s.empty()) return QuoteYaml(s);
      return s;
    }
    case FieldType::kStringList:
      return ListText(*std::get<std::vector<std::string>*>(p));
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Checking and setting one field.
// ---------------------------------------------------------------------------------------------

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "" when `v` is inside the field's range; otherwise the problem, showing the value as `shown`.
std::string CheckNumber(const Field& f, double v, const std::string& shown) {
  if (!f.range) return "";
  const Range& r = *f.range;
  bool ok = !std::isnan(v) && v >= r.lo && v <= r.hi && !(r.lo_open && v == r.lo) &&
            !(r.hi_open && v == r.hi);
  if (ok) return "";
  return f.key + ": " + shown + " is out of range " + RangeText(f);
}

std::string CheckString(const Field& f, const std::string& v) {
  const std::vector<std::string> choices = ChoicesOf(f);
  if (!choices.empty()) {
    for (const std::string& c : choices) {
      if (v == c) return "";
    }
    std::string msg = f.key + ": '" + v + "' is not one of " + JoinChoices(choices);
    std::string near = NearestWord(Lower(v), choices);
    if (!near.empty()) msg += "; did you mean '" + near + "'?";
    return msg;
  }
  if (f.non_empty && v.empty()) return f.key + ": must not be empty";
  return "";
}

// "" when every entry of a string list is acceptable; otherwise the first problem. *bad (if
// given) receives the index of the offending entry.
std::string CheckStringList(const Field& f, const std::vector<std::string>& v,
                            size_t* bad = nullptr) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (f.non_empty && v[i].empty()) {
      if (bad != nullptr) *bad = i;
      return f.key + ": entry " + std::to_string(i + 1) + " must not be empty";
    }
  }
  return "";
}

// The range check of the field's current value, for configs built in code.
std::string CheckCurrentValue(const Field& f, const JobConfig& cfg) {
  JobConfig copy = cfg;
  FieldPtr p = f.get(copy);
  const std::string shown = ValueText(f, cfg, false);
  switch (f.type) {
    case FieldType::kInt:
      return CheckNumber(f, *std::get<int*>(p), shown);
    case FieldType::kInt64:
      return CheckNumber(f, static_cast<double>(*std::get<int64_t*>(p)), shown);
    case FieldType::kDouble:
      return CheckNumber(f, *std::get<double*>(p), shown);
    case FieldType::kString:
      return CheckString(f, *std::get<std::string*>(p));
    case FieldType::kStringList:
      return CheckStringList(f, *std::get<std::vector<std::string>*>(p));
    case FieldType::kUint64:
    case FieldType::kBool:
      return "";
  }
  return "";
}

// Decimal integer with optional sign; *overflow when it does not fit the parse type.
bool ParseSigned(const std::string& s, int64_t* out, bool* overflow) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j) {
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return false;
  }
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  *overflow = errno == ERANGE;
  *out = v;
  return true;
}

bool ParseUnsigned(const std::string& s, uint64_t* out, bool* out_of_range) {
  int64_t ignored;
  bool overflow;
  if (!ParseSigned(s, &ignored, &overflow)) return false;
  // strtoull would silently wrap "-1"; a negative number is a valid integer, just out of range.
  if (s[0] == '-') {
    *out_of_range = true;
    return true;
  }
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  *out_of_range = errno == ERANGE;
  *out = v;
  return true;
}

// Decimal or scientific notation only: strtod alone would also take "nan", "inf" and hex.
bool ParseDouble(const std::string& s, double* out) {
  if (s.empty() || s.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  if (s.find_first_of("0123456789") == std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);  // overflow gives +-HUGE_VAL, caught by the range check
  return end == s.c_str() + s.size();
}

bool ParseBool(const std::string& s, bool* out) {
  static const char* kTrue[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* kFalse[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (const char* t : kTrue) {
    if (s == t) {
      *out = true;
      return true;
    }
  }
  for (const char* t : kFalse) {
    if (s == t) {
      *out = false;
      return true;
    }
  }
  return false;
}

std::string DescribeNode(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Undefined:
      return "nothing";
  }
  return "?";
}

// A string list's value: a YAML sequence of scalars (each read as its text, like a string
// field); an empty value is the empty list. On error *error_at (if given and the culprit has a
// position) is moved to the offending entry.
StatusOr<std::vector<std::string>> ParseStringList(const Field& f, const YAML::Node& node,
                                                   YAML::Mark* error_at) {
  std::vector<std::string> v;
  if (node.IsNull()) return v;
  if (!node.IsSequence()) {
    return InvalidArgument(f.key + ": expected " + Expected(f.type) +
                           " such as [\"a\", \"b\"], got " + DescribeNode(node));
  }
  std::vector<YAML::Mark> marks;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node e = *it;
    if (!e.IsScalar()) {
      if (error_at != nullptr && !e.IsNull()) *error_at = e.Mark();
      return InvalidArgument(f.key + ": entry " + std::to_string(v.size() + 1) +
                             ": expected a string, got " + DescribeNode(e));
    }
    v.push_back(e.Scalar());
    marks.push_back(e.Mark());
  }
  size_t bad = 0;
  const std::string problem = CheckStringList(f, v, &bad);
  if (!problem.empty()) {
    if (error_at != nullptr) *error_at = marks[bad];
    return InvalidArgument(problem);
  }
  return v;
}

// Parses `node` as the field's value and stores it in `cfg`. On error (message without a
// location prefix) `cfg` is untouched; *error_at (if given) starts as the position of `node` and
// may be moved to a more precise one, such as a bad entry of a list.
Status SetField(const Field& f, const YAML::Node& node, JobConfig* cfg,
                YAML::Mark* error_at = nullptr) {
  if (f.type == FieldType::kStringList) {
    GYRE_ASSIGN_OR_RETURN(std::vector<std::string> v, ParseStringList(f, node, error_at));
    *std::get<std::vector<std::string>*>(f.get(*cfg)) = std::move(v);
    return Status::Ok();
  }
  // An empty value is the empty string for a string field ("path:" reads naturally as "none").
  bool empty_string = f.type == FieldType::kString && node.IsNull();
  if (!node.IsScalar() && !empty_string) {
    return InvalidArgument(f.key + ": expected " + Expected(f.type) + ", got " +
                           DescribeNode(node));
  }
  const std::string text = empty_string ? "" : node.Scalar();
  auto type_error = [&] {
    return InvalidArgument(f.key + ": expected " + Expected(f.type) + ", got '" + text + "'");
  };
  auto check = [](const std::string& problem) {
    return problem.empty() ? Status::Ok() : InvalidArgument(problem);
  };
  FieldPtr p = f.get(*cfg);
  switch (f.type) {
    case FieldType::kInt:
    case FieldType::kInt64: {
      int64_t v = 0;
      bool overflow = false;
      if (!ParseSigned(text, &v, &overflow)) return type_error();
      double as_double =
          overflow ? (text[0] == '-' ? -HUGE_VAL : HUGE_VAL) : static_cast<double>(v);
      GYRE_RETURN_IF_ERROR(check(CheckNumber(f, as_double, text)));
      if (f.type == FieldType::kInt) {
        *std::get<int*>(p) = static_cast<int>(v);
      } else {
        *std::get<int64_t*>(p) = v;
      }
      return Status::Ok();
    }
    case FieldType::kUint64: {
      uint64_t v = 0;
      bool out_of_range = false;
      if (!ParseUnsigned(text, &v, &out_of_range)) return type_error();
      if (out_of_range) {
        return InvalidArgument(f.key + ": " + text + " is out of range [0, " +
                               std::to_string(UINT64_MAX) + "]");
      }
      *std::get<uint64_t*>(p) = v;
      return Status::Ok();
    }
    case FieldType::kDouble: {
      double v = 0;
      if (!ParseDouble(text, &v)) return type_error();
      GYRE_RETURN_IF_ERROR(check(CheckNumber(f, v, text)));
      *std::get<double*>(p) = v;
      return Status::Ok();
    }
    case FieldType::kBool: {
      bool v = false;
      if (!ParseBool(text, &v)) return type_error();
      *std::get<bool*>(p) = v;
      return Status::Ok();
    }
    case FieldType::kString: {
      GYRE_RETURN_IF_ERROR(check(CheckString(f, text)));
      *std::get<std::string*>(p) = text;
      return Status::Ok();
    }
    case FieldType::kStringList:
      break;  // handled above
  }
  return Internal("unhandled field type");
}

// Sets the list field an alias stands for from the alias's single string (see kAliases).
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
// Cross-field validation.
// ---------------------------------------------------------------------------------------------

struct Problem {
  std::vector<std::string> keys;  // the fields involved, to locate the error in a file
  std::string message;            // names the fields itself
};

std::optional<Problem> FindProblem(const JobConfig& c) {
  for (const Field& f : Table()) {
    std::string problem = CheckCurrentValue(f, c);
    if (!problem.empty()) return Problem{{f.key}, problem};
  }
  auto num = [](double v) { return FormatDouble(v); };
  auto str = [](int64_t v) { return std::to_string(v); };

  for (char ch : c.job.name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-') {
      return Problem{{"job.name"},
                     "job.name: '" + c.job.name +
                         "' must be a plain directory name (letters, digits, '.', "
                         "'_', '-')"};
    }
  }
  if (c.job.name == "." || c.job.name == "..") {
    return Problem{{"job.name"}, "job.name: '" + c.job.name + "' is not a usable directory name"};
  }
  if (c.model.hidden_size % c.model.num_heads != 0) {
    return Problem{{"model.hidden_size", "model.num_heads"},
                   "model.hidden_size (" + str(c.model.hidden_size) +
                       ") must be divisible by model.num_heads (" + str(c.model.num_heads) + ")"};
  }
  if ((c.model.hidden_size / c.model.num_heads) % 2 != 0) {
    return Problem{
        {"model.hidden_size", "model.num_heads"},
        "model.hidden_size / model.num_heads = " + str(c.model.hidden_size / c.model.num_heads) +
            " must be even (rotary embeddings rotate pairs of dimensions)"};
  }
  if (c.model.num_heads % c.model.num_kv_heads != 0) {
    return Problem{{"model.num_kv_heads", "model.num_heads"},
                   "model.num_heads (" + str(c.model.num_heads) +
                       ") must be divisible by model.num_kv_heads (" + str(c.model.num_kv_heads) +
                       ") (each key/value head serves a whole group of query heads)"};
  }
  const std::string& wt = c.cluster.weight_transport;
  if ((wt == "nccl" || wt == "cuda_ipc") && c.model.device == "cpu") {
    return Problem{{"cluster.weight_transport", "model.device"},
                   "cluster.weight_transport: " + wt +
                       " moves weights between GPUs; set model.device: cuda (or use grpc or gloo "
                       "with model.device: cpu)"};
  }
  if (wt == "nccl" && c.cluster.placement != "disaggregated") {
    return Problem{{"cluster.weight_transport", "cluster.placement"},
                   "cluster.weight_transport: nccl needs the trainer and the rollout workers on "
                   "different GPUs (NCCL cannot connect two ranks on one GPU): set "
                   "cluster.placement: disaggregated, or use cuda_ipc for colocated workers"};
  }
  if (wt != "grpc" && c.cluster.weight_relay_fanout > 0) {
    return Problem{{"cluster.weight_relay_fanout", "cluster.weight_transport"},
                   "cluster.weight_relay_fanout relays weights between rollout workers over gRPC; "
                   "it needs cluster.weight_transport: grpc (or set it to 0)"};
  }
  if (wt == "grpc" && c.cluster.weight_bucket_bytes > kMaxGrpcWeightBucketBytes) {
    return Problem{{"cluster.weight_bucket_bytes", "cluster.weight_transport"},
                   "cluster.weight_bucket_bytes (" + str(c.cluster.weight_bucket_bytes) +
                       ") is larger than the gRPC weight transport can carry in one message (" +
                       str(kMaxGrpcWeightBucketBytes) +
                       " bytes); lower it, or use cluster.weight_transport: gloo"};
  }
  if (wt == "cuda_ipc" && c.cluster.mode != "local") {
    return Problem{{"cluster.weight_transport", "cluster.mode"},
                   "cluster.weight_transport: cuda_ipc needs the trainer and the rollout workers "
                   "on one host (cluster.mode: local); use nccl across hosts"};
  }
  if (c.data.min_digits > c.data.max_digits) {
    return Problem{{"data.min_digits", "data.max_digits"},
                   "data.min_digits (" + str(c.data.min_digits) + ") must be <= data.max_digits (" +
                       str(c.data.max_digits) + ")"};
  }
  if (c.data.task == "addition") {
    // The longest prompt is "<a>+<b>=" with max_digits-digit operands, plus the completion.
    int64_t need = 2 * int64_t{c.data.max_digits} + 2 + c.rollout.max_new_tokens;
    if (c.model.max_seq_len <= need) {
      return Problem{{"model.max_seq_len", "data.max_digits", "rollout.max_new_tokens"},
                     "model.max_seq_len (" + str(c.model.max_seq_len) +
                         ") must be greater than 2 * data.max_digits + 2 + "
                         "rollout.max_new_tokens = " +
                         str(need) + " (the longest addition prompt plus its completion)"};
    }
  }
  if (c.data.task == "copy") {
    // The longest prompt is "c<max_digits digits>=", plus the completion.
    const int64_t need = int64_t{c.data.max_digits} + 2 + c.rollout.max_new_tokens;
    if (c.model.max_seq_len <= need) {
      return Problem{{"model.max_seq_len", "data.max_digits", "rollout.max_new_tokens"},
                     "model.max_seq_len (" + str(c.model.max_seq_len) +
                         ") must be greater than data.max_digits + 2 + rollout.max_new_tokens = " +
                         str(need) + " (the longest copy prompt plus its completion)"};
    }
  }
  if (c.algorithm.advantage == "rloo" && c.rollout.group_size < 2) {
    return Problem{{"rollout.group_size", "algorithm.advantage"},
                   "rollout.group_size (" + str(c.rollout.group_size) +
                       ") must be >= 2 when algorithm.advantage is rloo (the leave-one-out "
                       "baseline needs another sample of the same prompt)"};
  }
  const BudgetSection& b = c.rollout.budget;
  if (b.policy != "uniform" && (c.rollout.async || c.rollout.partial_rollouts)) {
    return Problem{
        {"rollout.budget.policy", c.rollout.async ? "rollout.async" : "rollout.partial_rollouts"},
        "rollout.budget.policy: " + b.policy +
            " decides each step's samples after a first round, which needs "
            "synchronous rollout (rollout.async and rollout.partial_rollouts off)"};
  }
  if ((b.policy == "pilot" || b.policy == "variance") && b.pilot_samples > c.rollout.group_size) {
    return Problem{{"rollout.budget.pilot_samples", "rollout.group_size"},
                   "rollout.budget.pilot_samples (" + str(b.pilot_samples) +
                       ") must be at most rollout.group_size (" + str(c.rollout.group_size) + ")"};
  }
  if (b.policy == "variance" && b.pilot_samples < 2) {
    return Problem{{"rollout.budget.pilot_samples", "rollout.budget.policy"},
                   "rollout.budget.policy: variance needs rollout.budget.pilot_samples >= 2 (a "
                   "group's reward variance needs two samples)"};
  }
  if (b.pilot_low > b.pilot_high) {
    return Problem{{"rollout.budget.pilot_low", "rollout.budget.pilot_high"},
                   "rollout.budget.pilot_low (" + num(b.pilot_low) +
                       ") must be <= rollout.budget.pilot_high (" + num(b.pilot_high) + ")"};
  }
  if (c.reward.type == "service" && c.reward.address.empty() == c.reward.command.empty()) {
    return Problem{{"reward.type", "reward.address", "reward.command"},
                   "reward.type: service needs exactly one of reward.address (a running reward "
                   "server, host:port) and reward.command (a server for Gyre to start)"};
  }
  if (c.reward.type != "service" && (!c.reward.address.empty() || !c.reward.command.empty())) {
    return Problem{{"reward.type", c.reward.address.empty() ? "reward.command" : "reward.address"},
                   "reward." + std::string(c.reward.address.empty() ? "command" : "address") +
                       " is set but reward.type is " + c.reward.type +
                       ": set reward.type: service"};
  }
  const bool env = c.env.enabled();
  if (!c.env.address.empty() && !c.env.command.empty()) {
    return Problem{{"env.address", "env.command"},
                   "set one of env.address (a running environment server) and env.command (a "
                   "server for Gyre to start), not both"};
  }
  if (c.reward.type == "env" && !env) {
    return Problem{{"reward.type", "env.command", "env.address"},
                   "reward.type: env scores episodes by their environment's rewards: set "
                   "env.command or env.address"};
  }
  if (env && (c.rollout.async || c.rollout.partial_rollouts)) {
    return Problem{{c.rollout.async ? "rollout.async" : "rollout.partial_rollouts", "env.command",
                    "env.address"},
                   "environment episodes (env.command or env.address) run with synchronous "
                   "rollout: turn rollout.async and rollout.partial_rollouts off"};
  }
  if (env && c.rollout.budget.policy != "uniform") {
    return Problem{{"rollout.budget.policy", "env.command", "env.address"},
                   "environment episodes (env.command or env.address) need "
                   "rollout.budget.policy: uniform"};
  }
  if (env && c.env.chat_template.empty() && c.model.path.empty()) {
    return Problem{{"env.chat_template", "env.command", "env.address"},
                   "environment episodes render the environment's messages with a chat template, "
                   "and the built-in model has none: set env.chat_template to a Jinja file (e.g. "
                   "configs/templates/tiny_tools.jinja)"};
  }
  {
    const ClusterSection& k = c.cluster;
    const int tls_set = !k.tls_cert.empty() + !k.tls_key.empty() + !k.tls_ca.empty();
    if (tls_set != 0 && tls_set != 3) {
      return Problem{{"cluster.tls_cert", "cluster.tls_key", "cluster.tls_ca"},
                     "mutual TLS needs all three of cluster.tls_cert, cluster.tls_key and "
                     "cluster.tls_ca (or none of them, for plaintext)"};
    }
    if (!k.auth_token_file.empty() && tls_set == 0) {
      return Problem{{"cluster.auth_token_file", "cluster.tls_cert"},
                     "cluster.auth_token_file needs TLS (a token sent in the clear can be read off "
                     "the network): set cluster.tls_cert, cluster.tls_key and cluster.tls_ca too"};
    }
  }
  if (!c.metrics.endpoint.empty()) {
    const std::string& a = c.metrics.endpoint;
    std::string host;
    int port = 0;
    if (!ParseHostPort(a, &host, &port)) {
      return Problem{{"metrics.endpoint"},
                     "metrics.endpoint '" + a +
                         "' is not HOST:PORT with a port from 0 to 65535 (e.g. 127.0.0.1:9400; "
                         "0.0.0.0:9400 listens on every interface)"};
    }
  }
  if (c.algorithm.kl_in == "reward" && c.algorithm.kl == "none") {
    return Problem{
        {"algorithm.kl_in", "algorithm.kl"},
        "algorithm.kl_in: reward needs a KL estimator: set algorithm.kl to k1, k2 or k3"};
  }
  if (c.algorithm.overlong_buffer > 0 && c.algorithm.overlong_buffer >= c.rollout.max_new_tokens) {
    return Problem{{"algorithm.overlong_buffer", "rollout.max_new_tokens"},
                   "algorithm.overlong_buffer (" + str(c.algorithm.overlong_buffer) +
                       ") must be below rollout.max_new_tokens (" + str(c.rollout.max_new_tokens) +
                       "): the penalty ramps up over the last overlong_buffer tokens of the "
                       "length limit"};
  }
  if (c.rollout.partial_rollouts && c.algorithm.max_staleness < 1) {
    return Problem{{"rollout.partial_rollouts", "algorithm.max_staleness"},
                   "rollout.partial_rollouts needs algorithm.max_staleness >= 1 (a resumed sample "
                   "carries tokens of the previous policy version)"};
  }
  if (c.cluster.mode == "local" && c.rollout.workers > 64) {
    return Problem{{"rollout.workers", "cluster.mode"},
                   "rollout.workers (" + str(c.rollout.workers) +
                       ") must be at most 64 with cluster.mode: local (one host); start more "
                       "workers across hosts with cluster.mode: external"};
  }
  if (c.rollout.weight_updates != "lockstep" && !c.rollout.async) {
    return Problem{{"rollout.weight_updates", "rollout.async"},
                   "rollout.weight_updates: " + c.rollout.weight_updates +
                       " needs rollout.async: true (a synchronous step never has generation "
                       "running while it publishes)"};
  }
  if (c.rollout.async && c.algorithm.max_staleness > 0 &&
      c.algorithm.max_staleness < c.trainer.mini_batches) {
    return Problem{{"algorithm.max_staleness", "trainer.mini_batches"},
                   "rollout.async: algorithm.max_staleness (" + str(c.algorithm.max_staleness) +
                       ") is below trainer.mini_batches (" + str(c.trainer.mini_batches) +
                       "), so rollout can never run ahead: each GRPO step is " +
                       str(c.trainer.mini_batches) +
                       " policy versions; set max_staleness to at least that (or to 0)"};
  }
  if (c.trainer.publish_every > 1 && !c.rollout.async) {
    return Problem{{"trainer.publish_every", "rollout.async"},
                   "trainer.publish_every: " + str(c.trainer.publish_every) +
                       " needs rollout.async: true (a synchronous step generates with the "
                       "weights of the step before it)"};
  }
  if (c.trainer.publish_every > 1 &&
      c.algorithm.max_staleness < c.trainer.publish_every * c.trainer.mini_batches) {
    return Problem{{"trainer.publish_every", "algorithm.max_staleness"},
                   "trainer.publish_every: " + str(c.trainer.publish_every) +
                       " leaves the rollout workers up to " +
                       str((c.trainer.publish_every - 1) * c.trainer.mini_batches) +
                       " policy versions behind the trainer; set algorithm.max_staleness to at "
                       "least publish_every * trainer.mini_batches = " +
                       str(c.trainer.publish_every * c.trainer.mini_batches) +
                       " so they can still run ahead"};
  }
  if (c.rollout.async && c.rollout.partial_rollouts) {
    return Problem{
        {"rollout.async", "rollout.partial_rollouts"},
        "rollout.async and rollout.partial_rollouts cannot be combined yet (choose one)"};
  }
  if (c.algorithm.tis && c.algorithm.correction != "none" && c.algorithm.correction != "tis") {
    return Problem{{"algorithm.tis", "algorithm.correction"},
                   "algorithm.tis: true is shorthand for algorithm.correction: tis, but "
                   "algorithm.correction is " +
                       c.algorithm.correction + "; set only one of them"};
  }
  if (c.algorithm.proximal == "behaviour" &&
      (c.algorithm.tis || c.algorithm.correction != "none")) {
    return Problem{{"algorithm.proximal", "algorithm.correction"},
                   "algorithm.proximal: behaviour takes the ratio against the rollout policy "
                   "itself, so a behaviour weight (algorithm.correction / algorithm.tis) would "
                   "always be 1; use proximal: recompute or loglinear with a correction"};
  }
  if (c.algorithm.proximal == "loglinear" && c.algorithm.correction == "m2po") {
    return Problem{{"algorithm.proximal", "algorithm.correction"},
                   "algorithm.correction: m2po needs the proximal log-probs of the whole batch "
                   "before the step, which proximal: recompute computes exactly; loglinear "
                   "would gain nothing"};
  }
  if (c.algorithm.dual_clip_c != 0 && c.algorithm.dual_clip_c <= 1) {
    return Problem{{"algorithm.dual_clip_c"},
                   "algorithm.dual_clip_c (" + num(c.algorithm.dual_clip_c) +
                       ") must be 0 (off) or greater than 1"};
  }
  if (c.cluster.heartbeat_timeout_s <= c.cluster.heartbeat_interval_s) {
    return Problem{{"cluster.heartbeat_timeout_s", "cluster.heartbeat_interval_s"},
                   "cluster.heartbeat_timeout_s (" + num(c.cluster.heartbeat_timeout_s) +
                       ") must be greater than cluster.heartbeat_interval_s (" +
                       num(c.cluster.heartbeat_interval_s) + ")"};
  }
  return std::nullopt;
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

// ---------------------------------------------------------------------------------------------
// Public API.
// ---------------------------------------------------------------------------------------------

Status ApplyOverride(JobConfig* cfg, const std::string& key_eq_value) {
  std::string key;
  return ApplyOverrideImpl(cfg, key_eq_value, &key);
}

Status ValidateJobConfig(const JobConfig& cfg) {
  std::optional<Problem> p = FindProblem(cfg);
  return p ? InvalidArgument(p->message) : Status::Ok();
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

std::string DumpJobConfig(const JobConfig& cfg) {
  std::string out =
      "# Effective Gyre job config: every field, after --set overrides.\n"
      "# Field reference: docs/config.md.\n";
  std::vector<std::string> open;  // section path of the previous key
  for (const Field& f : Table()) {
    std::vector<std::string> parts = SplitString(f.key, '.');
    std::string leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (size_t i = common; i < parts.size(); ++i) {
      out += std::string(2 * i, ' ') + parts[i] + ":\n";
    }
    open = parts;
    // A choice lists its values (for the algorithm keys, the registry's names).
    const std::vector<std::string> choices = ChoicesOf(f);
    out += std::string(2 * parts.size(), ' ') + leaf + ": " + ValueText(f, cfg, true) + "  # " +
           f.doc + (choices.empty() ? "" : " (one of: " + JoinChoices(choices) + ")") + "\n";
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ConfigValues(const JobConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : Table()) out.emplace_back(f.key, ValueText(f, cfg, true));
  return out;
}

std::vector<std::string> AllConfigKeys() {
  std::vector<std::string> keys;
  for (const Field& f : Table()) keys.push_back(f.key);
  return keys;
}

std::vector<ConfigKeyInfo> DescribeConfigKeys() {
  const JobConfig defaults;
  std::vector<ConfigKeyInfo> out;
  for (const Field& f : Table()) {
    ConfigKeyInfo info;
    info.key = f.key;
    info.type = TypeName(f.type);
    info.default_value = ValueText(f, defaults, false);
    if (f.range) {
      info.allowed = RangeText(f);
    } else if (!ChoicesOf(f).empty()) {
      info.allowed = JoinChoices(ChoicesOf(f));
    } else if (f.type == FieldType::kBool) {
      info.allowed = "true, false";
    } else if (f.type == FieldType::kStringList) {
      info.allowed = f.non_empty ? "non-empty strings" : "any strings";
    } else if (f.non_empty) {
      info.allowed = "non-empty";
    } else {
      info.allowed = "any";
    }
    info.doc = f.doc;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace gyre::config
