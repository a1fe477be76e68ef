#include "model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/check.h"
#include "model/cpu_decode.h"
#include "model/cpu_gemm.h"
#include "model/tensor_parallel.h"

namespace gyre::model {

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

// A decoder layer's parameters as `spec` defines them, in NamedParameters() order: the name after
// "model.layers.N.", the member and the shape.
struct LayerField {
  const char* name;
  at::Tensor Layer::*member;
  std::vector<int64_t> shape;
};
std::vector<LayerField> LayerFields(const ModelSpec& s) {
  const int64_t H = s.hidden_size, hd = s.head_dim, I = s.intermediate_size;
  const int64_t q_out = s.num_heads * hd, kv_out = s.num_kv_heads * hd;
  std::vector<LayerField> f = {{"input_layernorm.weight", &Layer::input_norm, {H}},
                               {"self_attn.q_proj.weight", &Layer::q_proj, {q_out, H}}};
  if (s.attention_bias) f.push_back({"self_attn.q_proj.bias", &Layer::q_bias, {q_out}});
  f.push_back({"self_attn.k_proj.weight", &Layer::k_proj, {kv_out, H}});
  if (s.attention_bias) f.push_back({"self_attn.k_proj.bias", &Layer::k_bias, {kv_out}});
  f.push_back({"self_attn.v_proj.weight", &Layer::v_proj, {kv_out, H}});
  if (s.attention_bias) f.push_back({"self_attn.v_proj.bias", &Layer::v_bias, {kv_out}});
  f.push_back({"self_attn.o_proj.weight", &Layer::o_proj, {H, q_out}});
  if (s.qk_norm) {
    f.push_back({"self_attn.q_norm.weight", &Layer::q_norm, {hd}});
    f.push_back({"self_attn.k_norm.weight", &Layer::k_norm, {hd}});
  }
  f.push_back({"post_attention_layernorm.weight", &Layer::post_norm, {H}});
  f.push_back({"mlp.gate_proj.weight", &Layer::gate_proj, {I, H}});
  f.push_back({"mlp.up_proj.weight", &Layer::up_proj, {I, H}});
  f.push_back({"mlp.down_proj.weight", &Layer::down_proj, {H, I}});
  return f;
}

std::string LayerPrefix(size_t i) { return "model.layers." + std::to_string(i) + "."; }

}  // namespace

int64_t ParameterUnit::numel() const {
  int64_t n = 0;
  for (const auto& shape : shapes) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    n += k;
  }
  return n;
}

std::vector<ParameterUnit> ParameterUnits(const ModelSpec& spec) {
  std::vector<ParameterUnit> units;
  units.push_back({{"model.embed_tokens.weight"}, {{spec.vocab_size, spec.hidden_size}}});
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    ParameterUnit u;
    for (const LayerField& f : LayerFields(spec)) {
      u.names.push_back(LayerPrefix(static_cast<size_t>(i)) + f.name);
      u.shapes.push_back(f.shape);
    }
    units.push_back(std::move(u));
  }
  ParameterUnit head{{"model.norm.weight"}, {{spec.hidden_size}}};
  if (!spec.tie_embeddings) {
    head.names.push_back("lm_head.weight");
    head.shapes.push_back({spec.vocab_size, spec.hidden_size});
  }
  units.push_back(std::move(head));
  return units;
}

std::vector<ParameterUnit> TensorParallelUnits(const ModelSpec& spec, int rank, int size) {
  std::vector<ParameterUnit> units = ParameterUnits(spec);
  if (size <= 1) return units;
  for (ParameterUnit& u : units) {
    for (size_t i = 0; i < u.names.size(); ++i) {
      const int dim = TensorParallelDim(u.names[i]);
      if (dim < 0) continue;
      const auto [begin, end] = TensorParallelRange(u.names[i], u.shapes[i][dim], rank, size);
      u.shapes[i][dim] = end - begin;
    }
  }
  return units;
}

struct Transformer::Impl {
  ModelSpec spec;
  at::Tensor embed;
  std::vector<Layer> layers;
  at::Tensor final_norm;
  at::Tensor lm_head;                // undefined when tied
  at::Tensor inv_freq;               // [head_dim / 2], float32
  bool checkpoint_layers = false;    // SetActivationCheckpointing
  bool feature_major_decode = true;  // SetFeatureMajorDecode
  // Transformer::Gathered: the parameters come from here, unit by unit (the tensors above are
  // undefined), computed in gather_dtype on gather_device.
  ParameterGather* gather = nullptr;
  at::ScalarType gather_dtype = at::kFloat;
  at::Device gather_device = at::kCPU;
  // Transformer::TensorParallelSlice: this rank's slices (tensor_parallel.h) and the first
  // vocabulary row it holds.
  TensorParallelGroup* tp = nullptr;
  int64_t vocab_begin = 0;

  int TpSize() const { return tp != nullptr ? tp->size() : 1; }
  // This rank's query and key/value heads.
  int64_t Heads() const { return spec.num_heads / TpSize(); }
  int64_t KvHeads() const { return spec.num_kv_heads / TpSize(); }
  at::Tensor TpCopy(const at::Tensor& x) const { return TensorParallelCopy(x, tp); }
  // The embedding lookup: with tensor parallelism, the tokens of this rank's vocabulary rows
  // (zeros for the others), summed over the ranks.
  at::Tensor Embed(const at::Tensor& weight, const at::Tensor& tokens) const {
    if (tp == nullptr) return at::embedding(weight, tokens);
    const at::Tensor local = tokens - vocab_begin;
    const at::Tensor mine = (local >= 0) & (local < weight.size(0));
    const at::Tensor rows = at::embedding(weight, at::where(mine, local, at::zeros_like(local)));
    return TpReduce(rows * mine.unsqueeze(-1).to(weight.scalar_type()));
  }
  at::Tensor TpReduce(const at::Tensor& x) const { return TensorParallelReduce(x, tp); }

