#include "model/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

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
  if (logp_only) return out;
  const at::Tensor p = (shifted - lse.unsqueeze(1)).exp();
  out.entropy = lse - TensorParallelReduce((p * shifted).sum(-1), group);
  at::NoGradGuard no_grad;
  at::Tensor ok = mine & (local_arg == local);
  if (group != nullptr) ok = ok & (winner == group->rank());
  out.argmax_ok = ok.to(at::kFloat);
  if (group != nullptr) group->AllReduceSum(out.argmax_ok);
  return out;
}

}  // namespace gyre::model
