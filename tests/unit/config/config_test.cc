// Tests of job config loading as a user meets it: the messages they would read for each kind of
// mistake (with file:line:col), --set overrides, the effective-config dump, and the docs.

#include "config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "test_paths.h"

namespace gyre::config {
namespace {

const char kSource[] = "jobs/x.yaml";

StatusOr<JobConfig> Parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return ParseJobConfig(text, kSource, overrides);
}

// The error message a user would see for `text`; fails the test if parsing succeeds.
std::string ParseError(const std::string& text, const std::vector<std::string>& overrides = {}) {
  StatusOr<JobConfig> r = Parse(text, overrides);
  EXPECT_FALSE(r.ok()) << "expected an error for:\n" << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  return r.status().message();
}

std::string OverrideError(const std::string& kv) {
  JobConfig cfg;
  const std::string before = DumpJobConfig(cfg);
  Status s = ApplyOverride(&cfg, kv);
  EXPECT_FALSE(s.ok()) << kv;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(DumpJobConfig(cfg), before) << "a failed --set must leave the config unchanged";
  return s.message();
}

// Two configs are equal when their dumps are: the dump has every field, and doubles round-trip.
void ExpectSameConfig(const JobConfig& a, const JobConfig& b) {
  EXPECT_EQ(DumpJobConfig(a), DumpJobConfig(b));
}

// ---- defaults ---------------------------------------------------------------------------------

TEST(ConfigDefaults, EmptyOrCommentOnlyFileGivesDefaults) {
  for (const char* text :
       {"", "\n\n", "# just a comment\n", "~\n", "job:\nrollout:\n  sampling:\n"}) {
    StatusOr<JobConfig> r = Parse(text);
    ASSERT_TRUE(r.ok()) << r.status() << " for '" << text << "'";
    ExpectSameConfig(*r, JobConfig{});
    EXPECT_EQ(r->trainer.steps, 40);
    EXPECT_EQ(r->algorithm.advantage, "grpo");
  }
}

TEST(ConfigDefaults, DefaultsPassValidation) { EXPECT_TRUE(ValidateJobConfig(JobConfig{}).ok()); }

TEST(ConfigDefaults, EveryDocumentedDefaultCanBeSetBack) {
  // The default text shown to users (docs, --help) must itself be a valid --set value.
  for (const ConfigKeyInfo& k : DescribeConfigKeys()) {
    JobConfig cfg;
    std::string value = k.default_value;
    Status s = ApplyOverride(&cfg, k.key + "=" + value);
    EXPECT_TRUE(s.ok()) << k.key << ": " << s;
    ExpectSameConfig(cfg, JobConfig{});
  }
}

// ---- parsing values ---------------------------------------------------------------------------

TEST(ConfigParse, ReadsEveryKindOfField) {
  StatusOr<JobConfig> r = Parse(R"(
job:
  name: my-run
  seed: 18446744073709551615
  log_level: debug
model:
  hidden_size: 64
  tie_embeddings: false
  rms_norm_eps: 1e-5
rollout:
  group_size: 4
  sampling:
    temperature: 0.7
    top_p: 0.95
algorithm:
  advantage: rloo
  tis: yes
cluster:
  weight_transport: gloo
  weight_bucket_bytes: 8589934592
  worker_binary: ""
data:
  train_path:
)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job.name, "my-run");
  EXPECT_EQ(r->job.seed, UINT64_MAX);
  EXPECT_EQ(r->job.log_level, "debug");
  EXPECT_EQ(r->model.hidden_size, 64);
  EXPECT_FALSE(r->model.tie_embeddings);
  EXPECT_EQ(r->model.rms_norm_eps, 1e-5);
  EXPECT_EQ(r->rollout.group_size, 4);
  EXPECT_EQ(r->rollout.sampling.temperature, 0.7);
  EXPECT_EQ(r->rollout.sampling.top_p, 0.95);
  EXPECT_EQ(r->algorithm.advantage, "rloo");
  EXPECT_TRUE(r->algorithm.tis);
  EXPECT_EQ(r->cluster.weight_bucket_bytes, int64_t{8589934592});
  EXPECT_EQ(r->cluster.worker_binary, "");
  EXPECT_EQ(r->data.train_path, "");
  // Untouched fields keep their defaults.
  EXPECT_EQ(r->trainer.steps, 40);
  EXPECT_EQ(r->model.num_layers, 2);
}

