#include "rollout/engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "ops/ops.h"

namespace gyre::rollout {

Engine::Engine(const model::Transformer* model, int64_t max_batch)
    : model_(model), max_batch_(std::max<int64_t>(1, max_batch)) {}

StatusOr<std::vector<GenerationResult>> Engine::Generate(
    const std::vector<GenerationRequest>& requests, const TokenCallback& on_token) {
  const auto& spec = model_->spec();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) return InvalidArgument("request " + std::to_string(i) + ": empty prompt");
    for (int32_t id : r.prompt) {
      if (id < 0 || id >= spec.vocab_size) {
        return InvalidArgument("request " + std::to_string(i) + ": token id " + std::to_string(id) +
                               " outside the vocabulary of " + std::to_string(spec.vocab_size));
      }
    }
    if (r.max_new_tokens < 1) {
      return InvalidArgument("request " + std::to_string(i) + ": max_new_tokens must be >= 1");
    }
    if (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens > spec.max_seq_len) {
      return InvalidArgument("request " + std::to_string(i) + ": prompt of " +
                             std::to_string(r.prompt.size()) + " tokens + max_new_tokens " +
                             std::to_string(r.max_new_tokens) + " exceeds max_seq_len " +
                             std::to_string(spec.max_seq_len));
    }
  }
  std::vector<GenerationResult> out;
  out.reserve(requests.size());
  for (size_t start = 0; start < requests.size(); start += max_batch_) {
    int64_t n = std::min<int64_t>(max_batch_, static_cast<int64_t>(requests.size() - start));
    GYRE_ASSIGN_OR_RETURN(auto part, GenerateBatch(requests.data() + start, n, start, on_token));
    for (auto& r : part) out.push_back(std::move(r));
  }
  return out;
}

StatusOr<std::vector<GenerationResult>> Engine::GenerateBatch(const GenerationRequest* reqs,
                                                              int64_t B, size_t first_index,
                                                              const TokenCallback& on_token) {
  c10::InferenceMode guard;
  int64_t P = 0, max_new = 0;
  for (int64_t b = 0; b < B; ++b) {
    P = std::max<int64_t>(P, static_cast<int64_t>(reqs[b].prompt.size()));
    max_new = std::max<int64_t>(max_new, reqs[b].max_new_tokens);
  }
  auto lopt = at::TensorOptions().dtype(at::kLong);
  at::Tensor tokens = at::zeros({B, P}, lopt);
  at::Tensor positions = at::zeros({B, P}, lopt);
  at::Tensor valid = at::zeros({B, P}, at::TensorOptions().dtype(at::kBool));
  auto tok_a = tokens.accessor<int64_t, 2>();
  auto pos_a = positions.accessor<int64_t, 2>();
  auto val_a = valid.accessor<bool, 2>();
  std::vector<int64_t> next_pos(B);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = reqs[b].prompt;
    const int64_t pad = P - static_cast<int64_t>(p.size());
    for (int64_t t = 0; t < P; ++t) {
      if (t >= pad) {
        tok_a[b][t] = p[t - pad];
        pos_a[b][t] = t - pad;
        val_a[b][t] = true;
      }
    }
    next_pos[b] = static_cast<int64_t>(p.size());
  }
  const at::Device device = model_->device();
  model::KvCache cache = model_->NewCache(B, P + max_new);
  at::Tensor logits =
      model_->ForwardCached(tokens.to(device), positions.to(device), valid.to(device), &cache)
          .select(1, P - 1);

  std::vector<GenerationResult> results(B);
  std::vector<bool> done(B, false);
  std::vector<kernels::SamplingRowParams> params(B);
  for (int64_t step = 0; step < max_new; ++step) {
    for (int64_t b = 0; b < B; ++b) {
      const auto& r = reqs[b];
      params[b] = {r.temperature, r.top_k, r.top_p, r.min_p, r.seed, static_cast<uint64_t>(step)};
    }
    GYRE_ASSIGN_OR_RETURN(ops::SampleOutput s, ops::SampleRows(logits, params));
    bool all_done = true;
    at::Tensor next = at::zeros({B, 1}, lopt);
    at::Tensor next_positions = at::zeros({B, 1}, lopt);
    auto next_a = next.accessor<int64_t, 2>();
    auto npos_a = next_positions.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      next_a[b][0] = s.tokens[b];
      npos_a[b][0] = next_pos[b]++;
      if (done[b]) continue;
      auto& res = results[b];
      res.tokens.push_back(s.tokens[b]);
      if (on_token) on_token(first_index + static_cast<size_t>(b), s.tokens[b]);
      res.logprobs.push_back(s.logprobs[b]);
      res.kept_mass.push_back(s.kept_mass[b]);
      const auto& stops = reqs[b].stop_token_ids;
      if (std::find(stops.begin(), stops.end(), s.tokens[b]) != stops.end()) {
        res.finish = Finish::kStop;
        done[b] = true;
      } else if (static_cast<int64_t>(res.tokens.size()) >= reqs[b].max_new_tokens) {
        res.finish = Finish::kLength;
        done[b] = true;
      }
      all_done = all_done && done[b];
    }
    if (all_done || step + 1 == max_new) break;
    at::Tensor ones = at::ones({B, 1}, at::TensorOptions().dtype(at::kBool).device(device));
    logits = model_->ForwardCached(next.to(device), next_positions.to(device), ones, &cache)
                 .select(1, 0);
  }
  return results;
}

}  // namespace gyre::rollout
