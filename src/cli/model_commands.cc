#include "cli/model_commands.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/command_line.h"
#include "common/file_util.h"
#include "kernels/device_info.h"
#include "model/gguf_convert.h"
#include "model/hf_config.h"
#include "model/hf_model.h"
#include "model/weights.h"
#include "text/tokenizer_json.h"

namespace gyre::cli {

namespace {

constexpr char kLogprobsSummary[] =
    "Loads a Hugging Face model directory (config.json + safetensors) and prints, for each\n"
    "token sequence, one JSON line {\"ids\": [...], \"logprobs\": [...]} where\n"
    "logprobs[t] = log p(ids[t+1] | ids[0..t]). Sequences come from --ids or, without it, one\n"
    "JSON array of ids per line on stdin.";

constexpr char kLogprobsDetails[] =
    "--dtype bfloat16 or float16 computes in that type, as a job with model.dtype does; --device\n"
    "cuda runs on the first visible GPU. --full adds \"full\": the log-softmax over the whole\n"
    "vocabulary at every position (for parity checks against another implementation).\n"
    "Exit status: 0, 1 when the model cannot be loaded or a sequence is refused, 2 on a usage\n"
    "error.";

// --dtype: the names model::ParseWeightDtype takes.
CLI::Validator WeightDtype() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        const StatusOr<at::ScalarType> dtype = model::ParseWeightDtype(name);
        return dtype.ok() ? "" : dtype.status().message();
      },
      "");
}

StatusOr<std::vector<int64_t>> ParseIds(const std::string& text, bool json_array) {
  std::vector<int64_t> ids;
  if (json_array) {
    try {
      auto j = nlohmann::json::parse(text);
      if (!j.is_array()) return InvalidArgument("expected a JSON array of token ids");
      for (const auto& v : j) {
        if (!v.is_number_integer()) return InvalidArgument("token ids must be integers");
        ids.push_back(v.get<int64_t>());
      }
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(std::string("not valid JSON: ") + e.what());
    }
    return ids;
  }
  std::string cleaned = text;
  for (char& c : cleaned) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(cleaned);
  std::string tok;
  while (in >> tok) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(tok, &used));
      if (used != tok.size()) throw std::invalid_argument(tok);
    } catch (const std::exception&) {
      return InvalidArgument("'" + tok + "' is not a token id");
    }
  }
  return ids;
}

}  // namespace