TEST(ConfigParse, AcceptsDottedKeysLikeSet) {
  StatusOr<JobConfig> r = Parse("trainer.steps: 7\nrollout:\n  sampling.top_k: 5\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trainer.steps, 7);
  EXPECT_EQ(r->rollout.sampling.top_k, 5);
}

// ---- unknown keys -----------------------------------------------------------------------------

TEST(ConfigErrors, UnknownKeySuggestsByLastComponentWithinSection) {
  EXPECT_EQ(ParseError("rollout:\n  workers: 2\n  tmperature: 0.5\n"),
            "jobs/x.yaml:3:3: unknown key 'rollout.tmperature'; "
            "did you mean 'rollout.sampling.temperature'?");
}

TEST(ConfigErrors, UnknownNestedKeySuggestsFullKey) {
  EXPECT_EQ(ParseError("rollout:\n  sampling:\n    temprature: 0.5\n"),
            "jobs/x.yaml:3:5: unknown key 'rollout.sampling.temprature'; "
            "did you mean 'rollout.sampling.temperature'?");
}

TEST(ConfigErrors, UnknownKeyPrefersSameSection) {
  // "workers" exists in both rollout and trainer; the section the user is in wins.
  EXPECT_EQ(ParseError("trainer:\n  worker: 2\n"),
            "jobs/x.yaml:2:3: unknown key 'trainer.worker'; did you mean 'trainer.workers'?");
  EXPECT_EQ(ParseError("rollout:\n  worker: 2\n"),
            "jobs/x.yaml:2:3: unknown key 'rollout.worker'; did you mean 'rollout.workers'?");
}

TEST(ConfigErrors, KeyInWrongSectionSuggestsItsHome) {
  EXPECT_EQ(ParseError("rollout:\n  lr: 0.1\n"),
            "jobs/x.yaml:2:3: unknown key 'rollout.lr'; did you mean 'trainer.lr'?");
  EXPECT_EQ(ParseError("steps: 10\n"),
            "jobs/x.yaml:1:1: unknown key 'steps'; did you mean 'trainer.steps'?");
}

TEST(ConfigErrors, UnknownSectionSuggestsSection) {
  EXPECT_EQ(ParseError("job:\n  name: a\nrolout:\n  workers: 2\n"),
            "jobs/x.yaml:3:1: unknown key 'rolout'; did you mean 'rollout'?");
}

TEST(ConfigErrors, UnknownKeyWithNothingCloseHasNoSuggestion) {
  EXPECT_EQ(ParseError("trainer:\n  xyzzyplugh: 1\n"),
            "jobs/x.yaml:2:3: unknown key 'trainer.xyzzyplugh'");
}

// ---- wrong types ------------------------------------------------------------------------------

TEST(ConfigErrors, WrongTypeNamesKeyExpectedAndGot) {
  EXPECT_EQ(ParseError("job:\n  name: a\ntrainer:\n  steps: ten\n"),
            "jobs/x.yaml:4:10: trainer.steps: expected an integer, got 'ten'");
  EXPECT_EQ(ParseError("trainer:\n  steps: 10.5\n"),
            "jobs/x.yaml:2:10: trainer.steps: expected an integer, got '10.5'");
  EXPECT_EQ(ParseError("trainer:\n  lr: fast\n"),
            "jobs/x.yaml:2:7: trainer.lr: expected a number, got 'fast'");
  EXPECT_EQ(ParseError("trainer:\n  lr: nan\n"),
            "jobs/x.yaml:2:7: trainer.lr: expected a number, got 'nan'");
  EXPECT_EQ(ParseError("algorithm:\n  tis: maybe\n"),
            "jobs/x.yaml:2:8: algorithm.tis: expected true or false, got 'maybe'");
  EXPECT_EQ(ParseError("job:\n  seed: abc\n"),
            "jobs/x.yaml:2:9: job.seed: expected an integer, got 'abc'");
}

TEST(ConfigErrors, ListMapOrNothingWhereAValueBelongs) {
  EXPECT_EQ(ParseError("trainer:\n  steps: [1, 2]\n"),
            "jobs/x.yaml:2:10: trainer.steps: expected an integer, got a list");
  EXPECT_EQ(ParseError("job:\n  name:\n    first: a\n"),
            "jobs/x.yaml:3:5: job.name: expected a string, got a map");
  // An empty value is pointed at by its key (the value has no position of its own).
  EXPECT_EQ(ParseError("trainer:\n  steps:\n  lr: 0.1\n"),
            "jobs/x.yaml:2:3: trainer.steps: expected an integer, got nothing");
}

TEST(ConfigErrors, SectionThatIsNotAMap) {
  EXPECT_EQ(ParseError("rollout: 5\n"),
            "jobs/x.yaml:1:10: rollout: expected a map of settings, got '5'");
  EXPECT_EQ(ParseError("rollout:\n  sampling: [1]\n"),
            "jobs/x.yaml:2:13: rollout.sampling: expected a map of settings, got a list");
}

TEST(ConfigErrors, TopLevelThatIsNotAMap) {
  EXPECT_EQ(ParseError("- job\n- model\n"),
            "jobs/x.yaml:1:1: expected a map of sections (job, model, data, ...), got a list");
  EXPECT_EQ(ParseError("hello\n"),
            "jobs/x.yaml:1:1: expected a map of sections (job, model, data, ...), got 'hello'");
}

// ---- out of range and bad choices -------------------------------------------------------------

TEST(ConfigErrors, OutOfRangeShowsTheAllowedInterval) {
  EXPECT_EQ(ParseError("rollout:\n  group_size: 0\n"),
            "jobs/x.yaml:2:15: rollout.group_size: 0 is out of range [1, 4096]");
  EXPECT_EQ(ParseError("rollout:\n  sampling:\n    top_p: 0\n"),
            "jobs/x.yaml:3:12: rollout.sampling.top_p: 0 is out of range (0, 1]");
  EXPECT_EQ(ParseError("trainer:\n  beta2: 1.0\n"),
            "jobs/x.yaml:2:10: trainer.beta2: 1.0 is out of range [0, 1)");
  EXPECT_EQ(ParseError("cluster:\n  controller_port: 70000\n"),
            "jobs/x.yaml:2:20: cluster.controller_port: 70000 is out of range [0, 65535]");
  EXPECT_EQ(ParseError("rollout:\n  sampling:\n    temperature: 1e999\n"),
            "jobs/x.yaml:3:18: rollout.sampling.temperature: 1e999 is out of range [0, 100]");
}

TEST(ConfigErrors, IntegerTooBigForAnyTypeIsOutOfRangeNotAWrongType) {
  EXPECT_EQ(ParseError("trainer:\n  steps: 99999999999999999999\n"),
            "jobs/x.yaml:2:10: trainer.steps: 99999999999999999999 is out of range "
            "[0, 100000000]");
  EXPECT_EQ(ParseError("job:\n  seed: -1\n"),
            "jobs/x.yaml:2:9: job.seed: -1 is out of range [0, 18446744073709551615]");
  EXPECT_EQ(ParseError("job:\n  seed: 18446744073709551616\n"),
            "jobs/x.yaml:2:9: job.seed: 18446744073709551616 is out of range "
            "[0, 18446744073709551615]");
}

TEST(ConfigErrors, UnknownChoiceListsChoicesAndSuggests) {
  EXPECT_EQ(ParseError("algorithm:\n  advantage: grpoo\n"),
            "jobs/x.yaml:2:14: algorithm.advantage: 'grpoo' is not one of grpo, grpo_no_std, "
            "rloo, reinforce_pp, reinforce_pp_baseline, median, grpo_passk, gpg, opo; did you "
            "mean 'grpo'?");
  EXPECT_EQ(ParseError("job:\n  log_level: WARN\n"),
            "jobs/x.yaml:2:14: job.log_level: 'WARN' is not one of trace, debug, info, warn, "
            "error, critical, off; did you mean 'warn'?");
  EXPECT_EQ(ParseError("model:\n  dtype: bf16\n"),
            "jobs/x.yaml:2:10: model.dtype: 'bf16' is not one of float32, bfloat16, float16");
}

TEST(ConfigErrors, RequiredStringMustNotBeEmpty) {
  EXPECT_EQ(ParseError("job:\n  name: \"\"\n"), "jobs/x.yaml:2:9: job.name: must not be empty");
}

// ---- YAML-level problems ----------------------------------------------------------------------

TEST(ConfigErrors, SyntaxErrorCarriesItsPosition) {
  EXPECT_EQ(ParseError("trainer:\n  steps: [1\n"),
            "jobs/x.yaml:3:1: invalid YAML: end of sequence flow not found");
  EXPECT_EQ(ParseError("trainer:\n  steps: 1\n   lr: 2\n"),
            "jobs/x.yaml:3:6: invalid YAML: illegal map value");
}

TEST(ConfigErrors, DuplicateKeysAreRejected) {
  EXPECT_EQ(ParseError("trainer:\n  steps: 1\n  steps: 2\n"),
            "jobs/x.yaml:3:3: duplicate key 'trainer.steps' (first set at 2:3)");
  EXPECT_EQ(ParseError("trainer:\n  steps: 1\ntrainer.steps: 2\n"),
            "jobs/x.yaml:3:1: duplicate key 'trainer.steps' (first set at 2:3)");
  EXPECT_EQ(ParseError("trainer:\n  steps: 1\ntrainer:\n  lr: 0.1\n"),
            "jobs/x.yaml:3:1: duplicate key 'trainer' (first set at 1:1)");
}

TEST(ConfigErrors, SecondDocumentIsRejected) {
  EXPECT_EQ(ParseError("trainer:\n  steps: 1\n---\ntrainer:\n  steps: 2\n"),
            "jobs/x.yaml:4:1: a job file holds one YAML document; found a second one here");
}

// Found by fuzz_job_config (docs/reliability.md): yaml-cpp 0.7's LoadAll never returned, and kept
// allocating, on a stray "," (jbeder/yaml-cpp#1040); the loader must answer with an error.
TEST(ConfigErrors, StrayCommaIsAnErrorNotAHang) {
  EXPECT_EQ(ParseError(","), "jobs/x.yaml:1:1: invalid YAML: unexpected ','");
  EXPECT_EQ(ParseError("\n,\n    "), "jobs/x.yaml:2:1: invalid YAML: unexpected ','");
}

// ---- cross-field checks -----------------------------------------------------------------------

TEST(ConfigValidate, CrossFieldErrorPointsAtAnInvolvedKey) {
  EXPECT_EQ(ParseError("data:\n  min_digits: 3\n  max_digits: 2\n"),
            "jobs/x.yaml:2:3: data.min_digits (3) must be <= data.max_digits (2)");
  EXPECT_EQ(ParseError("rollout:\n  group_size: 1\nalgorithm:\n  advantage: rloo\n"),
            "jobs/x.yaml:2:3: rollout.group_size (1) must be >= 2 when algorithm.advantage is "
            "rloo (the leave-one-out baseline needs another sample of the same prompt)");
  EXPECT_EQ(ParseError("rollout:\n  async: true\n  partial_rollouts: true\nalgorithm:\n"
                       "  max_staleness: 1\n"),
            "jobs/x.yaml:2:3: rollout.async and rollout.partial_rollouts cannot be combined yet "
            "(choose one)");
  EXPECT_EQ(ParseError("model:\n  max_seq_len: 14\n"),
            "jobs/x.yaml:2:3: model.max_seq_len (14) must be greater than 2 * data.max_digits + "
            "2 + rollout.max_new_tokens = 14 (the longest addition prompt plus its completion)");
  EXPECT_EQ(ParseError("model:\n  num_heads: 3\n"),
            "jobs/x.yaml:2:3: model.hidden_size (128) must be divisible by model.num_heads (3)");
  EXPECT_EQ(ParseError("model:\n  num_kv_heads: 3\n"),
            "jobs/x.yaml:2:3: model.num_heads (4) must be divisible by model.num_kv_heads (3) "
            "(each key/value head serves a whole group of query heads)");
  EXPECT_EQ(ParseError("model:\n  hidden_size: 12\n  num_heads: 4\n  num_kv_heads: 1\n"),
            "jobs/x.yaml:2:3: model.hidden_size / model.num_heads = 3 must be even (rotary "
            "embeddings rotate pairs of dimensions)");
  EXPECT_EQ(ParseError("data:\n  task: copy\n  max_digits: 18\nrollout:\n  max_new_tokens: 44\n"),
            "jobs/x.yaml:3:3: model.max_seq_len (64) must be greater than data.max_digits + 2 + "
            "rollout.max_new_tokens = 64 (the longest copy prompt plus its completion)");
  EXPECT_EQ(ParseError("rollout:\n  workers: 65\n"),
            "jobs/x.yaml:2:3: rollout.workers (65) must be at most 64 with cluster.mode: local "
            "(one host); start more workers across hosts with cluster.mode: external");
  EXPECT_EQ(ParseError("rollout:\n  weight_updates: between_steps\n"),
            "jobs/x.yaml:2:3: rollout.weight_updates: between_steps needs rollout.async: true (a "
            "synchronous step never has generation running while it publishes)");
  EXPECT_EQ(ParseError("rollout:\n  weight_updates: repack\n"),
            "jobs/x.yaml:2:3: rollout.weight_updates: repack needs rollout.async: true (a "
            "synchronous step never has generation running while it publishes)");
  EXPECT_EQ(ParseError("rollout:\n  async: true\nalgorithm:\n  max_staleness: 1\ntrainer:\n"
                       "  mini_batches: 4\n"),
            "jobs/x.yaml:4:3: rollout.async: algorithm.max_staleness (1) is below "
            "trainer.mini_batches (4), so rollout can never run ahead: each GRPO step is 4 policy "
            "versions; set max_staleness to at least that (or to 0)");
  EXPECT_EQ(ParseError("cluster:\n  weight_transport: gloo\n  weight_relay_fanout: 2\n"),
            "jobs/x.yaml:3:3: cluster.weight_relay_fanout relays weights between rollout workers "
            "over gRPC; it needs cluster.weight_transport: grpc (or set it to 0)");
  EXPECT_EQ(ParseError("algorithm:\n  tis: true\n  correction: icepop\n"),
            "jobs/x.yaml:2:3: algorithm.tis: true is shorthand for algorithm.correction: tis, "
            "but algorithm.correction is icepop; set only one of them");
  EXPECT_EQ(ParseError("algorithm:\n  proximal: behaviour\n  correction: seq-tis\n"),
            "jobs/x.yaml:2:3: algorithm.proximal: behaviour takes the ratio against the rollout "
            "policy itself, so a behaviour weight (algorithm.correction / algorithm.tis) would "
            "always be 1; use proximal: recompute or loglinear with a correction");
  EXPECT_EQ(ParseError("algorithm:\n  proximal: loglinear\n  correction: m2po\n"),
            "jobs/x.yaml:2:3: algorithm.correction: m2po needs the proximal log-probs of the "
            "whole batch before the step, which proximal: recompute computes exactly; loglinear "
            "would gain nothing");
  EXPECT_EQ(ParseError("rollout:\n  max_new_tokens: 5\nalgorithm:\n  overlong_buffer: 5\n"),
            "jobs/x.yaml:4:3: algorithm.overlong_buffer (5) must be below rollout.max_new_tokens "
            "(5): the penalty ramps up over the last overlong_buffer tokens of the length limit");
  EXPECT_EQ(ParseError("algorithm:\n  kl_in: reward\n"),
            "jobs/x.yaml:2:3: algorithm.kl_in: reward needs a KL estimator: set algorithm.kl to "
            "k1, k2 or k3");
  EXPECT_EQ(ParseError("reward:\n  type: service\n"),
            "jobs/x.yaml:2:3: reward.type: service needs exactly one of reward.address (a running "
            "reward server, host:port) and reward.command (a server for Gyre to start)");
  EXPECT_EQ(ParseError("reward:\n  type: service\n  address: h:1\n  command: [x]\n"),
            "jobs/x.yaml:2:3: reward.type: service needs exactly one of reward.address (a running "
            "reward server, host:port) and reward.command (a server for Gyre to start)");
  EXPECT_EQ(ParseError("reward:\n  command: [python3, r.py]\n"),
            "jobs/x.yaml:2:3: reward.command is set but reward.type is builtin: set "
            "reward.type: service");
  EXPECT_EQ(ParseError("env:\n  address: h:1\n  command: [x]\n"),
            "jobs/x.yaml:2:3: set one of env.address (a running environment server) and "
            "env.command (a server for Gyre to start), not both");
  EXPECT_EQ(ParseError("reward:\n  type: env\n"),
            "jobs/x.yaml:2:3: reward.type: env scores episodes by their environment's rewards: "
            "set env.command or env.address");
  EXPECT_EQ(ParseError("env:\n  address: h:1\n  chat_template: t.jinja\nrollout:\n  async: true\n"),
            "jobs/x.yaml:5:3: environment episodes (env.command or env.address) run with "
            "synchronous rollout: turn rollout.async and rollout.partial_rollouts off");
  EXPECT_EQ(ParseError("env:\n  command: [python3, e.py]\n"),
            "jobs/x.yaml:2:3: environment episodes render the environment's messages with a chat "
            "template, and the built-in model has none: set env.chat_template to a Jinja file "
            "(e.g. configs/templates/tiny_tools.jinja)");
  EXPECT_EQ(ParseError("reward:\n  on_failure: skip\n"),
            "jobs/x.yaml:2:15: reward.on_failure: 'skip' is not one of drop_sample, drop_group, "
            "zero");
  EXPECT_EQ(ParseError("algorithm:\n  policy_loss: gspoo\n"),
            "jobs/x.yaml:2:16: algorithm.policy_loss: 'gspoo' is not one of ppo, gspo, cispo, "
            "sao, gmpo; did you mean 'gspo'?");
  EXPECT_EQ(ParseError("algorithm:\n  dual_clip_c: 0.5\n"),
            "jobs/x.yaml:2:3: algorithm.dual_clip_c (0.5) must be 0 (off) or greater than 1");
  EXPECT_EQ(ParseError("cluster:\n  heartbeat_timeout_s: 1\n"),
            "jobs/x.yaml:2:3: cluster.heartbeat_timeout_s (1) must be greater than "
            "cluster.heartbeat_interval_s (1)");
  EXPECT_EQ(ParseError("job:\n  name: a/b\n"),
            "jobs/x.yaml:2:3: job.name: 'a/b' must be a plain directory name (letters, digits, "
            "'.', '_', '-')");
}

TEST(ConfigValidate, CrossFieldErrorCausedBySetNamesSet) {
  EXPECT_EQ(ParseError("data:\n  max_digits: 2\n", {"data.min_digits=3"}),
            "--set: data.min_digits (3) must be <= data.max_digits (2)");
}

TEST(ConfigValidate, CatchesBadValuesInConfigsBuiltInCode) {
  JobConfig cfg;
  cfg.rollout.group_size = 0;
  EXPECT_EQ(ValidateJobConfig(cfg).message(), "rollout.group_size: 0 is out of range [1, 4096]");
  cfg = JobConfig{};
  cfg.algorithm.loss_agg = "mean";
  EXPECT_EQ(ValidateJobConfig(cfg).message(),
            "algorithm.loss_agg: 'mean' is not one of token-mean, seq-mean-token-mean, "
            "seq-mean-token-sum, seq-mean-token-sum-norm");
  cfg = JobConfig{};
  cfg.data.min_digits = 5;
  EXPECT_EQ(ValidateJobConfig(cfg).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateJobConfig(cfg).message(), "data.min_digits (5) must be <= data.max_digits (2)");
}

// ---- --set ------------------------------------------------------------------------------------

TEST(ConfigOverride, SetsNestedFieldsOfEveryType) {
  JobConfig cfg;
  ASSERT_TRUE(ApplyOverride(&cfg, "trainer.steps=10").ok());
  ASSERT_TRUE(ApplyOverride(&cfg, "rollout.sampling.top_p=0.9").ok());
  ASSERT_TRUE(ApplyOverride(&cfg, "algorithm.tis=true").ok());
  ASSERT_TRUE(ApplyOverride(&cfg, "job.name=\"my-run\"").ok());
  ASSERT_TRUE(ApplyOverride(&cfg, "model.path=").ok());
  ASSERT_TRUE(ApplyOverride(&cfg, "data.train_path=/data/train=v2.jsonl").ok());
  ASSERT_TRUE(ApplyOverride(&cfg, " job.seed = 7").ok());
  EXPECT_EQ(cfg.trainer.steps, 10);
  EXPECT_EQ(cfg.rollout.sampling.top_p, 0.9);
  EXPECT_TRUE(cfg.algorithm.tis);
  EXPECT_EQ(cfg.job.name, "my-run");
  EXPECT_EQ(cfg.model.path, "");
  EXPECT_EQ(cfg.data.train_path, "/data/train=v2.jsonl");  // only the first '=' splits
  EXPECT_EQ(cfg.job.seed, 7u);
}

TEST(ConfigOverride, ErrorsNameSetAndLeaveConfigUnchanged) {
  EXPECT_EQ(OverrideError("trainer.step=10"),
            "--set: unknown key 'trainer.step'; did you mean 'trainer.steps'?");
  EXPECT_EQ(
      OverrideError("rollout.tmperature=0.5"),
      "--set: unknown key 'rollout.tmperature'; did you mean 'rollout.sampling.temperature'?");
  EXPECT_EQ(OverrideError("trainer.steps=ten"),
            "--set: trainer.steps: expected an integer, got 'ten'");
  EXPECT_EQ(OverrideError("rollout.group_size=0"),
            "--set: rollout.group_size: 0 is out of range [1, 4096]");
  EXPECT_EQ(OverrideError("algorithm.advantage=grpoo"),
            "--set: algorithm.advantage: 'grpoo' is not one of grpo, grpo_no_std, rloo, "
            "reinforce_pp, reinforce_pp_baseline, median, grpo_passk, gpg, opo; did you mean "
            "'grpo'?");
  EXPECT_EQ(OverrideError("trainer.steps=[1,2]"),
            "--set: trainer.steps: expected an integer, got a list");
  EXPECT_EQ(OverrideError("trainer.steps"),
            "--set: expected key=value (e.g. trainer.steps=10), got 'trainer.steps'");
  EXPECT_EQ(OverrideError("=10"), "--set: expected key=value (e.g. trainer.steps=10), got '=10'");
  EXPECT_EQ(OverrideError("rollout.sampling=1"),
            "--set: 'rollout.sampling' is a section; set one of its keys, e.g. "
            "'rollout.sampling.temperature'");
  EXPECT_EQ(OverrideError("trainer.steps=[1"),
            "--set: trainer.steps: cannot read '[1' as a YAML value: end of sequence flow not "
            "found");
}

TEST(ConfigOverride, OverridesApplyAfterTheFileInOrder) {
  StatusOr<JobConfig> r =
      Parse("trainer:\n  steps: 5\n", {"trainer.steps=6", "trainer.steps=7", "trainer.lr=0.5"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->trainer.steps, 7);
  EXPECT_EQ(r->trainer.lr, 0.5);
}

TEST(ConfigOverride, BadOverrideFailsTheWholeLoad) {
  EXPECT_EQ(ParseError("trainer:\n  steps: 5\n", {"trainer.steps=-1"}),
            "--set: trainer.steps: -1 is out of range [0, 100000000]");
}

// ---- dump -------------------------------------------------------------------------------------

TEST(ConfigDump, DefaultDumpRoundTripsAndReadsNaturally) {
  const std::string dump = DumpJobConfig(JobConfig{});
  StatusOr<JobConfig> r = ParseJobConfig(dump, "dump");
  ASSERT_TRUE(r.ok()) << r.status() << "\n" << dump;
  ExpectSameConfig(*r, JobConfig{});
  EXPECT_NE(dump.find("\n  clip_eps_low: 0.2  # "), std::string::npos) << dump;
  EXPECT_NE(dump.find("\n  rope_theta: 10000.0  # "), std::string::npos) << dump;
  EXPECT_NE(dump.find("\n  name: \"gyre-job\"  # "), std::string::npos) << dump;
  EXPECT_NE(dump.find("\nrollout:\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("\n  sampling:\n    temperature: 1.0  # "), std::string::npos) << dump;
  // Choices list their values; the algorithm keys' come from the registry.
  EXPECT_NE(dump.find("\n  policy_loss: \"ppo\"  # policy term of each token "
                      "(docs/algorithms.md) (one of: ppo, gspo, cispo, sao, gmpo)\n"),
            std::string::npos)
      << dump;
  EXPECT_NE(dump.find("(one of: uniform, pilot, variance, greso)"), std::string::npos) << dump;
}

TEST(ConfigDump, EditedConfigRoundTripsExactly) {
  JobConfig cfg;
  cfg.job.name = "run-1";
  cfg.job.seed = UINT64_MAX;
  cfg.job.output_dir = "out dir/with: colon # and hash \"quoted\" \\ back\tslash";
  cfg.model.path = "  leading space and unicode \xc3\xa9\n";
  cfg.model.rms_norm_eps = 1e-300;
  cfg.trainer.lr = 0.1 + 0.2;  // 0.30000000000000004: needs 17 digits
  cfg.trainer.beta2 = 0.999;
  cfg.rollout.sampling.top_p = 1.0 / 3.0;
  cfg.cluster.weight_transport = "gloo";  // grpc carries at most 496 MiB per bucket
  cfg.cluster.weight_bucket_bytes = int64_t{17179869184};
  cfg.cluster.worker_binary = "yes";  // a YAML-1.1 boolean word must stay a string
  cfg.algorithm.tis = true;
  cfg.algorithm.advantage = "rloo";
  cfg.data.eval_path = "";
  ASSERT_TRUE(ValidateJobConfig(cfg).ok());

  const std::string dump = DumpJobConfig(cfg);
  StatusOr<JobConfig> r = ParseJobConfig(dump, "dump");
  ASSERT_TRUE(r.ok()) << r.status() << "\n" << dump;
  EXPECT_EQ(r->job.seed, UINT64_MAX);
  EXPECT_EQ(r->job.output_dir, cfg.job.output_dir);
  EXPECT_EQ(r->model.path, cfg.model.path);
  EXPECT_EQ(r->model.rms_norm_eps, 1e-300);
  EXPECT_EQ(r->trainer.lr, 0.1 + 0.2);
  EXPECT_EQ(r->rollout.sampling.top_p, 1.0 / 3.0);
  EXPECT_EQ(r->cluster.weight_bucket_bytes, int64_t{17179869184});
  EXPECT_EQ(r->cluster.worker_binary, "yes");
  EXPECT_TRUE(r->algorithm.tis);
  ExpectSameConfig(*r, cfg);
}

TEST(ConfigDump, MentionsEveryKeyOnce) {
  const std::string dump = DumpJobConfig(JobConfig{});
  std::vector<std::string> keys = AllConfigKeys();
  std::set<std::string> unique(keys.begin(), keys.end());
  EXPECT_EQ(unique.size(), keys.size());
  EXPECT_GE(keys.size(), 60u);
  for (const char* want : {"job.name", "rollout.sampling.top_p", "cluster.worker_binary",
                           "metrics.eval_every", "trainer.torch_threads"}) {
    EXPECT_TRUE(unique.count(want)) << want;
  }
  // Each key's leaf name appears as a line of the dump.
  for (const std::string& key : keys) {
    std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(dump.find(" " + leaf + ": "), std::string::npos) << key;
  }
}

// ---- string lists (rollout.stop_strings) -------------------------------------------------------

TEST(ConfigStringList, ReadsFlowAndBlockSequences) {
  StatusOr<JobConfig> r = Parse("rollout:\n  stop_strings: [\"</answer>\", \"\\n\\nUser:\"]\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rollout.stop_strings, (std::vector<std::string>{"</answer>", "\n\nUser:"}));
  r = Parse("rollout:\n  stop_strings:\n    - \"</answer>\"\n    - '++'\n    - 12\n");
  ASSERT_TRUE(r.ok()) << r.status();
  // A plain scalar is read as its text, as in a string field.
  EXPECT_EQ(r->rollout.stop_strings, (std::vector<std::string>{"</answer>", "++", "12"}));
  for (const char* none : {"rollout:\n  stop_strings: []\n", "rollout:\n  stop_strings:\n"}) {
    r = Parse(none);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->rollout.stop_strings.empty()) << none;
  }
  EXPECT_TRUE(JobConfig{}.rollout.stop_strings.empty());
}

TEST(ConfigStringList, BadEntriesNameTheirPosition) {
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: [\"a\", \"\"]\n"),
            "jobs/x.yaml:2:23: rollout.stop_strings: entry 2 must not be empty");
  EXPECT_EQ(ParseError("rollout:\n  stop_strings:\n    - a\n    - ''\n"),
            "jobs/x.yaml:4:7: rollout.stop_strings: entry 2 must not be empty");
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: [a, {b: 1}]\n"),
            "jobs/x.yaml:2:21: rollout.stop_strings: entry 2: expected a string, got a map");
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: [a, [b]]\n"),
            "jobs/x.yaml:2:21: rollout.stop_strings: entry 2: expected a string, got a list");
  // An empty entry has no position of its own: the list's is given.
  EXPECT_EQ(ParseError("rollout:\n  stop_strings:\n    - a\n    -\n"),
            "jobs/x.yaml:3:5: rollout.stop_strings: entry 2: expected a string, got nothing");
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: [a, ~]\n"),
            "jobs/x.yaml:2:17: rollout.stop_strings: entry 2: expected a string, got nothing");
  // One string where a list belongs: the message shows the list form.
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: \"</answer>\"\n"),
            "jobs/x.yaml:2:17: rollout.stop_strings: expected a list of strings such as [\"a\", "
            "\"b\"], got '</answer>'");
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: {a: b}\n"),
            "jobs/x.yaml:2:17: rollout.stop_strings: expected a list of strings such as [\"a\", "
            "\"b\"], got a map");
}

