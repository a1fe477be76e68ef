#include "model/transformer.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "testing/tensor_compare.h"
#include "testing/tiny_model.h"

namespace gyre::model {
namespace {

ModelSpec TinySpec(bool tied, bool bias, bool qk_norm, bool qwen3_like = false) {
  ModelSpec s = testing::TinySpec(37, 32, 2, 4, 2, 48);
  s.tie_embeddings = tied;
  s.attention_bias = bias;
  s.qk_norm = qk_norm;
  if (qwen3_like) {  // head_dim decoupled from hidden / heads, and llama3 RoPE scaling
    s.head_dim = 12;
    s.rope_type = "llama3";
    s.rope_factor = 8;
    s.rope_original_max_position = 4;
  }
  return s;
}

using testing::AllClose;

// The same math in another order (batch width, matmul blocking, SIMD width): float32 rounding
// scaled to the tensor's magnitude. Measured worst case: 1.5e-6 on values up to 2.8 (AVX-512),
// about 5e-7 of the scale; this allows 20x that.
constexpr testing::Tolerance kReordered{/*rtol=*/1e-5, /*atol=*/1e-6, /*srtol=*/1e-5};

class TransformerTest : public ::testing::TestWithParam<std::tuple<bool, bool, bool, bool>> {};

// Decoding token by token with the KV cache (including left-padded rows) must give the same
// logits as one full causal forward over each unpadded sequence.
TEST_P(TransformerTest, CachedDecodeEqualsFullForward) {
  auto [tied, bias, qk_norm, qwen3_like] = GetParam();
  auto model = Transformer::Create(TinySpec(tied, bias, qk_norm, qwen3_like), 7, 0.2);
  c10::InferenceMode guard;
  const std::vector<std::vector<int64_t>> seqs = {{5, 9, 2, 30, 11, 4, 8}, {3, 17, 6, 1, 2}};
  const int64_t prompt_max = 4;  // prefill the first tokens, decode the rest one at a time
  const int64_t B = 2;
  KvCache cache = model->NewCache(B, 16);
  // Prefill: row 0 has 4 prompt tokens, row 1 has 2 (left-padded by 2).
  std::vector<int64_t> plen = {4, 2};
  at::Tensor tokens = at::zeros({B, prompt_max}, at::kLong);
  at::Tensor pos = at::zeros({B, prompt_max}, at::kLong);
  at::Tensor valid = at::zeros({B, prompt_max}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pad = prompt_max - plen[b];
    for (int64_t t = pad; t < prompt_max; ++t) {
      tokens[b][t] = seqs[b][t - pad];
      pos[b][t] = t - pad;
      valid[b][t] = true;
    }
  }
  std::vector<std::vector<at::Tensor>> got(B);
  at::Tensor logits = model->ForwardCached(tokens, pos, valid, &cache);
  for (int64_t b = 0; b < B; ++b) got[b].push_back(logits[b][prompt_max - 1]);
  for (int64_t step = 0; step < 3; ++step) {
    at::Tensor next = at::zeros({B, 1}, at::kLong);
    at::Tensor npos = at::zeros({B, 1}, at::kLong);
    for (int64_t b = 0; b < B; ++b) {
      next[b][0] = seqs[b][plen[b] + step];
      npos[b][0] = plen[b] + step;
    }
    logits = model->ForwardCached(next, npos, at::ones({B, 1}, at::kBool), &cache);
    for (int64_t b = 0; b < B; ++b) got[b].push_back(logits[b][0]);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = plen[b] + 3;
    at::Tensor full = model->Forward(
        at::tensor(std::vector<int64_t>(seqs[b].begin(), seqs[b].begin() + n)).unsqueeze(0));
    for (int64_t k = 0; k < 4; ++k) {
      at::Tensor want = full[0][plen[b] - 1 + k];
      EXPECT_TRUE(AllClose(got[b][k], want, kReordered))
          << "row " << b << " position " << plen[b] - 1 + k;
    }
  }
}

// A packed batch (several sequences end to end per row, block-diagonal causal attention,
// per-sequence positions, padding at a row's end) gives each sequence the logits a forward of
// that sequence alone gives, at the positions asked for and in their order; gradients too.
TEST_P(TransformerTest, PackedForwardEqualsEachSequenceAlone) {
  auto [tied, bias, qk_norm, qwen3_like] = GetParam();
  auto model = Transformer::Create(TinySpec(tied, bias, qk_norm, qwen3_like), 7, 0.2);
  const std::vector<std::vector<int64_t>> seqs = {
      {5, 9, 2, 30, 11, 4, 8}, {3, 17, 6}, {1, 2, 3, 4}, {36}, {7, 7, 7}};
  // Row 0: seq 0 (7 tokens). Row 1: seq 2 (4), seq 1 (3). Row 2: seq 4 (3), seq 3 (1), 3 pads.
  const std::vector<std::vector<int>> rows = {{0}, {2, 1}, {4, 3}};
  const int64_t width = 7;
  PackedBatch b;
  b.tokens = at::zeros({3, width}, at::kLong);
  b.positions = at::zeros({3, width}, at::kLong);
  b.segments = at::full({3, width}, 99, at::kLong);
  std::vector<int64_t> want_rows;                   // flat index of each wanted position
  std::vector<std::pair<int, int64_t>> want_which;  // (sequence, position)
  for (int64_t r = 0; r < 3; ++r) {
    int64_t col = 0;
    for (int s : rows[r]) {
      for (size_t t = 0; t < seqs[s].size(); ++t, ++col) {
        b.tokens[r][col] = seqs[s][t];
        b.positions[r][col] = static_cast<int64_t>(t);
        b.segments[r][col] = s;
        want_rows.push_back(r * width + col);
        want_which.push_back({s, static_cast<int64_t>(t)});
      }
    }
  }
  // Ask for the positions in reverse order: the output follows logit_index.
  std::reverse(want_rows.begin(), want_rows.end());
  std::reverse(want_which.begin(), want_which.end());
  b.logit_index = at::tensor(want_rows);
  at::Tensor packed = model->ForwardPacked(b);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{static_cast<int64_t>(want_rows.size()), 37}));
  std::vector<at::Tensor> alone;
  for (const auto& seq : seqs) alone.push_back(model->Forward(at::tensor(seq).unsqueeze(0))[0]);
  for (size_t i = 0; i < want_rows.size(); ++i) {
    const auto [s, t] = want_which[i];
    EXPECT_TRUE(
        AllClose(packed[static_cast<int64_t>(i)].detach(), alone[s][t].detach(), kReordered))
        << "sequence " << s << " position " << t;
  }
  // The same loss through both paths gives the same gradients.
  auto grads = [&](const at::Tensor& loss) {
    for (auto& [n, p] : model->NamedParameters()) p.mutable_grad() = at::Tensor();
    loss.backward();
    std::vector<at::Tensor> g;
    for (auto& [n, p] : model->NamedParameters()) g.push_back(p.grad().clone());
    return g;
  };
  at::Tensor w = at::linspace(-1.0, 1.0, 37);
  const std::vector<at::Tensor> g_packed = grads((model->ForwardPacked(b) * w).logsumexp(-1).sum());
  at::Tensor loss_alone = at::zeros({});
  for (size_t i = 0; i < want_rows.size(); ++i) {
    const auto [s, t] = want_which[i];
    loss_alone =
        loss_alone + (model->Forward(at::tensor(seqs[s]).unsqueeze(0))[0][t] * w).logsumexp(-1);
  }
  const std::vector<at::Tensor> g_alone = grads(loss_alone);
  const auto names = model->NamedParameters();
  for (size_t i = 0; i < g_packed.size(); ++i) {
    EXPECT_TRUE(AllClose(g_packed[i], g_alone[i], kReordered)) << names[i].first;
  }
}

