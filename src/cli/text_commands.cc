// `gyre tokenize` and `gyre generate`: text in, text out, on a Hugging Face model directory.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/model_commands.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "model/hf_config.h"
#include "model/hf_model.h"
#include "rollout/rollout_engine.h"
#include "text/bpe_tokenizer.h"
#include "text/chat_template.h"

namespace gyre::cli {

namespace {

constexpr char kTokenizeUsage[] =
    "usage: gyre tokenize --tokenizer PATH [--text TEXT | --jsonl] [--no-special]\n"
    "\n"
    "Encodes text with a Hugging Face tokenizer.json (PATH is the file or a model directory)\n"
    "and prints the ids as a JSON array. Text comes from --text or from stdin (all of it, as one\n"
    "text). With --jsonl, every stdin line is a JSON string and every output line the JSON array\n"
    "of its ids. --no-special encodes special-token strings as plain text.\n";

constexpr char kGenerateUsage[] =
    "usage: gyre generate --model DIR --prompt TEXT [--max-new-tokens N] [--temperature T]\n"
    "                     [--top-k K] [--top-p P] [--min-p P] [--seed S] [--benchmark]\n"
    "                     [--chat qwen2.5|qwen3|llama3]\n"
    "\n"
    "Generates a continuation of TEXT with the model in DIR (config.json, safetensors,\n"
    "tokenizer.json), streaming it to stdout as it is sampled; statistics go to stderr.\n"
    "--temperature 0 (the default) is greedy. Generation stops at the config's eos_token_id(s)\n"
    "or after --max-new-tokens (default 64). --benchmark also times a naive loop that reruns\n"
    "the full forward pass for every token, in the same run, and prints both rates.\n"
    "--chat renders the prompt with that chat template first: TEXT is a user message, or a\n"
    "JSON array of {\"role\", \"content\"} messages; the assistant generation prompt is added.\n";

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
  bool have_text = false, jsonl = false, special = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kTokenizeUsage, stdout);
      return 0;
    } else if (args[i] == "--tokenizer" && i + 1 < args.size()) {
      path = args[++i];
    } else if (args[i] == "--text" && i + 1 < args.size()) {
      text = args[++i];
      have_text = true;
    } else if (args[i] == "--jsonl") {
      jsonl = true;
    } else if (args[i] == "--no-special") {
      special = false;
    } else {
      std::fprintf(stderr, "gyre tokenize: unexpected argument '%s' (see --help)\n",
                   args[i].c_str());
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "gyre tokenize: --tokenizer PATH is required\n");
    return 2;
  }
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
    if (!have_text) {
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
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--help" || a == "-h") {
      std::fputs(kGenerateUsage, stdout);
      return 0;
    } else if (a == "--model" && has_value) {
      dir = args[++i];
    } else if (a == "--prompt" && has_value) {
      prompt = args[++i];
    } else if (a == "--max-new-tokens" && has_value) {
      sampling.max_new_tokens = std::atoi(args[++i].c_str());
    } else if (a == "--temperature" && has_value) {
      sampling.temperature = std::strtof(args[++i].c_str(), nullptr);
    } else if (a == "--top-k" && has_value) {
      sampling.top_k = std::atoi(args[++i].c_str());
    } else if (a == "--top-p" && has_value) {
      sampling.top_p = std::strtof(args[++i].c_str(), nullptr);
    } else if (a == "--min-p" && has_value) {
      sampling.min_p = std::strtof(args[++i].c_str(), nullptr);
    } else if (a == "--seed" && has_value) {
      req.seed = std::strtoull(args[++i].c_str(), nullptr, 10);
    } else if (a == "--chat" && has_value) {
      chat = args[++i];
    } else if (a == "--benchmark") {
      benchmark = true;
    } else {
      std::fprintf(stderr, "gyre generate: unexpected argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (dir.empty() || prompt.empty()) {
    std::fprintf(stderr, "gyre generate: --model DIR and --prompt TEXT are required\n");
    return 2;
  }
  if (sampling.max_new_tokens < 1 || sampling.temperature < 0 || sampling.top_p <= 0 ||
      sampling.top_p > 1 || sampling.min_p < 0 || sampling.min_p > 1) {
    std::fprintf(stderr,
                 "gyre generate: need --max-new-tokens >= 1, --temperature >= 0, --top-p in "
                 "(0, 1], --min-p in [0, 1]\n");
    return 2;
  }
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
    auto format = text::ParseChatFormat(chat);
    auto messages = format.ok() ? text::ParseMessagesJson(prompt)
                                : StatusOr<std::vector<text::ChatMessage>>(format.status());
    if (!messages.ok() && format.ok()) {
      messages = std::vector<text::ChatMessage>{{"user", prompt}};  // plain text = one user turn
    }
    auto rendered = messages.ok() ? text::RenderChat(*format, *messages, text::ChatOptions{})
                                  : StatusOr<std::string>(messages.status());
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