TEST(ConfigStringList, DeprecatedSingleStringIsAOneElementList) {
  StatusOr<JobConfig> r = Parse("rollout:\n  stop_string: \"</answer>\"\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rollout.stop_strings, (std::vector<std::string>{"</answer>"}));
  // The old default (the empty string, as older dumps and checkpoints wrote it) means none.
  for (const char* none : {"rollout:\n  stop_string: \"\"\n", "rollout:\n  stop_string:\n",
                           "rollout.stop_string: \"\"\n"}) {
    r = Parse(none);
    ASSERT_TRUE(r.ok()) << r.status() << " for " << none;
    ExpectSameConfig(*r, JobConfig{});
  }
  // The effective config uses the new name only.
  r = Parse("rollout:\n  stop_string: \"++\"\n");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string dump = DumpJobConfig(*r);
  EXPECT_NE(dump.find("\n  stop_strings: [\"++\"]  # "), std::string::npos) << dump;
  EXPECT_EQ(dump.find("stop_string:"), std::string::npos) << dump;

  EXPECT_EQ(ParseError("rollout:\n  stop_string: [a, b]\n"),
            "jobs/x.yaml:2:16: rollout.stop_string: expected a string, got a list "
            "(rollout.stop_string is the deprecated single-string spelling; write a list as "
            "rollout.stop_strings)");
  // The old and the new name are one setting.
  EXPECT_EQ(ParseError("rollout:\n  stop_strings: [a]\n  stop_string: b\n"),
            "jobs/x.yaml:3:3: duplicate key 'rollout.stop_string': 'rollout.stop_strings' (set at "
            "2:3) is the same setting; keep only rollout.stop_strings");
  EXPECT_EQ(ParseError("rollout:\n  stop_string: b\n  stop_strings: [a]\n"),
            "jobs/x.yaml:3:3: duplicate key 'rollout.stop_strings': 'rollout.stop_string' (set at "
            "2:3) is the same setting; keep only rollout.stop_strings");
  EXPECT_EQ(ParseError("rollout:\n  stop_string: b\n  stop_string: c\n"),
            "jobs/x.yaml:3:3: duplicate key 'rollout.stop_string' (first set at 2:3)");
}

TEST(ConfigStringList, SetOverridesTakeAFlowSequenceOrTheOldSingleString) {
  JobConfig cfg;
  ASSERT_TRUE(ApplyOverride(&cfg, "rollout.stop_strings=[\"</answer>\", \"User:\"]").ok());
  EXPECT_EQ(cfg.rollout.stop_strings, (std::vector<std::string>{"</answer>", "User:"}));
  ASSERT_TRUE(ApplyOverride(&cfg, "rollout.stop_string=++").ok());
  EXPECT_EQ(cfg.rollout.stop_strings, (std::vector<std::string>{"++"}));
  ASSERT_TRUE(ApplyOverride(&cfg, "rollout.stop_strings=[]").ok());
  EXPECT_TRUE(cfg.rollout.stop_strings.empty());
  EXPECT_EQ(OverrideError("rollout.stop_strings=++"),
            "--set: rollout.stop_strings: expected a list of strings such as [\"a\", \"b\"], "
            "got '++'");
  EXPECT_EQ(OverrideError("rollout.stop_strings=[a, \"\"]"),
            "--set: rollout.stop_strings: entry 2 must not be empty");
  EXPECT_EQ(OverrideError("rollout.stop_string=[a]"),
            "--set: rollout.stop_string: expected a string, got a list (rollout.stop_string is "
            "the deprecated single-string spelling; write a list as rollout.stop_strings)");
  // A --set of the old name after the file's new one wins, like any later --set.
  StatusOr<JobConfig> r = Parse("rollout:\n  stop_strings: [a, b]\n", {"rollout.stop_string=c"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rollout.stop_strings, (std::vector<std::string>{"c"}));
}

TEST(ConfigStringList, DumpRoundTripsAnyStringsAndCodeBuiltListsAreChecked) {
  JobConfig cfg;
  cfg.rollout.stop_strings = {"</answer>", "\n\nUser:", "a \"quoted\" # not a comment",
                              "yes",       "[",         "\xc3\xa9\t"};
  ASSERT_TRUE(ValidateJobConfig(cfg).ok());
  const std::string dump = DumpJobConfig(cfg);
  StatusOr<JobConfig> r = ParseJobConfig(dump, "dump");
  ASSERT_TRUE(r.ok()) << r.status() << "\n" << dump;
  EXPECT_EQ(r->rollout.stop_strings, cfg.rollout.stop_strings);
  ExpectSameConfig(*r, cfg);

  cfg.rollout.stop_strings = {"a", ""};
  EXPECT_EQ(ValidateJobConfig(cfg).message(), "rollout.stop_strings: entry 2 must not be empty");
}

TEST(ConfigStringList, DescribedAsAStringList) {
  bool found = false;
  for (const ConfigKeyInfo& k : DescribeConfigKeys()) {
    EXPECT_NE(k.key, "rollout.stop_string") << "a deprecated alias is not a listed key";
    if (k.key != "rollout.stop_strings") continue;
    found = true;
    EXPECT_EQ(k.type, "string list");
    EXPECT_EQ(k.default_value, "[]");
    EXPECT_EQ(k.allowed, "non-empty strings");
  }
  EXPECT_TRUE(found);
}

// ---- files ------------------------------------------------------------------------------------

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("gyre_config_test_" + std::to_string(::getpid()));
    ASSERT_TRUE(MakeDirs(dir_.string()).ok());
  }
  void TearDown() override { (void)RemoveTree(dir_.string()); }

  std::string Write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(ConfigFileTest, LoadsARealFileWithOverrides) {
  std::string path = Write("job.yaml",
                           "# a small job\n"
                           "job:\n"
                           "  name: file-test\n"
                           "trainer:\n"
                           "  steps: 3\n"
                           "  lr: 2e-3\n");
  StatusOr<JobConfig> r = LoadJobConfigFile(path, {"rollout.workers=4"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job.name, "file-test");
  EXPECT_EQ(r->trainer.steps, 3);
  EXPECT_EQ(r->trainer.lr, 2e-3);
  EXPECT_EQ(r->rollout.workers, 4);
}

TEST_F(ConfigFileTest, ErrorsNameThePathGiven) {
  std::string path = Write("bad.yaml", "trainer:\n  stepz: 3\n");
  StatusOr<JobConfig> r = LoadJobConfigFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            path + ":2:3: unknown key 'trainer.stepz'; did you mean 'trainer.steps'?");
}

TEST_F(ConfigFileTest, EmptyFileGivesDefaults) {
  StatusOr<JobConfig> r = LoadJobConfigFile(Write("empty.yaml", ""));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSameConfig(*r, JobConfig{});
}

TEST_F(ConfigFileTest, MissingFileIsNotFound) {
  std::string path = (dir_ / "nope.yaml").string();
  StatusOr<JobConfig> r = LoadJobConfigFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "job config file '" + path + "' does not exist");
}