// The autograd graph's nodes reachable from `root`, by name.
std::map<std::string, int> GraphNodes(const at::Tensor& root) {
  std::map<std::string, int> names;
  std::set<const torch::autograd::Node*> seen;
  std::vector<std::shared_ptr<torch::autograd::Node>> todo = {root.grad_fn()};
  while (!todo.empty()) {
    auto n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n.get()).second) continue;
    ++names[n->name()];
    for (const auto& e : n->next_edges()) todo.push_back(e.function);
  }
  return names;
}

// trainer.activation_checkpointing: the same logits and gradients as without, on a packed batch
// (block-diagonal mask) and on a plain causal forward, while the graph holds one checkpoint node
// per decoder layer in place of the layers' own operations.
TEST_P(TransformerTest, CheckpointedLayersGiveTheSameValuesAndGradients) {
  auto [tied, bias, qk_norm, qwen3_like] = GetParam();
  auto model = Transformer::Create(TinySpec(tied, bias, qk_norm, qwen3_like), 9, 0.2);
  PackedBatch b;
  b.tokens = at::tensor(std::vector<int64_t>{5, 9, 2, 30, 3, 17, 6, 1}).view({2, 4});
  b.positions = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 0}).view({2, 4});
  b.segments = at::tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 2}).view({2, 4});
  b.logit_index = at::tensor(std::vector<int64_t>{1, 2, 3, 5, 6, 7});
  const at::Tensor w = at::linspace(-1.0, 1.0, 37);
  const at::Tensor plain_tokens =
      at::tensor(std::vector<int64_t>{4, 8, 15, 16, 23, 36}).view({2, 3});
  struct Run {
    at::Tensor packed, plain;
    std::vector<at::Tensor> grads;
    std::map<std::string, int> nodes;
  };
  auto run = [&](bool checkpoint) {
    model->SetActivationCheckpointing(checkpoint);
    EXPECT_EQ(model->activation_checkpointing(), checkpoint);
    for (auto& [n, p] : model->NamedParameters()) p.mutable_grad() = at::Tensor();
    Run r;
    r.packed = model->ForwardPacked(b);
    r.plain = model->Forward(plain_tokens);
    const at::Tensor loss = (r.packed * w).logsumexp(-1).sum() + (r.plain * w).logsumexp(-1).sum();
    r.nodes = GraphNodes(loss);
    loss.backward();
    for (auto& [n, p] : model->NamedParameters()) r.grads.push_back(p.grad().clone());
    return r;
  };
  const Run plain = run(false), ckpt = run(true);
  int checkpoints = 0, total_plain = 0, total_ckpt = 0;
  for (const auto& [name, count] : ckpt.nodes) {
    if (name.find("LayerCheckpoint") != std::string::npos) checkpoints += count;
    total_ckpt += count;
  }
  for (const auto& [name, count] : plain.nodes) {
    EXPECT_EQ(name.find("LayerCheckpoint"), std::string::npos) << name;
    total_plain += count;
  }
  EXPECT_EQ(checkpoints, 2 * 2) << "2 forwards of 2 layers";
  EXPECT_LT(total_ckpt * 2, total_plain) << "the layers' own operations stay out of the graph";
  EXPECT_TRUE(AllClose(ckpt.packed.detach(), plain.packed.detach(), kReordered));
  EXPECT_TRUE(AllClose(ckpt.plain.detach(), plain.plain.detach(), kReordered));
  const auto names = model->NamedParameters();
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_GT(plain.grads[i].abs().sum().item<float>(), 0.0f) << names[i].first;
    EXPECT_TRUE(AllClose(ckpt.grads[i], plain.grads[i], kReordered)) << names[i].first;
  }
  // Without autograd (old log-probs, generation) nothing is checkpointed.
  at::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(model->ForwardPacked(b), plain.packed.detach(), kReordered));
}

