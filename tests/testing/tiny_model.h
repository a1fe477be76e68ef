#pragma once
// Small model shapes for unit tests: fast on a CPU, still exercising grouped-query attention.

#include <cstdint>

#include "model/model_spec.h"

namespace gyre::testing {

// head_dim = hidden / heads; heads must be a multiple of kv_heads.
inline model::ModelSpec TinySpec(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads,
                                 int64_t kv_heads, int64_t intermediate, int64_t max_seq = 32) {
  model::ModelSpec s;
  s.vocab_size = vocab;
  s.hidden_size = hidden;
  s.num_layers = layers;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = hidden / heads;
  s.intermediate_size = intermediate;
  s.max_seq_len = max_seq;
  return s;
}

// A Qwen3-shaped TinySpec (hidden 32, 2 layers, 4 query and 2 key/value heads of 8, MLP 48):
// tied embeddings, q/k norms and attention biases, so that every kind of parameter a
// tensor-parallel slice splits or replicates is there.
inline model::ModelSpec TinyQwen3Spec(int64_t vocab, int64_t max_seq) {
  model::ModelSpec s = TinySpec(vocab, 32, 2, 4, 2, 48, max_seq);
  s.architecture = "qwen3";
  s.tie_embeddings = true;
  s.qk_norm = true;
  s.attention_bias = true;
  return s;
}

}  // namespace gyre::testing
