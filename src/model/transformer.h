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

// Paged key/value cache: per layer, k[l] and v[l] are pools [num_blocks, block_size, kv_heads,
// head_dim]. Which block holds which positions of which sequence is the caller's business (see
// rollout/block_allocator.h); the model only reads and writes the slots it is given, where slot
// s is row s % block_size of block s / block_size.
struct PagedKvCache {
  std::vector<at::Tensor> k;
  std::vector<at::Tensor> v;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
};

// One forward over the new tokens of several sequences, flattened sequence after sequence (no
// padding). Sequence i contributes query_lens[i] new tokens, which sit at the end of its
// context of context_lens[i] tokens (the earlier ones already in the cache).
struct PagedBatch {
  at::Tensor tokens;     // int64 [N]
  at::Tensor positions;  // int64 [N]: RoPE positions (the token's index in its sequence)
  at::Tensor slots;      // int64 [N]: cache slot that receives each new token's key and value
  std::vector<int64_t> query_lens;    // per sequence; sums to N
  std::vector<int64_t> context_lens;  // per sequence; >= query_lens[i]
  // int64 [num_sequences, max blocks]: each sequence's block table (context position p is in
  // block block_tables[i][p / block_size]); entries past its context must still be valid block
  // indices (0 will do) and are ignored.
  at::Tensor block_tables;
  // Rows of the N new tokens whose next-token logits are wanted, in the order returned.
  std::vector<int64_t> logit_rows;
};

// A decode step of B sequences (one new token each) in fixed-shape device tensors, so that the
// forward can be captured once as a CUDA graph and replayed with new contents
// (rollout/decode_graphs.h). Rows may be padding: give them a slot and table entries in a scratch
// block no sequence uses, and a mask with at least one true position.
struct DecodeBatch {
  at::Tensor tokens;     // int64 [B]
  at::Tensor positions;  // int64 [B]
  at::Tensor slots;      // int64 [B]
  at::Tensor tables;     // int64 [B, M]: block tables, padded with any valid block index
  at::Tensor mask;       // bool [B, 1, 1, M * block_size]: context position p of row b is
                         // attended iff mask[b, 0, 0, p] (true for p < context length)
};

