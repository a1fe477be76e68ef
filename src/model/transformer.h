#pragma once
// Transformer: a decoder-only language model in the Llama/Qwen2 layout (RMSNorm, rotate-half
// RoPE, grouped-query attention, SwiGLU MLP, optional tied embeddings), written with ATen ops so
// autograd works for training and the same code runs generation with a KV cache.
//
// Not thread-safe: one thread drives a Transformer at a time. Parameters are owned tensors;
// NamedParameters() hands out aliases (in a fixed order) for the optimizer and weight transfer.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gyre/status.h"
#include "model/model_spec.h"

namespace gyre::model {

// Per-layer key/value cache for batched generation: k[l], v[l] are [B, kv_heads, capacity,
// head_dim]. Slots [0, length) are filled; `valid` [B, capacity] marks slots that real tokens
// (not left padding) occupy.
struct KvCache {
  std::vector<at::Tensor> k;
  std::vector<at::Tensor> v;
  at::Tensor valid;
  int64_t length = 0;
  int64_t capacity = 0;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// RoPE inverse frequencies [head_dim / 2] (float32), with the spec's scaling applied.
at::Tensor RopeInverseFrequencies(const ModelSpec& spec);

class Transformer {
 public:
  // Random init from `seed`: linear and embedding weights ~ N(0, init_std), norms = 1. A
  // negative init_std leaves those weights uninitialised (for a checkpoint to overwrite).
  static std::unique_ptr<Transformer> Create(const ModelSpec& spec, uint64_t seed, double init_std);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelSpec& spec() const;

  // Full causal forward without a cache. tokens: int64 [B, T] (right padding is harmless: real
  // tokens never attend to later positions). Returns float32 logits [B, T, V].
  at::Tensor Forward(const at::Tensor& tokens) const;

  // Allocates an empty cache for `batch` sequences of up to `capacity` positions.
  KvCache NewCache(int64_t batch, int64_t capacity) const;

  // Appends `tokens` [B, T] at cache slots [length, length + T). positions [B, T] are the RoPE
  // positions; valid [B, T] marks real tokens (false for left padding). Each query attends to
  // valid earlier slots and to itself. Returns logits [B, T, V] and advances cache->length.
  at::Tensor ForwardCached(const at::Tensor& tokens, const at::Tensor& positions,
                           const at::Tensor& valid, KvCache* cache) const;

  // Parameters in a fixed order with Hugging Face names (model.layers.0.self_attn.q_proj.weight).
  NamedTensors NamedParameters() const;
  int64_t NumParameters() const;

 private:
  struct Impl;
  explicit Transformer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre::model
