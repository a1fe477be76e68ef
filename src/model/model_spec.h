#pragma once
// ModelSpec: the shape of a decoder-only transformer in the Llama/Qwen2 layout. The names mirror
// Hugging Face config.json fields so real checkpoints slot in (see docs/models.md).

#include <cstdint>
#include <string>

#include "gyre/config.h"

namespace gyre::model {

struct ModelSpec {
  std::string architecture = "llama";  // llama | qwen2 (q/k/v bias) | qwen3 (q/k norm)
  int64_t vocab_size = 0;
  int64_t hidden_size = 128;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 32;
  int64_t intermediate_size = 384;
  int64_t max_seq_len = 64;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_embeddings = true;
  bool attention_bias = false;
  bool qk_norm = false;
  // RoPE scaling: "default" (none) or "llama3" (Llama 3.1 frequency-dependent scaling).
  std::string rope_type = "default";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
};

// The built-in spec of a job's model section, for a tokenizer of `vocab_size` tokens.
ModelSpec SpecFromConfig(const ModelSection& section, int64_t vocab_size);

}  // namespace gyre::model
