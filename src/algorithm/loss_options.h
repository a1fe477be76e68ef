#pragma once
// gyre::PolicyLossOptions (include/gyre/algorithms.h) as the kernels' parameters, shared by the
// plain-array API and the torch wrapper (include_torch/gyre/torch.h).

#include "gyre/algorithms.h"
#include "kernels/reference/policy_loss_ref.h"

namespace gyre::algorithm {

// InvalidArgument naming the field and the accepted names for an unknown loss, aggregation,
// correction or KL estimator.
StatusOr<kernels::PolicyLossParams> ToKernelParams(const PolicyLossOptions& options);

}  // namespace gyre::algorithm