int RunLogprobs(const std::vector<std::string>& args) {
  std::string model_dir, ids_text, dtype_name = "float32", device_name = "cpu";
  bool full = false;
  auto app = NewCommand("gyre logprobs", kLogprobsSummary, kLogprobsDetails);
  app->add_option("--model", model_dir, "the model directory")->required()->type_name("DIR");
  CLI::Option* ids_option =
      app->add_option("--ids", ids_text,
                      "one sequence of token ids (default: JSON arrays on stdin)")
          ->type_name("\"ID ...\"");
  app->add_flag("--full", full, "add the whole log-softmax at every position");
  app->add_option("--dtype", dtype_name, "float32, bfloat16 or float16")
      ->type_name("DTYPE")
      ->check(WeightDtype());
  app->add_option("--device", device_name, "where the model runs")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  const at::ScalarType dtype = model::ParseWeightDtype(dtype_name).value();  // checked
  if (device_name == "cuda" && kernels::CudaDeviceCount() == 0) {
    std::fprintf(stderr,
                 "gyre logprobs: --device cuda, but no usable CUDA device is visible (no GPU or "
                 "driver, CUDA_VISIBLE_DEVICES empty, or a build without CUDA)\n");
    return 1;
  }
  const at::Device device = device_name == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  auto model = model::LoadHfModel(model_dir);
  if (!model.ok()) {
    std::fprintf(stderr, "gyre: %s\n", model.status().message().c_str());
    return 1;
  }
  (*model)->To(device);
  (*model)->ToDtype(dtype);
  const int64_t vocab = (*model)->spec().vocab_size;
  c10::InferenceMode guard;
  auto run = [&](const std::string& text, bool json_array) -> bool {
    auto ids = ParseIds(text, json_array);
    Status s = ids.status();
    if (s.ok() && ids->empty()) s = InvalidArgument("empty token sequence");
    if (s.ok()) {
      for (int64_t id : *ids) {
        if (id < 0 || id >= vocab) {
          s = InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary of " +
                              std::to_string(vocab));
          break;
        }
      }
    }
    if (s.ok() && static_cast<int64_t>(ids->size()) > (*model)->spec().max_seq_len) {
      s = InvalidArgument(std::to_string(ids->size()) + " tokens exceed max_position_embeddings " +
                          std::to_string((*model)->spec().max_seq_len));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "gyre logprobs: %s\n", s.message().c_str());
      return false;
    }
    at::Tensor tokens = at::tensor(*ids).unsqueeze(0).to(device);
    at::Tensor lsm =
        at::log_softmax((*model)->Forward(tokens)[0].to(at::kFloat), -1).cpu();  // [T, V]
    nlohmann::json out;
    out["ids"] = *ids;
    std::vector<double> lp;
    for (size_t t = 0; t + 1 < ids->size(); ++t) {
      lp.push_back(lsm[static_cast<int64_t>(t)][(*ids)[t + 1]].item<double>());
    }
    out["logprobs"] = lp;
    if (full) {
      std::vector<std::vector<float>> rows(ids->size());
      auto a = lsm.contiguous();
      for (size_t t = 0; t < ids->size(); ++t) {
        const float* row = a.data_ptr<float>() + t * vocab;
        rows[t].assign(row, row + vocab);
      }
      out["full"] = rows;
    }
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
    return true;
  };
  if (ids_option->count() > 0) return run(ids_text, false) ? 0 : 1;
  std::string line;
  bool ok = true;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ok = run(line, true) && ok;
  }
  return ok ? 0 : 1;
}

