#include "model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "common/check.h"

namespace gyre::model {

ModelSpec SpecFromConfig(const ModelSection& s, int64_t vocab_size) {
  ModelSpec spec;
  spec.vocab_size = vocab_size;
  spec.hidden_size = s.hidden_size;
  spec.num_layers = s.num_layers;
  spec.num_heads = s.num_heads;
  spec.num_kv_heads = s.num_kv_heads;
  spec.head_dim = s.hidden_size / s.num_heads;
  spec.intermediate_size = s.intermediate_size;
  spec.max_seq_len = s.max_seq_len;
  spec.rope_theta = s.rope_theta;
  spec.rms_norm_eps = s.rms_norm_eps;
  spec.tie_embeddings = s.tie_embeddings;
  return spec;
}

at::Tensor RopeInverseFrequencies(const ModelSpec& spec) {
  // As Hugging Face computes them: float32 exponents, then the optional llama3 rescaling.
  const int64_t hd = spec.head_dim;
  at::Tensor exponents = at::arange(0, hd, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
                         static_cast<double>(hd);
  at::Tensor inv_freq = 1.0 / at::pow(spec.rope_theta, exponents);
  if (spec.rope_type == "llama3") {
    const double factor = spec.rope_factor;
    const double low = spec.rope_low_freq_factor, high = spec.rope_high_freq_factor;
    const double old_len = static_cast<double>(spec.rope_original_max_position);
    const double low_freq_wavelen = old_len / low, high_freq_wavelen = old_len / high;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
    at::Tensor smooth = (old_len / wavelen - low) / (high - low);
    at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  return inv_freq;
}

namespace {

struct Layer {
  at::Tensor input_norm, q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias;
  at::Tensor q_norm, k_norm, post_norm, gate_proj, up_proj, down_proj;
};

}  // namespace

struct Transformer::Impl {
  ModelSpec spec;
  at::Tensor embed;
  std::vector<Layer> layers;
  at::Tensor final_norm;
  at::Tensor lm_head;   // undefined when tied
  at::Tensor inv_freq;  // [head_dim / 2], float32

  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w) const {
    // HF numerics: normalise in float32, then scale by the weight.
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor var = xf.pow(2).mean({-1}, /*keepdim=*/true);
    return (xf * at::rsqrt(var + spec.rms_norm_eps)).to(x.scalar_type()) * w;
  }

  // cos/sin for positions [B, T] -> [B, 1, T, head_dim].
  std::pair<at::Tensor, at::Tensor> Rope(const at::Tensor& positions) const {
    at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});
    at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);
    return {emb.cos(), emb.sin()};
  }

  static at::Tensor RotateHalf(const at::Tensor& x) {
    int64_t half = x.size(-1) / 2;
    return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }

  // x [B, T, H]; mask: bool [B, 1, T, S] or undefined (then causal over T).
  at::Tensor Attention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& mask, KvCache* cache,
                       int layer_index) const {
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t nh = spec.num_heads, nkv = spec.num_kv_heads, hd = spec.head_dim;
    at::Tensor q = at::linear(x, l.q_proj, l.q_bias).view({B, T, nh, hd}).transpose(1, 2);
    at::Tensor k = at::linear(x, l.k_proj, l.k_bias).view({B, T, nkv, hd}).transpose(1, 2);
    at::Tensor v = at::linear(x, l.v_proj, l.v_bias).view({B, T, nkv, hd}).transpose(1, 2);
    if (spec.qk_norm) {
      q = RmsNorm(q, l.q_norm);
      k = RmsNorm(k, l.k_norm);
    }
    q = q * cos + RotateHalf(q) * sin;
    k = k * cos + RotateHalf(k) * sin;
    if (cache != nullptr) {
      const int64_t start = cache->length;
      cache->k[layer_index].narrow(2, start, T).copy_(k);
      cache->v[layer_index].narrow(2, start, T).copy_(v);
      k = cache->k[layer_index].narrow(2, 0, start + T);
      v = cache->v[layer_index].narrow(2, 0, start + T);
    }
    if (nkv != nh) {
      k = k.repeat_interleave(nh / nkv, 1);
      v = v.repeat_interleave(nh / nkv, 1);
    }
    at::Tensor out;
    if (mask.defined()) {
      out = at::scaled_dot_product_attention(q, k, v, mask);
    } else {
      out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    }
    out = out.transpose(1, 2).reshape({B, T, nh * hd});
    return at::linear(out, l.o_proj);
  }

  at::Tensor Run(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& mask,
                 KvCache* cache) const {
    at::Tensor h = at::embedding(embed, tokens);
    auto [cos, sin] = Rope(positions);
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      h = h + Attention(l, RmsNorm(h, l.input_norm), cos, sin, mask, cache, static_cast<int>(i));
      at::Tensor y = RmsNorm(h, l.post_norm);
      h = h +
          at::linear(at::silu(at::linear(y, l.gate_proj)) * at::linear(y, l.up_proj), l.down_proj);
    }
    h = RmsNorm(h, final_norm);
    return at::linear(h, spec.tie_embeddings ? embed : lm_head).to(at::kFloat);
  }
};

Transformer::Transformer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Transformer::~Transformer() = default;

const ModelSpec& Transformer::spec() const { return impl_->spec; }

