#include "kernels/reference/token_logprobs_ref.h"

#include <cmath>
#include <limits>

namespace gyre::kernels {

namespace {

struct RowStats {
  double m = -std::numeric_limits<double>::infinity();  // running max of z
  double s = 0;                                         // sum exp(z - m)
  double w = 0;                                         // sum exp(z - m) * z
};

// One pass over a row with the online rescaling the CUDA kernel uses per thread.
RowStats Scan(const float* row, int64_t V, double inv_tau) {
  RowStats r;
  for (int64_t j = 0; j < V; ++j) {
    const double z = static_cast<double>(row[j]) * inv_tau;
    if (z == -std::numeric_limits<double>::infinity()) continue;
    if (z > r.m) {
      const double scale = std::exp(r.m - z);  // exp(-inf) = 0 on the first finite value
      r.s *= scale;
      r.w *= scale;
      r.m = z;
    }
    const double e = std::exp(z - r.m);
    r.s += e;
    r.w += e * z;
  }
  return r;
}

double InvTau(float temperature) { return temperature > 0 ? 1.0 / temperature : 1.0; }

}  // namespace

void TokenLogprobsForwardRef(const float* logits, const int64_t* targets, int64_t T, int64_t V,
                             float temperature, float* logp, float* entropy) {
  const double inv_tau = InvTau(temperature);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits + t * V;
    const RowStats r = Scan(row, V, inv_tau);
    const double lse = r.m + std::log(r.s);
    logp[t] = static_cast<float>(static_cast<double>(row[targets[t]]) * inv_tau - lse);
    if (entropy != nullptr) entropy[t] = static_cast<float>(lse - r.w / r.s);
  }
}

void TokenLogprobsBackwardRef(const float* logits, const int64_t* targets, int64_t T, int64_t V,
                              float temperature, const float* grad_logp, const float* grad_entropy,
                              float* grad_logits) {
  const double inv_tau = InvTau(temperature);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits + t * V;
    const RowStats r = Scan(row, V, inv_tau);
    const double lse = r.m + std::log(r.s);
    const double h = lse - r.w / r.s;
    const double g_lp = grad_logp[t];
    const double g_h = grad_entropy != nullptr ? grad_entropy[t] : 0.0;
    for (int64_t j = 0; j < V; ++j) {
      const double z = static_cast<double>(row[j]) * inv_tau;
      const double log_p = z - lse;
      const double p = std::exp(log_p);
      double g = -g_lp * p;
      if (j == targets[t]) g += g_lp;
      if (g_h != 0.0 && p > 0.0) g -= g_h * p * (log_p + h);
      grad_logits[t * V + j] = static_cast<float>(g * inv_tau);
    }
  }
}

}  // namespace gyre::kernels
