#include "ops/ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#if GYRE_OPS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/policy_loss.cuh"
#include "kernels/sampling.cuh"
#include "kernels/token_logprobs.cuh"
#endif

#include "kernels/philox.h"

namespace gyre::ops {

namespace {

Status RequireDefined(const at::Tensor& t, const char* name) {
  if (!t.defined()) return InvalidArgument(std::string(name) + " is undefined");
  return Status::Ok();
}

// CPU tensors take the reference path; CUDA tensors the kernels when this build has them.
StatusOr<bool> UseCuda(const at::Tensor& t, const char* name) {
  if (t.device().is_cpu()) return false;
  if (!t.device().is_cuda()) {
    return InvalidArgument(std::string(name) + " is on an unsupported device (" + t.device().str() +
                           "); use a CPU or CUDA tensor");
  }
#if GYRE_OPS_CUDA
  return true;
#else
  return FailedPrecondition(std::string(name) +
                            " is on a GPU but this build of Gyre has no CUDA kernels (configure "
                            "with nvcc on PATH and a CUDA-enabled libtorch)");
#endif
}

at::Tensor AsFloatContiguous(const at::Tensor& t) { return t.detach().to(at::kFloat).contiguous(); }

// Raw pointers of float32 [S, T] tensors on one device (logp_rollout / logp_ref may be undefined).
kernels::PolicyLossInputs LossInputs(const at::Tensor& lp, const at::Tensor& lo,
                                     const at::Tensor& lr, const at::Tensor& lref,
                                     const at::Tensor& adv, const at::Tensor& m) {
  kernels::PolicyLossInputs in;
  in.S = lp.size(0);
  in.T = lp.size(1);
  in.logp = lp.data_ptr<float>();
  in.logp_old = lo.data_ptr<float>();
  in.logp_rollout = lr.defined() ? lr.data_ptr<float>() : nullptr;
  in.logp_ref = lref.defined() ? lref.data_ptr<float>() : nullptr;
  in.advantages = adv.data_ptr<float>();
  in.mask = m.data_ptr<float>();
  return in;
}

#if GYRE_OPS_CUDA
Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

// Logits as the kernels read them: float32 or bfloat16, contiguous; other dtypes become float32.
at::Tensor KernelLogits(const at::Tensor& logits) {
  if (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16) {
    return logits.contiguous();
  }
  return logits.to(at::kFloat).contiguous();
}

StatusOr<SampleOutput> SampleRowsCuda(const at::Tensor& logits,
                                      const std::vector<kernels::SamplingRowParams>& params) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
  const int64_t B = logits.size(0), V = logits.size(1);
  at::Tensor l = KernelLogits(logits.detach());
  at::Tensor host_params =
      at::empty({static_cast<int64_t>(params.size() * sizeof(kernels::SamplingRowParams))},
                at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host_params.data_ptr(), params.data(), host_params.numel());
  at::Tensor dev_params = host_params.to(logits.device(), /*non_blocking=*/true);
  at::Tensor tokens = at::empty({B}, logits.options().dtype(at::kInt));
  at::Tensor logprobs = at::empty({B}, logits.options().dtype(at::kFloat));
  at::Tensor kept = at::empty({B}, logits.options().dtype(at::kFloat));
  const auto* p = reinterpret_cast<const kernels::SamplingRowParams*>(dev_params.data_ptr());
  cudaError_t err;
  if (l.scalar_type() == at::kBFloat16) {
    err = kernels::LaunchSampleRows(reinterpret_cast<const __nv_bfloat16*>(l.data_ptr()), B, V, p,
                                    tokens.data_ptr<int32_t>(), logprobs.data_ptr<float>(),
                                    kept.data_ptr<float>(), stream);
  } else {
    err = kernels::LaunchSampleRows(l.data_ptr<float>(), B, V, p, tokens.data_ptr<int32_t>(),
                                    logprobs.data_ptr<float>(), kept.data_ptr<float>(), stream);
  }
  GYRE_RETURN_IF_ERROR(CudaStatus(err, "sampling kernel launch"));
  at::Tensor t = tokens.cpu(), lp = logprobs.cpu(), km = kept.cpu();  // synchronises
  SampleOutput out;
  out.tokens.assign(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + B);
  out.logprobs.assign(lp.data_ptr<float>(), lp.data_ptr<float>() + B);
  out.kept_mass.assign(km.data_ptr<float>(), km.data_ptr<float>() + B);
  return out;
}

// Fused log-softmax + gather on the GPU as an autograd function: the backward recomputes the
// row statistics instead of keeping a [N, V] float buffer alive.
class TokenLogprobsFunction : public torch::autograd::Function<TokenLogprobsFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, double temperature) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
    const int64_t V = logits.size(-1);
    at::Tensor l = logits.contiguous().view({-1, V});
    at::Tensor y = targets.to(at::kLong).contiguous().view({-1});
    at::Tensor logp = at::empty({l.size(0)}, logits.options().dtype(at::kFloat));
    cudaError_t err;
    if (l.scalar_type() == at::kBFloat16) {
      err = kernels::LaunchTokenLogprobsForward(
          reinterpret_cast<const __nv_bfloat16*>(l.data_ptr()), y.data_ptr<int64_t>(), l.size(0), V,
          static_cast<float>(temperature), logp.data_ptr<float>(), nullptr, stream);
    } else {
      err = kernels::LaunchTokenLogprobsForward(l.data_ptr<float>(), y.data_ptr<int64_t>(),
                                                l.size(0), V, static_cast<float>(temperature),
                                                logp.data_ptr<float>(), nullptr, stream);
    }
    TORCH_CHECK(err == cudaSuccess, "token log-prob kernel: ", cudaGetErrorString(err));
    ctx->save_for_backward({l, y});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["shape"] = logits.sizes().vec();
    return logp.view(targets.sizes());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& l = saved[0];
    const at::Tensor& y = saved[1];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const c10::cuda::CUDAGuard guard(l.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(l.device().index()).stream();
    at::Tensor g = grads[0].to(at::kFloat).contiguous().view({-1});
    at::Tensor grad_logits = at::empty_like(l);
    cudaError_t err;
    if (l.scalar_type() == at::kBFloat16) {
      err = kernels::LaunchTokenLogprobsBackward(
          reinterpret_cast<const __nv_bfloat16*>(l.data_ptr()), y.data_ptr<int64_t>(), l.size(0),
          l.size(1), static_cast<float>(temperature), g.data_ptr<float>(), nullptr,
          reinterpret_cast<__nv_bfloat16*>(grad_logits.data_ptr()), stream);
    } else {
      err = kernels::LaunchTokenLogprobsBackward(
          l.data_ptr<float>(), y.data_ptr<int64_t>(), l.size(0), l.size(1),
          static_cast<float>(temperature), g.data_ptr<float>(), nullptr,
          grad_logits.data_ptr<float>(), stream);
    }
    TORCH_CHECK(err == cudaSuccess, "token log-prob backward kernel: ", cudaGetErrorString(err));
    return {grad_logits.view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

StatusOr<PolicyLossResult> PolicyLossCuda(const at::Tensor& lp, const at::Tensor& lo,
                                          const at::Tensor& lr, const at::Tensor& lref,
                                          const at::Tensor& adv, const at::Tensor& m,
                                          const kernels::PolicyLossParams& params) {
  const c10::cuda::CUDAGuard guard(lp.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(lp.device().index()).stream();
  const kernels::PolicyLossInputs in = LossInputs(lp, lo, lr, lref, adv, m);
  PolicyLossResult r;
  r.grad_logp = at::empty_like(lp);
  at::Tensor stats = at::empty({kernels::kPolicyLossStatSlots}, lp.options().dtype(at::kDouble));
  GYRE_RETURN_IF_ERROR(
      CudaStatus(kernels::LaunchPolicyLoss(in, params, r.grad_logp.data_ptr<float>(),
                                           stats.data_ptr<double>(), stream),
                 "policy loss kernel launch"));
  at::Tensor host = stats.cpu();  // synchronises
  r.stats = kernels::FinishPolicyLossStats(host.data_ptr<double>(), params);
  return r;
}
#endif  // GYRE_OPS_CUDA

}  // namespace

namespace {

// Rows that sample from the full distribution: temperature > 0 and finite, no top-k, top-p or
// min-p. SamplePlainRows draws those whose logits are finite.
std::vector<int64_t> PlainSamplingRows(int64_t vocab,
                                       const std::vector<kernels::SamplingRowParams>& params) {
  std::vector<int64_t> rows;
  for (size_t r = 0; r < params.size(); ++r) {
    const kernels::SamplingRowParams& p = params[r];
    if (p.temperature > 0.0f && std::isfinite(p.temperature) &&
        (p.top_k <= 0 || p.top_k >= vocab) && p.top_p >= 1.0f && !(p.min_p > 0.0f)) {
      rows.push_back(static_cast<int64_t>(r));
    }
  }
  return rows;
}

// The CPU sampler's fast path for PlainSamplingRows: the same draw as kernels::SampleRowsRef
// (docs/design.md, "Sampling"), with the exponentials and their sums computed by ATen's vectorised,
// multithreaded kernels instead of one scalar expf per logit. With m the row's largest logit,
// e_i = exp((logit_i - m) / T) and S = sum e_i in double, the token is the first i whose running
// sum of e (in double, ascending id order) exceeds u * S for the row's Philox draw u (the
// reference's running sum of e_i / S against u * sum_i e_i / S), else the last token with
// e_i > 0; the log-prob is (logit - m) / T - log S and the kept mass 1 (nothing is truncated).
// Against the reference only the exponentials' last bits and the summation order differ. -inf
// logits are never drawn (e = 0), as in the reference; a row with a NaN or +inf logit (its
// maximum is not finite) is left to the reference. Marks the rows it drew in *done. The
// exponentials go into a buffer each thread keeps, so no [rows, V] tensor is allocated per step.
void SamplePlainRows(const at::Tensor& l, const std::vector<kernels::SamplingRowParams>& params,
                     const std::vector<int64_t>& rows, SampleOutput* out,
                     std::vector<uint8_t>* done) {
  const int64_t n = static_cast<int64_t>(rows.size()), V = l.size(1);
  const at::Tensor x = n == l.size(0) ? l : l.index_select(0, at::tensor(rows, at::kLong));
  std::vector<float> temps(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) temps[i] = params[static_cast<size_t>(rows[i])].temperature;
  const at::Tensor max = at::amax(x, 1, /*keepdim=*/true);  // NaN when the row has one
  thread_local at::Tensor e;
  if (!e.defined()) e = at::empty({0}, at::kFloat);
  e.resize_({n, V});
  at::sub_out(e, x, max);
  e.div_(at::from_blob(temps.data(), {n, 1}, at::kFloat));
  e.exp_();
  const at::Tensor sums = e.sum(1, /*keepdim=*/false, at::kDouble);
  const float* ep = e.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* mp = max.data_ptr<float>();
  const double* sp = sums.data_ptr<double>();
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(V, 1));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(mp[i])) continue;
      const int64_t r = rows[static_cast<size_t>(i)];
      const kernels::SamplingRowParams& p = params[static_cast<size_t>(r)];
      const float* row = ep + i * V;
      const double target = static_cast<double>(kernels::PhiloxUniform(p.seed, p.position)) * sp[i];
      int64_t token = -1, last = 0;
      double running = 0.0;
      for (int64_t k = 0; k < V; ++k) {
        if (!(row[k] > 0.0f)) continue;
        last = k;
        running += static_cast<double>(row[k]);
        if (running > target) {
          token = k;
          break;
        }
      }
      if (token < 0) token = last;
      const float shifted = (xp[i * V + token] - mp[i]) / p.temperature;
      out->tokens[r] = static_cast<int32_t>(token);
      out->logprobs[r] = static_cast<float>(static_cast<double>(shifted) - std::log(sp[i]));
      out->kept_mass[r] = 1.0f;
      (*done)[static_cast<size_t>(r)] = 1;
    }
  });
}

}  // namespace

