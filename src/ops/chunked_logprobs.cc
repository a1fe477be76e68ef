// ChunkedTokenStats: token log-probs and entropies from the LM head's input, a chunk of tokens
// at a time, with a hand-written backward that recomputes each chunk's logits (as the fused CUDA
// kernel does for the log-softmax, here on any device with ATen ops).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "ops/ops.h"

namespace gyre::ops {

namespace {

// One chunk's logits [n, V] in float32, divided by the temperature.
at::Tensor ChunkLogits(const at::Tensor& h, const at::Tensor& w, double temperature) {
  at::Tensor z = at::linear(h, w).to(at::kFloat);
  return temperature != 1.0 ? z / temperature : z;
}

class ChunkedStatsFunction : public torch::autograd::Function<ChunkedStatsFunction> {
 public:
  // Returns {logp [N], entropy [N], argmax_ok [N]}.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, double temperature,
                                                int64_t chunk, bool logp_only) {
    const int64_t N = hidden.size(0);
    const auto fopts = hidden.options().dtype(at::kFloat);
    const int64_t stats = logp_only ? 0 : N;  // entropy and argmax_ok rows
    at::Tensor logp = at::empty({N}, fopts), entropy = at::empty({stats}, fopts);
    at::Tensor ok = at::empty({stats}, fopts);
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor z = ChunkLogits(hidden.narrow(0, s, n), weight, temperature);
      const at::Tensor lsm = at::log_softmax(z, -1);
      const at::Tensor y = targets.narrow(0, s, n);
      logp.narrow(0, s, n).copy_(lsm.gather(-1, y.unsqueeze(-1)).squeeze(-1));
      if (logp_only) continue;
      entropy.narrow(0, s, n).copy_(-(lsm.exp() * lsm).sum(-1));
      ok.narrow(0, s, n).copy_((z.argmax(-1) == y).to(at::kFloat));
    }
    ctx->save_for_backward({hidden, weight, targets, entropy});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->mark_non_differentiable({ok});
    return {logp, entropy, ok};
  }

  // With p = softmax(z) and z = hidden weight^T / T: d logp_y / dz = onehot(y) - p, and
  // d entropy / dz_j = -p_j (log p_j + entropy); then dz / T flows into both matmul operands.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2];
    const at::Tensor& entropy = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor& g_logp = grads[0];
    const at::Tensor& g_ent = grads[1];
    const int64_t N = hidden.size(0);
    at::Tensor grad_h = at::empty_like(hidden);
    at::Tensor grad_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor h = hidden.narrow(0, s, n);
      const at::Tensor lsm = at::log_softmax(ChunkLogits(h, weight, temperature), -1);
      const at::Tensor p = lsm.exp();
      at::Tensor dz = at::zeros_like(p);
      if (g_logp.defined()) {
        const at::Tensor g = g_logp.narrow(0, s, n).unsqueeze(-1);
        dz = dz - g * p;
        dz.scatter_add_(-1, targets.narrow(0, s, n).unsqueeze(-1), g);
      }
      if (g_ent.defined() && entropy.numel() > 0) {
        const at::Tensor g = g_ent.narrow(0, s, n).unsqueeze(-1);
        dz = dz - g * p * (lsm + entropy.narrow(0, s, n).unsqueeze(-1));
      }
      if (temperature != 1.0) dz = dz / temperature;
      const at::Tensor dzc = dz.to(weight.scalar_type());
      grad_h.narrow(0, s, n).copy_(at::mm(dzc, weight));
      grad_w.add_(at::mm(dzc.t(), h).to(at::kFloat));
    }
    return {grad_h,      grad_w.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

TokenStats ChunkedTokenStats(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets, double temperature, int64_t chunk_tokens,
                             bool logp_only) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
                  targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "ChunkedTokenStats: hidden [N, H], weight [V, H] and targets [N] expected");
  const double t = temperature > 0 ? temperature : 1.0;
  auto out = ChunkedStatsFunction::apply(hidden, weight, targets.to(at::kLong), t,
                                         std::max<int64_t>(1, chunk_tokens), logp_only);
  return {out[0], out[1], out[2]};
}

}  // namespace gyre::ops
