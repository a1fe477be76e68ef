#include "model/hf_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/limits.h"
#include "common/strings.h"

namespace gyre::model {

namespace {

using nlohmann::json;

// Reads an optional number field; fails if present with the wrong type.
template <typename T>
Status Field(const json& j, const std::string& key, const std::string& src, T* out, bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return InvalidArgument(src + ": missing field \"" + key + "\"");
    return Status::Ok();
  }
  const json& v = j[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return InvalidArgument(src + ": \"" + key + "\" must be true or false");
    *out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return InvalidArgument(src + ": \"" + key + "\" must be a string");
    *out = v.get<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) {
      return InvalidArgument(src + ": \"" + key + "\" must be an integer");
    }
    *out = v.get<T>();
  } else {
    if (!v.is_number()) return InvalidArgument(src + ": \"" + key + "\" must be a number");
    *out = v.get<T>();
  }
  return Status::Ok();
}

std::string Number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

StatusOr<ModelSpec> ParseHfConfig(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(src + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgument(src + ": expected a JSON object");
  ModelSpec s;
  std::string model_type;
  GYRE_RETURN_IF_ERROR(Field(j, "model_type", src, &model_type, true));
  if (model_type != "llama" && model_type != "qwen2" && model_type != "qwen3") {
    return InvalidArgument(src + ": model_type '" + model_type +
                           "' is not supported (supported: llama, qwen2, qwen3)");
  }
  s.architecture = model_type;
  GYRE_RETURN_IF_ERROR(Field(j, "vocab_size", src, &s.vocab_size, true));
  GYRE_RETURN_IF_ERROR(Field(j, "hidden_size", src, &s.hidden_size, true));
  GYRE_RETURN_IF_ERROR(Field(j, "num_hidden_layers", src, &s.num_layers, true));
  GYRE_RETURN_IF_ERROR(Field(j, "num_attention_heads", src, &s.num_heads, true));
  s.num_kv_heads = s.num_heads;
  GYRE_RETURN_IF_ERROR(Field(j, "num_key_value_heads", src, &s.num_kv_heads, false));
  GYRE_RETURN_IF_ERROR(Field(j, "intermediate_size", src, &s.intermediate_size, true));
  if (s.vocab_size <= 0 || s.hidden_size <= 0 || s.num_layers <= 0 || s.num_heads <= 0 ||
      s.num_kv_heads <= 0 || s.intermediate_size <= 0) {
    return InvalidArgument(src + ": sizes must be positive");
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument(src + ": num_attention_heads " + std::to_string(s.num_heads) +
                           " is not a multiple of num_key_value_heads " +
                           std::to_string(s.num_kv_heads));
  }
  s.head_dim = s.hidden_size / s.num_heads;
  GYRE_RETURN_IF_ERROR(Field(j, "head_dim", src, &s.head_dim, false));
  if (s.head_dim <= 0 || s.head_dim % 2 != 0) {
    return InvalidArgument(src + ": head_dim must be a positive even number");
  }
  s.max_seq_len = 2048;
  GYRE_RETURN_IF_ERROR(Field(j, "max_position_embeddings", src, &s.max_seq_len, false));
  if (s.max_seq_len <= 0) {
    return InvalidArgument(src + ": max_position_embeddings must be positive (got " +
                           std::to_string(s.max_seq_len) + ")");
  }
  GYRE_RETURN_IF_ERROR(Field(j, "rms_norm_eps", src, &s.rms_norm_eps, false));
  if (!(s.rms_norm_eps > 0) || !std::isfinite(s.rms_norm_eps)) {
    return InvalidArgument(src + ": rms_norm_eps must be a positive number (got " +
                           Number(s.rms_norm_eps) + ")");
  }
  s.tie_embeddings = false;
  GYRE_RETURN_IF_ERROR(Field(j, "tie_word_embeddings", src, &s.tie_embeddings, false));
  // Qwen2 always has q/k/v biases; Llama and Qwen3 have them when attention_bias is true.
  s.attention_bias = model_type == "qwen2";
  if (model_type != "qwen2") {
    GYRE_RETURN_IF_ERROR(Field(j, "attention_bias", src, &s.attention_bias, false));
  }
  s.qk_norm = model_type == "qwen3";
  std::string act = "silu";
  GYRE_RETURN_IF_ERROR(Field(j, "hidden_act", src, &act, false));
  if (act != "silu") {
    return InvalidArgument(src + ": hidden_act '" + act + "' is not supported (only silu)");
  }
  bool sliding = false;
  GYRE_RETURN_IF_ERROR(Field(j, "use_sliding_window", src, &sliding, false));
  if (sliding) return InvalidArgument(src + ": use_sliding_window: true is not supported");
  if (j.contains("mlp_bias") && j["mlp_bias"].is_boolean() && j["mlp_bias"].get<bool>()) {
    return InvalidArgument(src + ": mlp_bias: true is not supported");
  }

  // RoPE: rope_theta at the top level (transformers 4.x) or inside rope_parameters (5.x);
  // scaling in rope_scaling or rope_parameters, its kind under "rope_type" or "type".
  GYRE_RETURN_IF_ERROR(Field(j, "rope_theta", src, &s.rope_theta, false));
  const json* rope = nullptr;
  std::string rope_key;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (j.contains(key) && !j[key].is_null()) {
      if (!j[key].is_object()) return InvalidArgument(src + ": \"" + key + "\" must be an object");
      rope = &j[key];
      rope_key = key;
      break;
    }
  }
  if (rope != nullptr) {
    const std::string where = src + ": " + rope_key;
    GYRE_RETURN_IF_ERROR(Field(*rope, "rope_theta", where, &s.rope_theta, false));
    std::string type = "default";
    GYRE_RETURN_IF_ERROR(Field(*rope, "type", where, &type, false));
    GYRE_RETURN_IF_ERROR(Field(*rope, "rope_type", where, &type, false));
    if (type == "llama3") {
      s.rope_type = "llama3";
      GYRE_RETURN_IF_ERROR(Field(*rope, "factor", where, &s.rope_factor, true));
      GYRE_RETURN_IF_ERROR(Field(*rope, "low_freq_factor", where, &s.rope_low_freq_factor, true));
      GYRE_RETURN_IF_ERROR(Field(*rope, "high_freq_factor", where, &s.rope_high_freq_factor, true));
      GYRE_RETURN_IF_ERROR(Field(*rope, "original_max_position_embeddings", where,
                                 &s.rope_original_max_position, true));
      for (const auto& [name, value] : {std::pair<const char*, double>{"factor", s.rope_factor},
                                        {"low_freq_factor", s.rope_low_freq_factor},
                                        {"high_freq_factor", s.rope_high_freq_factor}}) {
        if (!(value > 0) || !std::isfinite(value)) {
          return InvalidArgument(where + ": " + name + " must be a positive number (got " +
                                 Number(value) + ")");
        }
      }
      if (s.rope_original_max_position <= 0) {
        return InvalidArgument(where + ": original_max_position_embeddings must be positive");
      }
      if (s.rope_high_freq_factor <= s.rope_low_freq_factor) {
        return InvalidArgument(where + ": high_freq_factor must exceed low_freq_factor");
      }
    } else if (type != "default") {
      return InvalidArgument(where + ": rope_type '" + type +
                             "' is not supported (supported: default, llama3)");
    }
  }
  if (!(s.rope_theta > 0) || !std::isfinite(s.rope_theta)) {
    return InvalidArgument(src + ": rope_theta must be a positive number (got " +
                           Number(s.rope_theta) + ")");
  }
  return s;
}

