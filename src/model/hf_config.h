#pragma once
// Hugging Face config.json <-> ModelSpec, without libtorch (the controller uses it). Loading a
// whole model directory is model/hf_model.h.
//
// Supported: Llama (incl. rope_type llama3 scaling), Qwen2/Qwen2.5 (q/k/v biases), Qwen3
// (per-head q/k RMSNorm, explicit head_dim). Honoured fields: vocab_size, hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
// max_position_embeddings, rope_theta, rope_scaling / rope_parameters (both spellings),
// rms_norm_eps, tie_word_embeddings, attention_bias, hidden_act. Anything else that would change
// the numerics (another rope type, sliding windows, another activation) is rejected with a
// message naming the field.

#include <cstdint>
#include <string>

#include "gyre/status.h"
#include "model/model_spec.h"

namespace gyre::model {

// Parses and checks config.json text: every size positive, eps and RoPE factors positive and
// finite. Errors name `source` and the field. (LoadHfModel also checks the model's size against
// this machine's memory before it allocates anything.)
StatusOr<ModelSpec> ParseHfConfig(const std::string& json_text, const std::string& source);
StatusOr<ModelSpec> LoadHfConfig(const std::string& dir);

// The number of parameters a model of `spec` has (embeddings, layers, final norm, lm_head when
// untied), as a double so that no config can overflow it.
double EstimateParameterCount(const ModelSpec& spec);

// Refuses a model whose float32 parameters would exceed `limit_bytes` (0 = this machine's
// physical memory), naming `source` and the sizes that make it that large.
Status CheckModelSize(const ModelSpec& spec, const std::string& source, double limit_bytes = 0);

// Writes `dir`/config.json for `spec` with the fields transformers reads for its architecture
// (LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM). `extra` fields (bos/eos ids) are
// merged in.
Status WriteHfConfig(const std::string& dir, const ModelSpec& spec,
                     const std::string& extra_json = "{}");

// The sequence-length limit a job with model.max_seq_len = `requested` gets from a model whose
// config.json (`source`) allows `spec.max_seq_len` positions: `requested`, or an error when it is
// larger.
StatusOr<int64_t> EffectiveMaxSeqLen(const ModelSpec& spec, int64_t requested,
                                     const std::string& source);

// Whether `spec` splits over `size` tensor-parallel ranks (model/tensor_parallel.h): `size`
// divides num_heads, num_kv_heads and intermediate_size, and every rank gets at least one
// vocabulary row (ceil(V / size) rows each, the last the rest). The error names the field, the
// values and the rule.
Status CheckTensorParallel(const ModelSpec& spec, int size);

}  // namespace gyre::model