  at::ScalarType ComputeType() const { return gather ? gather_dtype : embed.scalar_type(); }

  // Decoder layer `index` from a gathered unit (ParameterUnits order).
  Layer LayerOf(const std::vector<at::Tensor>& params) const {
    const std::vector<LayerField> fields = LayerFields(spec);
    GYRE_CHECK(params.size() == fields.size())
        << "a decoder layer unit of " << params.size() << " tensors, expected " << fields.size();
    Layer l;
    for (size_t k = 0; k < fields.size(); ++k) l.*(fields[k].member) = params[k];
    return l;
  }

  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w) const {
    // HF numerics: normalise in float32, then scale by the weight.
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor var = xf.pow(2).mean({-1}, /*keepdim=*/true);
    return (xf * at::rsqrt(var + spec.rms_norm_eps)).to(x.scalar_type()) * w;
  }

  // cos/sin for positions [B, T] -> [B, 1, T, head_dim], computed in float32 and handed out in
  // the model's dtype (as Hugging Face does), so q and k keep that dtype.
  std::pair<at::Tensor, at::Tensor> Rope(const at::Tensor& positions) const {
    at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});
    at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);
    const at::ScalarType type = ComputeType();
    return {emb.cos().to(type), emb.sin().to(type)};
  }

  // Every parameter, for walking them all (inv_freq is not one).
  std::vector<at::Tensor*> Parameters() {
    std::vector<at::Tensor*> out = {&embed};
    for (Layer& l : layers) {
      for (at::Tensor* t : {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_bias,
                            &l.k_bias, &l.v_bias, &l.q_norm, &l.k_norm, &l.post_norm, &l.gate_proj,
                            &l.up_proj, &l.down_proj}) {
        out.push_back(t);
      }
    }
    out.push_back(&final_norm);
    out.push_back(&lm_head);
    return out;
  }

  static at::Tensor RotateHalf(const at::Tensor& x) {
    int64_t half = x.size(-1) / 2;
    return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }

  // Inference matmuls on the CPU (the paged engine's forward, never differentiated). With a few
  // dozen rows, MKL spends a large part of a y = x W^T call copying the weight W into its packed
  // layout, on every call. Computing y^T = W x^T makes W the streamed operand and packs only the
  // small x^T: 1.2-2.5x faster per matmul at 64 rows on SmolLM2's shapes (docs/rollout.md).
  // Small weights (the tiny test models) keep at::linear: their calls are per-op overhead. So do
  // calls of fewer than 16 rows: from 12 rows up MKL computes every output of W x^T with the same
  // sums as the trainer's at::linear over a whole packed batch (bit for bit on this project's
  // hosts), below that it picks other kernels; at::linear keeps the rollout-vs-trainer log-prob
  // gap of float32 at zero there as before (docs/models.md).
  static bool WeightsLeft(const at::Tensor& x, const at::Tensor& w) {
    return x.is_cpu() && w.numel() >= (int64_t{1} << 16) && x.dim() >= 1 &&
           x.numel() >= 16 * x.size(-1);
  }
  // at::linear(x, w, b) for x [..., in], through W x^T when WeightsLeft.
  static at::Tensor InferLinear(const at::Tensor& x, const at::Tensor& w,
                                const at::Tensor& b = at::Tensor()) {
    if (!WeightsLeft(x, w)) return at::linear(x, w, b);
    at::Tensor xt = x.reshape({-1, x.size(-1)}).t().contiguous();
    at::Tensor yt = b.defined() ? at::addmm(b.unsqueeze(1), w, xt) : at::mm(w, xt);
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return yt.t().contiguous().view(sizes);
  }
  // The MLP for inference: feature-major ([features, rows]) between the input and the output,
  // so the three matmuls need one transpose in; the result is a transposed view.
  static at::Tensor InferMlp(const Layer& l, const at::Tensor& y) {
    if (!WeightsLeft(y, l.gate_proj)) {
      return at::linear(at::silu(at::linear(y, l.gate_proj)) * at::linear(y, l.up_proj),
                        l.down_proj);
    }
    at::Tensor xt = y.reshape({-1, y.size(-1)}).t().contiguous();
    at::Tensor a = at::silu(at::mm(l.gate_proj, xt)).mul_(at::mm(l.up_proj, xt));
    return at::mm(l.down_proj, a).t().reshape(y.sizes());
  }

  // x [B, T, H] -> q [B, nh, T, hd], k and v [B, nkv, T, hd], with q/k norm and RoPE applied.
  // infer: the paged engine's forward (InferLinear).
  struct Qkv {
    at::Tensor q, k, v;
  };
  Qkv Project(const Layer& l, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
              bool infer = false) const {
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t nh = Heads(), nkv = KvHeads(), hd = spec.head_dim;
    auto linear = [&](const at::Tensor& w, const at::Tensor& b) {
      return infer ? InferLinear(x, w, b) : at::linear(x, w, b);
    };
    at::Tensor q = linear(l.q_proj, l.q_bias).view({B, T, nh, hd}).transpose(1, 2);
    at::Tensor k = linear(l.k_proj, l.k_bias).view({B, T, nkv, hd}).transpose(1, 2);
    at::Tensor v = linear(l.v_proj, l.v_bias).view({B, T, nkv, hd}).transpose(1, 2);
    if (spec.qk_norm) {  // (replicated weights inside the rank's heads: TpCopy)
      q = RmsNorm(q, TpCopy(l.q_norm));
      k = RmsNorm(k, TpCopy(l.k_norm));
    }
    q = q * cos + RotateHalf(q) * sin;
    k = k * cos + RotateHalf(k) * sin;
    return {q, k, v};
  }

  // x [B, T, H]; mask: bool [B, 1, T, S] or undefined (then causal over T).
  at::Tensor Attention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& mask, KvCache* cache,
                       int layer_index) const {
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t nh = Heads(), nkv = KvHeads(), hd = spec.head_dim;
    auto [q, k, v] = Project(l, x, cos, sin);
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
    return TpReduce(at::linear(out, l.o_proj));
  }

  // One decoder layer: h [B, T, H] -> h [B, T, H].
  at::Tensor DecoderLayer(const Layer& l, const at::Tensor& h_in, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& mask, KvCache* cache,
                          int layer_index) const {
    at::Tensor h = h_in + Attention(l, TpCopy(RmsNorm(h_in, l.input_norm)), cos, sin, mask, cache,
                                    layer_index);
    at::Tensor y = TpCopy(RmsNorm(h, l.post_norm));
    return h + TpReduce(at::linear(at::silu(at::linear(y, l.gate_proj)) * at::linear(y, l.up_proj),
                                   l.down_proj));
  }

  // DecoderLayer(layer) of layer `index` through LayerCheckpoint (defined below Impl).
  static at::Tensor CheckpointedLayer(const std::shared_ptr<const Impl>& self, const Layer& layer,
                                      size_t index, const at::Tensor& h, const at::Tensor& cos,
                                      const at::Tensor& sin, const at::Tensor& mask);

  // select: undefined, or int64 [N] flat indices into [B * T] of the positions whose logits are
  // returned ([N, V] instead of [B, T, V]); the final norm and LM head run on those only.
  // hidden_only: return the final-normed hidden states, without the LM head.
  // head_weight: when not null, receives the LM head weight the call used (or would have used,
  // with hidden_only).
  at::Tensor Run(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& mask,
                 KvCache* cache, const at::Tensor& select = at::Tensor(), bool hidden_only = false,
                 at::Tensor* head_weight = nullptr) const {
    GYRE_CHECK(gather == nullptr || cache == nullptr) << "a gathered model runs no KV cache";
    at::Tensor h;
    if (gather != nullptr) {
      h = Embed(gather->Acquire(0).at(0), tokens);
      gather->Release(0, at::Tensor());  // the lookup's backward needs no weight
    } else {
      h = Embed(embed, tokens);
    }
    auto [cos, sin] = Rope(positions);
    const bool checkpoint = checkpoint_layers && cache == nullptr && at::GradMode::is_enabled();
    std::shared_ptr<const Impl> self;  // what the checkpointed layers recompute with
    if (checkpoint) self = std::make_shared<const Impl>(*this);
    for (size_t i = 0; i < layers.size(); ++i) {
      const int unit = static_cast<int>(i) + 1;
      const Layer layer = gather != nullptr ? LayerOf(gather->Acquire(unit)) : layers[i];
      if (checkpoint) {
        h = CheckpointedLayer(self, layer, i, h, cos, sin, mask);
      } else {
        h = DecoderLayer(layer, h, cos, sin, mask, cache, static_cast<int>(i));
      }
      if (gather != nullptr) gather->Release(unit, h.requires_grad() ? h : at::Tensor());
    }
    at::Tensor norm = final_norm;
    at::Tensor head = spec.tie_embeddings ? embed : lm_head;
    if (gather != nullptr) {
      const std::vector<at::Tensor> last = gather->Acquire(static_cast<int>(layers.size()) + 1);
      norm = last.at(0);
      head = spec.tie_embeddings ? gather->Acquire(0).at(0) : last.at(1);
    }
    if (head_weight != nullptr) *head_weight = head;
    if (select.defined()) h = h.reshape({-1, h.size(-1)}).index_select(0, select);
    h = TpCopy(RmsNorm(h, norm));  // (tensor parallel: the LM head's rows are this rank's)
    if (hidden_only) return h;
    return at::linear(h, head).to(at::kFloat);
  }

  // Decoding sequences of similar context length, attended together (see ForwardPaged).
  struct DecodeBucket {
    at::Tensor rows;    // int64 [D]: their rows among the N new tokens
    at::Tensor tables;  // int64 [D, blocks]
    at::Tensor mask;    // bool [D, 1, 1, blocks * block_size]: position < context length
    at::Tensor lens;    // int64 [D] context lengths on the host, or undefined (then SDPA)
  };

  // Paged attention for the flattened batch x [1, N, H]: projections, the new keys and values
  // into the cache, AttendPaged, the output projection.
  at::Tensor PagedAttention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const PagedBatch& b,
                            const std::vector<DecodeBucket>& buckets, PagedKvCache* cache,
                            int layer_index) const {
    const int64_t nkv = KvHeads(), hd = spec.head_dim;
    auto [q4, k4, v4] = Project(l, x, cos, sin, /*infer=*/true);
    at::Tensor q = q4.squeeze(0).transpose(0, 1);  // [N, nh, hd]
    at::Tensor k = k4.squeeze(0).transpose(0, 1);  // [N, nkv, hd]
    at::Tensor v = v4.squeeze(0).transpose(0, 1);
    const at::Tensor& k_blocks = cache->k[layer_index];  // [num_blocks, bs, nkv, hd]
    const at::Tensor& v_blocks = cache->v[layer_index];
    k_blocks.view({-1, nkv, hd}).index_copy_(0, b.slots, k.contiguous());
    v_blocks.view({-1, nkv, hd}).index_copy_(0, b.slots, v.contiguous());
    return TpReduce(
        InferLinear(AttendPaged(q, b, buckets, *cache, layer_index).unsqueeze(0), l.o_proj));
  }

  // Attention of the N new queries q [N, nh, hd] (their keys and values already in the cache)
  // -> [N, nh * hd]: each bucket of decoding sequences in one call, each prefill chunk in its own.
  at::Tensor AttendPaged(const at::Tensor& q, const PagedBatch& b,
                         const std::vector<DecodeBucket>& buckets, const PagedKvCache& cache,
                         int layer_index) const {
    const int64_t N = q.size(0);
    const int64_t nh = Heads(), nkv = KvHeads(), hd = spec.head_dim;
    const int64_t bs = cache.block_size;
    const at::Tensor& k_blocks = cache.k[layer_index];  // [num_blocks, bs, nkv, hd]
    const at::Tensor& v_blocks = cache.v[layer_index];
    at::Tensor out = at::empty({N, nh * hd}, q.options());
    const bool direct = q.is_cpu() && q.scalar_type() == at::kFloat && k_blocks.is_contiguous() &&
                        v_blocks.is_contiguous();
    at::Tensor q_rows;  // [N, nh * hd] contiguous, for the direct kernel
    if (direct) q_rows = q.reshape({N, nh * hd}).contiguous();
    for (const DecodeBucket& d : buckets) {
      if (direct && d.lens.defined()) {
        // Straight from the cache blocks, no gather (cpu_decode.h).
        PagedDecodeAttentionArgs a;
        a.rows = d.rows.data_ptr<int64_t>();
        a.q = q_rows.data_ptr<float>();
        a.q_row_stride = nh * hd;
        a.k_blocks = k_blocks.data_ptr<float>();
        a.v_blocks = v_blocks.data_ptr<float>();
        a.tables = d.tables.data_ptr<int64_t>();
        a.table_stride = d.tables.size(1);
        a.lens = d.lens.data_ptr<int64_t>();
        a.out = out.data_ptr<float>();
        a.num_seqs = d.rows.size(0);
        a.num_heads = nh;
        a.kv_heads = nkv;
        a.head_dim = hd;
        a.block_size = bs;
        a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
        PagedDecodeAttention(a);
        continue;
      }
      const int64_t D = d.tables.size(0), S = d.tables.size(1) * bs;
      at::Tensor flat = d.tables.reshape({-1});
      at::Tensor kd = k_blocks.index_select(0, flat).view({D, S, nkv, hd}).transpose(1, 2);
      at::Tensor vd = v_blocks.index_select(0, flat).view({D, S, nkv, hd}).transpose(1, 2);
      at::Tensor qd = q.index_select(0, d.rows).unsqueeze(2);  // [D, nh, 1, hd]
      at::Tensor od = at::scaled_dot_product_attention(qd, kd, vd, d.mask, 0.0, false, std::nullopt,
                                                       /*enable_gqa=*/true);
      out.index_copy_(0, d.rows, od.reshape({D, nh * hd}));
    }
    int64_t start = 0;
    for (size_t i = 0; i < b.query_lens.size(); ++i) {
      const int64_t T = b.query_lens[i], C = b.context_lens[i];
      if (T > 1) {
        const int64_t nblk = (C + bs - 1) / bs;
        at::Tensor table = b.block_tables[static_cast<int64_t>(i)].narrow(0, 0, nblk);
        auto gather = [&](const at::Tensor& blocks) {  // -> [1, nkv, C, hd]
          return blocks.index_select(0, table)
              .view({nblk * bs, nkv, hd})
              .narrow(0, 0, C)
              .transpose(0, 1)
              .unsqueeze(0);
        };
        at::Tensor ks = gather(k_blocks), vs = gather(v_blocks);
        at::Tensor qs = q.narrow(0, start, T).transpose(0, 1).unsqueeze(0);  // [1, nh, T, hd]
        at::Tensor o;
        if (C == T) {
          o = at::scaled_dot_product_attention(qs, ks, vs, {}, 0.0, /*is_causal=*/true,
                                               std::nullopt, /*enable_gqa=*/true);
        } else {
          auto lopts = b.slots.options();
          at::Tensor q_idx = at::arange(C - T, C, lopts).view({T, 1});
          at::Tensor k_idx = at::arange(0, C, lopts).view({1, C});
          o = at::scaled_dot_product_attention(qs, ks, vs, (k_idx <= q_idx).view({1, 1, T, C}), 0.0,
                                               false, std::nullopt, /*enable_gqa=*/true);
        }
        out.narrow(0, start, T).copy_(o.squeeze(0).transpose(0, 1).reshape({T, nh * hd}));
      }
      start += T;
    }
    return out;
  }

  // PagedLayers for float32 CPU batches of at least kFeatureMajorRows rows (FeatureMajor).
  // Activations stay feature-major, h^T [H, N], so every matmul computes W x^T with the weight
  // as the streamed operand and no transposes (see InferLinear), and the norms, biases, q/k
  // norms, RoPE, cache writes and decode attention are the kernels of cpu_decode.h: about a
  // dozen calls per layer instead of some fifty small ATen ops. Returns h^T [H, N].
  static constexpr int64_t kFeatureMajorRows = 16;  // the 16-row rule of InferLinear
  bool FeatureMajor(const at::Tensor& tokens) const {
    return feature_major_decode && tp == nullptr && embed.is_cpu() &&
           embed.scalar_type() == at::kFloat && tokens.numel() >= kFeatureMajorRows &&
           !layers.empty() && layers[0].gate_proj.numel() >= (int64_t{1} << 16);
  }
  at::Tensor PagedLayersFeatureMajor(const PagedBatch& b, const std::vector<DecodeBucket>& buckets,
                                     PagedKvCache* cache) const {
    const int64_t N = b.tokens.numel(), H = spec.hidden_size;
    const int64_t nh = spec.num_heads, nkv = spec.num_kv_heads, hd = spec.head_dim;
    const int64_t fq = nh * hd, fkv = nkv * hd;
    auto opts = embed.options();
    at::Tensor h = at::embedding(embed, b.tokens).t().contiguous();  // [H, N]
    auto [cos, sin] = Rope(b.positions.view({1, N}));                // [1, 1, N, hd]
    cos = cos.contiguous();
    sin = sin.contiguous();
    at::Tensor slots = b.slots.contiguous();
    at::Tensor x = at::empty({H, N}, opts);
    at::Tensor qkv = at::empty({fq + 2 * fkv, N}, opts);
    at::Tensor q_rows = at::empty({N, nh, hd}, opts);
    at::Tensor gate = at::empty({spec.intermediate_size, N}, opts);
    at::Tensor up = at::empty({spec.intermediate_size, N}, opts);
    auto ptr = [](const at::Tensor& t) -> float* {
      if (!t.defined()) return nullptr;
      GYRE_CHECK(t.is_contiguous()) << "a norm or bias weight is not contiguous";
      return t.data_ptr<float>();
    };
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      RmsNormColumns(h.data_ptr<float>(), ptr(l.input_norm), H, N, spec.rms_norm_eps,
                     x.data_ptr<float>());
      at::Tensor q_t = qkv.narrow(0, 0, fq), k_t = qkv.narrow(0, fq, fkv);
      at::Tensor v_t = qkv.narrow(0, fq + fkv, fkv);
      LinearFeatureMajor(q_t, l.q_proj, x, false);
      LinearFeatureMajor(k_t, l.k_proj, x, false);
      LinearFeatureMajor(v_t, l.v_proj, x, false);
      const at::Tensor& k_cache = cache->k[i];
      const at::Tensor& v_cache = cache->v[i];
      GYRE_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous()) << "paged cache not dense";
      RopeStoreArgs r;
      r.qkv = qkv.data_ptr<float>();
      r.cols = N;
      r.num_heads = nh;
      r.kv_heads = nkv;
      r.head_dim = hd;
      r.q_bias = ptr(l.q_bias);
      r.k_bias = ptr(l.k_bias);
      r.v_bias = ptr(l.v_bias);
      if (spec.qk_norm) {
        r.q_norm = ptr(l.q_norm);
        r.k_norm = ptr(l.k_norm);
      }
      r.eps = spec.rms_norm_eps;
      r.cos = cos.data_ptr<float>();
      r.sin = sin.data_ptr<float>();
      r.slots = slots.data_ptr<int64_t>();
      r.q_out = q_rows.data_ptr<float>();
      r.k_cache = k_cache.data_ptr<float>();
      r.v_cache = v_cache.data_ptr<float>();
      RopeStore(r);
      at::Tensor attn_t =
          AttendPaged(q_rows, b, buckets, *cache, static_cast<int>(i)).t().contiguous();
      LinearFeatureMajor(h, l.o_proj, attn_t, true);  // h += W_o attn^T
      RmsNormColumns(h.data_ptr<float>(), ptr(l.post_norm), H, N, spec.rms_norm_eps,
                     x.data_ptr<float>());
      LinearFeatureMajor(gate, l.gate_proj, x, false);
      LinearFeatureMajor(up, l.up_proj, x, false);
      at::silu_(gate).mul_(up);
      LinearFeatureMajor(h, l.down_proj, gate, true);  // h += W_down (silu(W_gate x) * W_up x)
    }
    return h;
  }

  // out (+)= w x for float32 feature-major operands (rows of w, x and out contiguous): the
  // engine's decode matmul (cpu_gemm.h) where the CPU has one, ATen's mm otherwise.
  static void LinearFeatureMajor(const at::Tensor& out, const at::Tensor& w, const at::Tensor& x,
                                 bool accumulate) {
    if (w.stride(1) == 1 && x.stride(1) == 1 && out.stride(1) == 1) {
      CpuMatmulArgs a;
      a.w = w.data_ptr<float>();
      a.ldw = w.stride(0);
      a.x = x.data_ptr<float>();
      a.ldx = x.stride(0);
      a.out = out.data_ptr<float>();
      a.ldo = out.stride(0);
      a.n = w.size(0);
      a.k = w.size(1);
      a.cols = x.size(1);
      a.accumulate = accumulate;
      if (CpuMatmul(a)) return;
    }
    at::Tensor o = out;  // addmm_/mm_out write through this alias of the caller's tensor
    if (accumulate) {
      o.addmm_(w, x);
    } else {
      at::mm_out(o, w, x);
    }
  }

  // Final norm and LM head for feature-major hidden states h^T [H, N]: logits [rows, V] of the
  // selected columns (all of them when `rows` is undefined), in float32.
  at::Tensor LogitsFeatureMajor(const at::Tensor& h, const at::Tensor& rows) const {
    at::Tensor sel = rows.defined() ? h.index_select(1, rows) : h;
    const int64_t H = sel.size(0), R = sel.size(1);
    at::Tensor x = at::empty({H, R}, sel.options());
    RmsNormColumns(sel.data_ptr<float>(), final_norm.data_ptr<float>(), H, R, spec.rms_norm_eps,
                   x.data_ptr<float>());
    const at::Tensor& head = spec.tie_embeddings ? embed : lm_head;
    const int64_t V = head.size(0);
    at::Tensor logits = at::empty({R, V}, sel.options());
    if (head.is_contiguous()) {  // the engine's kernel writes [rows, V] directly
      CpuMatmulArgs a;
      a.w = head.data_ptr<float>();
      a.ldw = H;
      a.x = x.data_ptr<float>();
      a.ldx = R;
      a.out = logits.data_ptr<float>();
      a.ldo = V;
      a.n = V;
      a.k = H;
      a.cols = R;
      a.transpose_out = true;
      if (CpuMatmul(a)) return logits;
    }
    // Otherwise ATen's mm, in slices of the vocabulary: one call over a large head (SmolLM2: 49152
    // x 576) spends much of its time repacking the weight; slices that fit the cache run about 1.2x
    // faster, and each slice's transpose into the [rows, V] result is read while still cached.
    constexpr int64_t kSlice = 2048;
    at::Tensor part = at::empty({std::min(kSlice, V), R}, sel.options());
    for (int64_t v0 = 0; v0 < V; v0 += kSlice) {
      const int64_t n = std::min(kSlice, V - v0);
      at::Tensor p = part.narrow(0, 0, n);
      at::mm_out(p, head.narrow(0, v0, n), x);
      logits.narrow(1, v0, n).copy_(p.t());
    }
    return logits;
  }

  // Embedding and every decoder layer over the flattened batch: hidden states [1, N, H].
  at::Tensor PagedLayers(const PagedBatch& b, const std::vector<DecodeBucket>& buckets,
                         PagedKvCache* cache) const {
    const int64_t N = b.tokens.numel();
    at::Tensor h = Embed(embed, b.tokens.view({1, N}));
    auto [cos, sin] = Rope(b.positions.view({1, N}));
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      h = h + PagedAttention(l, RmsNorm(h, l.input_norm), cos, sin, b, buckets, cache,
                             static_cast<int>(i));
      h = h + TpReduce(InferMlp(l, RmsNorm(h, l.post_norm)));
    }
    return h;
  }
};