ModelSpec SpecFromConfig(const ModelSection& s, int64_t vocab_size) {
  ModelSpec spec;
  spec.vocab_size = vocab_size;
  spec.hidden_size = s.hidden_size;
  spec.num_layers = s.num_layers;
  spec.num_heads = s.num_heads;
  spec.num_kv_heads = s.num_kv_heads;
  spec.head_dim = s.hidden_size / s.num_heads;
  spec.intermediate_size = s.intermediate_size;
  spec.max_seq_len = s.max_seq_len;
  spec.rope_theta = s.rope_theta;
  spec.rms_norm_eps = s.rms_norm_eps;
  spec.tie_embeddings = s.tie_embeddings;
  return spec;
}

double EstimateParameterCount(const ModelSpec& s) {
  // In double: a hostile config must not overflow the estimate itself.
  const double h = static_cast<double>(s.hidden_size), v = static_cast<double>(s.vocab_size);
  const double q = static_cast<double>(s.num_heads) * static_cast<double>(s.head_dim);
  const double kv = static_cast<double>(s.num_kv_heads) * static_cast<double>(s.head_dim);
  const double inter = static_cast<double>(s.intermediate_size);
  double layer = 2 * h;                       // the two RMSNorms
  layer += h * q + 2 * h * kv + q * h;        // q, k, v, o projections
  if (s.attention_bias) layer += q + 2 * kv;  // q/k/v biases
  if (s.qk_norm) layer += 2 * static_cast<double>(s.head_dim);
  layer += 3 * h * inter;  // gate, up, down
  double total = v * h + static_cast<double>(s.num_layers) * layer + h;
  if (!s.tie_embeddings) total += v * h;
  return total;
}