// The fixed-shape decode forward (what a CUDA graph captures) computes the same logits as
// ForwardPaged for the real rows, whatever the padding: extra rows on a scratch block, block
// tables padded past each context, a wider mask. Padding writes only the scratch block.
TEST_P(TransformerTest, FixedShapeDecodeEqualsPagedDecode) {
  auto [tied, bias, qk_norm, qwen3_like] = GetParam();
  auto model = Transformer::Create(TinySpec(tied, bias, qk_norm, qwen3_like), 7, 0.2);
  c10::InferenceMode guard;
  const int64_t bs = 4, blocks = 8, scratch = blocks;  // one block past the allocator's
  PagedKvCache cache = model->NewPagedCache(blocks + 1, bs);
  // Two sequences: 6 tokens in blocks {2, 5}, 3 tokens in block {1}; prefill all but the last.
  const std::vector<std::vector<int64_t>> seqs = {{5, 9, 2, 30, 11, 4}, {3, 17, 6}};
  const std::vector<std::vector<int64_t>> tables = {{2, 5}, {1}};
  auto slot = [&](size_t s, int64_t p) { return tables[s][p / bs] * bs + p % bs; };
  PagedBatch pre;
  std::vector<int64_t> toks, pos, slots;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t p = 0; p + 1 < static_cast<int64_t>(seqs[s].size()); ++p) {
      toks.push_back(seqs[s][p]);
      pos.push_back(p);
      slots.push_back(slot(s, p));
    }
    pre.query_lens.push_back(static_cast<int64_t>(seqs[s].size()) - 1);
    pre.context_lens.push_back(static_cast<int64_t>(seqs[s].size()) - 1);
  }
  pre.tokens = at::tensor(toks, at::kLong);
  pre.positions = at::tensor(pos, at::kLong);
  pre.slots = at::tensor(slots, at::kLong);
  pre.block_tables = at::tensor(std::vector<int64_t>{2, 5, 1, 0}, at::kLong).view({2, 2});
  pre.logit_rows = {4, 6};
  model->ForwardPaged(pre, &cache);
  PagedKvCache copy = cache;
  for (auto& t : copy.k) t = t.clone();
  for (auto& t : copy.v) t = t.clone();

  // Reference: the decode step through ForwardPaged.
  PagedBatch dec;
  dec.tokens = at::tensor(std::vector<int64_t>{seqs[0][5], seqs[1][2]}, at::kLong);
  dec.positions = at::tensor(std::vector<int64_t>{5, 2}, at::kLong);
  dec.slots = at::tensor(std::vector<int64_t>{slot(0, 5), slot(1, 2)}, at::kLong);
  dec.query_lens = {1, 1};
  dec.context_lens = {6, 3};
  dec.block_tables = pre.block_tables;
  dec.logit_rows = {0, 1};
  at::Tensor want = model->ForwardPaged(dec, &cache);

  // Fixed shape: 4 rows (2 padding), 4 blocks per row, the unused entries on the scratch block.
  const int64_t B = 4, M = 4;
  DecodeBatch db;
  db.tokens = at::tensor(std::vector<int64_t>{seqs[0][5], seqs[1][2], 0, 0}, at::kLong);
  db.positions = at::tensor(std::vector<int64_t>{5, 2, 0, 0}, at::kLong);
  db.slots = at::tensor(std::vector<int64_t>{slot(0, 5), slot(1, 2), scratch * bs, scratch * bs},
                        at::kLong);
  db.tables = at::full({B, M}, scratch, at::kLong);
  db.tables[0][0] = 2;
  db.tables[0][1] = 5;
  db.tables[1][0] = 1;
  db.mask = at::zeros({B, 1, 1, M * bs}, at::kBool);
  db.mask.narrow(3, 0, 6)[0].fill_(true);
  db.mask.narrow(3, 0, 3)[1].fill_(true);
  db.mask.narrow(3, 0, 1)[2].fill_(true);
  db.mask.narrow(3, 0, 1)[3].fill_(true);
  at::Tensor got = model->ForwardDecode(db, &copy);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{B, 37}));
  EXPECT_TRUE(AllClose(got.narrow(0, 0, 2), want, kReordered));
  for (size_t l = 0; l < cache.k.size(); ++l) {
    // Up to float reordering: a wider batch may block its matmuls differently.
    EXPECT_TRUE(
        AllClose(copy.k[l].narrow(0, 0, blocks), cache.k[l].narrow(0, 0, blocks), kReordered))
        << "layer " << l << " keys";
    EXPECT_TRUE(
        AllClose(copy.v[l].narrow(0, 0, blocks), cache.v[l].narrow(0, 0, blocks), kReordered))
        << "layer " << l << " values";
  }
}

