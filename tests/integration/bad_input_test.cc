// Bad input through the real `gyre` binary: damaged model directories, hostile tokenizer files,
// datasets with records that cannot be used, configs that cannot work. Each must end the command
// with exit status 1 and one line naming the file or field and what is wrong; never a signal,
// std::terminate or an allocation that takes the machine down.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "integration/run_util.h"
#include "test_paths.h"

namespace gyre::testing {
namespace {

using nlohmann::json;

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";

struct CmdResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string output;
  std::string last_line;
};

CmdResult RunGyre(const std::vector<std::string>& args, const std::string& dir,
                  double timeout_s = 120) {
  auto p = GyreProcess::Start(args, dir);
  CmdResult r;
  const bool exited = p.Wait(timeout_s);
  r.output = p.Output();
  if (exited && WIFEXITED(p.wait_status)) r.exit_code = WEXITSTATUS(p.wait_status);
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) r.last_line = line;
  }
  return r;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A real model directory written by `gyre init-model`.
std::string MakeModel(const std::string& dir, const std::string& name,
                      const std::string& arch = "llama") {
  const std::string out = dir + "/" + name;
  CmdResult r = RunGyre({"init-model", "--arch", arch, "--preset", "micro", "--out", out}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return out;
}

// A copy of a model directory to damage.
Status CopyModel(const std::string& from, const std::string& to) {
  GYRE_RETURN_IF_ERROR(MakeDirs(to));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    GYRE_RETURN_IF_ERROR(CopyFile(from + "/" + f, to + "/" + f));
  }
  return Status::Ok();
}

json ReadJson(const std::string& path) { return json::parse(ReadFile(path)); }

// Exit 1 with the problem on the last line, naming every needle; the output (a command's error,
// or a job's log plus its closing line) has no sign of a crash.
void ExpectCleanError(const CmdResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const std::string& n : needles) {
    EXPECT_NE(r.last_line.find(n), std::string::npos)
        << "missing '" << n << "' in: " << r.last_line;
  }
  for (const char* crash : {"terminate called", "Aborted", "core dumped", "Segmentation",
                            "what():", "bad_alloc", "length_error"}) {
    EXPECT_EQ(r.output.find(crash), std::string::npos) << crash << " in:\n" << r.output;
  }
}

TEST(BadInputTest, DamagedModelConfigsAreRefusedByName) {
  const std::string dir = MakeTempDir("bad_model");
  const std::string base = MakeModel(dir, "base");
  struct Case {
    std::string field;
    json value;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"vocab_size",
       json(1000000000000LL),
       {"config.json", "vocab_size 1000000000000", "more than this machine's"}},
      {"hidden_size", json(int64_t{1} << 40), {"config.json", "more than this machine's"}},
      {"rms_norm_eps", json(0), {"config.json", "rms_norm_eps must be a positive number"}},
      {"rms_norm_eps", json(-1e-5), {"rms_norm_eps must be a positive number"}},
      {"max_position_embeddings", json(0), {"max_position_embeddings must be positive"}},
      {"rope_theta", json(-1), {"rope_theta must be a positive number"}},
      {"num_key_value_heads", json(3), {"not a multiple of num_key_value_heads"}},
      {"vocab_size", json("many"), {"\"vocab_size\" must be an integer"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string m = dir + "/m" + std::to_string(i++);
    ASSERT_TRUE(CopyModel(base, m).ok());
    json cfg = ReadJson(m + "/config.json");
    cfg[c.field] = c.value;
    WriteText(m + "/config.json", cfg.dump());
    CmdResult r = RunGyre({"logprobs", "--model", m, "--ids", "1 2 3"}, dir);
    SCOPED_TRACE(c.field + " = " + c.value.dump());
    ExpectCleanError(r, c.needles);
  }
  // llama3 RoPE scaling with a factor that is not positive.
  for (double factor : {0.0, -8.0}) {
    const std::string m = dir + "/rope" + std::to_string(i++);
    ASSERT_TRUE(CopyModel(base, m).ok());
    json cfg = ReadJson(m + "/config.json");
    cfg["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", factor},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 64}};
    WriteText(m + "/config.json", cfg.dump());
    CmdResult r = RunGyre({"logprobs", "--model", m, "--ids", "1 2 3"}, dir);
    ExpectCleanError(r, {"config.json", "rope_scaling: factor must be a positive number"});
  }
  // Truncated weights.
  const std::string cut = dir + "/cut";
  ASSERT_TRUE(CopyModel(base, cut).ok());
  const std::string weights = ReadFile(cut + "/model.safetensors");
  WriteText(cut + "/model.safetensors", weights.substr(0, weights.size() / 2));
  CmdResult r = RunGyre({"generate", "--model", cut, "--prompt", "hi"}, dir);
  ExpectCleanError(r, {"model.safetensors"});
}

