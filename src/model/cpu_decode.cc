#include "model/cpu_decode.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace gyre::model {
namespace {

// The hot loops are compiled twice on x86-64: for AVX2 with FMA, and for the baseline the project
// builds for. The first call picks one: AVX2 where the CPU has it, unless ATEN_CPU_CAPABILITY is
// "default" (the same switch that makes ATen use its baseline kernels).
#if defined(__x86_64__) && defined(__GNUC__)
#define GYRE_AVX2 __attribute__((target("avx2,fma")))
bool UseAvx2() {
  static const bool use = [] {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    if (cap != nullptr && std::strcmp(cap, "default") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return use;
}
#define GYRE_DISPATCH(name, params, args)               \
  GYRE_AVX2 void name##Avx2 params { name##Body args; } \
  void name params {                                    \
    if (UseAvx2()) {                                    \
      name##Avx2 args;                                  \
    } else {                                            \
      name##Body args;                                  \
    }                                                   \
  }
#else
#define GYRE_DISPATCH(name, params, args) \
  void name params { name##Body args; }
#endif
#define GYRE_INLINE inline __attribute__((always_inline))

// Eight floats in one vector register (AVX) or two (SSE), through the compilers' generic vector
// extension; unaligned loads and stores go through memcpy.
typedef float Vec8 __attribute__((vector_size(32)));
GYRE_INLINE Vec8 Load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
GYRE_INLINE void Store8(float* p, Vec8 v) { std::memcpy(p, &v, sizeof v); }

// Eight independent partial sums, added in a fixed order at the end.
GYRE_INLINE float Dot(const float* a, const float* b, int64_t n) {
  Vec8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += Load8(a + i) * Load8(b + i);
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

GYRE_INLINE void Axpy(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(y + i, Load8(y + i) + alpha * Load8(x + i));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// Sequences [begin, end); `scores` holds num_heads * max_len floats. A sequence's cached keys
// (and values) are read position by position, all key/value heads at once: each position of a
// block is one contiguous run of kv_heads * head_dim floats.
GYRE_INLINE void AttendTasksBody(const PagedDecodeAttentionArgs& a, int64_t begin, int64_t end,
                                 float* scores) {
  const int64_t hd = a.head_dim, bs = a.block_size, nkv = a.kv_heads, nh = a.num_heads;
  const int64_t group = nh / nkv;       // query heads per key/value head
  const int64_t pos_stride = nkv * hd;  // floats between two positions of a block
  for (int64_t d = begin; d < end; ++d) {
    const int64_t len = a.lens[d];
    const int64_t* table = a.tables + d * a.table_stride;
    const float* q = a.q + a.rows[d] * a.q_row_stride;
    float* out = a.out + a.rows[d] * nh * hd;
    // Scores of head h at position j: scores[h * len + j].
    for (int64_t j = 0; j < len; ++j) {
      const float* k = a.k_blocks + (table[j / bs] * bs + j % bs) * pos_stride;
      for (int64_t h = 0; h < nh; ++h) {
        scores[h * len + j] = Dot(q + h * hd, k + (h / group) * hd, hd) * a.scale;
      }
    }
    // Softmax per head, normalised before the weighted sum (as softmax(...) @ v is).
    for (int64_t h = 0; h < nh; ++h) {
      float* s = scores + h * len;
      float m = s[0];
      for (int64_t j = 1; j < len; ++j) m = std::max(m, s[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < len; ++j) s[j] *= inv;
    }
    std::fill(out, out + nh * hd, 0.0f);
    for (int64_t j = 0; j < len; ++j) {
      const float* v = a.v_blocks + (table[j / bs] * bs + j % bs) * pos_stride;
      for (int64_t h = 0; h < nh; ++h)
        Axpy(scores[h * len + j], v + (h / group) * hd, out + h * hd, hd);
    }
  }
}

// Columns [c0, c1) (at most kNormCols) of RmsNormColumns. Each column's sum of squares runs
// over the features in order; the columns are the vector lanes.
constexpr int64_t kNormCols = 16;
GYRE_INLINE void RmsNormColumnBlockBody(const float* x, const float* w, int64_t features,
                                        int64_t cols, int64_t c0, int64_t c1, float eps,
                                        float* out) {
  const int64_t n = c1 - c0;
  float ss[kNormCols] = {};
  for (int64_t f = 0; f < features; ++f) {
    const float* row = x + f * cols + c0;
    for (int64_t c = 0; c < n; ++c) ss[c] += row[c] * row[c];
  }
  float r[kNormCols];
  for (int64_t c = 0; c < n; ++c) {
    r[c] = 1.0f / std::sqrt(ss[c] / static_cast<float>(features) + eps);
  }
  for (int64_t f = 0; f < features; ++f) {
    const float* row = x + f * cols + c0;
    float* o = out + f * cols + c0;
    const float wf = w[f];
    for (int64_t c = 0; c < n; ++c) o[c] = (row[c] * r[c]) * wf;
  }
}

// Columns [c0, c1) of RopeStore; `tmp` holds head_dim floats.
GYRE_INLINE void RopeStoreColumnsBody(const RopeStoreArgs& a, int64_t c0, int64_t c1, float* tmp) {
  const int64_t hd = a.head_dim, half = hd / 2, nh = a.num_heads, nkv = a.kv_heads;
  const int64_t cols = a.cols;
  const float eps = static_cast<float>(a.eps);
  for (int64_t c = c0; c < c1; ++c) {
    const float* cos = a.cos + c * hd;
    const float* sin = a.sin + c * hd;
    const int64_t slot = a.slots[c];
    for (int64_t h = 0; h < nh + 2 * nkv; ++h) {
      const bool is_q = h < nh, is_k = !is_q && h < nh + nkv;
      const int64_t local = is_q ? h : is_k ? h - nh : h - nh - nkv;  // head within its kind
      const float* bias = is_q ? a.q_bias : is_k ? a.k_bias : a.v_bias;
      const float* src = a.qkv + h * hd * cols + c;
      for (int64_t i = 0; i < hd; ++i) tmp[i] = src[i * cols];
      if (bias != nullptr) {
        for (int64_t i = 0; i < hd; ++i) tmp[i] += bias[local * hd + i];
      }
      if (!is_q && !is_k) {
        float* v = a.v_cache + (slot * nkv + local) * hd;
        for (int64_t i = 0; i < hd; ++i) v[i] = tmp[i];
        continue;
      }
      const float* norm = is_q ? a.q_norm : a.k_norm;
      if (norm != nullptr) {
        float ss = 0.0f;
        for (int64_t i = 0; i < hd; ++i) ss += tmp[i] * tmp[i];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
        for (int64_t i = 0; i < hd; ++i) tmp[i] = (tmp[i] * r) * norm[i];
      }
      float* dst = is_q ? a.q_out + (c * nh + local) * hd : a.k_cache + (slot * nkv + local) * hd;
      for (int64_t i = 0; i < half; ++i) dst[i] = tmp[i] * cos[i] + (-tmp[i + half]) * sin[i];
      for (int64_t i = half; i < hd; ++i) dst[i] = tmp[i] * cos[i] + tmp[i - half] * sin[i];
    }
  }
}

GYRE_DISPATCH(AttendTasks,
              (const PagedDecodeAttentionArgs& a, int64_t begin, int64_t end, float* scores),
              (a, begin, end, scores))
GYRE_DISPATCH(RmsNormColumnBlock,
              (const float* x, const float* w, int64_t features, int64_t cols, int64_t c0,
               int64_t c1, float eps, float* out),
              (x, w, features, cols, c0, c1, eps, out))
GYRE_DISPATCH(RopeStoreColumns, (const RopeStoreArgs& a, int64_t c0, int64_t c1, float* tmp),
              (a, c0, c1, tmp))

}  // namespace

void PagedDecodeAttention(const PagedDecodeAttentionArgs& a) {
  if (a.num_seqs <= 0) return;
  const int64_t max_len = *std::max_element(a.lens, a.lens + a.num_seqs);
  at::parallel_for(0, a.num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(a.num_heads * max_len));
    AttendTasks(a, begin, end, scores.data());
  });
}

void RmsNormColumns(const float* x, const float* w, int64_t features, int64_t cols, double eps,
                    float* out) {
  const int64_t blocks = (cols + kNormCols - 1) / kNormCols;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      RmsNormColumnBlock(x, w, features, cols, b * kNormCols, std::min(cols, (b + 1) * kNormCols),
                         static_cast<float>(eps), out);
    }
  });
}

void RopeStore(const RopeStoreArgs& a) {
  at::parallel_for(0, a.cols, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> tmp(static_cast<size_t>(a.head_dim));
    RopeStoreColumns(a, begin, end, tmp.data());
  });
}

}  // namespace gyre::model
