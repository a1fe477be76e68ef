#pragma once
// Hugging Face checkpoints: config.json -> ModelSpec, and a directory -> a loaded Transformer.
//
// Supported: Llama (incl. rope_type llama3 scaling), Qwen2/Qwen2.5 (q/k/v biases), Qwen3
// (per-head q/k RMSNorm, explicit head_dim). Honoured fields: vocab_size, hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
// max_position_embeddings, rope_theta, rope_scaling / rope_parameters (both spellings),
// rms_norm_eps, tie_word_embeddings, attention_bias, hidden_act. Anything else that would change
// the numerics (another rope type, sliding windows, another activation) is rejected with a
// message naming the field.

#include <memory>
#include <string>

#include "gyre/status.h"
#include "model/model_spec.h"
#include "model/transformer.h"

namespace gyre::model {

StatusOr<ModelSpec> ParseHfConfig(const std::string& json_text, const std::string& source);
StatusOr<ModelSpec> LoadHfConfig(const std::string& dir);

// Writes `dir`/config.json for `spec` with the fields transformers reads for its architecture
// (LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM). `extra` fields (bos/eos ids) are
// merged in.
Status WriteHfConfig(const std::string& dir, const ModelSpec& spec,
                     const std::string& extra_json = "{}");

// config.json + model.safetensors (or a sharded index) in `dir` -> a float32 Transformer.
StatusOr<std::unique_ptr<Transformer>> LoadHfModel(const std::string& dir);

}  // namespace gyre::model