TEST(BadInputTest, TokenizerIdsNearTwoToTheThirtyOneAreRefused) {
  const std::string dir = MakeTempDir("bad_tok");
  const std::string base = MakeModel(dir, "base", "qwen2");
  const json good = ReadJson(base + "/tokenizer.json");
  for (int64_t id : {int64_t{2147483647}, int64_t{2147483000}, int64_t{1000000000}}) {
    json t = good;
    t["added_tokens"][0]["id"] = id;
    WriteText(dir + "/added.json", t.dump());
    CmdResult r = RunGyre({"tokenize", "--tokenizer", dir + "/added.json", "--text", "hi"}, dir);
    ExpectCleanError(r, {"added.json", "added_tokens[0].id", "implausibly large"});
    t = good;
    t["model"]["vocab"]["a"] = id;
    WriteText(dir + "/vocab.json", t.dump());
    r = RunGyre({"tokenize", "--tokenizer", dir + "/vocab.json", "--text", "hi"}, dir);
    ExpectCleanError(r, {"vocab.json", "model.vocab[\"a\"]", "implausibly large"});
  }
  // Added-token ids near 2^31 in a model directory make `generate` refuse it the same way.
  json t = good;
  t["added_tokens"][0]["id"] = 2147483647;
  WriteText(base + "/tokenizer.json", t.dump());
  CmdResult r = RunGyre({"generate", "--model", base, "--prompt", "hi"}, dir);
  ExpectCleanError(r, {"tokenizer.json", "implausibly large"});
}

