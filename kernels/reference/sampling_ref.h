// CPU reference for Gyre's token sampler: plain loops over one row of logits at a time.
//
// This is the definition of what a sampled token, its logprob and its kept mass mean
// (docs/design.md, "Sampling"); the CUDA sampler is tested against it. Thread-safe: the
// functions keep no state between calls.
//
// Exact semantics, per row (float32 math unless noted; sums are accumulated in double in
// ascending token-id order, so results are deterministic):
//  - Logit cleaning: NaN is treated as -inf; +inf is treated as FLT_MAX (so tokens at +inf share
//    the mass equally, the limit of a very large logit). A -inf token has probability 0 and is
//    never drawn.
//  - Greedy when temperature <= 0 or NaN (configs only allow 0; anything else is treated the same
//    rather than inverting the distribution): token = argmax of the logits, ties -> lowest id;
//    logprob = log_softmax(logits)[token] with T = 1; kept_mass = 1.
//  - Otherwise, with m = max logit: d_i = (logit_i - m) / T, e_i = expf(d_i), S = sum_i e_i
//    (double), p_i = float(e_i / S). This is softmax(logits / T) computed so that a tiny T cannot
//    overflow logits / T to inf.
//  - Truncation, in this order, each step acting on the survivors of the previous one:
//      top-k  (0 < top_k < V): keep p_i >= the k-th largest p over the vocabulary; ties kept.
//      top-p  (top_p < 1): on the distribution renormalised after top-k (as vLLM and FlashInfer
//             do), keep the smallest set of highest-prob survivors whose mass >= top_p, i.e.
//             walking survivors by descending p, the boundary is the first p at which the running
//             mass reaches top_p * (mass kept by top-k); every survivor with p >= that boundary
//             is kept (ties kept). top_p <= 0 keeps only the top token (and its ties).
//      min-p  (min_p > 0): keep p_i >= min(min_p, 1) * max_j p_j.
//    The top token always survives. Tokens with p_i == 0 (e.g. -inf logits, or underflow) are
//    never kept.
//  - Draw: u = PhiloxUniform(seed, position) in [0, 1). Walking kept tokens in ascending id order
//    with running mass c (double), pick the first token with c > u * kept_mass; if rounding lets
//    the walk finish without a pick, take the last kept token.
//  - Outputs: token; logprob = log_softmax(logits / T)[token] over the FULL vocabulary (the value
//    the trainer recomputes at the same temperature), computed as d_token - log(S) in double;
//    kept_mass = float(sum of p_i over kept tokens).
//  - Degenerate row (every logit -inf or NaN), greedy or not: token 0, logprob -inf,
//    kept_mass 0, so callers can detect it.
#pragma once

#include <cstdint>

namespace gyre::kernels {

// Per-row sampling parameters. `seed` and `position` (the token's index in its sequence) select
// the row's random draw; nothing else does.
struct SamplingRowParams {
  float temperature;  // <= 0 (or NaN): greedy
  int32_t top_k;      // <= 0 or >= vocab: off
  float top_p;        // >= 1: off
  float min_p;        // <= 0: off
  uint64_t seed;
  uint64_t position;
};

// Samples one token per row of `logits` ([rows, vocab], row-major).
// Preconditions: vocab >= 1; `params`, `out_tokens`, `out_logprobs`, `out_kept_mass` each hold
// `rows` elements. Postconditions: out_tokens[r] in [0, vocab); see the header comment for the
// meaning of every output.
void SampleRowsRef(const float* logits, int64_t rows, int64_t vocab,
                   const SamplingRowParams* params, int32_t* out_tokens, float* out_logprobs,
                   float* out_kept_mass);

// log_softmax(logits / temperature)[token] over the whole row, with the same logit cleaning and
// arithmetic as SampleRowsRef; temperature <= 0 is treated as 1 (the greedy convention).
// Returns -inf for a degenerate row and NaN when token is outside [0, vocab).
float LogSoftmaxAt(const float* logits, int64_t vocab, float temperature, int32_t token);

}  // namespace gyre::kernels
