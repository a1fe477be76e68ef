// Float32 CPU kernels of the paged engine's forward (Transformer::ForwardPaged).
//
// At a few dozen rows per step, a decoder layer's non-matmul work is dozens of tiny ATen calls
// (norms, RoPE, transposes, cache writes) plus attention over gathered copies of every
// sequence's context. These kernels do that work in a few passes over plain arrays, on ATen's
// intra-op thread pool, with the same arithmetic as the ATen ops they replace (only the order
// of some float sums differs). The engine's CPU forward keeps its activations feature-major
// ([features, rows]) so that the matmuls compute W x^T without transposes (transformer.cc).
// No libtorch in this header.
#pragma once

#include <cstdint>

namespace gyre::model {

struct PagedDecodeAttentionArgs {
  // Sequence i reads its query from row rows[i] of q and writes row rows[i] of out; a row is
  // [num_heads, head_dim] (head h attends with key/value head h / (num_heads / kv_heads)).
  const int64_t* rows = nullptr;  // [D]
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  const float* k_blocks = nullptr;  // [num_blocks, block_size, kv_heads, head_dim]
  const float* v_blocks = nullptr;  // same shape
  const int64_t* tables = nullptr;  // [D, table_stride]: block ids of each sequence
  int64_t table_stride = 0;
  const int64_t* lens = nullptr;  // [D]: context length of each sequence (>= 1)
  float* out = nullptr;           // rows of num_heads * head_dim floats, contiguous
  int64_t num_seqs = 0, num_heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
};

// softmax(q k^T * scale) v over each sequence's first lens[i] cached positions, for one new
// query token per sequence, read in place from the paged cache: each cached key and value is
// read once for all the query heads that share it. One task per sequence.
void PagedDecodeAttention(const PagedDecodeAttentionArgs& a);

// RMS norm of each column of a feature-major x [features, cols] (row-major storage):
// out[f][c] = (x[f][c] * rsqrt(mean_f(x[f][c]^2) + eps)) * w[f], as Hugging Face computes it
// in float32. out may not alias x.
void RmsNormColumns(const float* x, const float* w, int64_t features, int64_t cols, double eps,
                    float* out);

struct RopeStoreArgs {
  // The fused q/k/v projection, feature-major: [(num_heads + 2 * kv_heads) * head_dim, cols],
  // q features first, then k, then v (row-major storage).
  const float* qkv = nullptr;
  int64_t cols = 0;
  int64_t num_heads = 0, kv_heads = 0, head_dim = 0;
  const float* q_bias = nullptr;  // [num_heads * head_dim] or null
  const float* k_bias = nullptr;  // [kv_heads * head_dim] or null
  const float* v_bias = nullptr;  // [kv_heads * head_dim] or null
  const float* q_norm = nullptr;  // [head_dim] per-head RMS norm weight (Qwen3) or null
  const float* k_norm = nullptr;
  double eps = 1e-6;
  const float* cos = nullptr;      // [cols, head_dim]: each column's RoPE cos and sin, halves
  const float* sin = nullptr;      // repeated (cat(freqs, freqs) as Hugging Face builds them)
  const int64_t* slots = nullptr;  // [cols]: cache slot of each column's key and value
  float* q_out = nullptr;          // [cols, num_heads * head_dim], row-major
  float* k_cache = nullptr;        // [slots, kv_heads, head_dim]
  float* v_cache = nullptr;
};

// For every column (token): adds the biases, applies the per-head q/k norms and rotary
// embedding (x * cos + rotate_half(x) * sin), writes the query row to q_out and the key and
// value into their cache slot.
void RopeStore(const RopeStoreArgs& a);

}  // namespace gyre::model