// `gyre convert gguf` on files that are not usable GGUF: one line naming the file, exit 1, and
// no model directory left behind.
TEST(BadInputTest, DamagedGgufFilesAreRefusedByName) {
  const std::string dir = MakeTempDir("bad_gguf");
  WriteText(dir + "/text.gguf", "this is not a model\n");
  CmdResult r = RunGyre({"convert", "gguf", dir + "/text.gguf", "--out", dir + "/out"}, dir);
  ExpectCleanError(r, {"text.gguf", "not a GGUF file"});
  WriteText(dir + "/short.gguf", std::string("GGUF\x03\0\0\0", 8) + std::string(20, '\xff'));
  r = RunGyre({"convert", "gguf", dir + "/short.gguf", "--out", dir + "/out"}, dir);
  ExpectCleanError(r, {"short.gguf"});
  r = RunGyre({"convert", "gguf", dir + "/missing.gguf", "--out", dir + "/out"}, dir);
  ExpectCleanError(r, {"missing.gguf"});
  EXPECT_FALSE(PathExists(dir + "/out/config.json"));
  r = RunGyre({"convert", "safetensors", dir + "/text.gguf", "--out", dir + "/out"}, dir);
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(BadInputTest, ConfigsThatCannotWorkFailValidation) {
  const std::string dir = MakeTempDir("bad_cfg");
  CmdResult r = RunGyre({"validate", kQuickstart, "--set", "cluster.weight_transport=grpc", "--set",
                         "cluster.weight_bucket_bytes=1073741824"},
                        dir);
  ExpectCleanError(r, {"cluster.weight_bucket_bytes", "520093696", "gloo"});
  r = RunGyre({"validate", kQuickstart, "--set", "cluster.weight_transport=gloo", "--set",
               "cluster.weight_bucket_bytes=1073741824"},
              dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Tensor parallelism: the layout against the workers, and the model's heads against T.
  r = RunGyre(
      {"validate", kQuickstart, "--set", "trainer.workers=3", "--set", "trainer.tensor_parallel=2"},
      dir);
  ExpectCleanError(r, {"trainer.workers (3) must be a multiple of trainer.tensor_parallel (2)"});
  r = RunGyre(
      {"validate", kQuickstart, "--set", "trainer.workers=4", "--set", "trainer.tensor_parallel=4"},
      dir);
  ExpectCleanError(r, {"tensor_parallel 4 does not divide model.num_kv_heads 2"});
  r = RunGyre({"validate", kQuickstart, "--set", "rollout.tensor_parallel=4"}, dir);
  ExpectCleanError(r, {"rollout.tensor_parallel",
                       "tensor_parallel 4 does not divide "
                       "model.num_kv_heads 2"});
  r = RunGyre(
      {"validate", kQuickstart, "--set", "trainer.workers=4", "--set", "trainer.tensor_parallel=2"},
      dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Dataset records that cannot be used fail the job when the data is loaded, before any worker
// starts, with the file and line: not hours in, when the record is drawn.
TEST(BadInputTest, UnusableTrainingRecordsFailAtLoadWithFileAndLine) {
  const std::string dir = MakeTempDir("bad_data");
  const std::string train = dir + "/train.jsonl";
  const std::string ok_lines =
      "{\"prompt\": \"1+2=\", \"answer\": \"3\"}\n"
      "{\"prompt\": \"4+4=\", \"answer\": \"8\"}\n";
  auto job = [&](const std::vector<std::string>& more) {
    std::vector<std::string> args = {"train",  kQuickstart,
                                     "--set",  "job.output_dir=" + dir,
                                     "--set",  "data.train_path=" + train,
                                     "--quiet"};
    for (const auto& m : more) args.insert(args.end(), {"--set", m});
    return args;
  };
  // A prompt whose tokens plus rollout.max_new_tokens exceed model.max_seq_len (32).
  WriteText(train,
            ok_lines + "{\"prompt\": \"" + std::string(40, '7') + "\", \"answer\": \"1\"}\n");
  CmdResult r = RunGyre(job({}), dir);
  ExpectCleanError(r, {"train.jsonl:3", "exceed model.max_seq_len 32"});
  EXPECT_EQ(r.output.find("started trainer-0"), std::string::npos) << "workers were started";
  // Chat messages without data.chat_template.
  WriteText(train, ok_lines +
                       "{\"prompt\": [{\"role\": \"user\", \"content\": \"1+1=\"}], "
                       "\"answer\": \"2\"}\n");
  r = RunGyre(job({}), dir);
  ExpectCleanError(r, {"train.jsonl:3", "needs data.chat_template"});
  // Characters the built-in tokenizer cannot encode.
  WriteText(train, "{\"prompt\": \"caf\\u00e9=\", \"answer\": \"1\"}\n" + ok_lines);
  r = RunGyre(job({}), dir);
  ExpectCleanError(r, {"train.jsonl:1"});
  // And malformed JSON, as before.
  WriteText(train, ok_lines + "{\"prompt\": \n");
  r = RunGyre(job({}), dir);
  ExpectCleanError(r, {"train.jsonl:3", "not valid JSON"});
}

// model.max_seq_len limits every job; with model.path it must fit the model's positions.
TEST(BadInputTest, SequenceLimitAboveTheModelsPositionsIsRefused) {
  const std::string dir = MakeTempDir("bad_len");
  const std::string model = MakeModel(dir, "m", "qwen2");
  json cfg = ReadJson(model + "/config.json");
  const int64_t positions = cfg["max_position_embeddings"].get<int64_t>();
  CmdResult r = RunGyre({"train", kQuickstart, "--set", "job.output_dir=" + dir, "--set",
                         "model.path=" + model, "--set", "data.chat_template=qwen2.5", "--set",
                         "model.max_seq_len=" + std::to_string(positions + 1), "--quiet"},
                        dir);
  ExpectCleanError(r, {"model.max_seq_len " + std::to_string(positions + 1),
                       "exceeds the model's max_position_embeddings " + std::to_string(positions)});
}

}  // namespace
}  // namespace gyre::testing
