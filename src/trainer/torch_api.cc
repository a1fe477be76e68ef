// <gyre/torch.h>'s PolicyLoss: the kernel's value and gradient as an autograd surrogate.
#include <ATen/ATen.h>

#include "algorithm/loss_options.h"
#include "gyre/torch.h"
#include "ops/ops.h"

namespace gyre {

StatusOr<TensorPolicyLoss> PolicyLoss(const at::Tensor& logp, const at::Tensor& logp_old,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const PolicyLossOptions& options,
                                      const at::Tensor& logp_rollout, const at::Tensor& logp_ref) {
  GYRE_ASSIGN_OR_RETURN(kernels::PolicyLossParams params, algorithm::ToKernelParams(options));
  if (!logp.defined() || !logp_old.defined() || !advantages.defined() || !mask.defined()) {
    return InvalidArgument("PolicyLoss: logp, logp_old, advantages and mask are required");
  }
  GYRE_ASSIGN_OR_RETURN(ops::PolicyLossResult r,
                        ops::PolicyLoss(logp.detach(), logp_old.detach(), logp_rollout, logp_ref,
                                        advantages.detach(), mask.detach(), params));
  // value: the kernel's loss; d/d logp: r.grad_logp (sum(logp * g) has exactly that gradient,
  // and the detached remainder moves the value without touching it).
  const at::Tensor linear = (logp * r.grad_logp).sum();
  const at::Tensor value = at::scalar_tensor(r.stats.loss, linear.options());
  TensorPolicyLoss out;
  out.loss = linear + (value - linear.detach());
  out.value.loss = r.stats.loss;
  out.value.policy_loss = r.stats.pg_loss;
  out.value.kl = r.stats.kl;
  out.value.clip_fraction = r.stats.clip_frac;
  out.value.approx_kl = r.stats.approx_kl;
  out.value.behaviour_weight_mean = r.stats.tis_mean;
  out.value.tokens = r.stats.tokens;
  return out;
}

}  // namespace gyre
