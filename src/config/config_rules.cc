// Cross-field rules: what a single field's range cannot express, e.g. min_digits <= max_digits or
// num_heads dividing hidden_size. Each rule group is a function returning the first problem it
// finds; FindProblem runs them in a fixed order, so a config with several problems always
// reports the same one.

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>

#include "common/limits.h"
#include "common/strings.h"
#include "config/config_internal.h"

namespace gyre::config::internal {
namespace {

// Numbers in messages.
std::string Real(double v) { return FormatDouble(v); }
std::string Int(int64_t v) { return std::to_string(v); }

// Each field against its own range or choices (a config built in code skips the parser's checks).
std::optional<Problem> CheckFieldRanges(const JobConfig& c) {
  for (const Field& f : Table()) {
    std::string problem = CheckCurrentValue(f, c);
    if (!problem.empty()) return Problem{{f.key}, problem};
  }
  return std::nullopt;
}

// job.name becomes a directory name.
std::optional<Problem> CheckJobName(const JobConfig& c) {
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
  return std::nullopt;
}

// The built-in decoder's heads divide its width evenly, in rotary pairs.
std::optional<Problem> CheckModelShape(const JobConfig& c) {
  if (c.model.hidden_size % c.model.num_heads != 0) {
    return Problem{{"model.hidden_size", "model.num_heads"},
                   "model.hidden_size (" + Int(c.model.hidden_size) +
                       ") must be divisible by model.num_heads (" + Int(c.model.num_heads) + ")"};
  }
  if ((c.model.hidden_size / c.model.num_heads) % 2 != 0) {
    return Problem{
        {"model.hidden_size", "model.num_heads"},
        "model.hidden_size / model.num_heads = " + Int(c.model.hidden_size / c.model.num_heads) +
            " must be even (rotary embeddings rotate pairs of dimensions)"};
  }
  if (c.model.num_heads % c.model.num_kv_heads != 0) {
    return Problem{{"model.num_kv_heads", "model.num_heads"},
                   "model.num_heads (" + Int(c.model.num_heads) +
                       ") must be divisible by model.num_kv_heads (" + Int(c.model.num_kv_heads) +
                       ") (each key/value head serves a whole group of query heads)"};
  }
  return std::nullopt;
}

// The weight transport suits the devices, placement, mode and bucket size.
std::optional<Problem> CheckWeightTransport(const JobConfig& c) {
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
                   "cluster.weight_bucket_bytes (" + Int(c.cluster.weight_bucket_bytes) +
                       ") is larger than the gRPC weight transport can carry in one message (" +
                       Int(kMaxGrpcWeightBucketBytes) +
                       " bytes); lower it, or use cluster.weight_transport: gloo"};
  }
  if (wt == "cuda_ipc" && c.cluster.mode != "local") {
    return Problem{{"cluster.weight_transport", "cluster.mode"},
                   "cluster.weight_transport: cuda_ipc needs the trainer and the rollout workers "
                   "on one host (cluster.mode: local); use nccl across hosts"};
  }
  return std::nullopt;
}

// The built-in tasks' longest prompt plus completion fits model.max_seq_len.
std::optional<Problem> CheckTaskLengths(const JobConfig& c) {
  if (c.data.min_digits > c.data.max_digits) {
    return Problem{{"data.min_digits", "data.max_digits"},
                   "data.min_digits (" + Int(c.data.min_digits) + ") must be <= data.max_digits (" +
                       Int(c.data.max_digits) + ")"};
  }
  if (c.data.task == "addition") {
    // The longest prompt is "<a>+<b>=" with max_digits-digit operands, plus the completion.
    int64_t need = 2 * int64_t{c.data.max_digits} + 2 + c.rollout.max_new_tokens;
    if (c.model.max_seq_len <= need) {
      return Problem{{"model.max_seq_len", "data.max_digits", "rollout.max_new_tokens"},
                     "model.max_seq_len (" + Int(c.model.max_seq_len) +
                         ") must be greater than 2 * data.max_digits + 2 + "
                         "rollout.max_new_tokens = " +
                         Int(need) + " (the longest addition prompt plus its completion)"};
    }
  }
  if (c.data.task == "copy") {
    // The longest prompt is "c<max_digits digits>=", plus the completion.
    const int64_t need = int64_t{c.data.max_digits} + 2 + c.rollout.max_new_tokens;
    if (c.model.max_seq_len <= need) {
      return Problem{{"model.max_seq_len", "data.max_digits", "rollout.max_new_tokens"},
                     "model.max_seq_len (" + Int(c.model.max_seq_len) +
                         ") must be greater than data.max_digits + 2 + rollout.max_new_tokens = " +
                         Int(need) + " (the longest copy prompt plus its completion)"};
    }
  }
  return std::nullopt;
}