// The feature-major CPU forward (float32, >= 16 rows, the fused kernels of cpu_decode.h)
// computes what the general path of ATen ops computes, up to float rounding: logits and cache
// contents, over a prefill of 18 sequences, a decode step of all of them (contexts in
// several length buckets), and a mixed step of decodes, a new prefill chunk and a subset of
// logit rows.
TEST_P(TransformerTest, FeatureMajorPagedForwardEqualsTheGeneralPath) {
  auto [tied, bias, qk_norm, qwen3_like] = GetParam();
  ModelSpec spec = testing::TinySpec(300, 256, 2, 4, 2, 512, 64);  // gate_proj >= 64K weights
  spec.tie_embeddings = tied;
  spec.attention_bias = bias;
  spec.qk_norm = qk_norm;
  if (qwen3_like) {
    spec.head_dim = 48;
    spec.rope_type = "llama3";
    spec.rope_factor = 8;
    spec.rope_original_max_position = 4;
  }
  auto model = Transformer::Create(spec, 5, 0.0625);
  if (bias) {  // non-zero biases, so that a bias the kernels dropped shows
    c10::InferenceMode guard;
    for (auto& [name, t] : model->NamedParameters()) {
      if (name.find("bias") != std::string::npos) t.uniform_(-0.5, 0.5);
    }
  }
  c10::InferenceMode guard;
  const int64_t bs = 4, per_seq = 5, num_seqs = 19;
  PagedKvCache fused = model->NewPagedCache(num_seqs * per_seq, bs);
  PagedKvCache general = model->NewPagedCache(num_seqs * per_seq, bs);
  std::vector<int64_t> length(num_seqs, 0);
  auto table = [&](int64_t s, int64_t b) { return s * per_seq + (per_seq - 1 - b); };  // reversed
  // One step: (sequence, number of new tokens) in row order; logits of `logit_rows`.
  auto step = [&](const std::vector<std::pair<int64_t, int64_t>>& work,
                  std::vector<int64_t> logit_rows) {
    PagedBatch b;
    std::vector<int64_t> toks, pos, slots, tables;
    for (const auto& [s, n] : work) {
      for (int64_t p = length[s]; p < length[s] + n; ++p) {
        toks.push_back((s * 31 + p * 7) % 300);
        pos.push_back(p);
        slots.push_back(table(s, p / bs) * bs + p % bs);
      }
      length[s] += n;
      b.query_lens.push_back(n);
      b.context_lens.push_back(length[s]);
      for (int64_t k = 0; k < per_seq; ++k) tables.push_back(table(s, k));
    }
    b.tokens = at::tensor(toks, at::kLong);
    b.positions = at::tensor(pos, at::kLong);
    b.slots = at::tensor(slots, at::kLong);
    b.block_tables =
        at::tensor(tables, at::kLong).view({static_cast<int64_t>(work.size()), per_seq});
    b.logit_rows = std::move(logit_rows);
    model->SetFeatureMajorDecode(true);
    at::Tensor got = model->ForwardPaged(b, &fused);
    model->SetFeatureMajorDecode(false);
    at::Tensor want = model->ForwardPaged(b, &general);
    EXPECT_TRUE(AllClose(got, want, kReordered));
    for (size_t l = 0; l < fused.k.size(); ++l) {
      EXPECT_TRUE(AllClose(fused.k[l], general.k[l], kReordered)) << "layer " << l << " keys";
      EXPECT_TRUE(AllClose(fused.v[l], general.v[l], kReordered)) << "layer " << l << " values";
    }
  };
  std::vector<std::pair<int64_t, int64_t>> prefill, decode;
  std::vector<int64_t> last_rows, all_rows;
  int64_t rows = 0;
  for (int64_t s = 0; s < num_seqs - 1; ++s) {
    const int64_t n = 1 + (s * 5) % 9;  // 1 .. 9 tokens
    prefill.emplace_back(s, n);
    rows += n;
    last_rows.push_back(rows - 1);
    decode.emplace_back(s, 1);
    all_rows.push_back(s);
  }
  step(prefill, last_rows);
  step(decode, all_rows);
  // Mixed: decodes around a new sequence's 6-token prefill chunk; some rows' logits.
  std::vector<std::pair<int64_t, int64_t>> mixed = decode;
  mixed.insert(mixed.begin() + 3, {num_seqs - 1, 6});
  step(mixed, {0, 8, 2, 20, 23});
}