// Training sequences packed end to end into the rows of a [rows, width] batch, so that no pad
// token is computed except at the end of a row. segments[r, c] names the sequence that position
// c of row r belongs to (padding at a row's end is a segment of its own); a token attends to the
// earlier tokens of its own segment only (block-diagonal causal attention), and its RoPE
// position is its index in its own sequence.
//
// Shared prompts (optional `trunks`): samples with the same prompt (a GRPO group) may share one
// copy of it. The prompt is then a segment of its own, followed in the same row by each sample's
// response tokens as further segments, positioned after the prompt; trunks[r, c] names the
// segment a token may attend to besides its own (the shared prompt for a response token, the
// token's own segment otherwise). So a token at column q attends to column k iff k <= q and
// segments[k] is segments[q] or trunks[q]: each sample sees exactly its own prompt and response,
// as when it is laid out alone.
struct PackedBatch {
  at::Tensor tokens;     // int64 [rows, width]
  at::Tensor positions;  // int64 [rows, width]
  at::Tensor segments;   // int64 [rows, width]
  at::Tensor trunks;     // int64 [rows, width], or undefined (= segments: nothing shared)
  // int64 [N]: flat indices (row * width + column) of the positions whose next-token logits are
  // wanted, in the order returned. The LM head runs on these positions only.
  at::Tensor logit_index;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Fully sharded training (trainer.shard: parameters, trainer/parameter_shards.h) holds no whole
// parameter between passes: the forward asks for one unit of parameters at a time, whole, just
// before it computes with them. Unit 0 is the embedding, unit 1 + i decoder layer i, and the last
// unit (1 + num_layers) the final norm and, when not tied, the LM head. A unit's parameters are
// listed in NamedParameters() order.
struct ParameterUnit {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  int64_t numel() const;
};
std::vector<ParameterUnit> ParameterUnits(const ModelSpec& spec);
// The units of tensor-parallel rank `rank` of `size`'s slices (tensor_parallel.h): the same
// names, each split parameter's shape cut to its slice; ParameterUnits for size 1. The spec must
// split over `size` (CheckTensorParallel).
std::vector<ParameterUnit> TensorParallelUnits(const ModelSpec& spec, int rank, int size);

// Supplies a forward's parameters unit by unit (Transformer::Gathered).
class ParameterGather {
 public:
  virtual ~ParameterGather() = default;
  // The whole parameters of `unit` (ParameterUnits order), in the compute dtype on the compute
  // device, differentiable into wherever they come from. Called just before the unit's forward;
  // with tied embeddings unit 0 is asked for again for the LM head, after the last unit. May
  // throw (a failed collective).
  virtual std::vector<at::Tensor> Acquire(int unit) = 0;
  // Unit `unit`'s forward is done. `output` is what it produced: when it requires grad, the
  // unit's parameters are needed again by its backward, which starts when the gradient of
  // `output` arrives; undefined when the backward needs none of them (the embedding lookup).
  // The last unit (and unit 0 acquired for the tied LM head) are not released by the forward:
  // the caller uses them after it returns.
  virtual void Release(int unit, const at::Tensor& output) = 0;
};

class TensorParallelGroup;  // tensor_parallel.h

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
  // The forward of a packed training batch (see PackedBatch): float32 logits [N, V] for the
  // positions in batch.logit_index. Each sequence's logits equal those Forward gives it alone
  // (up to floating-point summation order). Differentiable, like Forward.
  at::Tensor ForwardPacked(const PackedBatch& batch) const;
  // ForwardPacked up to the LM head: the final hidden states [N, H] (after the final norm, in
  // the model's dtype) at batch.logit_index, and the LM head weight [V, H] (the embedding when
  // tied), so that logits = hidden @ weight^T. For computing log-probs a chunk of tokens at a
  // time (ops::ChunkedTokenStats) without holding [N, V] logits.
  std::pair<at::Tensor, at::Tensor> ForwardPackedHidden(const PackedBatch& batch) const;

  // Activation checkpointing (trainer.activation_checkpointing): forwards with autograd on keep
  // only each decoder layer's input, and the backward runs each layer again to differentiate
  // it, so activation memory is one hidden state per layer instead of every intermediate, for
  // about one more forward of compute. Same values and gradients as without. Cast copies
  // (CastOf) inherit the setting. Generation (no autograd, or a KV cache) is unaffected.
  void SetActivationCheckpointing(bool on);
  bool activation_checkpointing() const;

  // ForwardPaged of float32 CPU batches of at least 16 rows runs feature-major with the fused
  // kernels of model/cpu_decode.h (on by default). Off: the general path of ATen ops, which
  // computes the same values up to float rounding (tests and benchmarks compare the two).
  void SetFeatureMajorDecode(bool on);

  // Allocates an empty cache for `batch` sequences of up to `capacity` positions.
  KvCache NewCache(int64_t batch, int64_t capacity) const;

  // Appends `tokens` [B, T] at cache slots [length, length + T). positions [B, T] are the RoPE
  // positions; valid [B, T] marks real tokens (false for left padding). Each query attends to
  // valid earlier slots and to itself. Returns logits [B, T, V] and advances cache->length.
  at::Tensor ForwardCached(const at::Tensor& tokens, const at::Tensor& positions,
                           const at::Tensor& valid, KvCache* cache) const;

  // A paged cache of `num_blocks` blocks of `block_size` positions, on the model's device and
  // dtype, zero-filled.
  PagedKvCache NewPagedCache(int64_t num_blocks, int64_t block_size) const;
  // Bytes of key + value cache one token position takes, over all layers.
  int64_t KvBytesPerToken() const;

