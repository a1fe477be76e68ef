// make_seeds OUT_DIR: writes seed inputs for every fuzz target into OUT_DIR/<target>/, made by
// Gyre's own writers wherever one exists (DumpJobConfig, SaveSafetensors, WriteControllerState,
// SaveTrainerState, the protobuf requests the controller and the workers send each other), from
// the same fixtures the targets load (controller_fixtures.h, model_fixtures.h). tools/fuzz.sh
// adds the repository's files (configs/*.yaml, tokenizer files) next to these.

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/weight_sync.h"
#include "common/check.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "config/config.h"
#include "controller/checkpoint.h"
#include "fakes/gguf_writer.h"
#include "fuzz/controller_fixtures.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/model_fixtures.h"
#include "gyre/v1/checkpoint.pb.h"
#include "gyre/v1/gyre.pb.h"
#include "model/weights.h"
#include "observe/event_file.h"
#include "trainer/trainer_state.h"

namespace gyre::fuzz {
namespace {

std::string g_out;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = g_out + "/" + target;
  GYRE_CHECK(MakeDirs(dir).ok()) << "cannot create " << dir;
  WriteFile(dir + "/" + name, bytes);
}

std::string Read(const std::string& path) {
  auto text = ReadFileToString(path);
  GYRE_CHECK(text.ok()) << text.status();
  return *text;
}

template <typename Message>
std::string Bytes(const Message& m) {
  std::string out;
  GYRE_CHECK(m.SerializeToString(&out));
  return out;
}

void JobConfigSeeds() {
  Seed("job_config", "default.yaml", config::DumpJobConfig(JobConfig{}));
  Seed("job_config", "partial_rollouts.yaml", config::DumpJobConfig(FixtureJobConfig()));
  JobConfig c;
  c.data.train_path = "data/train.jsonl";
  c.data.chat_template = "qwen3";
  c.rollout.stop_strings = {"\n", "</answer>"};
  c.trainer.checkpoint_every = 5;
  Seed("job_config", "dataset.yaml", config::DumpJobConfig(c));
  const std::string overrides = std::string("job:\n  name: fuzz\n") + '\0' + "trainer.steps=3" +
                                '\0' + "rollout.sampling.top_p=0.9" + '\0' +
                                "rollout.stop_string=x";
  Seed("job_config", "overrides", overrides);
}

// GGUF files as llama.cpp lays them out (tests/fakes/gguf_writer.h): every tensor type Gyre reads,
// llama and tokenizer metadata, arrays.
void GgufSeeds() {
  testing::GgufWriter w;
  w.MetaStr("general.architecture", "llama");
  w.MetaU32("llama.block_count", 1);
  w.MetaF32("llama.rope.freq_base", 10000.0f);
  w.MetaStr("tokenizer.ggml.model", "gpt2");
  w.MetaStrings("tokenizer.ggml.tokens", {"a", "b", "ab", "<s>"});
  w.MetaI32s("tokenizer.ggml.token_type", {1, 1, 1, 3});
  w.MetaStrings("tokenizer.ggml.merges", {"a b"});
  w.Tensor("f32", {2, 2}, 0, std::string(16, '\x3f'));
  w.Tensor("f16", {4}, 1, std::string(8, '\x3c'));
  w.Tensor("bf16", {4}, 30, std::string(8, '\x3f'));
  w.Tensor("q8_0", {32}, 8, std::string(34, '\x11'));
  w.Tensor("q4_0", {32, 2}, 2, std::string(36, '\x21'));
  w.Tensor("q4_1", {32}, 3, std::string(20, '\x31'));
  Seed("gguf", "all_types.gguf", w.Bytes());
  testing::GgufWriter aligned(64);
  aligned.Meta("general.alignment", 4, testing::GgufWriter::U32(64));
  aligned.Tensor("t", {8}, 0, std::string(32, '\0'));
  Seed("gguf", "alignment_64.gguf", aligned.Bytes());
}

void ChatSeeds() {
  Seed("chat_messages", "string.json", "\"What is 7+8?\"");
  Seed("chat_messages", "conversation.json",
       R"([{"role": "system", "content": "Answer briefly."},)"
       R"( {"role": "user", "content": "7+8="},)"
       R"( {"role": "assistant", "content": "<think>7 and 8</think>15"},)"
       R"( {"role": "user", "content": "And 9+9?", "tool_calls": null}])");
  Seed("chat_messages", "unicode.json",
       "[{\"role\": \"user\", \"content\": \"caf\\u00e9 \\ud83d\\udc4d \\n\\t<|im_end|>\"}]");
}

// Chat templates for fuzz_jinja: SmolLM2's (Apache-2.0) and Gyre-written ones covering the
// constructs the Qwen templates use (namespace, reversed slices, string methods, tojson, tools).
void JinjaSeeds() {
  Seed("jinja", "smollm2.jinja",
       "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
       "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
       "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
       "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
       "{{ '<|im_start|>assistant\n' }}{% endif %}");
  Seed("jinja", "tools.jinja",
       "{%- if tools %}\n    {{- '<tools>' }}\n    {%- for tool in tools %}\n"
       "        {{- '\n' + (tool | tojson) }}\n    {%- endfor %}\n{%- endif %}\n"
       "{%- set ns = namespace(last=messages|length - 1) %}\n"
       "{%- for m in messages[::-1] %}\n"
       "    {%- if ns.last == messages|length - 1 and m.role == 'user' and not "
       "m.content.startswith('<tool_response>') %}{% set ns.last = (messages|length - 1) - "
       "loop.index0 %}{% endif %}\n{%- endfor %}\n"
       "{%- for m in messages %}\n"
       "    {%- if m.role == 'assistant' and '</think>' in m.content %}\n"
       "        {{- m.content.split('</think>')[-1].lstrip('\n') }}\n"
       "    {%- elif m.tool_calls is defined %}\n"
       "        {%- for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | "
       "tojson(indent=2) }}{% endfor %}\n"
       "    {%- else %}{{ m.role | upper ~ ': ' ~ m.content | trim }}{% endif %}\n"
       "{%- endfor %}\n"
       "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false "
       "%}<think>\n\n</think>{% endif %}");
  Seed("jinja", "expressions.jinja",
       "{% macro f(x, y='d') %}{{ x ~ y }}{% endmacro %}{{ f(1) }}{{ [1, 2.5, none, 'a'][1:] }}"
       "{{ {'k': [true]} }}{{ 7 // 2 ** 2 % 3 }}{{ 'a' if n > 2 else 'b' }}"
       "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') "
       "}}{% for k, v in messages[0].items() if k != 'x' %}{{ loop.index }}{{ k }}{% else %}-"
       "{% endfor %}{% set s %}{{ raise_exception('boom') if n < 0 }}{% endset %}{{ s }}");
}

void ToolCallSeeds() {
  Seed("tool_calls", "hermes.txt",
       "Let me check.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
       "{\"expression\": \"12*7\"}}\n</tool_call>");
  Seed("tool_calls", "hermes_bad.txt",
       "<tool_call>{\"name\": 3}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": "
       "\"{\\\"a\\\": 1}\"}</tool_call><tool_call>{");
  Seed("tool_calls", "llama3.txt",
       "<|python_tag|>{\"name\": \"calculator\", \"parameters\": {\"expression\": \"2+2\"}}");
}

void JsonlSeeds() {
  Seed("jsonl", "addition.jsonl",
       "{\"prompt\": \"12+30=\", \"answer\": \"42\"}\n\n{\"prompt\": \"7+8=\", \"answer\": "
       "\"15\"}\n");
  Seed("jsonl", "messages.jsonl",
       "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
       "\"content\": \"2+2=\"}], \"answer\": \"4\"}\n{\"prompt\": \"1+1=\"}\n");
}

void SafetensorsSeeds(const std::string& scratch) {
  auto model = MakeFuzzModel();
  for (const char* dtype : {"F32", "F16", "BF16"}) {
    const std::string path = scratch + "/model_" + dtype + ".safetensors";
    GYRE_CHECK(model::SaveSafetensors(path, model->NamedParameters(), dtype).ok());
    Seed("safetensors", std::string("tiny_model_") + dtype + ".safetensors", Read(path));
  }
  // Every dtype the reader knows, a scalar, an empty tensor and metadata.
  struct Entry {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
    int elem;
  };
  const std::vector<Entry> entries = {
      {"f64", "F64", {2}, 8},    {"i64", "I64", {1, 2}, 8}, {"i32", "I32", {3}, 4},
      {"u32", "U32", {1}, 4},    {"i16", "I16", {2}, 2},    {"u16", "U16", {2}, 2},
      {"f16", "F16", {2, 1}, 2}, {"i8", "I8", {4}, 1},      {"u8", "U8", {2, 2}, 1},
      {"bool", "BOOL", {3}, 1},  {"scalar", "F32", {}, 4},  {"empty", "F32", {0, 3}, 4}};
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}, {"source", "gyre-fuzz"}}}};
  std::string body;
  for (const Entry& e : entries) {
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    const uint64_t begin = body.size();
    for (uint64_t i = 0; i < n * static_cast<uint64_t>(e.elem); ++i) {
      body += static_cast<char>(std::string(e.dtype) == "BOOL" ? i % 2 : 1 + i % 7);
    }
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {begin, body.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  Seed("safetensors", "all_dtypes.safetensors", file + h + body);
}

void CheckpointSeeds(const std::string& scratch) {
  const std::string dir = scratch + "/controller";
  GYRE_CHECK(MakeDirs(dir).ok());
  GYRE_CHECK(controller::WriteControllerState(dir, FixtureControllerState()).ok());
  const std::string json = Read(dir + "/controller.json");
  Seed("controller_state", "controller.json", json);
  // Format 1 (before partial rollouts): no carried_groups manifest.
  nlohmann::json v1_json = nlohmann::json::parse(json);
  v1_json["format_version"] = 1;
  v1_json.erase("carried_groups");
  Seed("controller_state", "controller_v1.json", v1_json.dump(1));

  // fuzz_carried_groups: policy_version and next_group_id, then carried_groups.pb.
  auto prefix = [](uint64_t a, uint64_t b) {
    std::string p(16, '\0');
    for (int i = 0; i < 8; ++i) {
      p[i] = static_cast<char>((a >> (8 * i)) & 0xff);
      p[8 + i] = static_cast<char>((b >> (8 * i)) & 0xff);
    }
    return p;
  };
  const controller::ControllerState state = FixtureControllerState();
  Seed("carried_groups", "fixture",
       prefix(state.policy_version, state.next_group_id) + Read(dir + "/carried_groups.pb"));
  Seed("carried_groups", "empty", prefix(0, 0));

  // The trainer's state, for the same trainer fuzz_trainer_state builds.
  const std::string tdir = scratch + "/trainer";
  auto trainer = MakeFuzzTrainer();
  GYRE_CHECK(trainer::SaveTrainerState(tdir, *trainer, "").ok());
  Seed("trainer_state", "trainer_state.json", Read(tdir + "/trainer_state.json"));
  Seed("safetensors", "optimizer.safetensors", Read(tdir + "/optimizer.safetensors"));
  Seed("safetensors", "trainer_model.safetensors", Read(tdir + "/model.safetensors"));
}

void ControllerRpcSeeds() {
  std::string seq;
  std::vector<std::string> registers;
  for (int k = 0; k < 3; ++k) {
    v1::RegisterRequest r;
    r.set_role(k < 2 ? v1::WORKER_ROLE_ROLLOUT : v1::WORKER_ROLE_TRAINER);
    r.set_index(k < 2 ? k : 0);
    r.set_address("127.0.0.1:" + std::to_string(40000 + k));
    r.set_pid(101 + k);
    r.set_hostname("localhost");
    registers.push_back(Bytes(r));
    seq += Record(0, registers.back());
  }
  for (const char* id : {"rollout-0", "rollout-1", "trainer-0"}) {
    v1::HeartbeatRequest h;
    h.set_worker_id(id);
    h.set_policy_version(3);
    seq += Record(1, Bytes(h));
  }
  Seed("controller_rpc", "register_heartbeat", seq);
  v1::ShutdownRequest s;
  s.set_worker_id("rollout-1");
  s.set_reason("out of memory");
  Seed("controller_rpc", "death_and_restart",
       seq + Record(3, std::string(1, '\1')) + Record(4, std::string(1, '\1')) +
           Record(0, registers[1]) + Record(2, Bytes(s)) + Record(5, "") + Record(6, "") +
           Record(7, ""));
}

// The chunks comm::SendWeights streams for `payload` in buckets of `bucket` bytes.
std::string WeightStream(const comm::WeightPayload& payload, uint64_t bucket) {
  const uint64_t total = payload.bytes.size();
  const uint32_t buckets =
      static_cast<uint32_t>(std::max<uint64_t>(1, (total + bucket - 1) / bucket));
  std::string out;
  for (uint32_t b = 0; b < buckets; ++b) {
    v1::WeightChunk chunk;
    chunk.set_version(payload.version);
    chunk.set_bucket_index(b);
    const uint64_t off = static_cast<uint64_t>(b) * bucket;
    const uint64_t n = std::min<uint64_t>(bucket, total - std::min(total, off));
    chunk.set_offset(off);
    if (b == 0) {
      chunk.set_total_bytes(total);
      chunk.set_num_buckets(buckets);
      comm::ManifestToProto(payload.manifest, chunk.mutable_manifest());
    }
    chunk.set_crc32(model::Crc32(payload.bytes.data() + off, n));
    chunk.set_data(payload.bytes.data() + off, n);
    out += Record(3, Bytes(chunk));
  }
  return out + Record(4, "");
}

void RolloutRpcSeeds() {
  v1::GenerateRequest g;
  for (int k = 0; k < 2; ++k) {
    v1::PromptGroup* pg = g.add_groups();
    pg->set_group_id(k);
    for (int32_t id : {1, 5, 9, 12 - k}) pg->add_prompt_ids(id);
    pg->set_n(2);
    pg->set_first_sample_id(2 * k);
    pg->set_seed(77 + k);
  }
  g.mutable_sampling()->set_temperature(1.0f);
  g.mutable_sampling()->set_top_p(0.9f);
  g.mutable_sampling()->set_max_new_tokens(6);
  g.mutable_sampling()->add_stop_token_ids(2);
  g.set_min_policy_version(-1);
  Seed("rollout_rpc", "generate", Record(0, Bytes(g)));
  v1::GenerateRequest partial = g;
  partial.set_target_finished_groups(1);
  partial.mutable_sampling()->add_stop_strings("cd");
  partial.mutable_sampling()->set_top_k(4);
  partial.mutable_sampling()->set_min_p(0.05f);
  v1::Sample* r = partial.add_resume();
  r->set_sample_id(9);
  r->set_group_id(4);
  for (int32_t id : {2, 3, 4}) r->add_prompt_ids(id);
  for (int32_t id : {6, 7}) {
    r->add_response_ids(id);
    r->add_logprobs(-1.5f);
    r->add_kept_mass(1.0f);
    r->add_versions(0);
  }
  r->set_seed(5);
  Seed("rollout_rpc", "generate_partial", Record(0, Bytes(partial)));

  comm::WeightPayload payload;
  payload.version = 4;
  auto model = MakeFuzzModel(11);
  payload.bytes = model::FlattenParameters(model->NamedParameters(), &payload.manifest);
  Seed("rollout_rpc", "load_weights", WeightStream(payload, 1024) + Record(0, Bytes(g)));
  v1::ReceiveWeightsRequest rw;
  rw.set_store_address("127.0.0.1:29500");
  rw.set_group("weights-rollout-0-1");
  rw.set_timeout_s(5);
  rw.set_transport("gloo");
  v1::StopRequest stop;
  stop.set_reason("job finished");
  Seed("rollout_rpc", "receive_and_stop", Record(1, Bytes(rw)) + Record(2, Bytes(stop)));
}

void TrainerRpcSeeds() {
  std::string seq;
  std::string steps[2];
  for (int k = 0; k < 2; ++k) {
    v1::TrainStepRequest t;
    t.set_expected_version(k);
    t.set_objective(k == 0 ? v1::OBJECTIVE_SFT : v1::OBJECTIVE_POLICY_GRADIENT);
    t.set_lr(1e-2f);
    t.set_temperature(1.0f);
    for (const trainer::TrainSample& s : FuzzBatch(k)) {
      v1::Sample* out = t.add_samples();
      for (int32_t id : s.prompt) out->add_prompt_ids(id);
      for (int32_t id : s.response) out->add_response_ids(id);
      for (float lp : s.rollout_logprobs) out->add_logprobs(lp);
      for (size_t i = 0; i < s.response.size(); ++i) out->add_loss_mask(1.0f);
      out->set_advantage(s.advantage);
    }
    steps[k] = Record(0, Bytes(t));
    seq += steps[k];
  }
  v1::PublishWeightsRequest p;
  p.set_version(2);
  p.set_transport("grpc");
  p.set_bucket_bytes(1024);
  seq += Record(1, Bytes(p));
  Seed("trainer_rpc", "train_and_publish", seq);
  v1::JoinGroupRequest j;
  j.set_store_address("127.0.0.1:29500");
  j.set_group("dp-1");
  j.set_rank(0);
  j.set_size(2);
  j.set_timeout_s(5);
  v1::PublishWeightsRequest gloo = p;
  gloo.set_version(0);
  gloo.set_transport("gloo");
  gloo.set_store_address("127.0.0.1:29500");
  gloo.add_rollout_ids("rollout-0");
  gloo.add_rollout_addresses("127.0.0.1:40000");
  gloo.add_groups("weights-rollout-0-1");
  v1::StopRequest stop;
  stop.set_reason("job finished");
  Seed("trainer_rpc", "join_publish_stop",
       Record(2, Bytes(j)) + Record(1, Bytes(gloo)) + Record(3, Bytes(stop)));
  // A checkpoint's calls: the model, the state, the state read back; and the DP store.
  v1::SaveRequest save;
  save.set_directory("runs/job/checkpoints/step-000002.tmp/final");
  v1::SaveStateRequest save_state;
  save_state.set_directory("runs/job/checkpoints/step-000002.tmp/trainer");
  v1::LoadStateRequest load_state;
  load_state.set_directory(save_state.directory());
  Seed("trainer_rpc", "checkpoint",
       steps[0] + Record(4, Bytes(save)) + Record(5, Bytes(save_state)) + steps[1] +
           Record(6, Bytes(load_state)) + Record(7, Bytes(v1::HostGroupStoreRequest())));
  // KL in the reward: the first call freezes the reference, a step moves away from it, the
  // second call measures the distance.
  v1::SequenceKlRequest kl;
  kl.set_expected_version(0);
  kl.set_estimator("k3");
  kl.set_temperature(1.0f);
  for (const trainer::TrainSample& s : FuzzBatch(0)) {
    v1::Sample* out = kl.add_samples();
    for (int32_t id : s.prompt) out->add_prompt_ids(id);
    for (int32_t id : s.response) out->add_response_ids(id);
  }
  v1::SequenceKlRequest kl_after = kl;
  kl_after.set_expected_version(1);
  Seed("trainer_rpc", "kl_in_reward", Record(8, Bytes(kl)) + steps[0] + Record(8, Bytes(kl_after)));
}

}  // namespace
}  // namespace gyre::fuzz