INSTANTIATE_TEST_SUITE_P(Architectures, TransformerTest,
                         ::testing::Values(std::make_tuple(true, false, false, false),
                                           std::make_tuple(false, true, false, false),
                                           std::make_tuple(false, false, true, false),
                                           std::make_tuple(true, false, true, true)));

TEST(TransformerInitTest, SameSeedSameWeightsDifferentSeedDifferent) {
  auto a = Transformer::Create(TinySpec(true, false, false), 1, 0.02);
  auto b = Transformer::Create(TinySpec(true, false, false), 1, 0.02);
  auto c = Transformer::Create(TinySpec(true, false, false), 2, 0.02);
  auto pa = a->NamedParameters(), pb = b->NamedParameters(), pc = c->NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(pa.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(pa.back().first, "model.norm.weight");  // tied: no lm_head
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i].second, pb[i].second));
  EXPECT_FALSE(at::equal(pa[0].second, pc[0].second));
  // 37*32 embed + per layer (norms 2*32, q 32*32, k,v 2*16*32, o 32*32, mlp 3*48*32) + norm 32
  const int64_t per_layer = 64 + 1024 + 1024 + 1024 + 3 * 48 * 32;
  EXPECT_EQ(a->NumParameters(), 37 * 32 + 2 * per_layer + 32);
}