Status CheckModelSize(const ModelSpec& s, const std::string& src, double limit_bytes) {
  if (limit_bytes <= 0) limit_bytes = PhysicalMemoryBytes();
  const double bytes = EstimateParameterCount(s) * 4.0;  // float32
  if (bytes > limit_bytes) {
    return InvalidArgument(
        src + ": the model's float32 parameters need " + HumanBytes(bytes) + " (vocab_size " +
        std::to_string(s.vocab_size) + ", hidden_size " + std::to_string(s.hidden_size) +
        ", num_hidden_layers " + std::to_string(s.num_layers) + ", intermediate_size " +
        std::to_string(s.intermediate_size) + ", num_attention_heads " +
        std::to_string(s.num_heads) + " x head_dim " + std::to_string(s.head_dim) +
        "), more than this machine's " + HumanBytes(limit_bytes) + " of memory");
  }
  return Status::Ok();
}

Status WriteHfConfig(const std::string& dir, const ModelSpec& spec, const std::string& extra_json) {
  json j;
  const std::string& arch = spec.architecture;
  j["model_type"] = arch;
  j["architectures"] = {arch == "qwen2"   ? "Qwen2ForCausalLM"
                        : arch == "qwen3" ? "Qwen3ForCausalLM"
                                          : "LlamaForCausalLM"};
  j["vocab_size"] = spec.vocab_size;
  j["hidden_size"] = spec.hidden_size;
  j["num_hidden_layers"] = spec.num_layers;
  j["num_attention_heads"] = spec.num_heads;
  j["num_key_value_heads"] = spec.num_kv_heads;
  j["head_dim"] = spec.head_dim;
  j["intermediate_size"] = spec.intermediate_size;
  j["max_position_embeddings"] = spec.max_seq_len;
  j["rms_norm_eps"] = spec.rms_norm_eps;
  j["tie_word_embeddings"] = spec.tie_embeddings;
  if (arch != "qwen2") j["attention_bias"] = spec.attention_bias;
  if (arch == "qwen2" && !spec.attention_bias) {
    return InvalidArgument("a qwen2 model always has q/k/v biases");
  }
  if (arch == "qwen3" && !spec.qk_norm) return InvalidArgument("a qwen3 model has q/k norms");
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  j["rope_theta"] = spec.rope_theta;
  if (spec.rope_type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", spec.rope_factor},
                         {"low_freq_factor", spec.rope_low_freq_factor},
                         {"high_freq_factor", spec.rope_high_freq_factor},
                         {"original_max_position_embeddings", spec.rope_original_max_position}};
  }
  try {
    j.update(json::parse(extra_json));
  } catch (const std::exception& e) {
    return Internal(std::string("WriteHfConfig: bad extra fields: ") + e.what());
  }
  std::ofstream out(dir + "/config.json");
  out << j.dump(2) << "\n";
  if (!out) return Unavailable("cannot write " + dir + "/config.json");
  return Status::Ok();
}

StatusOr<ModelSpec> LoadHfConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return NotFound("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseHfConfig(ss.str(), path);
}

StatusOr<int64_t> EffectiveMaxSeqLen(const ModelSpec& spec, int64_t requested,
                                     const std::string& source) {
  if (requested <= 0) return spec.max_seq_len;
  if (requested > spec.max_seq_len) {
    return InvalidArgument("model.max_seq_len " + std::to_string(requested) +
                           " exceeds the model's max_position_embeddings " +
                           std::to_string(spec.max_seq_len) + " (" + source +
                           "); lower model.max_seq_len");
  }
  return requested;
}

Status CheckTensorParallel(const ModelSpec& spec, int size) {
  if (size < 1) {
    return InvalidArgument("tensor_parallel must be at least 1, got " + std::to_string(size));
  }
  if (size == 1) return Status::Ok();
  auto divides = [&](const char* field, int64_t value) -> Status {
    if (value % size == 0) return Status::Ok();
    return InvalidArgument("tensor_parallel " + std::to_string(size) + " does not divide model." +
                           field + " " + std::to_string(value) +
                           ": each rank computes an equal share of them (pick a tensor_parallel "
                           "that divides num_heads, num_kv_heads and intermediate_size)");
  };
  GYRE_RETURN_IF_ERROR(divides("num_heads", spec.num_heads));
  GYRE_RETURN_IF_ERROR(divides("num_kv_heads", spec.num_kv_heads));
  GYRE_RETURN_IF_ERROR(divides("intermediate_size", spec.intermediate_size));
  const int64_t chunk = (spec.vocab_size + size - 1) / size;
  if (chunk * (size - 1) >= spec.vocab_size) {
    return InvalidArgument("a vocabulary of " + std::to_string(spec.vocab_size) +
                           " tokens leaves a tensor-parallel rank of " + std::to_string(size) +
                           " without vocabulary rows (each holds ceil(V / T) = " +
                           std::to_string(chunk) + " rows, the last the rest)");
  }
  return Status::Ok();
}

}  // namespace gyre::model
