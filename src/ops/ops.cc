#include "ops/ops.h"

#include <ATen/ATen.h>

#include <string>

namespace gyre::ops {

namespace {

Status RequireCpu(const at::Tensor& t, const char* name) {
  if (!t.defined()) return InvalidArgument(std::string(name) + " is undefined");
  if (!t.device().is_cpu()) {
    return FailedPrecondition(std::string(name) +
                              " is on a GPU; this build runs the CPU reference path only");
  }
  return Status::Ok();
}

at::Tensor AsFloatContiguous(const at::Tensor& t) { return t.detach().to(at::kFloat).contiguous(); }

}  // namespace

StatusOr<SampleOutput> SampleRows(const at::Tensor& logits,
                                  const std::vector<kernels::SamplingRowParams>& params) {
  GYRE_RETURN_IF_ERROR(RequireCpu(logits, "logits"));
  if (logits.dim() != 2) return InvalidArgument("logits must be [B, V]");
  const int64_t B = logits.size(0), V = logits.size(1);
  if (static_cast<int64_t>(params.size()) != B) {
    return InvalidArgument("SampleRows: " + std::to_string(params.size()) + " parameter sets for " +
                           std::to_string(B) + " rows");
  }
  at::Tensor l = AsFloatContiguous(logits);
  SampleOutput out;
  out.tokens.resize(B);
  out.logprobs.resize(B);
  out.kept_mass.resize(B);
  kernels::SampleRowsRef(l.data_ptr<float>(), B, V, params.data(), out.tokens.data(),
                         out.logprobs.data(), out.kept_mass.data());
  return out;
}

at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets, double temperature) {
  at::Tensor z = logits.to(at::kFloat);
  if (temperature > 0 && temperature != 1.0) z = z / temperature;
  return at::log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

StatusOr<PolicyLossResult> PolicyLoss(const at::Tensor& logp, const at::Tensor& logp_old,
                                      const at::Tensor& logp_rollout, const at::Tensor& logp_ref,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const kernels::PolicyLossParams& params) {
  for (auto [t, name] : {std::pair{&logp, "logp"},
                         {&logp_old, "logp_old"},
                         {&advantages, "advantages"},
                         {&mask, "mask"}}) {
    GYRE_RETURN_IF_ERROR(RequireCpu(*t, name));
    if (t->sizes() != logp.sizes() || t->dim() != 2) {
      return InvalidArgument(std::string(name) + " must be [S, T] like logp");
    }
  }
  if (params.use_tis && !logp_rollout.defined()) {
    return InvalidArgument("truncated importance sampling needs the rollout log-probs");
  }
  if (params.kl != kernels::KlKind::kNone && !logp_ref.defined()) {
    return InvalidArgument("a KL penalty needs reference log-probs");
  }
  at::Tensor lp = AsFloatContiguous(logp), lo = AsFloatContiguous(logp_old);
  at::Tensor adv = AsFloatContiguous(advantages), m = AsFloatContiguous(mask);
  at::Tensor lr = logp_rollout.defined() ? AsFloatContiguous(logp_rollout) : at::Tensor();
  at::Tensor lref = logp_ref.defined() ? AsFloatContiguous(logp_ref) : at::Tensor();
  kernels::PolicyLossInputs in;
  in.S = lp.size(0);
  in.T = lp.size(1);
  in.logp = lp.data_ptr<float>();
  in.logp_old = lo.data_ptr<float>();
  in.logp_rollout = lr.defined() ? lr.data_ptr<float>() : nullptr;
  in.logp_ref = lref.defined() ? lref.data_ptr<float>() : nullptr;
  in.advantages = adv.data_ptr<float>();
  in.mask = m.data_ptr<float>();
  PolicyLossResult r;
  r.grad_logp = at::zeros_like(lp);
  r.stats = kernels::PolicyLossRef(in, params, r.grad_logp.data_ptr<float>());
  return r;
}

}  // namespace gyre::ops