std::unique_ptr<Transformer> Transformer::Create(const ModelSpec& spec, uint64_t seed,
                                                 double init_std) {
  GYRE_CHECK(spec.vocab_size > 0 && spec.num_heads % spec.num_kv_heads == 0) << "bad spec";
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto normal = [&](std::vector<int64_t> shape) {
    at::Tensor t = at::empty(shape, opts);
    if (init_std >= 0) t.normal_(0.0, init_std, gen);
    return t.set_requires_grad(true);
  };
  auto ones = [&](int64_t n) { return at::ones({n}, opts).set_requires_grad(true); };
  auto zeros = [&](int64_t n) { return at::zeros({n}, opts).set_requires_grad(true); };
  const int64_t H = spec.hidden_size, hd = spec.head_dim;
  const int64_t q_out = spec.num_heads * hd, kv_out = spec.num_kv_heads * hd;
  impl->embed = normal({spec.vocab_size, H});
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    Layer l;
    l.input_norm = ones(H);
    l.q_proj = normal({q_out, H});
    l.k_proj = normal({kv_out, H});
    l.v_proj = normal({kv_out, H});
    l.o_proj = normal({H, q_out});
    if (spec.attention_bias) {
      l.q_bias = zeros(q_out);
      l.k_bias = zeros(kv_out);
      l.v_bias = zeros(kv_out);
    }
    if (spec.qk_norm) {
      l.q_norm = ones(hd);
      l.k_norm = ones(hd);
    }
    l.post_norm = ones(H);
    l.gate_proj = normal({spec.intermediate_size, H});
    l.up_proj = normal({spec.intermediate_size, H});
    l.down_proj = normal({H, spec.intermediate_size});
    impl->layers.push_back(std::move(l));
  }
  impl->final_norm = ones(H);
  if (!spec.tie_embeddings) impl->lm_head = normal({spec.vocab_size, H});
  impl->inv_freq = RopeInverseFrequencies(spec);
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

at::Tensor Transformer::Forward(const at::Tensor& tokens) const {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  at::Tensor positions =
      at::arange(T, tokens.options().dtype(at::kLong)).unsqueeze(0).expand({B, T});
  return impl_->Run(tokens, positions, at::Tensor(), nullptr);
}

KvCache Transformer::NewCache(int64_t batch, int64_t capacity) const {
  const ModelSpec& s = impl_->spec;
  KvCache cache;
  auto opts = impl_->embed.options().requires_grad(false);
  for (int64_t i = 0; i < s.num_layers; ++i) {
    cache.k.push_back(at::zeros({batch, s.num_kv_heads, capacity, s.head_dim}, opts));
    cache.v.push_back(at::zeros({batch, s.num_kv_heads, capacity, s.head_dim}, opts));
  }
  cache.valid = at::zeros({batch, capacity}, opts.dtype(at::kBool));
  cache.capacity = capacity;
  return cache;
}

at::Tensor Transformer::ForwardCached(const at::Tensor& tokens, const at::Tensor& positions,
                                      const at::Tensor& valid, KvCache* cache) const {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const int64_t start = cache->length, S = start + T;
  GYRE_CHECK(S <= cache->capacity) << "KV cache overflow: " << S << " > " << cache->capacity;
  cache->valid.narrow(1, start, T).copy_(valid);
  // mask[b, 0, t, s] = (s <= start + t && valid[b, s]) || s == start + t
  auto lopts = tokens.options().dtype(at::kLong);
  at::Tensor q_idx = at::arange(start, S, lopts).view({1, 1, T, 1});
  at::Tensor k_idx = at::arange(0, S, lopts).view({1, 1, 1, S});
  at::Tensor key_valid = cache->valid.narrow(1, 0, S).view({B, 1, 1, S});
  at::Tensor mask = ((k_idx <= q_idx) & key_valid) | (k_idx == q_idx);
  at::Tensor logits = impl_->Run(tokens, positions, mask, cache);
  cache->length = S;
  return logits;
}

NamedTensors Transformer::NamedParameters() const {
  NamedTensors out;
  out.emplace_back("model.embed_tokens.weight", impl_->embed);
  for (size_t i = 0; i < impl_->layers.size(); ++i) {
    const Layer& l = impl_->layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.emplace_back(p + "input_layernorm.weight", l.input_norm);
    out.emplace_back(p + "self_attn.q_proj.weight", l.q_proj);
    if (l.q_bias.defined()) out.emplace_back(p + "self_attn.q_proj.bias", l.q_bias);
    out.emplace_back(p + "self_attn.k_proj.weight", l.k_proj);
    if (l.k_bias.defined()) out.emplace_back(p + "self_attn.k_proj.bias", l.k_bias);
    out.emplace_back(p + "self_attn.v_proj.weight", l.v_proj);
    if (l.v_bias.defined()) out.emplace_back(p + "self_attn.v_proj.bias", l.v_bias);
    out.emplace_back(p + "self_attn.o_proj.weight", l.o_proj);
    if (l.q_norm.defined()) out.emplace_back(p + "self_attn.q_norm.weight", l.q_norm);
    if (l.k_norm.defined()) out.emplace_back(p + "self_attn.k_norm.weight", l.k_norm);
    out.emplace_back(p + "post_attention_layernorm.weight", l.post_norm);
    out.emplace_back(p + "mlp.gate_proj.weight", l.gate_proj);
    out.emplace_back(p + "mlp.up_proj.weight", l.up_proj);
    out.emplace_back(p + "mlp.down_proj.weight", l.down_proj);
  }
  out.emplace_back("model.norm.weight", impl_->final_norm);
  if (impl_->lm_head.defined()) out.emplace_back("lm_head.weight", impl_->lm_head);
  return out;
}

int64_t Transformer::NumParameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : NamedParameters()) n += t.numel();
  return n;
}

}  // namespace gyre::model