namespace {

// What a checkpointed layer needs to run again in the backward: the model (a shared shell of
// tensor handles, so it outlives the Transformer if it must), the layer, and its RoPE and mask.
struct LayerRecompute : torch::CustomClassHolder {
  std::shared_ptr<const Transformer::Impl> model;
  Layer layer;  // handles: a gathered layer's storage is gathered again before the backward
  size_t index = 0;
  at::Tensor cos, sin, mask;
  std::vector<at::Tensor> params;  // the layer's defined parameters, in LayerParams order

  at::Tensor Run(const at::Tensor& h) const {
    return model->DecoderLayer(layer, h, cos, sin, mask, nullptr, static_cast<int>(index));
  }
};

std::vector<at::Tensor> LayerParams(const Layer& l) {
  std::vector<at::Tensor> out;
  for (const at::Tensor* t :
       {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_bias, &l.k_bias, &l.v_bias,
        &l.q_norm, &l.k_norm, &l.post_norm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
    if (t->defined()) out.push_back(*t);
  }
  return out;
}

// Activation checkpointing of one decoder layer: the forward runs without a graph and keeps
// only the layer's input; the backward runs the layer again with a graph and differentiates it
// into the input and the layer's parameters (which are inputs of this function, so their
// gradients take the usual path: AccumulateGrad and its hooks, or a cast's backward to float32
// master weights).
class LayerCheckpoint : public torch::autograd::Function<LayerCheckpoint> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            const c10::intrusive_ptr<LayerRecompute>& layer,
                            at::TensorList params) {
    ctx->save_for_backward({h});
    ctx->saved_data["layer"] = at::IValue::make_capsule(layer);
    return layer->Run(h);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const auto layer =
        c10::static_intrusive_pointer_cast<LayerRecompute>(ctx->saved_data["layer"].toCapsule());
    at::AutoGradMode grad_on(true);
    const at::Tensor input = h.detach().requires_grad_(true);
    const at::Tensor out = layer->Run(input);
    std::vector<at::Tensor> wrt = {input};
    std::vector<size_t> slot;  // wrt[k + 1] is params[slot[k]]
    for (size_t k = 0; k < layer->params.size(); ++k) {
      if (layer->params[k].requires_grad()) {
        wrt.push_back(layer->params[k]);
        slot.push_back(k);
      }
    }
    const auto g = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    // One gradient per input of forward: h, the layer (none), then each parameter.
    torch::autograd::variable_list result(2 + layer->params.size());
    result[0] = g[0];
    for (size_t k = 0; k < slot.size(); ++k) result[2 + slot[k]] = g[k + 1];
    return result;
  }
};

}  // namespace

