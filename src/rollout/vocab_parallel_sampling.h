#pragma once
// Sampling from vocabulary-parallel logits (rollout.tensor_parallel; docs/rollout.md, "Tensor
// parallelism"): each of T ranks holds the logits of its vocabulary rows only, [rows, V_r], and
// together they draw what kernels::SampleRowsRef draws from the whole rows, without any rank
// holding a [rows, V] tensor. Every exchange is [rows]-sized (top-k: [rows, k]):
//   1. the row maximum and its token (all-gather; ties go to the lowest id, as in the reference);
//   2. S = sum of exp((logit - max) / T) (all-reduce), so p_i = exp(d_i) / S as in the reference,
//      and the largest probability is 1 / S;
//   3. top-k: each rank's k largest probabilities are gathered and the k-th largest of them all
//      is the threshold;
//   4. top-p: the boundary probability is found by bisection over float values v: the largest v
//      with mass(p >= v among survivors) >= top_p * survivor mass, each step one all-reduce of
//      every row's local mass (sorted once per rank, so a step costs O(log V_r) a row);
//   5. min-p is local (p_max = 1 / S is known everywhere);
//   6. the draw: u * kept mass, each rank walks its kept tokens in ascending id order starting
//      from the kept mass of the ranks before it, and the lowest rank whose walk crosses the
//      target owns the token (the log-prob comes from that rank's logit).
// Every rank returns the same tokens, log-probs and kept masses. They equal SampleRowsRef's on
// the gathered rows up to the order of double-precision summation (per rank, then over ranks,
// instead of one pass over the vocabulary): a token can differ only when a draw or a top-p
// boundary falls within that rounding of a cumulative mass.
//
// Every rank must call with the same params and row count, in the same order (collectives).
// Collective failures throw std::runtime_error (TensorParallelGroup's convention).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/reference/sampling_ref.h"
#include "model/tensor_parallel.h"
#include "ops/ops.h"

namespace gyre::rollout {

// logits: float32 [rows, V_r] of vocabulary ids [vocab_begin, vocab_begin + V_r), any device
// (read on the host); vocab: the whole vocabulary size (V_r may be 0 only if no rank is empty:
// CheckTensorParallel guarantees every rank at least one row).
ops::SampleOutput VocabParallelSampleRows(const at::Tensor& logits, int64_t vocab_begin,
                                          int64_t vocab,
                                          const std::vector<kernels::SamplingRowParams>& params,
                                          model::TensorParallelGroup* group);

}  // namespace gyre::rollout