StatusOr<SampleOutput> SampleRows(const at::Tensor& logits,
                                  const std::vector<kernels::SamplingRowParams>& params) {
  GYRE_RETURN_IF_ERROR(RequireDefined(logits, "logits"));
  GYRE_ASSIGN_OR_RETURN(const bool cuda, UseCuda(logits, "logits"));
  if (logits.dim() != 2) return InvalidArgument("logits must be [B, V]");
  const int64_t B = logits.size(0), V = logits.size(1);
  if (static_cast<int64_t>(params.size()) != B) {
    return InvalidArgument("SampleRows: " + std::to_string(params.size()) + " parameter sets for " +
                           std::to_string(B) + " rows");
  }
  if (V < 1 && B > 0) return InvalidArgument("SampleRows: logits have an empty vocabulary");
#if GYRE_OPS_CUDA
  if (cuda) return SampleRowsCuda(logits, params);
#endif
  (void)cuda;
  at::Tensor l = AsFloatContiguous(logits);
  SampleOutput out;
  out.tokens.resize(B);
  out.logprobs.resize(B);
  out.kept_mass.resize(B);
  // Rows are independent: split them over the intra-op threads (each row's result is the same
  // whichever thread draws it).
  const float* base = l.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(V, 1));
  std::vector<uint8_t> done(static_cast<size_t>(B), 0);
  const std::vector<int64_t> plain = PlainSamplingRows(V, params);
  if (!plain.empty()) SamplePlainRows(l, params, plain, &out, &done);
  at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      kernels::SampleRowsRef(base + r * V, 1, V, params.data() + r, out.tokens.data() + r,
                             out.logprobs.data() + r, out.kept_mass.data() + r);
    }
  });
  return out;
}

