#pragma once
// Decode steps as CUDA graphs. A decode step runs the same kernels every time for a given batch
// shape; launching them one by one costs more host time than a small model's GPU time, so each
// shape is captured once (Transformer::ForwardDecode on fixed device tensors) and replayed with
// new contents. Shapes are bucketed: the rows are padded to the next power of two (up to
// max_batch) and the block-table width to the next power of two (up to max_blocks). Padding rows
// and unused table entries point at a scratch block of the cache that no sequence owns, so they
// never touch real keys and values.
//
// The graphs read the model's parameter tensors and the cache by address: weight updates that
// copy into the parameters (model::LoadFlatParameters) keep them valid; moving the model or
// reallocating the cache does not (make a new DecodeGraphs).
//
// Built with a CUDA-enabled libtorch only (Compiled() says so). Thread-safety: one thread at a
// time (the engine's).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gyre/status.h"
#include "model/transformer.h"

namespace gyre::rollout {

class DecodeGraphs {
 public:
  static bool Compiled();
  // `cache` lives on the model's CUDA device and has a block `scratch_block` that the engine
  // never hands to a sequence. `max_batch` >= 1 rows, `max_blocks` >= 1 table entries per row.
  static StatusOr<std::unique_ptr<DecodeGraphs>> Create(const model::Transformer* model,
                                                        model::PagedKvCache* cache,
                                                        int64_t scratch_block, int64_t max_batch,
                                                        int64_t max_blocks);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Whether a decode step of `rows` sequences whose widest block table has `blocks` entries
  // fits the captured range.
  bool Fits(int64_t rows, int64_t blocks) const;

  // One decode step: row i feeds tokens[i] at position positions[i], writes its key and value to
  // slots[i] and attends to the first context_lens[i] positions of its block table
  // (tables[i * width .. i * width + width)). Captures the padded shape on first use, then
  // replays it. Returns float32 logits [rows, V], valid until the next Run. A failed capture
  // (e.g. out of memory) returns its error and disables the graphs: Fits() is false from then on
  // and the caller runs the step eagerly.
  StatusOr<at::Tensor> Run(const std::vector<int64_t>& tokens,
                           const std::vector<int64_t>& positions, const std::vector<int64_t>& slots,
                           const std::vector<int64_t>& tables, int64_t width,
                           const std::vector<int64_t>& context_lens);

  int64_t captured() const;  // graphs captured so far
  int64_t replays() const;

 private:
  struct Impl;
  explicit DecodeGraphs(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre::rollout