namespace {

constexpr char kInitSummary[] =
    "Writes a randomly initialised model as a Hugging Face directory (config.json,\n"
    "model.safetensors in float32, tokenizer.json) that Gyre and transformers both load. For\n"
    "tests, benchmarks and quickstarts; the tokenizer is byte-level with no merges (one token\n"
    "per byte) plus the architecture's special tokens.";

constexpr char kInitDetails[] =
    "Presets: micro (32 wide, 2 layers, under 200 KB: committed golden references), tiny (64\n"
    "wide, 2 layers), small (256 wide, 4 layers), qwen2.5-0.5b (the shape of Qwen2.5-0.5B,\n"
    "about 2 GB in float32).\n"
    "\n"
    "Linear and embedding weights are drawn from N(0, S^2), S = --init-std; norm weights are 1\n"
    "and biases 0. For numerical references, where every parameter must matter:\n"
    "--random-norms-and-biases draws norm weights from N(1, 0.3^2) and biases from N(0, S^2),\n"
    "and --rope-scaling llama3 (llama only) adds Llama 3.1's RoPE scaling (factor 8, low/high\n"
    "frequency factors 1 and 4) with original_max_position_embeddings = max_position / 8.\n"
    "Exit status: 0, 1 when DIR already holds a model (without --force) or cannot be written,\n"
    "2 on a usage error.";

constexpr char kConvertSummary[] =
    "Converts a model file from another format into a Hugging Face model directory. One\n"
    "format: gguf (see gyre convert gguf --help).";

constexpr char kConvertGgufSummary[] =
    "Converts a llama-architecture GGUF file (llama.cpp's format; tensors F32, F16, BF16, Q8_0,\n"
    "Q4_0 or Q4_1) into a Hugging Face directory that Gyre and transformers load: config.json,\n"
    "model.safetensors (every tensor dequantised to float32), tokenizer.json and\n"
    "tokenizer_config.json (with the chat template) from the file's tokenizer metadata. Then\n"
    "use DIR as model.path.";

constexpr char kConvertGgufDetails[] =
    "Exit status: 0, 1 when the file cannot be converted or DIR already holds a model (without\n"
    "--force), 2 on a usage error.";

int RunConvertGguf(const std::vector<std::string>& args) {
  std::string in, out;
  bool force = false;
  auto app = NewCommand("gyre convert gguf", kConvertGgufSummary, kConvertGgufDetails);
  app->add_option("FILE.gguf", in, "the GGUF file")->required();
  app->add_option("--out", out, "the model directory to write")->required()->type_name("DIR");
  app->add_flag("--force", force, "replace a model already in DIR");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  if (PathExists(out + "/config.json") && !force) {
    std::fprintf(stderr, "gyre convert: %s already holds a model (use --force)\n", out.c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto conv = model::ConvertGgufToHf(in, out);
  if (!conv.ok()) {
    std::fprintf(stderr, "gyre convert: %s\n", conv.status().message().c_str());
    return 1;
  }
  std::printf(
      "wrote %s: llama, %lld parameters (%lld layers, hidden %lld, %lld heads / %lld kv), "
      "vocabulary %lld; tensors %s; %.1f s\n",
      out.c_str(), static_cast<long long>(conv->parameters),
      static_cast<long long>(conv->spec.num_layers), static_cast<long long>(conv->spec.hidden_size),
      static_cast<long long>(conv->spec.num_heads), static_cast<long long>(conv->spec.num_kv_heads),
      static_cast<long long>(conv->vocab), conv->tensor_types.c_str(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int RunConvert(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "gguf") return RunConvertGguf({args.begin() + 1, args.end()});
  // `gyre convert --help`, or a usage error naming what is wrong.
  std::string format;
  auto app = NewCommand("gyre convert", kConvertSummary);
  app->add_option("FORMAT", format, "the input's format")
      ->required()
      ->check(CLI::IsMember({"gguf"}));
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  return RunConvertGguf({});  // `gyre convert -- gguf`: FILE.gguf and --out are missing
}

int RunInitModel(const std::vector<std::string>& args) {
  std::string arch, out, preset = "tiny", rope_scaling;
  uint64_t seed = 0;
  double init_std = 0.02;
  bool force = false, random_norms_and_biases = false;
  auto app = NewCommand("gyre init-model", kInitSummary, kInitDetails);
  app->add_option("--arch", arch, "the architecture")
      ->required()
      ->check(CLI::IsMember({"qwen2", "qwen3", "llama"}));
  app->add_option("--out", out, "the model directory to write")->required()->type_name("DIR");
  app->add_option("--preset", preset, "the model's size (see below)")
      ->check(CLI::IsMember({"micro", "tiny", "small", "qwen2.5-0.5b"}));
  app->add_option("--seed", seed, "the seed of the random weights");
  app->add_flag("--force", force, "replace a model already in DIR");
  app->add_option("--init-std", init_std,
                  "the standard deviation of linear and embedding weights, > 0")
      ->type_name("S")
      ->check(NumberIn(0, kNoUpperBound, /*min_open=*/true));
  app->add_flag("--random-norms-and-biases", random_norms_and_biases,
                "random norm weights and biases too (see below)");
  app->add_option("--rope-scaling", rope_scaling,
                  "Llama 3.1's RoPE scaling, with --arch llama (default: none)")
      ->check(CLI::IsMember({"llama3"}));
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  if (!rope_scaling.empty() && arch != "llama") {
    return CommandLineError(*app, "--rope-scaling llama3 needs --arch llama");
  }
  model::ModelSpec s;
  s.architecture = arch;
  if (preset == "micro") {
    // max_seq_len 2048: with --rope-scaling llama3 (256 original positions, so wavelength
    // thresholds 64 and 256) the four RoPE wavelengths at head_dim 8 and theta 5e5 (6, 167, 4443
    // and 118143 positions) fall in all three regimes: kept, smoothed and divided by 8.
    s.hidden_size = 32, s.num_layers = 2, s.num_heads = 4, s.num_kv_heads = 2;
    s.intermediate_size = 64, s.max_seq_len = 2048;
  } else if (preset == "tiny") {
    s.hidden_size = 64, s.num_layers = 2, s.num_heads = 4, s.num_kv_heads = 2;
    s.intermediate_size = 128, s.max_seq_len = 512;
  } else if (preset == "small") {
    s.hidden_size = 256, s.num_layers = 4, s.num_heads = 8, s.num_kv_heads = 2;
    s.intermediate_size = 688, s.max_seq_len = 2048;
  } else {  // qwen2.5-0.5b, the last name --preset takes
    s.hidden_size = 896, s.num_layers = 24, s.num_heads = 14, s.num_kv_heads = 2;
    s.intermediate_size = 4864, s.max_seq_len = 32768;
  }
  s.head_dim = s.hidden_size / s.num_heads;
  if (arch == "qwen3") s.head_dim *= 2;  // Qwen3 decouples head_dim from hidden / heads
  std::vector<std::string> specials;
  if (arch == "llama") {
    specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                "<|end_header_id|>"};
    s.rope_theta = 500000.0;
    s.rms_norm_eps = 1e-5;
    s.tie_embeddings = false;
    if (rope_scaling == "llama3") {
      s.rope_type = "llama3";
      s.rope_factor = 8.0;
      s.rope_low_freq_factor = 1.0;
      s.rope_high_freq_factor = 4.0;
      s.rope_original_max_position = s.max_seq_len / 8;
    }
  } else {
    specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    s.rope_theta = 1000000.0;
    s.rms_norm_eps = 1e-6;
    s.tie_embeddings = true;
    s.attention_bias = arch == "qwen2";
    s.qk_norm = arch == "qwen3";
  }
  // Padded vocabulary, as real checkpoints have: a multiple of 64 above the real token count.
  const int64_t real_tokens = 256 + static_cast<int64_t>(specials.size());
  s.vocab_size = preset == "qwen2.5-0.5b" ? 151936 : (real_tokens + 63) / 64 * 64;

  if (PathExists(out + "/config.json") && !force) {
    std::fprintf(stderr, "gyre init-model: %s already holds a model (use --force)\n", out.c_str());
    return 1;
  }
  Status st = MakeDirs(out);
  auto m = model::Transformer::Create(s, seed, init_std);
  if (random_norms_and_biases) {
    // A second random stream, so the other weights stay those of the same seed without the flag.
    c10::InferenceMode no_grad;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
    const auto ends_with = [](const std::string& name, const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    for (auto& named : m->NamedParameters()) {
      if (ends_with(named.first, "norm.weight")) named.second.normal_(1.0, 0.3, gen);
      if (ends_with(named.first, ".bias")) named.second.normal_(0.0, init_std, gen);
    }
  }
  nlohmann::json extra;
  if (arch == "llama") {
    extra = {{"bos_token_id", 256}, {"eos_token_id", 257}};
  } else {
    extra = {{"bos_token_id", 256}, {"eos_token_id", arch == "qwen3" ? 258 : 256}};
  }
  if (st.ok()) st = model::WriteHfConfig(out, s, extra.dump());
  if (st.ok()) st = model::SaveSafetensors(out + "/model.safetensors", m->NamedParameters());
  if (st.ok()) {
    std::vector<std::pair<uint8_t, int32_t>> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(static_cast<uint8_t>(b), b);
    std::vector<std::pair<std::string, int32_t>> special_ids;
    for (size_t i = 0; i < specials.size(); ++i) {
      special_ids.emplace_back(specials[i], 256 + static_cast<int32_t>(i));
    }
    std::ofstream tok(out + "/tokenizer.json");
    tok << text::NoMergeByteLevelTokenizerJson(bytes, special_ids);
    if (!tok) st = Unavailable("cannot write " + out + "/tokenizer.json");
  }
  if (!st.ok()) {
    std::fprintf(stderr, "gyre: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("wrote %s model (%s preset, %lld parameters) to %s\n", arch.c_str(), preset.c_str(),
              static_cast<long long>(m->NumParameters()), out.c_str());
  return 0;
}

}  // namespace gyre::cli
