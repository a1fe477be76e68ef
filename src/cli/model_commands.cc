#include "cli/model_commands.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_util.h"
#include "kernels/device_info.h"
#include "model/gguf_convert.h"
#include "model/hf_config.h"
#include "model/hf_model.h"
#include "model/weights.h"
#include "text/tokenizer_json.h"

namespace gyre::cli {

namespace {

constexpr char kLogprobsUsage[] =
    "usage: gyre logprobs --model DIR [--ids \"ID ID ...\"] [--full] [--dtype DTYPE]\n"
    "                     [--device cpu|cuda]\n"
    "\n"
    "Loads a Hugging Face model directory (config.json + safetensors) in float32 (or --dtype:\n"
    "bfloat16, float16, computing in it as a job with model.dtype does) on the CPU (or --device\n"
    "cuda: the first visible GPU) and prints,\n"
    "for each token sequence, one JSON line {\"ids\": [...], \"logprobs\": [...]} where\n"
    "logprobs[t] = log p(ids[t+1] | ids[0..t]). Sequences come from --ids or, without it, one\n"
    "JSON array of ids per line on stdin. --full adds \"full\": the log-softmax over the whole\n"
    "vocabulary at every position (for parity checks against another implementation).\n";

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
  bool full = false, have_ids = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kLogprobsUsage, stdout);
      return 0;
    } else if (args[i] == "--model" && i + 1 < args.size()) {
      model_dir = args[++i];
    } else if (args[i] == "--ids" && i + 1 < args.size()) {
      ids_text = args[++i];
      have_ids = true;
    } else if (args[i] == "--full") {
      full = true;
    } else if (args[i] == "--dtype" && i + 1 < args.size()) {
      dtype_name = args[++i];
    } else if (args[i] == "--device" && i + 1 < args.size()) {
      device_name = args[++i];
    } else {
      std::fprintf(stderr, "gyre logprobs: unexpected argument '%s' (see gyre logprobs --help)\n",
                   args[i].c_str());
      return 2;
    }
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "gyre logprobs: --model DIR is required\n");
    return 2;
  }
  const StatusOr<at::ScalarType> dtype = model::ParseWeightDtype(dtype_name);
  if (!dtype.ok()) {
    std::fprintf(stderr, "gyre logprobs: --dtype: %s\n", dtype.status().message().c_str());
    return 2;
  }
  if (device_name != "cpu" && device_name != "cuda") {
    std::fprintf(stderr, "gyre logprobs: --device must be cpu or cuda, not '%s'\n",
                 device_name.c_str());
    return 2;
  }
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
  (*model)->ToDtype(*dtype);
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
  if (have_ids) return run(ids_text, false) ? 0 : 1;
  std::string line;
  bool ok = true;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ok = run(line, true) && ok;
  }
  return ok ? 0 : 1;
}

namespace {

constexpr char kInitUsage[] =
    "usage: gyre init-model --arch qwen2|qwen3|llama --out DIR\n"
    "                       [--preset micro|tiny|small|qwen2.5-0.5b] [--seed N] [--force]\n"
    "                       [--init-std S] [--random-norms-and-biases] [--rope-scaling llama3]\n"
    "\n"
    "Writes a randomly initialised model as a Hugging Face directory (config.json,\n"
    "model.safetensors in float32, tokenizer.json) that Gyre and transformers both load. For\n"
    "tests, benchmarks and quickstarts; the tokenizer is byte-level with no merges (one token per\n"
    "byte) plus the architecture's special tokens. Presets: micro (32 wide, 2 layers, under\n"
    "200 KB: committed golden references), tiny (64 wide, 2 layers), small (256 wide, 4 layers),\n"
    "qwen2.5-0.5b (the shape of Qwen2.5-0.5B, about 2 GB in float32).\n"
    "\n"
    "Linear and embedding weights are drawn from N(0, S^2), S = --init-std (default 0.02); norm\n"
    "weights are 1 and biases 0. For numerical references, where every parameter must matter:\n"
    "--random-norms-and-biases draws norm weights from N(1, 0.3^2) and biases from N(0, S^2),\n"
    "and --rope-scaling llama3 (llama only) adds Llama 3.1's RoPE scaling (factor 8, low/high\n"
    "frequency factors 1 and 4) with original_max_position_embeddings = max_position / 8.\n";

}  // namespace