// The advantage estimator and the sampling policy have the samples they need.
std::optional<Problem> CheckSamplingBudget(const JobConfig& c) {
  if (c.algorithm.advantage == "rloo" && c.rollout.group_size < 2) {
    return Problem{{"rollout.group_size", "algorithm.advantage"},
                   "rollout.group_size (" + Int(c.rollout.group_size) +
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
                   "rollout.budget.pilot_samples (" + Int(b.pilot_samples) +
                       ") must be at most rollout.group_size (" + Int(c.rollout.group_size) + ")"};
  }
  if (b.policy == "variance" && b.pilot_samples < 2) {
    return Problem{{"rollout.budget.pilot_samples", "rollout.budget.policy"},
                   "rollout.budget.policy: variance needs rollout.budget.pilot_samples >= 2 (a "
                   "group's reward variance needs two samples)"};
  }
  if (b.pilot_low > b.pilot_high) {
    return Problem{{"rollout.budget.pilot_low", "rollout.budget.pilot_high"},
                   "rollout.budget.pilot_low (" + Real(b.pilot_low) +
                       ") must be <= rollout.budget.pilot_high (" + Real(b.pilot_high) + ")"};
  }
  return std::nullopt;
}

// A reward server is configured exactly when reward.type is service.
std::optional<Problem> CheckReward(const JobConfig& c) {
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
  return std::nullopt;
}

// Environment episodes: one server, synchronous uniform rollout, a chat template.
std::optional<Problem> CheckEnvironment(const JobConfig& c) {
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
  return std::nullopt;
}

// Mutual TLS is all or nothing, and a token needs it.
std::optional<Problem> CheckSecurity(const JobConfig& c) {
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
  return std::nullopt;
}

// metrics.endpoint is HOST:PORT.
std::optional<Problem> CheckMetricsEndpoint(const JobConfig& c) {
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
  return std::nullopt;
}

// KL in the reward needs an estimator; the overlong buffer fits the length limit.
std::optional<Problem> CheckRewardShaping(const JobConfig& c) {
  if (c.algorithm.kl_in == "reward" && c.algorithm.kl == "none") {
    return Problem{
        {"algorithm.kl_in", "algorithm.kl"},
        "algorithm.kl_in: reward needs a KL estimator: set algorithm.kl to k1, k2 or k3"};
  }
  if (c.algorithm.overlong_buffer > 0 && c.algorithm.overlong_buffer >= c.rollout.max_new_tokens) {
    return Problem{{"algorithm.overlong_buffer", "rollout.max_new_tokens"},
                   "algorithm.overlong_buffer (" + Int(c.algorithm.overlong_buffer) +
                       ") must be below rollout.max_new_tokens (" + Int(c.rollout.max_new_tokens) +
                       "): the penalty ramps up over the last overlong_buffer tokens of the "
                       "length limit"};
  }
  return std::nullopt;
}

