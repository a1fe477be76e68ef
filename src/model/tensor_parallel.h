#pragma once
// Tensor parallelism (trainer.tensor_parallel; docs/distributed.md "Tensor parallelism"), in the
// Megatron layout: T ranks each hold a slice of every decoder layer and of the vocabulary, and
// compute one forward together, exchanging activations.
//
// Who holds what (rank r of T):
//   q_proj (weight, bias)       rows of query heads [r nh/T, (r+1) nh/T)        (column parallel)
//   k_proj, v_proj              rows of key/value heads [r nkv/T, (r+1) nkv/T)  (column parallel)
//   o_proj                      the matching columns                             (row parallel)
//   gate_proj, up_proj          rows [r I/T, (r+1) I/T)                          (column parallel)
//   down_proj                   the matching columns                             (row parallel)
//   embed_tokens, lm_head       vocabulary rows [r c, min(V, (r+1) c)), c = ceil(V / T)
//   the norms (q/k norms too)   whole on every rank
// T must divide num_heads, num_kv_heads (key/value heads are not replicated) and
// intermediate_size, and every rank must own at least one vocabulary row (CheckTensorParallel).
//
// The forward of a slice (model::Transformer::TensorParallelSlice) keeps the hidden state [.., H]
// whole on every rank. Entering a column-parallel block it passes through TensorParallelCopy
// (identity forward; the backward sums the gradient over the ranks, since every rank's slice
// contributed part of it); a row-parallel block's partial output goes through
// TensorParallelReduce (sum over the ranks forward; identity backward). The embedding looks up the
// tokens of the rank's vocabulary rows (zero for the others) and reduces. The LM head gives each
// rank the logits of its vocabulary rows only, [N, V_r]: VocabParallelTokenStats computes
// log-probs, entropies and the argmax over the whole vocabulary from those, exchanging [N]-sized
// values, so no rank ever holds a [tokens, vocabulary] tensor. Replicated weights used inside a
// rank's slice (q/k norms) enter through TensorParallelCopy too, so every rank ends with their
// whole gradient; the other replicated weights see the same whole gradient on every rank by
// construction.
//
// Every rank must run the same passes: collectives run in the forward and in the backward (on the
// thread autograd uses: the caller's, for CPU tensors), in the same order on every rank.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

#include "gyre/status.h"
#include "model/hf_config.h"
#include "model/model_spec.h"

namespace gyre::model {

// The collectives a tensor-parallel forward needs. Implemented over a comm::Communicator by the
// trainer (trainer/policy_trainer.cc). Calls throw std::runtime_error when the collective fails
// (a peer left, a deadline passed): they run inside autograd, which has no other way out; the
// trainer turns that into a Status.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place, element-wise sum over the ranks of a contiguous tensor.
  virtual void AllReduceSum(at::Tensor& t) = 0;
  // [size, ...t's shape]: every rank's `t` (contiguous, the same shape on every rank), by rank.
  virtual at::Tensor AllGather(const at::Tensor& t) = 0;
  // In place: every rank's `t` (contiguous, any dtype, the same shape on every rank) becomes
  // rank `root`'s. `timeout_s` > 0 replaces the group's deadline for this call (a rollout
  // rank waiting for its leader's next step may wait long).
  virtual void Broadcast(at::Tensor& t, int root, double timeout_s = 0) = 0;
  // Rank `root`'s `parts` (contiguous, [size, ...out's shape], out's dtype) is cut along its first
  // dimension: every rank's `out` (contiguous, any dtype), the root's included, becomes part
  // rank(). Only the root reads `parts`; the others may pass an undefined tensor.
  virtual void Scatter(const at::Tensor& parts, at::Tensor& out, int root) = 0;
  // Seconds spent in the calls above so far (the compute waits for each: none is hidden).
  virtual double seconds() const { return 0; }
  // Bytes this rank has received so far in Broadcast and Scatter calls that another rank rooted.
  virtual uint64_t received_bytes() const { return 0; }
};

// Which dimension of a parameter (by its Hugging Face name) tensor parallelism splits: 0 (rows), 1
// (columns) or -1 (replicated).
int TensorParallelDim(const std::string& name);
// Whether dimension TensorParallelDim(name) of extent `extent` splits over `size` ranks: always
// for a replicated parameter and for the vocabulary (whose last ranks may hold fewer rows), else
// when `size` divides `extent`. TensorParallelRange requires it.
bool TensorParallelSplits(const std::string& name, int64_t extent, int size);
// The range [begin, end) of dimension TensorParallelDim(name), of extent `extent`, that rank
// `rank` of `size` holds ({0, extent} for a replicated parameter).
std::pair<int64_t, int64_t> TensorParallelRange(const std::string& name, int64_t extent, int rank,
                                                int size);
// Rank `rank`'s slice of the whole parameter `whole` named `name` (a view).
at::Tensor TensorParallelSliceOf(const std::string& name, const at::Tensor& whole, int rank,
                                 int size);
// (Whether a spec splits over T ranks: CheckTensorParallel, model/hf_config.h, torch-free.)

// Every rank of `group` says whether it succeeded (a collective); the ranks that did not, as
// "1, 3", or "" when all did.
std::string TensorParallelRanksNotOk(TensorParallelGroup* group, bool ok);

// The two exchanges of a tensor-parallel forward (see above), differentiable. With a null group
// both return x.
at::Tensor TensorParallelCopy(const at::Tensor& x, TensorParallelGroup* group);
at::Tensor TensorParallelReduce(const at::Tensor& x, TensorParallelGroup* group);

// Per-token statistics of `targets` [N] (int64, whole-vocabulary ids) from this rank's logits
// [N, V_r] of vocabulary rows [vocab_begin, vocab_begin + V_r) (float32), divided by temperature,
// over the whole vocabulary of every rank of `group`: logp and entropy (float32 [N], replicated on
// every rank, differentiable into `logits`), argmax_ok (1 where the most likely token over the
// whole vocabulary, the first on a tie, is the target; not differentiable). logp_only: entropy and
// argmax_ok are left undefined.
struct VocabParallelStats {
  at::Tensor logp, entropy, argmax_ok;
  // log sum_j exp(z_j) over the whole vocabulary, z = logits / temperature (float32 [N], not
  // differentiable): log softmax(z)_j = z_j - log_normalizer.
  at::Tensor log_normalizer;
};
VocabParallelStats VocabParallelTokenStats(const at::Tensor& logits, int64_t vocab_begin,
                                           const at::Tensor& targets, double temperature,
                                           TensorParallelGroup* group, bool logp_only = false);

// VocabParallelTokenStats of the logits hidden [N, H] @ weight [V_r, H]^T (the LM head's input,
// as ForwardPackedHidden of a slice returns it, and this rank's rows of its weight), computed
// `chunk_tokens` tokens at a time: no rank holds more than [chunk_tokens, V_r] logits, forward
// or backward (which recomputes each chunk's logits and needs no collective: the forward keeps
// each token's log-normalizer). logp and entropy are differentiable with respect to hidden (this
// rank's part of its gradient: the ranks' parts are summed by the TensorParallelCopy the hidden
// state went through) and weight. Equal to the unchunked statistics up to float rounding.
VocabParallelStats VocabParallelChunkedTokenStats(const at::Tensor& hidden,
                                                  const at::Tensor& weight, int64_t vocab_begin,
                                                  const at::Tensor& targets, double temperature,
                                                  int64_t chunk_tokens, TensorParallelGroup* group,
                                                  bool logp_only = false);

}  // namespace gyre::model