at::Tensor Transformer::Impl::CheckpointedLayer(const std::shared_ptr<const Impl>& self,
                                                const Layer& weights, size_t index,
                                                const at::Tensor& h, const at::Tensor& cos,
                                                const at::Tensor& sin, const at::Tensor& mask) {
  auto layer = c10::make_intrusive<LayerRecompute>();
  layer->model = self;
  layer->layer = weights;
  layer->index = index;
  layer->cos = cos;
  layer->sin = sin;
  layer->mask = mask;
  layer->params = LayerParams(weights);
  const std::vector<at::Tensor> params = layer->params;
  return LayerCheckpoint::apply(h, layer, at::TensorList(params));
}

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

namespace {

// mask[r, 0, q, k] = k <= q && (segments[r, k] == segments[r, q] || segments[r, k] == trunks[r, q])
at::Tensor PackedMask(const PackedBatch& batch) {
  const int64_t rows = batch.tokens.size(0), width = batch.tokens.size(1);
  GYRE_CHECK(batch.positions.sizes() == batch.tokens.sizes() &&
             batch.segments.sizes() == batch.tokens.sizes() &&
             (!batch.trunks.defined() || batch.trunks.sizes() == batch.tokens.sizes()) &&
             batch.logit_index.dim() == 1)
      << "packed batch: tokens, positions, segments and trunks must be [rows, width], "
         "logit_index [N]";
  const at::Tensor idx = at::arange(width, batch.tokens.options().dtype(at::kLong));
  const at::Tensor causal =
      (idx.view({1, width}) <= idx.view({width, 1})).view({1, 1, width, width});
  const at::Tensor keys = batch.segments.view({rows, 1, 1, width});
  at::Tensor visible = batch.segments.view({rows, 1, width, 1}) == keys;
  if (batch.trunks.defined()) visible = visible | (batch.trunks.view({rows, 1, width, 1}) == keys);
  return causal & visible;
}

}  // namespace

