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

}  // namespace gyre::testing
