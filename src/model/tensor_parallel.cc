#include "model/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>

#include "common/check.h"

namespace gyre::model {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsVocabulary(const std::string& name) {
  return name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

// Identity forward, gradient summed over the ranks (Megatron's "f").
class CopyToRanks : public torch::autograd::Function<CopyToRanks> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            TensorParallelGroup* group) {
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<TensorParallelGroup*>(
        static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
    at::Tensor g = grads[0].contiguous().clone();
    group->AllReduceSum(g);
    return {g, at::Tensor()};
  }
};

// Sum over the ranks forward, identity backward (Megatron's "g").
class ReduceFromRanks : public torch::autograd::Function<ReduceFromRanks> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x,
                            TensorParallelGroup* group) {
    at::Tensor out = x.contiguous().clone();
    group->AllReduceSum(out);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

int TensorParallelDim(const std::string& name) {
  if (IsVocabulary(name)) return 0;
  for (const char* rows :
       {"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
        "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
        "mlp.gate_proj.weight", "mlp.up_proj.weight"}) {
    if (EndsWith(name, rows)) return 0;
  }
  if (EndsWith(name, "self_attn.o_proj.weight") || EndsWith(name, "mlp.down_proj.weight")) return 1;
  return -1;
}

bool TensorParallelSplits(const std::string& name, int64_t extent, int size) {
  if (size < 1 || extent < 0) return false;
  if (TensorParallelDim(name) < 0 || size == 1 || IsVocabulary(name)) return true;
  return extent % size == 0;
}

std::pair<int64_t, int64_t> TensorParallelRange(const std::string& name, int64_t extent, int rank,
                                                int size) {
  GYRE_CHECK(size >= 1 && rank >= 0 && rank < size)
      << "tensor-parallel rank " << rank << " of " << size;
  if (TensorParallelDim(name) < 0 || size == 1) return {0, extent};
  if (IsVocabulary(name)) {
    const int64_t chunk = (extent + size - 1) / size;
    const int64_t begin = std::min<int64_t>(extent, rank * chunk);
    return {begin, std::min<int64_t>(extent, begin + chunk)};
  }
  GYRE_CHECK(extent % size == 0) << name << ": " << extent << " does not split over " << size
                                 << " tensor-parallel ranks";
  const int64_t chunk = extent / size;
  return {rank * chunk, (rank + 1) * chunk};
}

at::Tensor TensorParallelSliceOf(const std::string& name, const at::Tensor& whole, int rank,
                                 int size) {
  const int dim = TensorParallelDim(name);
  if (dim < 0 || size == 1) return whole;
  GYRE_CHECK(whole.dim() > dim) << name << " has " << whole.dim() << " dimensions";
  const auto [begin, end] = TensorParallelRange(name, whole.size(dim), rank, size);
  return whole.narrow(dim, begin, end - begin);
}

std::string TensorParallelRanksNotOk(TensorParallelGroup* group, bool ok) {
  at::Tensor failed = at::zeros({group->size()}, at::TensorOptions().dtype(at::kDouble));
  if (!ok) failed.data_ptr<double>()[group->rank()] = 1.0;
  group->AllReduceSum(failed);
  std::string ranks;
  for (int r = 0; r < group->size(); ++r) {
    if (failed.data_ptr<double>()[r] > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  return ranks;
}

at::Tensor TensorParallelCopy(const at::Tensor& x, TensorParallelGroup* group) {
  if (group == nullptr) return x;
  return CopyToRanks::apply(x, group);
}

at::Tensor TensorParallelReduce(const at::Tensor& x, TensorParallelGroup* group) {
  if (group == nullptr) return x;
  return ReduceFromRanks::apply(x, group);
}

VocabParallelStats VocabParallelTokenStats(const at::Tensor& logits, int64_t vocab_begin,
                                           const at::Tensor& targets, double temperature,
                                           TensorParallelGroup* group, bool logp_only) {
  GYRE_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0))
      << "vocabulary-parallel stats: logits [N, V_r] and targets [N]";
  const int64_t V_r = logits.size(1);
  const at::Tensor z = logits.to(at::kFloat) / (temperature > 0 ? temperature : 1.0);
  at::Tensor local_max, local_arg;
  {
    at::NoGradGuard no_grad;
    std::tie(local_max, local_arg) = z.detach().max(-1);
  }
  // The global maximum per token (a constant shift: no gradient) and which rank holds it.
  at::Tensor global_max = local_max, winner;
  if (group != nullptr) {
    at::NoGradGuard no_grad;
    const at::Tensor all = group->AllGather(local_max.contiguous());  // [T, N]
    std::tie(global_max, winner) = all.max(0);  // the first rank on a tie: the lowest id
  }
  const at::Tensor shifted = z - global_max.unsqueeze(1);
  const at::Tensor sum_exp = TensorParallelReduce(shifted.exp().sum(-1), group);
  const at::Tensor lse = sum_exp.log();  // log-sum-exp minus the maximum
  const at::Tensor local = targets - vocab_begin;
  const at::Tensor mine = (local >= 0) & (local < V_r);
  const at::Tensor index = at::where(mine, local, at::zeros_like(local)).unsqueeze(1);
  const at::Tensor target_z =
      TensorParallelReduce(shifted.gather(1, index).squeeze(1) * mine.to(at::kFloat), group);
  VocabParallelStats out;
  out.logp = target_z - lse;
  out.log_normalizer = (lse + global_max).detach();
  if (logp_only) return out;
  // Each rank's sum below depends on lse through its own probabilities, so the gradient lse gets
  // from it differs between the ranks: TensorParallelCopy sums those parts in the backward (the
  // direct use of lse is the same on every rank and stays as it is).
  const at::Tensor p = (shifted - TensorParallelCopy(lse, group).unsqueeze(1)).exp();
  out.entropy = lse - TensorParallelReduce((p * shifted).sum(-1), group);
  at::NoGradGuard no_grad;
  at::Tensor ok = mine & (local_arg == local);
  if (group != nullptr) ok = ok & (winner == group->rank());
  out.argmax_ok = ok.to(at::kFloat);
  if (group != nullptr) group->AllReduceSum(out.argmax_ok);
  return out;
}

namespace {

// One chunk's logits [n, V_r] in float32.
at::Tensor ChunkLogits(const at::Tensor& h, const at::Tensor& w) {
  return at::linear(h, w).to(at::kFloat);
}

class VocabParallelChunkedFunction
    : public torch::autograd::Function<VocabParallelChunkedFunction> {
 public:
  // Returns {logp [N], entropy [N], argmax_ok [N]} (entropy and argmax_ok [0] with logp_only).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t vocab_begin,
                                                double temperature, int64_t chunk, int64_t owner,
                                                bool logp_only) {
    auto* group = reinterpret_cast<TensorParallelGroup*>(owner);
    const int64_t N = hidden.size(0);
    const auto fopts = hidden.options().dtype(at::kFloat);
    const int64_t stats = logp_only ? 0 : N;
    at::Tensor logp = at::empty({N}, fopts), entropy = at::empty({stats}, fopts);
    at::Tensor ok = at::empty({stats}, fopts), norm = at::empty({N}, fopts);
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const VocabParallelStats st =
          VocabParallelTokenStats(ChunkLogits(hidden.narrow(0, s, n), weight), vocab_begin,
                                  targets.narrow(0, s, n), temperature, group, logp_only);
      logp.narrow(0, s, n).copy_(st.logp);
      norm.narrow(0, s, n).copy_(st.log_normalizer);
      if (logp_only) continue;
      entropy.narrow(0, s, n).copy_(st.entropy);
      ok.narrow(0, s, n).copy_(st.argmax_ok);
    }
    ctx->save_for_backward({hidden, weight, targets, entropy, norm});
    ctx->saved_data["vocab_begin"] = vocab_begin;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->mark_non_differentiable({ok});
    return {logp, entropy, ok};
  }

  // With log p = z - log_normalizer over the whole vocabulary (this rank's columns here):
  // d logp_y / dz = onehot(y) - p (the one-hot only on the rank that holds y), d entropy / dz_j =
  // -p_j (log p_j + entropy); then dz / T flows into both matmul operands.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2];
    const at::Tensor &entropy = saved[3], &norm = saved[4];
    const int64_t vocab_begin = ctx->saved_data["vocab_begin"].toInt();
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor& g_logp = grads[0];
    const at::Tensor& g_ent = grads[1];
    const int64_t N = hidden.size(0), V_r = weight.size(0);
    at::Tensor grad_h = at::empty_like(hidden);
    at::Tensor grad_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor h = hidden.narrow(0, s, n);
      const at::Tensor lsm =
          ChunkLogits(h, weight) / temperature - norm.narrow(0, s, n).unsqueeze(-1);
      const at::Tensor p = lsm.exp();
      at::Tensor dz = at::zeros_like(p);
      if (g_logp.defined()) {
        const at::Tensor g = g_logp.narrow(0, s, n).unsqueeze(-1);
        dz = dz - g * p;
        const at::Tensor local = targets.narrow(0, s, n) - vocab_begin;
        const at::Tensor mine = (local >= 0) & (local < V_r);
        const at::Tensor index = at::where(mine, local, at::zeros_like(local)).unsqueeze(-1);
        dz.scatter_add_(-1, index, g * mine.unsqueeze(-1).to(at::kFloat));
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
    return {grad_h,       grad_w.to(weight.scalar_type()),
            at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

VocabParallelStats VocabParallelChunkedTokenStats(const at::Tensor& hidden,
                                                  const at::Tensor& weight, int64_t vocab_begin,
                                                  const at::Tensor& targets, double temperature,
                                                  int64_t chunk_tokens, TensorParallelGroup* group,
                                                  bool logp_only) {
  GYRE_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) &&
             targets.dim() == 1 && targets.size(0) == hidden.size(0))
      << "vocabulary-parallel chunked stats: hidden [N, H], weight [V_r, H] and targets [N]";
  const double t = temperature > 0 ? temperature : 1.0;
  auto out = VocabParallelChunkedFunction::apply(hidden, weight, targets.to(at::kLong), vocab_begin,
                                                 t, std::max<int64_t>(1, chunk_tokens),
                                                 reinterpret_cast<int64_t>(group), logp_only);
  VocabParallelStats st;
  st.logp = out[0];
  if (!logp_only) {
    st.entropy = out[1];
    st.argmax_ok = out[2];
  }
  return st;
}

}  // namespace gyre::model