// Asynchronous and partial rollout, weight updates and publishing agree with max_staleness; local
// mode's worker count.
std::optional<Problem> CheckRolloutScheduling(const JobConfig& c) {
  if (c.rollout.partial_rollouts && c.algorithm.max_staleness < 1) {
    return Problem{{"rollout.partial_rollouts", "algorithm.max_staleness"},
                   "rollout.partial_rollouts needs algorithm.max_staleness >= 1 (a resumed sample "
                   "carries tokens of the previous policy version)"};
  }
  if (c.cluster.mode == "local" && c.rollout.workers > 64) {
    return Problem{{"rollout.workers", "cluster.mode"},
                   "rollout.workers (" + Int(c.rollout.workers) +
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
                   "rollout.async: algorithm.max_staleness (" + Int(c.algorithm.max_staleness) +
                       ") is below trainer.mini_batches (" + Int(c.trainer.mini_batches) +
                       "), so rollout can never run ahead: each GRPO step is " +
                       Int(c.trainer.mini_batches) +
                       " policy versions; set max_staleness to at least that (or to 0)"};
  }
  if (c.trainer.publish_every > 1 && !c.rollout.async) {
    return Problem{{"trainer.publish_every", "rollout.async"},
                   "trainer.publish_every: " + Int(c.trainer.publish_every) +
                       " needs rollout.async: true (a synchronous step generates with the "
                       "weights of the step before it)"};
  }
  if (c.trainer.publish_every > 1 &&
      c.algorithm.max_staleness < c.trainer.publish_every * c.trainer.mini_batches) {
    return Problem{{"trainer.publish_every", "algorithm.max_staleness"},
                   "trainer.publish_every: " + Int(c.trainer.publish_every) +
                       " leaves the rollout workers up to " +
                       Int((c.trainer.publish_every - 1) * c.trainer.mini_batches) +
                       " policy versions behind the trainer; set algorithm.max_staleness to at "
                       "least publish_every * trainer.mini_batches = " +
                       Int(c.trainer.publish_every * c.trainer.mini_batches) +
                       " so they can still run ahead"};
  }
  if (c.rollout.async && c.rollout.partial_rollouts) {
    return Problem{
        {"rollout.async", "rollout.partial_rollouts"},
        "rollout.async and rollout.partial_rollouts cannot be combined yet (choose one)"};
  }
  return std::nullopt;
}

// Behaviour-policy corrections agree with the proximal policy; the dual clip bound.
std::optional<Problem> CheckCorrection(const JobConfig& c) {
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
                   "algorithm.dual_clip_c (" + Real(c.algorithm.dual_clip_c) +
                       ") must be 0 (off) or greater than 1"};
  }
  return std::nullopt;
}

// trainer.shard: parameters (ZeRO-3): every trainer takes part in publishing a version (gathered
// unit by unit and streamed by trainer-0), which the host transports can do.
std::optional<Problem> CheckShard(const JobConfig& c) {
  if (!c.trainer.reshard_after_forward && c.trainer.shard != "parameters") {
    return Problem{{"trainer.reshard_after_forward", "trainer.shard"},
                   "trainer.reshard_after_forward: false keeps the layers that trainer.shard: "
                   "parameters gathers until their backward, but trainer.shard is '" +
                       c.trainer.shard +
                       "', which gathers no layers (set trainer.shard: parameters, or remove "
                       "trainer.reshard_after_forward)"};
  }
  // Split trainers publish from host memory, unit by unit as they gather (grpc and gloo); the
  // device transports send one device buffer holding the whole version.
  if (c.trainer.shard == "parameters" &&
      (c.cluster.weight_transport == "nccl" || c.cluster.weight_transport == "cuda_ipc")) {
    return Problem{{"trainer.shard", "cluster.weight_transport"},
                   "trainer.shard: parameters publishes each policy version from the trainers' "
                   "slices over cluster.weight_transport grpc or gloo; '" +
                       c.cluster.weight_transport +
                       "' sends from one device buffer holding the whole model, which no "
                       "trainer has (use grpc or gloo, or trainer.shard: gradients)"};
  }
  return std::nullopt;
}