at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets, double temperature) {
#if GYRE_OPS_CUDA
  if (logits.is_cuda()) {
    at::Tensor l = KernelLogits(logits);  // a differentiable cast when the dtype changes
    return TokenLogprobsFunction::apply(l, targets, temperature > 0 ? temperature : 1.0);
  }
#endif
  at::Tensor z = logits.to(at::kFloat);
  if (temperature > 0 && temperature != 1.0) z = z / temperature;
  return at::log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

StatusOr<PolicyLossResult> PolicyLoss(const at::Tensor& logp, const at::Tensor& logp_old,
                                      const at::Tensor& logp_rollout, const at::Tensor& logp_ref,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const kernels::PolicyLossParams& params) {
  GYRE_RETURN_IF_ERROR(RequireDefined(logp, "logp"));
  GYRE_ASSIGN_OR_RETURN(const bool cuda, UseCuda(logp, "logp"));
  for (auto [t, name] : {std::pair{&logp, "logp"},
                         {&logp_old, "logp_old"},
                         {&logp_rollout, "logp_rollout"},
                         {&logp_ref, "logp_ref"},
                         {&advantages, "advantages"},
                         {&mask, "mask"}}) {
    if (!t->defined() && (t == &logp_rollout || t == &logp_ref)) continue;
    GYRE_RETURN_IF_ERROR(RequireDefined(*t, name));
    if (t->device() != logp.device()) {
      return InvalidArgument(std::string(name) + " is on " + t->device().str() +
                             " but logp is on " + logp.device().str());
    }
    if (t->sizes() != logp.sizes() || t->dim() != 2) {
      return InvalidArgument(std::string(name) + " must be [S, T] like logp");
    }
  }
  if (params.correction != kernels::Correction::kNone && !logp_rollout.defined()) {
    return InvalidArgument("a behaviour-policy correction needs the rollout log-probs");
  }
  if (params.kl != kernels::KlKind::kNone && !logp_ref.defined()) {
    return InvalidArgument("a KL penalty needs reference log-probs");
  }
  at::Tensor lp = AsFloatContiguous(logp), lo = AsFloatContiguous(logp_old);
  at::Tensor adv = AsFloatContiguous(advantages), m = AsFloatContiguous(mask);
  at::Tensor lr = logp_rollout.defined() ? AsFloatContiguous(logp_rollout) : at::Tensor();
  at::Tensor lref = logp_ref.defined() ? AsFloatContiguous(logp_ref) : at::Tensor();
#if GYRE_OPS_CUDA
  if (cuda) return PolicyLossCuda(lp, lo, lr, lref, adv, m, params);
#endif
  (void)cuda;
  const kernels::PolicyLossInputs in = LossInputs(lp, lo, lr, lref, adv, m);
  PolicyLossResult r;
  r.grad_logp = at::zeros_like(lp);
  r.stats = kernels::PolicyLossRef(in, params, r.grad_logp.data_ptr<float>());
  return r;
}

}  // namespace gyre::ops