  // Writes the keys/values of batch.tokens into their slots, then lets each new token attend to
  // its sequence's context (earlier slots and itself, causally). Returns float32 logits
  // [batch.logit_rows.size(), V]. Preconditions (checked): consistent sizes, slots inside the
  // cache; the caller guarantees that no two sequences write the same slot.
  at::Tensor ForwardPaged(const PagedBatch& batch, PagedKvCache* cache) const;
  // The decode-only case of ForwardPaged with every input prepared on the device: no host reads,
  // no shape that depends on the data, so it can be captured as a CUDA graph. Returns float32
  // logits [B, V], one row per batch row. For the real rows it computes what ForwardPaged does.
  at::Tensor ForwardDecode(const DecodeBatch& batch, PagedKvCache* cache) const;

  // Moves every parameter (and the RoPE table) to `device`; parameters stay leaf tensors that
  // require grad. Inputs to the forward passes must then live on the same device. Aliases from
  // an earlier NamedParameters() call keep pointing at the old tensors: call it again.
  void To(const at::Device& device);
  at::Device device() const;
  // Converts every parameter to `dtype` (float32, bfloat16 or float16) in place; they stay leaf
  // tensors with their requires_grad. The forward passes compute in the parameters' dtype
  // (RMSNorm statistics, RoPE tables and the returned logits in float32, as Hugging Face does);
  // caches made afterwards use it too. Aliases from NamedParameters() go stale, as with To.
  void ToDtype(at::ScalarType dtype);
  at::ScalarType dtype() const;
  // A model whose parameters are `src`'s cast to `dtype` through autograd: a forward of the copy
  // differentiates into `src`'s parameters (float32 master weights with bfloat16 compute). The
  // casts are made now, so make a new copy after `src` changes; it does not own `src`'s tensors
  // and must not outlive them in use.
  static std::unique_ptr<Transformer> CastOf(const Transformer& src, at::ScalarType dtype);

  // A model that owns no parameters: every forward takes them unit by unit from `gather` (not
  // owned; it must outlive the model's use), computing in `dtype` on `device`. Forward,
  // ForwardPacked and ForwardPackedHidden only (no caches). NamedParameters() is empty. With a
  // tensor-parallel group `tp` (not owned) of more than one rank, the units are that rank's
  // slices (TensorParallelUnits) and the forwards run as TensorParallelSlice's do.
  static std::unique_ptr<Transformer> Gathered(const ModelSpec& spec, ParameterGather* gather,
                                               at::ScalarType dtype, const at::Device& device,
                                               TensorParallelGroup* tp = nullptr);

  // Tensor parallelism (tensor_parallel.h): a model holding rank group->rank()'s slices of
  // `whole`'s parameters (copies, leaf tensors requiring grad, in `whole`'s dtype and device),
  // whose forwards run together with the other ranks' over `group` (not owned; it must outlive the
  // model's use). Every forward works; the logits they return, and the LM head weight of
  // ForwardPackedHidden, are this rank's vocabulary rows (vocabulary_range()), and the KV caches
  // it makes hold its key/value heads only (KvBytesPerToken likewise): the ranks run every
  // forward together, on the same inputs (slots, block tables). NamedParameters() lists the
  // slices under the whole parameters' names.
  // The spec must split over the group (CheckTensorParallel; aborts otherwise: check first).
  static std::unique_ptr<Transformer> TensorParallelSlice(const Transformer& whole,
                                                          TensorParallelGroup* group);
  // The group of a slice; null for a whole model.
  TensorParallelGroup* tensor_parallel() const;
  // The vocabulary rows [begin, end) of the logits this model returns ([0, V) unless a slice).
  std::pair<int64_t, int64_t> vocabulary_range() const;
  // A copy of `src` whose parameters are detached clones that require no grad (a frozen policy),
  // with src's layout (a tensor-parallel slice stays one, in the same group).
  static std::unique_ptr<Transformer> FrozenCopy(const Transformer& src);

  // Parameters in a fixed order with Hugging Face names (model.layers.0.self_attn.q_proj.weight).
  NamedTensors NamedParameters() const;
  int64_t NumParameters() const;

  struct Impl;  // opaque (named here for transformer.cc's own helpers)

 private:
  explicit Transformer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre::model