TEST(TransformerTrainTest, GradientsFlowToEveryParameter) {
  auto m = Transformer::Create(TinySpec(false, true, true), 3, 0.1);
  at::Tensor logits = m->Forward(at::tensor(std::vector<int64_t>{1, 2, 3, 4}).unsqueeze(0));
  logits.logsumexp(-1).sum().backward();
  for (const auto& [name, p] : m->NamedParameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(p.grad().abs().sum().item<float>(), 0.0f) << name;
  }
}

// model.dtype: bfloat16 and float16 copies of a float32 model compute in their dtype (parameters,
// cache) and return float32 logits that track float32's within half-precision rounding: 8 bits
// of mantissa (bfloat16) lose about 4e-3 per rounding, compounded over two layers. Measured worst
// case: 1.4e-2 of the logits' scale (bfloat16), 1.1e-3 (float16); this allows 3.5x and 9x that.
// Cached decoding in the half dtype equals its own full forward within the same bound.
TEST(TransformerDtypeTest, HalfPrecisionCopiesTrackFloat32) {
  const at::Tensor tokens =
      at::tensor(std::vector<int64_t>{5, 1, 30, 7, 2, 19, 3, 11}).view({2, 4});
  for (const at::ScalarType type : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(at::toString(type));
    const double srtol = type == at::kBFloat16 ? 5e-2 : 1e-2;
    auto m = Transformer::Create(TinySpec(false, true, true), 4, 0.1);
    const at::Tensor want = m->Forward(tokens).detach();
    m->ToDtype(type);
    EXPECT_EQ(m->dtype(), type);
    for (const auto& [name, p] : m->NamedParameters()) {
      EXPECT_EQ(p.scalar_type(), type) << name;
      EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << name;
    }
    const at::Tensor got = m->Forward(tokens).detach();
    EXPECT_EQ(got.scalar_type(), at::kFloat);
    EXPECT_TRUE(AllClose(got, want, {0, 0, srtol}));
    EXPECT_EQ(m->NewPagedCache(2, 4).k[0].scalar_type(), type);
    EXPECT_EQ(m->KvBytesPerToken(), 2 * 2 * 2 * 8 * 2);  // k and v, 2 layers, 2 heads of 8
    KvCache cache = m->NewCache(2, 4);
    at::Tensor step;
    for (int64_t t = 0; t < 4; ++t) {
      step = m->ForwardCached(tokens.narrow(1, t, 1), at::full({2, 1}, t, tokens.options()),
                              at::ones({2, 1}, tokens.options().dtype(at::kBool)), &cache);
    }
    EXPECT_TRUE(AllClose(step.squeeze(1), got.select(1, 3), {0, 0, srtol}));
  }
}