// trainer.tensor_parallel T: the trainers are workers / T data-parallel ranks of T each (any
// trainer.shard then splits over those data-parallel ranks), publishing from the slices like
// shard: parameters. (Whether the model's heads, MLP and vocabulary split over T is checked against
// the model when the job starts.)
std::optional<Problem> CheckTensorParallel(const JobConfig& c) {
  const int t = c.trainer.tensor_parallel;
  if (t <= 1) return std::nullopt;
  if (c.trainer.workers % t != 0) {
    return Problem{{"trainer.workers", "trainer.tensor_parallel"},
                   "trainer.workers (" + std::to_string(c.trainer.workers) +
                       ") must be a multiple of trainer.tensor_parallel (" + std::to_string(t) +
                       "): the trainers are data-parallel ranks of tensor_parallel workers each"};
  }
  if (c.cluster.weight_transport == "nccl" || c.cluster.weight_transport == "cuda_ipc") {
    return Problem{{"trainer.tensor_parallel", "cluster.weight_transport"},
                   "trainer.tensor_parallel publishes each policy version from the trainers' "
                   "slices over cluster.weight_transport grpc or gloo; '" +
                       c.cluster.weight_transport +
                       "' sends from one device buffer holding the whole model, which no "
                       "trainer has (use grpc or gloo)"};
  }
  return std::nullopt;
}

// rollout.tensor_parallel T: each rollout worker is T processes; a version reaches rank 0 whole
// over grpc or gloo and rank 0 hands each rank its slices, so neither the device transports
// (one device buffer for one process) nor peer relay (a worker holds slices only) apply.
std::optional<Problem> CheckRolloutTensorParallel(const JobConfig& c) {
  const int t = c.rollout.tensor_parallel;
  if (t <= 1) return std::nullopt;
  if (c.cluster.weight_transport == "nccl" || c.cluster.weight_transport == "cuda_ipc") {
    return Problem{{"rollout.tensor_parallel", "cluster.weight_transport"},
                   "rollout.tensor_parallel workers take each policy version over "
                   "cluster.weight_transport grpc or gloo; '" +
                       c.cluster.weight_transport +
                       "' writes one device buffer of one process (use grpc or gloo)"};
  }
  if (c.cluster.weight_relay_fanout > 0) {
    return Problem{{"rollout.tensor_parallel", "cluster.weight_relay_fanout"},
                   "rollout.tensor_parallel workers hold slices of the model, which they cannot "
                   "relay to other workers: set cluster.weight_relay_fanout to 0 or -1"};
  }
  return std::nullopt;
}

// A worker is declared dead only after missing a heartbeat.
std::optional<Problem> CheckHeartbeat(const JobConfig& c) {
  if (c.cluster.heartbeat_timeout_s <= c.cluster.heartbeat_interval_s) {
    return Problem{{"cluster.heartbeat_timeout_s", "cluster.heartbeat_interval_s"},
                   "cluster.heartbeat_timeout_s (" + Real(c.cluster.heartbeat_timeout_s) +
                       ") must be greater than cluster.heartbeat_interval_s (" +
                       Real(c.cluster.heartbeat_interval_s) + ")"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Problem> FindProblem(const JobConfig& c) {
  using Rule = std::optional<Problem> (*)(const JobConfig&);
  static constexpr Rule kRules[] = {CheckFieldRanges,
                                    CheckJobName,
                                    CheckModelShape,
                                    CheckWeightTransport,
                                    CheckTaskLengths,
                                    CheckSamplingBudget,
                                    CheckReward,
                                    CheckEnvironment,
                                    CheckSecurity,
                                    CheckMetricsEndpoint,
                                    CheckRewardShaping,
                                    CheckRolloutScheduling,
                                    CheckCorrection,
                                    CheckHeartbeat,
                                    CheckShard,
                                    CheckTensorParallel,
                                    CheckRolloutTensorParallel};
  for (Rule rule : kRules) {
    if (std::optional<Problem> p = rule(c)) return p;
  }
  return std::nullopt;
}

}  // namespace gyre::config::internal

namespace gyre::config {

Status ValidateJobConfig(const JobConfig& cfg) {
  std::optional<internal::Problem> p = internal::FindProblem(cfg);
  return p ? InvalidArgument(p->message) : Status::Ok();
}

}  // namespace gyre::config
