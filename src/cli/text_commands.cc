// `gyre tokenize` and `gyre generate`: text in, text out, on a Hugging Face model directory.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/model_commands.h"
#include "common/clock.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "model/hf_config.h"
#include "model/hf_model.h"
#include "rollout/rollout_engine.h"
#include "text/bpe_tokenizer.h"
#include "text/chat_template.h"

namespace gyre::cli {

namespace {

constexpr char kTokenizeSummary[] =
    "Encodes text with a Hugging Face tokenizer.json (PATH is the file or a model directory)\n"
    "and prints the ids as a JSON array. Text comes from --text or from stdin (all of it, as\n"
    "one text).";

constexpr char kTokenizeDetails[] =
    "Exit status: 0, 1 when the tokenizer cannot be read or a text cannot be encoded, 2 on a\n"
    "usage error.";

constexpr char kGenerateSummary[] =
    "Generates a continuation of TEXT with the model in DIR (config.json, safetensors,\n"
    "tokenizer.json), streaming it to stdout as it is sampled; statistics go to stderr.";

constexpr char kGenerateDetails[] =
    "Generation stops at the config's eos_token_id(s) or after --max-new-tokens. --benchmark\n"
    "also times a naive loop that reruns the full forward pass for every token, in the same\n"
    "run, and prints both rates. --chat renders the prompt with that chat template first: TEXT\n"
    "is a user message, or a JSON array of {\"role\", \"content\"} messages; the assistant\n"
    "generation prompt is added.\n"
    "Exit status: 0, 1 when the model cannot be loaded or generation fails, 2 on a usage error.";

// --chat: the names text::ParseChatFormat takes.
CLI::Validator ChatFormatName() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        const StatusOr<text::ChatFormat> format = text::ParseChatFormat(name);
        return format.ok() ? "" : format.status().message();
      },
      "");
}

StatusOr<std::unique_ptr<text::BpeTokenizer>> OpenTokenizer(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/tokenizer.json" : path;
  return text::BpeTokenizer::FromFile(file);
}

std::string IdsJson(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

// eos_token_id in config.json: an integer or a list of them.
std::vector<int32_t> EosIds(const std::string& dir) {
  std::vector<int32_t> out;
  std::ifstream in(dir + "/config.json");
  try {
    auto j = nlohmann::json::parse(in);
    if (j.contains("eos_token_id")) {
      const auto& e = j["eos_token_id"];
      if (e.is_number_integer()) out.push_back(e.get<int32_t>());
      if (e.is_array()) {
        for (const auto& v : e) {
          if (v.is_number_integer()) out.push_back(v.get<int32_t>());
        }
      }
    }
  } catch (const std::exception&) {
    // LoadHfModel has already validated config.json; no eos id means "stop at max tokens".
  }
  return out;
}

}  // namespace

int RunTokenize(const std::vector<std::string>& args) {
  std::string path, text;
  bool jsonl = false, no_special = false;
  auto app = NewCommand("gyre tokenize", kTokenizeSummary, kTokenizeDetails);
  app->add_option("--tokenizer", path, "a tokenizer.json, or a model directory holding one")
      ->required()
      ->type_name("PATH");
  CLI::Option* text_option =
      app->add_option("--text", text, "the text to encode (default: all of stdin)");
  app->add_flag("--jsonl", jsonl, "stdin: one JSON string a line; output: one JSON array a line")
      ->excludes(text_option);
  app->add_flag("--no-special", no_special, "encode special-token strings as plain text");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const bool special = !no_special;
  auto tok = OpenTokenizer(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "gyre: %s\n", tok.status().message().c_str());
    return 1;
  }
  auto encode = [&](const std::string& t, int line) -> bool {
    auto ids = (*tok)->Encode(t, special);
    if (!ids.ok()) {
      std::fprintf(stderr, "gyre tokenize: %s%s\n",
                   line > 0 ? ("line " + std::to_string(line) + ": ").c_str() : "",
                   ids.status().message().c_str());
      return false;
    }
    std::printf("%s\n", IdsJson(*ids).c_str());
    return true;
  };
  if (!jsonl) {
    if (text_option->count() == 0) {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    return encode(text, 0) ? 0 : 1;
  }
  std::string line;
  int n = 0;
  bool ok = true;
  while (std::getline(std::cin, line)) {
    ++n;
    try {
      auto j = nlohmann::json::parse(line);
      if (!j.is_string()) {
        std::fprintf(stderr, "gyre tokenize: line %d: expected a JSON string\n", n);
        ok = false;
        continue;
      }
      ok = encode(j.get<std::string>(), n) && ok;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gyre tokenize: line %d: not valid JSON: %s\n", n, e.what());
      ok = false;
    }
  }
  return ok ? 0 : 1;
}

