#include "rollout/vocab_parallel_sampling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "common/check.h"
#include "kernels/philox.h"

namespace gyre::rollout {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The reference's logit cleaning (sampling_ref.h): NaN is -inf, +inf is FLT_MAX.
float Clean(float x) {
  if (std::isnan(x)) return kNegInf;
  return x > FLT_MAX ? FLT_MAX : x;
}

float Shifted(float logit, float max_logit, float temperature) {
  const float c = Clean(logit);
  return c == kNegInf ? kNegInf : (c - max_logit) / temperature;
}

// Non-negative floats order as their bit patterns do.
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool Sampled(const kernels::SamplingRowParams& p) { return p.temperature > 0.0f; }

}  // namespace

ops::SampleOutput VocabParallelSampleRows(const at::Tensor& logits, int64_t vocab_begin,
                                          int64_t vocab,
                                          const std::vector<kernels::SamplingRowParams>& params,
                                          model::TensorParallelGroup* group) {
  GYRE_CHECK(group != nullptr) << "vocabulary-parallel sampling needs a group";
  GYRE_CHECK(logits.dim() == 2) << "logits must be [rows, vocabulary slice]";
  const at::Tensor host = logits.to(at::kCPU, at::kFloat).contiguous();
  const int64_t rows = host.size(0), width = host.size(1);
  GYRE_CHECK(rows == static_cast<int64_t>(params.size()))
      << rows << " rows of logits, " << params.size() << " parameter sets";
  const int ranks = group->size(), me = group->rank();
  const float* L = host.data_ptr<float>();
  const auto dopts = at::TensorOptions().dtype(at::kDouble);
  const auto fopts = at::TensorOptions().dtype(at::kFloat);
  ops::SampleOutput out;
  out.tokens.assign(static_cast<size_t>(rows), 0);
  out.logprobs.assign(static_cast<size_t>(rows), kNegInf);
  out.kept_mass.assign(static_cast<size_t>(rows), 0.0f);
  if (rows == 0) return out;

  // 1. The row maximum and its token over the whole vocabulary (ties: the lowest id, which is
  // the lowest rank's, then the lowest local index).
  at::Tensor local_max = at::empty({rows, 2}, dopts);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = -1;
    float best_value = kNegInf;
    for (int64_t i = 0; i < width; ++i) {
      const float v = Clean(L[r * width + i]);
      if (v > best_value) {
        best_value = v;
        best = i;
      }
    }
    local_max.data_ptr<double>()[2 * r] = best_value;
    local_max.data_ptr<double>()[2 * r + 1] =
        best < 0 ? -1.0 : static_cast<double>(vocab_begin + best);
  }
  const at::Tensor all_max = group->AllGather(local_max).contiguous();  // [T, rows, 2]
  std::vector<float> max_logit(static_cast<size_t>(rows), kNegInf);
  std::vector<int64_t> argmax(static_cast<size_t>(rows), -1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int k = 0; k < ranks; ++k) {
      const double* e = all_max.data_ptr<double>() + (k * rows + r) * 2;
      if (static_cast<float>(e[0]) > max_logit[r]) {
        max_logit[r] = static_cast<float>(e[0]);
        argmax[r] = static_cast<int64_t>(e[1]);
      }
    }
  }

  // 2. S = sum exp(d_i) over the whole vocabulary; e holds this rank's exp(d_i).
  std::vector<float> temperature(static_cast<size_t>(rows));
  std::vector<float> p(static_cast<size_t>(rows * width), 0.0f);
  at::Tensor sums = at::zeros({rows}, dopts);
  for (int64_t r = 0; r < rows; ++r) {
    temperature[r] = Sampled(params[r]) ? params[r].temperature : 1.0f;
    if (argmax[r] < 0) continue;
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) {
      const float e = std::exp(Shifted(L[r * width + i], max_logit[r], temperature[r]));
      p[r * width + i] = e;
      sum += static_cast<double>(e);
    }
    sums.data_ptr<double>()[r] = sum;
  }
  group->AllReduceSum(sums);
  const double* S = sums.data_ptr<double>();

  // Greedy and degenerate rows are done; the others become probabilities.
  std::vector<char> sampled(static_cast<size_t>(rows), 0);
  std::vector<uint8_t> kept(static_cast<size_t>(rows * width), 0);
  std::vector<float> p_max(static_cast<size_t>(rows), 0.0f);
  bool any_sampled = false;
  for (int64_t r = 0; r < rows; ++r) {
    if (argmax[r] < 0) continue;  // every logit -inf or NaN: token 0, -inf, 0
    if (!Sampled(params[r])) {
      out.tokens[r] = static_cast<int32_t>(argmax[r]);
      out.logprobs[r] = static_cast<float>(0.0 - std::log(S[r]));  // d of the max is 0
      out.kept_mass[r] = 1.0f;
      continue;
    }
    sampled[r] = 1;
    any_sampled = true;
    p_max[r] = static_cast<float>(1.0 / S[r]);  // the max token's exp(d) is exactly 1
    for (int64_t i = 0; i < width; ++i) {
      float& v = p[r * width + i];
      v = static_cast<float>(static_cast<double>(v) / S[r]);
      kept[r * width + i] = v > 0.0f;
    }
  }
  if (!any_sampled) return out;

  // 3. top-k: the k-th largest of every rank's k largest probabilities.
  auto top_k_on = [&](int64_t r) {
    return sampled[r] && params[r].top_k > 0 && params[r].top_k < vocab;
  };
  int64_t k_max = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (top_k_on(r)) k_max = std::max<int64_t>(k_max, params[r].top_k);
  }
  if (k_max > 0) {
    const int64_t chunk = (vocab + ranks - 1) / ranks;  // no rank holds more rows
    const int64_t k_cap = std::min(k_max, chunk);
    at::Tensor tops = at::full({rows, k_cap}, -1.0f, fopts);
    std::vector<float> scratch;
    for (int64_t r = 0; r < rows; ++r) {
      if (!top_k_on(r)) continue;
      scratch.assign(p.begin() + r * width, p.begin() + (r + 1) * width);
      const int64_t take = std::min<int64_t>({params[r].top_k, width, k_cap});
      std::partial_sort(scratch.begin(), scratch.begin() + take, scratch.end(),
                        std::greater<float>());
      std::copy(scratch.begin(), scratch.begin() + take, tops.data_ptr<float>() + r * k_cap);
    }
    const at::Tensor all_tops = group->AllGather(tops).contiguous();  // [T, rows, k_cap]
    for (int64_t r = 0; r < rows; ++r) {
      if (!top_k_on(r)) continue;
      scratch.clear();
      for (int k = 0; k < ranks; ++k) {
        const float* t = all_tops.data_ptr<float>() + (k * rows + r) * k_cap;
        scratch.insert(scratch.end(), t, t + k_cap);
      }
      auto kth = scratch.begin() + (params[r].top_k - 1);
      std::nth_element(scratch.begin(), kth, scratch.end(), std::greater<float>());
      const float threshold = *kth;
      for (int64_t i = 0; i < width; ++i) {
        kept[r * width + i] = kept[r * width + i] && p[r * width + i] >= threshold;
      }
    }
  }

  // 4. top-p: the boundary is the largest survivor probability v whose mass(p >= v) reaches
  // top_p times the survivors' mass, found by bisection over float bit patterns in
  // [0, p_max] (the mass is a step function that changes only at survivor values, so the
  // largest v that passes is one). If rounding lets none pass, 0 keeps every survivor, as the
  // reference does.
  auto top_p_on = [&](int64_t r) { return sampled[r] && params[r].top_p < 1.0f; };
  bool any_top_p = false;
  for (int64_t r = 0; r < rows; ++r) any_top_p = any_top_p || top_p_on(r);
  if (any_top_p) {
    at::Tensor survivor_mass = at::zeros({rows}, dopts);
    std::vector<std::vector<float>> sorted(static_cast<size_t>(rows));
    std::vector<std::vector<double>> prefix(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      if (!top_p_on(r)) continue;
      double mass = 0.0;
      for (int64_t i = 0; i < width; ++i) {
        if (!kept[r * width + i]) continue;
        mass += p[r * width + i];
        sorted[r].push_back(p[r * width + i]);
      }
      survivor_mass.data_ptr<double>()[r] = mass;
      std::sort(sorted[r].begin(), sorted[r].end(), std::greater<float>());
      prefix[r].assign(1, 0.0);
      for (float v : sorted[r]) prefix[r].push_back(prefix[r].back() + v);
    }
    group->AllReduceSum(survivor_mass);
    std::vector<double> target(static_cast<size_t>(rows));
    std::vector<uint32_t> lo(static_cast<size_t>(rows), 0), hi(static_cast<size_t>(rows), 0);
    for (int64_t r = 0; r < rows; ++r) {
      if (!top_p_on(r)) continue;
      target[r] = static_cast<double>(params[r].top_p) * survivor_mass.data_ptr<double>()[r];
      hi[r] = Bits(p_max[r]);
    }
    at::Tensor mass = at::zeros({rows}, dopts);
    std::vector<uint32_t> mid(static_cast<size_t>(rows));
    for (;;) {
      bool open = false;
      double* m = mass.data_ptr<double>();
      for (int64_t r = 0; r < rows; ++r) {
        m[r] = 0.0;
        if (!top_p_on(r) || lo[r] >= hi[r]) continue;
        open = true;
        mid[r] = lo[r] + (hi[r] - lo[r] + 1) / 2;
        const float v = FromBits(mid[r]);
        const auto end = std::partition_point(sorted[r].begin(), sorted[r].end(),
                                              [v](float x) { return x >= v; });
        m[r] = prefix[r][static_cast<size_t>(end - sorted[r].begin())];
      }
      if (!open) break;  // the same on every rank: lo and hi follow the reduced masses
      group->AllReduceSum(mass);
      for (int64_t r = 0; r < rows; ++r) {
        if (!top_p_on(r) || lo[r] >= hi[r]) continue;
        if (m[r] >= target[r]) {
          lo[r] = mid[r];
        } else {
          hi[r] = mid[r] - 1;
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (!top_p_on(r)) continue;
      const float boundary = FromBits(lo[r]);
      for (int64_t i = 0; i < width; ++i) {
        kept[r * width + i] = kept[r * width + i] && p[r * width + i] >= boundary;
      }
    }
  }

  // 5. min-p, local.
  for (int64_t r = 0; r < rows; ++r) {
    if (!sampled[r] || !(params[r].min_p > 0.0f)) continue;
    const float threshold = std::min(params[r].min_p, 1.0f) * p_max[r];
    for (int64_t i = 0; i < width; ++i) {
      kept[r * width + i] = kept[r * width + i] && p[r * width + i] >= threshold;
    }
  }

  // 6. The draw over the kept tokens in ascending id order, rank after rank.
  at::Tensor kept_local = at::zeros({rows}, dopts);
  for (int64_t r = 0; r < rows; ++r) {
    if (!sampled[r]) continue;
    double mass = 0.0;
    for (int64_t i = 0; i < width; ++i) {
      if (kept[r * width + i]) mass += p[r * width + i];
    }
    kept_local.data_ptr<double>()[r] = mass;
  }
  const at::Tensor all_kept = group->AllGather(kept_local).contiguous();  // [T, rows]
  // Per row: picked id, its d, last kept id, its d (ids -1 when none).
  at::Tensor found = at::full({rows, 4}, -1.0, dopts);
  std::vector<double> total(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (!sampled[r]) continue;
    double before = 0.0;
    for (int k = 0; k < ranks; ++k) {
      const double m = all_kept.data_ptr<double>()[k * rows + r];
      if (k < me) before += m;
      total[r] += m;
    }
    const double target =
        static_cast<double>(kernels::PhiloxUniform(params[r].seed, params[r].position)) * total[r];
    double running = before;
    double* f = found.data_ptr<double>() + 4 * r;
    for (int64_t i = 0; i < width; ++i) {
      if (!kept[r * width + i]) continue;
      const double d = Shifted(L[r * width + i], max_logit[r], temperature[r]);
      f[2] = static_cast<double>(vocab_begin + i);
      f[3] = d;
      running += p[r * width + i];
      if (running > target) {
        f[0] = static_cast<double>(vocab_begin + i);
        f[1] = d;
        break;
      }
    }
  }
  const at::Tensor all_found = group->AllGather(found).contiguous();  // [T, rows, 4]
  for (int64_t r = 0; r < rows; ++r) {
    if (!sampled[r]) continue;
    double token = -1, d = 0;
    for (int k = 0; k < ranks && token < 0; ++k) {
      const double* f = all_found.data_ptr<double>() + (k * rows + r) * 4;
      if (f[0] >= 0) token = f[0], d = f[1];
    }
    for (int k = ranks - 1; k >= 0 && token < 0; --k) {  // rounding: the last kept token
      const double* f = all_found.data_ptr<double>() + (k * rows + r) * 4;
      if (f[2] >= 0) token = f[2], d = f[3];
    }
    out.tokens[r] = static_cast<int32_t>(token);
    out.logprobs[r] = static_cast<float>(d - std::log(S[r]));
    out.kept_mass[r] = static_cast<float>(total[r]);
  }
  return out;
}

}  // namespace gyre::rollout