TEST_F(ConfigFileTest, DirectoryIsRejected) {
  StatusOr<JobConfig> r = LoadJobConfigFile(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "job config '" + dir_.string() + "' is a directory, not a YAML file");
}

// ---- docs -------------------------------------------------------------------------------------

// docs/config.md must document every key with its current type, default and allowed values, in
// a table row that starts with the dotted key in backticks.
// ZeRO-3 jobs publish from the trainers' slices over the host transports; the device transports
// (one buffer holding the whole version) are refused with the alternatives.
TEST(ConfigCrossField, FullyShardedParametersPublishOverHostTransportsOnly) {
  for (const char* transport : {"grpc", "gloo"}) {
    auto ok = Parse(std::string("trainer:\n  workers: 2\n  shard: parameters\ncluster:\n"
                                "  weight_transport: ") +
                    transport + "\n");
    EXPECT_TRUE(ok.ok()) << transport << ": " << ok.status();
  }
  const std::string e = ParseError(
      "model:\n  device: cuda\ntrainer:\n  workers: 2\n  shard: parameters\n"
      "cluster:\n  weight_transport: nccl\n  placement: disaggregated\n");
  EXPECT_NE(e.find("trainer.shard: parameters publishes each policy version from the trainers' "
                   "slices over cluster.weight_transport grpc or gloo; 'nccl'"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("use grpc or gloo, or trainer.shard: gradients"), std::string::npos) << e;
}

// trainer.reshard_after_forward: false keeps the layers shard: parameters gathers; with any other
// shard there is nothing to keep, and the job is refused with both fields and the way out.
TEST(ConfigCrossField, KeepingGatheredLayersNeedsShardedParameters) {
  auto ok = Parse("trainer:\n  workers: 2\n  shard: parameters\n  reshard_after_forward: false\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->trainer.reshard_after_forward);
  EXPECT_TRUE(Parse("trainer:\n  shard: parameters\n")->trainer.reshard_after_forward);
  for (const char* shard : {"none", "optimizer", "gradients"}) {
    const std::string e = ParseError(std::string("trainer:\n  workers: 2\n  shard: ") + shard +
                                     "\n  reshard_after_forward: false\n");
    EXPECT_NE(e.find("trainer.reshard_after_forward: false keeps the layers that trainer.shard: "
                     "parameters gathers until their backward, but trainer.shard is '" +
                     std::string(shard) + "'"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("set trainer.shard: parameters, or remove trainer.reshard_after_forward"),
              std::string::npos)
        << e;
  }
}

// trainer.tensor_parallel: the workers are data-parallel ranks of T, which any shard splits over;
// host transports.
TEST(ConfigCrossField, TensorParallelLayoutsAreCheckedWithTheRule) {
  auto ok = Parse("trainer:\n  workers: 4\n  tensor_parallel: 2\n");
  EXPECT_TRUE(ok.ok()) << ok.status();
  std::string e = ParseError("trainer:\n  workers: 3\n  tensor_parallel: 2\n");
  EXPECT_NE(e.find("trainer.workers (3) must be a multiple of trainer.tensor_parallel (2)"),
            std::string::npos)
      << e;
  for (const char* shard : {"optimizer", "gradients", "parameters"}) {
    auto zero = Parse(std::string("trainer:\n  workers: 4\n  tensor_parallel: 2\n  shard: ") +
                      shard + "\n");
    EXPECT_TRUE(zero.ok()) << shard << ": " << zero.status();
  }
  e = ParseError(
      "model:\n  device: cuda\ntrainer:\n  workers: 2\n  tensor_parallel: 2\n"
      "cluster:\n  weight_transport: nccl\n  placement: disaggregated\n");
  EXPECT_NE(e.find("trainer.tensor_parallel publishes each policy version from the trainers' "
                   "slices over cluster.weight_transport grpc or gloo; 'nccl'"),
            std::string::npos)
      << e;
  e = ParseError("trainer:\n  tensor_parallel: 0\n");
  EXPECT_NE(e.find("trainer.tensor_parallel"), std::string::npos) << e;
}

// rollout.tensor_parallel: versions arrive whole at rank 0 over a host transport; no relay.
TEST(ConfigCrossField, RolloutTensorParallelTakesHostTransportsWithoutRelay) {
  auto ok = Parse("rollout:\n  tensor_parallel: 2\ncluster:\n  weight_transport: gloo\n");
  EXPECT_TRUE(ok.ok()) << ok.status();
  std::string e = ParseError(
      "model:\n  device: cuda\nrollout:\n  tensor_parallel: 2\n"
      "cluster:\n  weight_transport: nccl\n  placement: disaggregated\n");
  EXPECT_NE(e.find("rollout.tensor_parallel workers take each policy version over "
                   "cluster.weight_transport grpc or gloo; 'nccl'"),
            std::string::npos)
      << e;
  e = ParseError("rollout:\n  tensor_parallel: 2\ncluster:\n  weight_relay_fanout: 2\n");
  EXPECT_NE(e.find("set cluster.weight_relay_fanout to 0 or -1"), std::string::npos) << e;
  e = ParseError("rollout:\n  tensor_parallel: 65\n");
  EXPECT_NE(e.find("rollout.tensor_parallel"), std::string::npos) << e;
}

TEST(ConfigCrossField, GpuWeightTransportsNeedGpusAndTheirPlacement) {
  std::string e = ParseError("cluster:\n  weight_transport: cuda_ipc\n");
  EXPECT_NE(e.find("jobs/x.yaml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("set model.device: cuda"), std::string::npos) << e;
  e = ParseError("model:\n  device: cuda\ncluster:\n  weight_transport: nccl\n");
  EXPECT_NE(e.find("cluster.placement: disaggregated"), std::string::npos) << e;
  e = ParseError(
      "model:\n  device: cuda\ncluster:\n  weight_transport: cuda_ipc\n"
      "  mode: external\n");
  EXPECT_NE(e.find("on one host (cluster.mode: local)"), std::string::npos) << e;
  e = ParseError("cluster:\n  placement: spread\n");
  EXPECT_NE(e.find("colocated"), std::string::npos) << e;

  auto ok = Parse(
      "model:\n  device: cuda\ncluster:\n  weight_transport: nccl\n"
      "  placement: disaggregated\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->cluster.weight_transport, "nccl");
  EXPECT_EQ(ok->cluster.placement, "disaggregated");
  ok = Parse("model:\n  device: auto\ncluster:\n  weight_transport: cuda_ipc\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(JobConfig{}.cluster.placement, "colocated");
}

TEST(ConfigCrossField, PublishEveryNeedsAsyncAndRoomInTheStalenessBound) {
  std::string e = ParseError("trainer:\n  publish_every: 2\n");
  EXPECT_NE(e.find("needs rollout.async: true"), std::string::npos) << e;
  e = ParseError(
      "rollout:\n  async: true\nalgorithm:\n  max_staleness: 2\n"
      "trainer:\n  publish_every: 2\n  mini_batches: 2\n");
  EXPECT_NE(e.find("up to 2 policy versions behind"), std::string::npos) << e;
  EXPECT_NE(e.find("at least publish_every * trainer.mini_batches = 4"), std::string::npos) << e;
  auto ok = Parse(
      "rollout:\n  async: true\nalgorithm:\n  max_staleness: 4\n"
      "trainer:\n  publish_every: 2\n  mini_batches: 2\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->trainer.publish_every, 2);
  EXPECT_EQ(JobConfig{}.trainer.publish_every, 1);
}

// A bucket larger than one gRPC message used to pass validation and fail at the first publish.
TEST(ConfigCrossField, GrpcWeightBucketsFitInOneMessage) {
  std::string e =
      ParseError("cluster:\n  weight_transport: grpc\n  weight_bucket_bytes: 1073741824\n");
  EXPECT_NE(e.find("cluster.weight_bucket_bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("520093696"), std::string::npos) << e;
  EXPECT_NE(e.find("weight_transport: gloo"), std::string::npos) << e;
  auto ok = Parse("cluster:\n  weight_transport: grpc\n  weight_bucket_bytes: 520093696\n");
  EXPECT_TRUE(ok.ok()) << ok.status();
  ok = Parse("cluster:\n  weight_transport: gloo\n  weight_bucket_bytes: 1073741824\n");
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(ConfigDocs, EveryKeyIsDocumentedWithItsDefaultAndRange) {
  std::ifstream in(std::string(GYRE_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "cannot open " << GYRE_SOURCE_DIR << "/docs/config.md";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);

  for (const ConfigKeyInfo& k : DescribeConfigKeys()) {
    const std::string prefix = "| `" + k.key + "` |";
    const std::string* row = nullptr;
    for (const std::string& line : lines) {
      if (line.rfind(prefix, 0) == 0) row = &line;
    }
    if (row == nullptr) {
      ADD_FAILURE() << "docs/config.md has no table row for " << k.key << " (want a line starting "
                    << prefix << ")";
      continue;
    }
    EXPECT_NE(row->find("| " + k.type + " |"), std::string::npos)
        << k.key << ": type should be " << k.type << "\n"
        << *row;
    EXPECT_NE(row->find("| `" + k.default_value + "` |"), std::string::npos)
        << k.key << ": default should be `" << k.default_value << "`\n"
        << *row;
    EXPECT_NE(row->find("| " + k.allowed + " |"), std::string::npos)
        << k.key << ": allowed values should be " << k.allowed << "\n"
        << *row;
  }
}

}  // namespace
}  // namespace gyre::config