int RunGenerate(const std::vector<std::string>& args) {
  std::string dir, prompt;
  rollout::Request req;
  rollout::SamplingOptions& sampling = req.sampling;
  sampling.temperature = 0.0f;
  sampling.max_new_tokens = 64;
  bool benchmark = false;
  std::string chat;
  auto app = NewCommand("gyre generate", kGenerateSummary, kGenerateDetails);
  app->add_option("--model", dir, "the model directory")->required()->type_name("DIR");
  app->add_option("--prompt", prompt, "the text to continue")->required()->type_name("TEXT");
  app->add_option("--max-new-tokens", sampling.max_new_tokens, "the most tokens to generate, >= 1")
      ->type_name("N")
      ->check(NumberIn(1, kNoUpperBound));
  app->add_option("--temperature", sampling.temperature,
                  "the sampling temperature, >= 0 (0: greedy)")
      ->type_name("T")
      ->check(NumberIn(0, kNoUpperBound));
  app->add_option("--top-k", sampling.top_k, "sample from the K likeliest tokens (0: all)")
      ->type_name("K");
  app->add_option("--top-p", sampling.top_p,
                  "keep the likeliest tokens up to probability mass P, in (0, 1]")
      ->type_name("P")
      ->check(NumberIn(0, 1, /*min_open=*/true));
  app->add_option("--min-p", sampling.min_p,
                  "drop tokens under P times the likeliest's probability, in [0, 1]")
      ->type_name("P")
      ->check(NumberIn(0, 1));
  app->add_option("--seed", req.seed, "the sampling seed")->type_name("S");
  app->add_option("--chat", chat,
                  "render TEXT with a chat template: qwen2.5, qwen3, llama3, smollm2")
      ->type_name("FORMAT")
      ->check(ChatFormatName());
  app->add_flag("--benchmark", benchmark, "also time a naive full-forward loop");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const auto t_load = std::chrono::steady_clock::now();
  auto model = model::LoadHfModel(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "gyre: %s\n", model.status().message().c_str());
    return 1;
  }
  const double load_s = SecondsSince(t_load);
  auto tok = OpenTokenizer(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "gyre: %s\n", tok.status().message().c_str());
    return 1;
  }
  if (!chat.empty()) {
    const text::ChatFormat format = text::ParseChatFormat(chat).value();  // checked
    auto messages = text::ParseMessagesJson(prompt);
    if (!messages.ok()) {
      messages = std::vector<text::ChatMessage>{{"user", prompt}};  // plain text = one user turn
    }
    auto rendered = text::RenderChat(format, *messages, text::ChatOptions{});
    if (!rendered.ok()) {
      std::fprintf(stderr, "gyre generate: %s\n", rendered.status().message().c_str());
      return 2;
    }
    prompt = *rendered;
  }
  auto ids = (*tok)->Encode(prompt);
  if (!ids.ok() || ids->empty()) {
    std::fprintf(stderr, "gyre generate: %s\n",
                 ids.ok() ? "the prompt encodes to no tokens" : ids.status().message().c_str());
    return 1;
  }
  req.prompt = *ids;
  sampling.stop_token_ids = EosIds(dir);
  // The paged engine with one sequence and a KV pool that holds it whole.
  rollout::EngineConfig config;
  config.max_running = 1;
  config.num_blocks =
      (static_cast<int64_t>(req.prompt.size()) + sampling.max_new_tokens + config.block_size - 1) /
          config.block_size +
      1;
  config.max_step_tokens = std::max<int64_t>(config.max_step_tokens, req.prompt.size());
  auto engine = rollout::RolloutEngine::Create(model->get(), config);
  if (!engine.ok()) {
    std::fprintf(stderr, "gyre generate: %s\n", engine.status().message().c_str());
    return 1;
  }
  text::BpeTokenizer::StreamDecoder stream(**tok, /*skip_special=*/true);
  (*engine)->SetTokenCallback([&](uint64_t, int32_t, int32_t token) {
    std::fputs(stream.Push(token).c_str(), stdout);
    std::fflush(stdout);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto out = (*engine)->Generate({req});
  const double gen_s = SecondsSince(t0);
  if (!out.ok()) {
    std::fprintf(stderr, "\ngyre generate: %s\n", out.status().message().c_str());
    return 1;
  }
  std::fputs(stream.Flush().c_str(), stdout);
  std::fputs("\n", stdout);
  const rollout::Response& r = (*out)[0].response;
  const rollout::Finish finish = (*out)[0].finish;
  const double tok_s = static_cast<double>(r.tokens.size()) / gen_s;
  uint64_t bytes = 0;
  for (const auto& [name, t] : (*model)->NamedParameters()) bytes += t.numel() * 4;
  std::fprintf(stderr,
               "[%zu prompt tokens, %zu generated (%s) in %.3f s: %.1f tokens/s; model loaded in "
               "%.3f s]\n",
               req.prompt.size(), r.tokens.size(),
               finish == rollout::Finish::kStop ? "stop" : "length", gen_s, tok_s, load_s);
  if (!benchmark) return 0;
  // The naive baseline: a full forward over the whole sequence for every new token, greedy,
  // as many tokens as the engine produced.
  c10::InferenceMode guard;
  std::vector<int64_t> seq(req.prompt.begin(), req.prompt.end());
  std::vector<int32_t> naive_tokens;
  const auto tn = std::chrono::steady_clock::now();
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    at::Tensor logits = (*model)->Forward(at::tensor(seq).unsqueeze(0));
    const int64_t next = logits[0][static_cast<int64_t>(seq.size()) - 1].argmax().item<int64_t>();
    naive_tokens.push_back(static_cast<int32_t>(next));
    seq.push_back(sampling.temperature == 0 ? next : r.tokens[i]);
  }
  const double naive_s = SecondsSince(tn);
  const double naive_tok_s = static_cast<double>(r.tokens.size()) / naive_s;
  std::fprintf(stderr,
               "benchmark: engine %.1f tokens/s, naive full-forward loop %.1f tokens/s, speedup "
               "%.2fx%s\n",
               tok_s, naive_tok_s, tok_s / naive_tok_s,
               sampling.temperature == 0
                   ? (naive_tokens == r.tokens ? " (greedy tokens identical)"
                                               : " (WARNING: greedy tokens differ)")
                   : "");
  std::fprintf(stderr, "benchmark: %.3f GB of float32 weights loaded in %.3f s (%.2f GB/s)\n",
               bytes / 1e9, load_s, bytes / 1e9 / load_s);
  return 0;
}

}  // namespace gyre::cli