constexpr char kConvertUsage[] =
    "usage: gyre convert gguf FILE.gguf --out DIR [--force]\n"
    "\n"
    "Converts a llama-architecture GGUF file (llama.cpp's format; tensors F32, F16, BF16, Q8_0,\n"
    "Q4_0 or Q4_1) into a Hugging Face directory that Gyre and transformers load: config.json,\n"
    "model.safetensors (every tensor dequantised to float32), tokenizer.json and\n"
    "tokenizer_config.json (with the chat template) from the file's tokenizer metadata. Then\n"
    "use DIR as model.path. --force replaces a model already in DIR.\n";

int RunConvert(const std::vector<std::string>& args) {
  std::string format, in, out;
  bool force = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kConvertUsage, stdout);
      return 0;
    } else if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--force") {
      force = true;
    } else if (format.empty() && args[i][0] != '-') {
      format = args[i];
    } else if (in.empty() && args[i][0] != '-') {
      in = args[i];
    } else {
      std::fprintf(stderr, "gyre convert: unexpected argument '%s' (see --help)\n",
                   args[i].c_str());
      return 2;
    }
  }
  if (format != "gguf" || in.empty() || out.empty()) {
    std::fprintf(stderr, "gyre convert: expected `gyre convert gguf FILE.gguf --out DIR`\n");
    return 2;
  }
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

int RunInitModel(const std::vector<std::string>& args) {
  std::string arch, out, preset = "tiny", rope_scaling;
  uint64_t seed = 0;
  double init_std = 0.02;
  bool force = false, random_norms_and_biases = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kInitUsage, stdout);
      return 0;
    } else if (args[i] == "--arch" && i + 1 < args.size()) {
      arch = args[++i];
    } else if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--preset" && i + 1 < args.size()) {
      preset = args[++i];
    } else if (args[i] == "--seed" && i + 1 < args.size()) {
      seed = std::strtoull(args[++i].c_str(), nullptr, 10);
    } else if (args[i] == "--force") {
      force = true;
    } else if (args[i] == "--init-std" && i + 1 < args.size()) {
      char* end = nullptr;
      init_std = std::strtod(args[++i].c_str(), &end);
      if (end == args[i].c_str() || *end != '\0' || !(init_std > 0) || !std::isfinite(init_std)) {
        std::fprintf(stderr, "gyre init-model: --init-std must be a positive number, not '%s'\n",
                     args[i].c_str());
        return 2;
      }
    } else if (args[i] == "--random-norms-and-biases") {
      random_norms_and_biases = true;
    } else if (args[i] == "--rope-scaling" && i + 1 < args.size()) {
      rope_scaling = args[++i];
    } else {
      std::fprintf(stderr, "gyre init-model: unexpected argument '%s' (see --help)\n",
                   args[i].c_str());
      return 2;
    }
  }
  if (arch != "qwen2" && arch != "qwen3" && arch != "llama") {
    std::fprintf(stderr, "gyre init-model: --arch must be qwen2, qwen3 or llama\n");
    return 2;
  }
  if (out.empty()) {
    std::fprintf(stderr, "gyre init-model: --out DIR is required\n");
    return 2;
  }
  if (!rope_scaling.empty() && (rope_scaling != "llama3" || arch != "llama")) {
    std::fprintf(stderr, "gyre init-model: --rope-scaling takes llama3, with --arch llama\n");
    return 2;
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
  } else if (preset == "qwen2.5-0.5b") {
    s.hidden_size = 896, s.num_layers = 24, s.num_heads = 14, s.num_kv_heads = 2;
    s.intermediate_size = 4864, s.max_seq_len = 32768;
  } else {
    std::fprintf(stderr,
                 "gyre init-model: unknown --preset '%s' (micro, tiny, small, qwen2.5-0.5b)\n",
                 preset.c_str());
    return 2;
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
