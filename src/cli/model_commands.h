#pragma once
// `gyre` subcommands that work on a model directory directly (no controller, no workers).

#include <string>
#include <vector>

namespace gyre::cli {

// gyre logprobs --model DIR [--ids "1 2 3"] [--full]
// For each token sequence (from --ids, else one JSON array per stdin line) prints one JSON
// object per line: {"ids": [...], "logprobs": [...]} where logprobs[t] is the log-probability
// of ids[t + 1] given ids[0..t]; with --full also "full": the whole log-softmax per position.
int RunLogprobs(const std::vector<std::string>& args);

// gyre init-model --arch qwen2|qwen3|llama [--preset tiny|small|qwen2.5-0.5b] --out DIR
// Writes a random-init Hugging Face directory: config.json, model.safetensors and a valid
// byte-level tokenizer.json (256 byte tokens, no merges, the architecture's special tokens).
int RunInitModel(const std::vector<std::string>& args);

// gyre convert gguf FILE.gguf --out DIR [--force]
// Writes a Hugging Face directory (config.json, model.safetensors in float32, tokenizer.json,
// tokenizer_config.json) from a llama-architecture GGUF file (model/gguf_convert.h).
int RunConvert(const std::vector<std::string>& args);

// gyre tokenize --tokenizer PATH [--text TEXT | --jsonl] [--no-special]
// PATH is a tokenizer.json or a model directory holding one.
int RunTokenize(const std::vector<std::string>& args);

// gyre generate --model DIR --prompt TEXT [sampling flags] [--benchmark]
int RunGenerate(const std::vector<std::string>& args);

}  // namespace gyre::cli
