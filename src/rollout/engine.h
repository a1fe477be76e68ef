#pragma once
// Engine: batched autoregressive generation over a Transformer with a KV cache.
//
// Requests are packed into batches of up to `max_batch` sequences, left-padded to a common
// prompt length, prefilled once and decoded token by token until every sequence has hit a stop
// token or its max_new_tokens. Sampling goes through ops::SampleRows with a counter-based stream
// keyed by (request seed, response position), so a sample does not depend on its batch.
// This is the simple fixed-batch path (`gyre generate`, and the static-batching baseline of
// `gyre bench rollout`); rollout workers use RolloutEngine (rollout_engine.h): continuous
// batching over a paged KV cache.
//
// Not thread-safe: callers serialise Generate() with weight updates to the same model.

#include <cstdint>
#include <functional>
#include <vector>

#include "gyre/status.h"
#include "model/transformer.h"

namespace gyre::rollout {

enum class Finish { kStop, kLength, kAbort };

struct GenerationRequest {
  std::vector<int32_t> prompt;
  uint64_t seed = 0;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // includes the stop token when one ended the sequence
  std::vector<float> logprobs;  // log softmax(logits / T) over the full vocabulary
  std::vector<float> kept_mass;
  Finish finish = Finish::kLength;
};

class Engine {
 public:
  Engine(const model::Transformer* model, int64_t max_batch);

  // Fails (changing nothing) when a prompt is empty, holds an id outside the vocabulary, or
  // prompt + max_new_tokens exceeds the model's max_seq_len.
  // `on_token`, when set, is called on this thread for every generated token as it is sampled
  // (request index, token id): for streaming output.
  using TokenCallback = std::function<void(size_t request, int32_t token)>;
  StatusOr<std::vector<GenerationResult>> Generate(const std::vector<GenerationRequest>& requests,
                                                   const TokenCallback& on_token = nullptr);

 private:
  StatusOr<std::vector<GenerationResult>> GenerateBatch(const GenerationRequest* requests,
                                                        int64_t count, size_t first_index,
                                                        const TokenCallback& on_token);
  const model::Transformer* model_;
  int64_t max_batch_;
};

}  // namespace gyre::rollout