// Mixed precision: a forward of CastOf(master, bfloat16) differentiates into the float32 master
// weights, and their gradients are exactly those of a bfloat16 model with the same weights,
// converted (the cast's backward converts the gradient and nothing else).
TEST(TransformerDtypeTest, CastCopyDifferentiatesIntoTheFloat32Master) {
  auto master = Transformer::Create(TinySpec(false, true, true), 5, 0.1);
  auto half = Transformer::Create(TinySpec(false, true, true), 5, 0.1);
  half->ToDtype(at::kBFloat16);
  const at::Tensor tokens = at::tensor(std::vector<int64_t>{1, 2, 3, 4}).unsqueeze(0);
  auto cast = Transformer::CastOf(*master, at::kBFloat16);
  EXPECT_EQ(cast->dtype(), at::kBFloat16);
  EXPECT_EQ(master->dtype(), at::kFloat);
  const at::Tensor via_cast = cast->Forward(tokens);
  const at::Tensor direct = half->Forward(tokens);
  EXPECT_TRUE(at::equal(via_cast, direct));
  via_cast.logsumexp(-1).sum().backward();
  direct.logsumexp(-1).sum().backward();
  const auto pm = master->NamedParameters(), ph = half->NamedParameters();
  for (size_t i = 0; i < pm.size(); ++i) {
    const at::Tensor& g = pm[i].second.grad();
    ASSERT_TRUE(g.defined()) << pm[i].first;
    EXPECT_EQ(g.scalar_type(), at::kFloat) << pm[i].first;
    EXPECT_TRUE(at::equal(g, ph[i].second.grad().to(at::kFloat))) << pm[i].first;
    EXPECT_GT(g.abs().sum().item<float>(), 0.0f) << pm[i].first;
  }
}

// Checkpointing a bfloat16 cast copy: the recomputed layers differentiate into the float32
// master weights exactly as without checkpointing.
TEST(TransformerDtypeTest, CheckpointedCastCopyGivesTheSameMasterGradients) {
  auto master = Transformer::Create(TinySpec(false, true, true), 6, 0.1);
  const at::Tensor tokens = at::tensor(std::vector<int64_t>{1, 2, 3, 4, 9, 12}).view({2, 3});
  auto grads = [&](bool checkpoint) {
    master->SetActivationCheckpointing(checkpoint);
    for (auto& [n, p] : master->NamedParameters()) p.mutable_grad() = at::Tensor();
    auto cast = Transformer::CastOf(*master, at::kBFloat16);
    EXPECT_EQ(cast->activation_checkpointing(), checkpoint);
    cast->Forward(tokens).logsumexp(-1).sum().backward();
    std::vector<at::Tensor> g;
    for (auto& [n, p] : master->NamedParameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto plain = grads(false), ckpt = grads(true);
  const auto names = master->NamedParameters();
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(ckpt[i].scalar_type(), at::kFloat) << names[i].first;
    EXPECT_TRUE(at::equal(ckpt[i], plain[i])) << names[i].first;
  }
}

}  // namespace
}  // namespace gyre::model