at::Tensor Transformer::ForwardPacked(const PackedBatch& batch) const {
  return impl_->Run(batch.tokens, batch.positions, PackedMask(batch), nullptr, batch.logit_index);
}

std::pair<at::Tensor, at::Tensor> Transformer::ForwardPackedHidden(const PackedBatch& batch) const {
  at::Tensor head;
  at::Tensor h = impl_->Run(batch.tokens, batch.positions, PackedMask(batch), nullptr,
                            batch.logit_index, /*hidden_only=*/true, &head);
  return {h, head};
}

KvCache Transformer::NewCache(int64_t batch, int64_t capacity) const {
  const ModelSpec& s = impl_->spec;
  KvCache cache;
  auto opts = impl_->embed.options().requires_grad(false);
  const int64_t nkv = impl_->KvHeads();  // (a tensor-parallel slice: its heads)
  for (int64_t i = 0; i < s.num_layers; ++i) {
    cache.k.push_back(at::zeros({batch, nkv, capacity, s.head_dim}, opts));
    cache.v.push_back(at::zeros({batch, nkv, capacity, s.head_dim}, opts));
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

PagedKvCache Transformer::NewPagedCache(int64_t num_blocks, int64_t block_size) const {
  const ModelSpec& s = impl_->spec;
  GYRE_CHECK(num_blocks > 0 && block_size > 0) << "empty paged cache";
  PagedKvCache cache;
  auto opts = impl_->embed.options().requires_grad(false);
  const int64_t nkv = impl_->KvHeads();  // (a tensor-parallel slice: its heads)
  for (int64_t i = 0; i < s.num_layers; ++i) {
    // Zeros, not garbage: attention gathers whole blocks and masks the unused positions, and a
    // masked NaN would still poison the weighted sum (0 * NaN).
    cache.k.push_back(at::zeros({num_blocks, block_size, nkv, s.head_dim}, opts));
    cache.v.push_back(at::zeros({num_blocks, block_size, nkv, s.head_dim}, opts));
  }
  cache.num_blocks = num_blocks;
  cache.block_size = block_size;
  return cache;
}

int64_t Transformer::KvBytesPerToken() const {
  const ModelSpec& s = impl_->spec;
  return 2 * s.num_layers * impl_->KvHeads() * s.head_dim *
         static_cast<int64_t>(impl_->embed.element_size());
}

at::Tensor Transformer::ForwardPaged(const PagedBatch& b, PagedKvCache* cache) const {
  const int64_t N = b.tokens.numel();
  const int64_t num_seqs = static_cast<int64_t>(b.query_lens.size());
  const int64_t bs = cache->block_size;
  GYRE_CHECK(b.positions.numel() == N && b.slots.numel() == N) << "tokens/positions/slots differ";
  GYRE_CHECK(static_cast<int64_t>(b.context_lens.size()) == num_seqs && b.block_tables.dim() == 2 &&
             b.block_tables.size(0) == num_seqs)
      << "per-sequence sizes differ";
  int64_t total = 0;
  // Decoding sequences, bucketed by the power of two above their block count, so a few long
  // contexts do not pad every short one to their length.
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> by_size;  // -> (row, sequence)
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t nblk = (b.context_lens[i] + bs - 1) / bs;
    GYRE_CHECK(b.query_lens[i] >= 1 && b.context_lens[i] >= b.query_lens[i] &&
               nblk <= b.block_tables.size(1))
        << "sequence " << i << ": query " << b.query_lens[i] << ", context " << b.context_lens[i];
    if (b.query_lens[i] == 1) {
      int bucket = 0;
      while ((int64_t{1} << bucket) < nblk) ++bucket;
      by_size[bucket].emplace_back(total, i);
    }
    total += b.query_lens[i];
  }
  GYRE_CHECK(total == N) << "query lengths sum to " << total << ", not " << N;
  if (N > 0 && b.slots.is_cpu()) {  // (a device-side check would cost a host sync)
    GYRE_CHECK(b.slots.min().item<int64_t>() >= 0 &&
               b.slots.max().item<int64_t>() < cache->num_blocks * bs)
        << "slot outside the paged cache";
  }
  auto lopts = b.slots.options();
  std::vector<Impl::DecodeBucket> buckets;
  for (const auto& [bucket, members] : by_size) {
    const int64_t D = static_cast<int64_t>(members.size());
    std::vector<int64_t> rows, seqs, lens;
    int64_t max_blocks = 0;
    for (const auto& [row, seq] : members) {
      rows.push_back(row);
      seqs.push_back(seq);
      lens.push_back(b.context_lens[seq]);
      max_blocks = std::max(max_blocks, (b.context_lens[seq] + bs - 1) / bs);
    }
    Impl::DecodeBucket d;
    d.rows = at::tensor(rows, lopts);
    d.tables = b.block_tables.index_select(0, at::tensor(seqs, lopts))
                   .narrow(1, 0, max_blocks)
                   .contiguous();
    const int64_t S = max_blocks * bs;
    d.lens = at::tensor(lens, lopts);
    d.mask = (at::arange(S, lopts).view({1, S}) < d.lens.view({D, 1})).view({D, 1, 1, S});
    buckets.push_back(std::move(d));
  }
  const Impl& m = *impl_;
  if (m.FeatureMajor(b.tokens)) {
    at::Tensor h = m.PagedLayersFeatureMajor(b, buckets, cache);
    const bool all_rows = static_cast<int64_t>(b.logit_rows.size()) == N &&
                          std::is_sorted(b.logit_rows.begin(), b.logit_rows.end());
    return m.LogitsFeatureMajor(h, all_rows ? at::Tensor() : at::tensor(b.logit_rows, lopts));
  }
  at::Tensor h = m.PagedLayers(b, buckets, cache);
  at::Tensor rows = h.squeeze(0).index_select(0, at::tensor(b.logit_rows, lopts));
  rows = m.RmsNorm(rows, m.final_norm);
  return Impl::InferLinear(rows, m.spec.tie_embeddings ? m.embed : m.lm_head).to(at::kFloat);
}

at::Tensor Transformer::ForwardDecode(const DecodeBatch& db, PagedKvCache* cache) const {
  const Impl& m = *impl_;
  const int64_t B = db.tokens.numel();
  GYRE_CHECK(db.positions.numel() == B && db.slots.numel() == B && db.tables.dim() == 2 &&
             db.tables.size(0) == B && db.mask.dim() == 4 && db.mask.size(0) == B &&
             db.mask.size(3) == db.tables.size(1) * cache->block_size)
      << "decode batch sizes differ";
  // One bucket holding every row; PagedAttention's per-sequence loop only handles prefill
  // chunks (query length > 1), of which there are none.
  PagedBatch b;
  b.tokens = db.tokens;
  b.positions = db.positions;
  b.slots = db.slots;
  b.query_lens.assign(static_cast<size_t>(B), 1);
  b.context_lens.assign(static_cast<size_t>(B), 1);
  b.block_tables = db.tables;
  Impl::DecodeBucket bucket;
  bucket.rows = at::arange(B, db.slots.options());
  bucket.tables = db.tables;
  bucket.mask = db.mask;
  at::Tensor h = m.PagedLayers(b, {bucket}, cache).squeeze(0);
  h = m.RmsNorm(h, m.final_norm);
  return Impl::InferLinear(h, m.spec.tie_embeddings ? m.embed : m.lm_head).to(at::kFloat);
}

void Transformer::To(const at::Device& device) {
  auto move = [&](at::Tensor& t) {
    if (!t.defined() || t.device() == device) return;
    const bool grad = t.requires_grad();
    t = t.detach().to(device).set_requires_grad(grad);
  };
  for (at::Tensor* t : impl_->Parameters()) move(*t);
  move(impl_->inv_freq);
}

void Transformer::ToDtype(at::ScalarType dtype) {
  for (at::Tensor* t : impl_->Parameters()) {
    if (!t->defined() || t->scalar_type() == dtype) continue;
    const bool grad = t->requires_grad();
    *t = t->detach().to(dtype).set_requires_grad(grad);
  }
}

std::unique_ptr<Transformer> Transformer::CastOf(const Transformer& src, at::ScalarType dtype) {
  auto impl = std::make_unique<Impl>(*src.impl_);  // shares the tensors, then replaces them
  for (at::Tensor* t : impl->Parameters()) {
    if (t->defined()) *t = t->to(dtype);  // differentiable: gradients flow back to src
  }
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

void Transformer::SetActivationCheckpointing(bool on) { impl_->checkpoint_layers = on; }
void Transformer::SetFeatureMajorDecode(bool on) { impl_->feature_major_decode = on; }
bool Transformer::activation_checkpointing() const { return impl_->checkpoint_layers; }

at::Device Transformer::device() const {
  return impl_->gather != nullptr ? impl_->gather_device : impl_->embed.device();
}
at::ScalarType Transformer::dtype() const { return impl_->ComputeType(); }

std::unique_ptr<Transformer> Transformer::Gathered(const ModelSpec& spec, ParameterGather* gather,
                                                   at::ScalarType dtype, const at::Device& device,
                                                   TensorParallelGroup* tp) {
  GYRE_CHECK(gather != nullptr) << "Transformer::Gathered needs a ParameterGather";
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  if (tp != nullptr && tp->size() > 1) {
    const Status fits = CheckTensorParallel(spec, tp->size());
    GYRE_CHECK(fits.ok()) << fits.message();
    impl->tp = tp;
    impl->vocab_begin =
        TensorParallelRange("model.embed_tokens.weight", spec.vocab_size, tp->rank(), tp->size())
            .first;
  }
  impl->layers.resize(static_cast<size_t>(spec.num_layers));
  impl->gather = gather;
  impl->gather_dtype = dtype;
  impl->gather_device = device;
  impl->inv_freq = RopeInverseFrequencies(spec).to(device);
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

std::unique_ptr<Transformer> Transformer::TensorParallelSlice(const Transformer& whole,
                                                              TensorParallelGroup* group) {
  GYRE_CHECK(group != nullptr && whole.impl_->gather == nullptr && whole.impl_->tp == nullptr)
      << "TensorParallelSlice needs a group and a whole model";
  const Status fits = CheckTensorParallel(whole.impl_->spec, group->size());
  GYRE_CHECK(fits.ok()) << fits.message();
  auto impl = std::make_unique<Impl>(*whole.impl_);  // shares the tensors, then replaces them
  impl->tp = group;
  const int rank = group->rank(), size = group->size();
  impl->vocab_begin =
      TensorParallelRange("model.embed_tokens.weight", impl->spec.vocab_size, rank, size).first;
  auto slice = [&](const std::string& name, at::Tensor* t) {
    at::NoGradGuard no_grad;
    const bool grad = t->requires_grad();
    *t = TensorParallelSliceOf(name, t->detach(), rank, size).clone().set_requires_grad(grad);
  };
  slice("model.embed_tokens.weight", &impl->embed);
  for (Layer& l : impl->layers) {
    for (const LayerField& f : LayerFields(impl->spec)) slice(f.name, &(l.*(f.member)));
  }
  slice("model.norm.weight", &impl->final_norm);
  if (impl->lm_head.defined()) slice("lm_head.weight", &impl->lm_head);
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

TensorParallelGroup* Transformer::tensor_parallel() const { return impl_->tp; }

std::pair<int64_t, int64_t> Transformer::vocabulary_range() const {
  if (impl_->tp == nullptr) return {0, impl_->spec.vocab_size};
  return TensorParallelRange("model.embed_tokens.weight", impl_->spec.vocab_size, impl_->tp->rank(),
                             impl_->tp->size());
}

std::unique_ptr<Transformer> Transformer::FrozenCopy(const Transformer& src) {
  GYRE_CHECK(src.impl_->gather == nullptr) << "FrozenCopy of a gathered model";
  auto impl = std::make_unique<Impl>(*src.impl_);
  at::NoGradGuard no_grad;
  for (at::Tensor* t : impl->Parameters()) {
    if (t->defined()) *t = t->detach().clone().set_requires_grad(false);
  }
  return std::unique_ptr<Transformer>(new Transformer(std::move(impl)));
}

NamedTensors Transformer::NamedParameters() const {
  NamedTensors out;
  if (impl_->gather != nullptr) return out;  // owns none
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
  if (impl_->gather != nullptr) {
    const int rank = impl_->tp != nullptr ? impl_->tp->rank() : 0;
    for (const ParameterUnit& u : TensorParallelUnits(impl_->spec, rank, impl_->TpSize())) {
      n += u.numel();
    }
    return n;
  }
  for (const auto& [name, t] : NamedParameters()) n += t.numel();
  return n;
}

}  // namespace gyre::model
