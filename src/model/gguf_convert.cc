#include "model/gguf_convert.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/gguf.h"
#include "model/hf_config.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "text/tokenizer_json.h"

namespace gyre::model {
namespace {

using nlohmann::json;

// The GGUF tensor behind a Hugging Face parameter name (llama layout), or "".
std::string GgufName(const std::string& hf) {
  static const std::map<std::string, std::string> kTop = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  if (auto it = kTop.find(hf); it != kTop.end()) return it->second;
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string prefix = "model.layers.";
  if (hf.compare(0, prefix.size(), prefix) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return "";
  auto it = kLayer.find(hf.substr(dot + 1));
  if (it == kLayer.end()) return "";
  return "blk." + hf.substr(prefix.size(), dot - prefix.size()) + "." + it->second;
}

// llama.cpp's converter reorders each head's rows of q_proj / k_proj from rotate-half pairs
// (i, i + d/2) to interleaved pairs (2i, 2i + 1); this undoes it. w: [heads * d, cols].
at::Tensor UnpermuteRope(const at::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1);
  return w.reshape({heads, rows / heads / 2, 2, cols}).transpose(1, 2).reshape({rows, cols});
}

StatusOr<ModelSpec> SpecOf(const GgufFile& f) {
  GYRE_ASSIGN_OR_RETURN(std::string arch, f.String("general.architecture"));
  if (arch != "llama") {
    return InvalidArgument(f.path() + ": general.architecture is '" + arch +
                           "'; gyre convert gguf reads llama-architecture files");
  }
  if (auto scaling = f.String("llama.rope.scaling.type"); scaling.ok() && *scaling != "none") {
    return InvalidArgument(f.path() + ": RoPE scaling '" + *scaling + "' is not supported");
  }
  ModelSpec s;
  s.architecture = "llama";
  auto u = [&](const char* key, int64_t* out) -> Status {
    GYRE_ASSIGN_OR_RETURN(uint64_t v, f.Uint(key));
    if (v == 0 || v > (1ull << 31))
      return InvalidArgument(f.path() + ": " + key + " = " + std::to_string(v));
    *out = static_cast<int64_t>(v);
    return Status::Ok();
  };
  GYRE_RETURN_IF_ERROR(u("llama.embedding_length", &s.hidden_size));
  GYRE_RETURN_IF_ERROR(u("llama.block_count", &s.num_layers));
  GYRE_RETURN_IF_ERROR(u("llama.attention.head_count", &s.num_heads));
  GYRE_RETURN_IF_ERROR(u("llama.feed_forward_length", &s.intermediate_size));
  GYRE_RETURN_IF_ERROR(u("llama.context_length", &s.max_seq_len));
  s.num_kv_heads = s.num_heads;
  if (f.metadata().count("llama.attention.head_count_kv")) {
    GYRE_RETURN_IF_ERROR(u("llama.attention.head_count_kv", &s.num_kv_heads));
  }
  if (s.hidden_size % s.num_heads != 0 || s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument(f.path() + ": " + std::to_string(s.num_heads) + " heads and " +
                           std::to_string(s.num_kv_heads) + " key/value heads do not divide a " +
                           std::to_string(s.hidden_size) + "-wide model");
  }
  s.head_dim = s.hidden_size / s.num_heads;
  if (f.metadata().count("llama.attention.key_length")) {
    GYRE_RETURN_IF_ERROR(u("llama.attention.key_length", &s.head_dim));
  }
  s.rope_theta = 10000.0;
  if (f.metadata().count("llama.rope.freq_base")) {
    GYRE_ASSIGN_OR_RETURN(s.rope_theta, f.Float("llama.rope.freq_base"));
  }
  GYRE_ASSIGN_OR_RETURN(s.rms_norm_eps, f.Float("llama.attention.layer_norm_rms_epsilon"));
  const GgufTensor* embed = f.Find("token_embd.weight");
  if (embed == nullptr || embed->dims.size() != 2) {
    return InvalidArgument(f.path() + ": no 2-D tensor token_embd.weight");
  }
  s.vocab_size = embed->dims[1];
  s.tie_embeddings = f.Find("output.weight") == nullptr;
  return s;
}

// tokenizer.json (byte-level BPE) and tokenizer_config.json from the tokenizer.ggml.* metadata.
Status WriteTokenizer(const GgufFile& f, const std::string& dir, int64_t* vocab) {
  GYRE_ASSIGN_OR_RETURN(std::string kind, f.String("tokenizer.ggml.model"));
  if (kind != "gpt2") {
    return InvalidArgument(f.path() + ": tokenizer.ggml.model is '" + kind +
                           "'; gyre convert gguf reads byte-level BPE (gpt2) tokenizers");
  }
  GYRE_ASSIGN_OR_RETURN(auto tokens, f.Strings("tokenizer.ggml.tokens"));
  GYRE_ASSIGN_OR_RETURN(auto merges, f.Strings("tokenizer.ggml.merges"));
  std::vector<int64_t> types(tokens.size(), 1);
  if (auto it = f.metadata().find("tokenizer.ggml.token_type"); it != f.metadata().end()) {
    if (it->second.items.size() != tokens.size()) {
      return InvalidArgument(f.path() + ": tokenizer.ggml.token_type has " +
                             std::to_string(it->second.items.size()) + " entries for " +
                             std::to_string(tokens.size()) + " tokens");
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      const GgufValue& v = it->second.items[i];
      types[i] = v.kind == GgufValue::Kind::kInt ? v.i : static_cast<int64_t>(v.u);
    }
  }
  std::string pre = "default";
  if (auto p = f.String("tokenizer.ggml.pre"); p.ok()) pre = *p;
  if (pre != "smollm" && pre != "default" && pre != "gpt2") {
    return InvalidArgument(f.path() + ": tokenizer.ggml.pre '" + pre +
                           "' is not supported (smollm, gpt2, default)");
  }
  std::vector<std::pair<std::string, int32_t>> ids;
  std::vector<text::AddedToken> added;
  for (size_t i = 0; i < tokens.size(); ++i) {
    ids.emplace_back(tokens[i], static_cast<int32_t>(i));
    // 3 = control, 4 = user-defined: matched whole before BPE.
    if (types[i] == 3 || types[i] == 4) {
      added.push_back({tokens[i], static_cast<int32_t>(i), types[i] == 3});
    }
  }
  const std::string t = text::ByteLevelBpeTokenizerJson(ids, merges, added, pre == "smollm");
  std::ofstream out(dir + "/tokenizer.json");
  out << t;
  if (!out) return Unavailable("cannot write " + dir + "/tokenizer.json");
  json cfg = {{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", 1 << 30}};
  auto token_of = [&](const char* key) -> std::string {
    auto id = f.Uint(key);
    return id.ok() && *id < tokens.size() ? tokens[*id] : std::string();
  };
  if (auto s = token_of("tokenizer.ggml.bos_token_id"); !s.empty()) cfg["bos_token"] = s;
  if (auto s = token_of("tokenizer.ggml.eos_token_id"); !s.empty()) cfg["eos_token"] = s;
  if (auto s = token_of("tokenizer.ggml.padding_token_id"); !s.empty()) cfg["pad_token"] = s;
  if (auto s = token_of("tokenizer.ggml.unknown_token_id"); !s.empty()) cfg["unk_token"] = s;
  if (auto tpl = f.String("tokenizer.chat_template"); tpl.ok()) cfg["chat_template"] = *tpl;
  std::ofstream cfg_out(dir + "/tokenizer_config.json");
  cfg_out << cfg.dump(2) << "\n";
  if (!cfg_out) return Unavailable("cannot write " + dir + "/tokenizer_config.json");
  *vocab = static_cast<int64_t>(tokens.size());
  return Status::Ok();
}

}  // namespace

StatusOr<GgufConversion> ConvertGgufToHf(const std::string& gguf_path, const std::string& out_dir) {
  GYRE_ASSIGN_OR_RETURN(auto file, GgufFile::Open(gguf_path));
  GgufConversion conv;
  GYRE_ASSIGN_OR_RETURN(conv.spec, SpecOf(*file));
  GYRE_RETURN_IF_ERROR(CheckModelSize(conv.spec, gguf_path));
  // Parameters shaped by the spec, filled tensor by tensor (uninitialised until then).
  auto model = Transformer::Create(conv.spec, 0, -1.0);
  const NamedTensors params = model->NamedParameters();
  std::map<std::string, int> types;
  at::NoGradGuard no_grad;
  std::vector<float> values;
  for (const auto& [name, param] : params) {
    const std::string gname = GgufName(name);
    const GgufTensor* t = gname.empty() ? nullptr : file->Find(gname);
    if (t == nullptr) {
      return InvalidArgument(gguf_path + ": no tensor " + (gname.empty() ? name : gname) +
                             " (for " + name + ")");
    }
    std::vector<int64_t> shape(t->dims.rbegin(), t->dims.rend());
    if (shape != param.sizes().vec()) {
      return InvalidArgument(gguf_path + ": tensor " + gname + " has " +
                             std::to_string(t->elements) +
                             " values in a shape that does not "
                             "match " +
                             name + "'s");
    }
    GYRE_RETURN_IF_ERROR(file->Dequantize(*t, &values));
    at::Tensor w = at::from_blob(values.data(), param.sizes(), at::kFloat);
    if (gname.find(".attn_q.") != std::string::npos) {
      w = UnpermuteRope(w, conv.spec.num_heads);
    } else if (gname.find(".attn_k.") != std::string::npos) {
      w = UnpermuteRope(w, conv.spec.num_kv_heads);
    }
    param.detach().copy_(w);
    ++types[GgmlTypeName(t->type)];
  }
  for (const auto& [type, n] : types) {
    conv.tensor_types += (conv.tensor_types.empty() ? "" : ", ") + type + " x" + std::to_string(n);
  }
  conv.parameters = model->NumParameters();
  GYRE_RETURN_IF_ERROR(MakeDirs(out_dir));
  json extra = json::object();
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    auto id = file->Uint(std::string("tokenizer.ggml.") + key);
    if (id.ok()) extra[key] = *id;
  }
  GYRE_RETURN_IF_ERROR(WriteTokenizer(*file, out_dir, &conv.vocab));
  GYRE_RETURN_IF_ERROR(SaveCheckpointWeights(out_dir, params));
  // config.json last: a directory without it is never taken for a model.
  GYRE_RETURN_IF_ERROR(WriteHfConfig(out_dir, conv.spec, extra.dump()));
  return conv;
}

}  // namespace gyre::model