namespace gyre::fuzz {
namespace {

// A real event file and a metrics.jsonl with every phase, each behind its selector byte.
void RunFileSeeds(const std::string& scratch) {
  std::string path;
  {
    auto w = observe::EventFileWriter::Open(scratch + "/tb");
    GYRE_CHECK(w.ok()) << w.status();
    GYRE_CHECK(w->AddScalars(1, {{"mean_reward", 0.5}, {"staleness/0", 8}, {"zero", 0}}).ok());
    GYRE_CHECK(w->AddSessionStart(1, "resumed").ok());
    GYRE_CHECK(w->AddScalars(1, {{"mean_reward", 0.25}}).ok());
    path = w->path();
  }
  Seed("run_files", "events", std::string(1, '\0') + Read(path));
  const std::string jsonl =
      "{\"phase\":\"warmup\",\"step\":1,\"loss\":2.5,\"token_accuracy\":0.1}\n"
      "{\"phase\":\"eval\",\"tag\":\"before_rl\",\"step\":0,\"accuracy\":0.2}\n"
      "{\"phase\":\"grpo\",\"step\":1,\"mean_reward\":0.3,\"accuracy\":0.3,"
      "\"generated_tokens\":100,\"samples\":8,\"staleness\":{\"0\":6,\"1\":2},"
      "\"step_time_s\":1.5,\"generate_s\":1,\"train_s\":0.4,\"publish_s\":0.1,"
      "\"approx_kl\":0.001,\"entropy\":0.7,\"clip_frac\":0.05,\"tokens_per_s\":90}\n"
      "{\"phase\":\"resume\",\"step\":0}\n"
      "{\"phase\":\"grpo\",\"step\":1,\"mean_reward\":1e308,\"accuracy\":-0.0}\n"
      "{\"phase\":\"summary\",\"wall_seconds\":3}\n";
  Seed("run_files", "metrics.jsonl", std::string(1, '\1') + jsonl);
}

}  // namespace
}  // namespace gyre::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  gyre::InitLogging("make_seeds", "warn");
  gyre::fuzz::g_out = argv[1];
  const std::string scratch = gyre::fuzz::ScratchDir("make_seeds");
  gyre::fuzz::JobConfigSeeds();
  gyre::fuzz::ChatSeeds();
  gyre::fuzz::ToolCallSeeds();
  gyre::fuzz::JinjaSeeds();
  gyre::fuzz::GgufSeeds();
  gyre::fuzz::JsonlSeeds();
  gyre::fuzz::SafetensorsSeeds(scratch);
  gyre::fuzz::CheckpointSeeds(scratch);
  gyre::fuzz::ControllerRpcSeeds();
  gyre::fuzz::RolloutRpcSeeds();
  gyre::fuzz::TrainerRpcSeeds();
  gyre::fuzz::RunFileSeeds(scratch);
  GYRE_CHECK(gyre::RemoveTree(scratch).ok());
  std::printf("make_seeds: wrote seeds into %s\n", argv[1]);
  return 0;
}
