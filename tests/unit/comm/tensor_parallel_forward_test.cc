// Tensor-parallel forwards (model/tensor_parallel.h) against the whole model: 2 ranks (threads of
// this process, each with its own Gloo member on loopback and its own slices of the same model)
// compute the full forward, a paged prefill and decode steps over a KV cache holding each rank's
// key/value heads, and the vocabulary-parallel statistics; gathered over the vocabulary, their
// logits equal the whole model's within float32 summation-order tolerances.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_communicator.h"
#include "comm/tensor_parallel_group.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "testing/tiny_model.h"

namespace gyre::comm {
namespace {

// Whole-vocabulary logits from each rank's rows [.., V_r] (ranks hold ceil(V / T) rows, the
// last the rest).
at::Tensor GatherVocabulary(const at::Tensor& local, model::TensorParallelGroup* group,
                            int64_t vocab) {
  const int ranks = group->size();
  const int64_t chunk = (vocab + ranks - 1) / ranks;
  std::vector<int64_t> shape = local.sizes().vec();
  shape.back() = chunk;
  at::Tensor padded = at::zeros(shape, local.options());
  padded.narrow(-1, 0, local.size(-1)).copy_(local);
  const at::Tensor all = group->AllGather(padded.contiguous());  // [T, .., chunk]
  std::vector<at::Tensor> parts;
  for (int r = 0; r < ranks; ++r) {
    const int64_t begin = r * chunk, end = std::min(vocab, begin + chunk);
    parts.push_back(all[r].narrow(-1, 0, end - begin));
  }
  return at::cat(parts, -1);
}

// Two sequences in a paged cache of blocks of 4 positions, 4 blocks each (sequence i owns blocks
// 4i .. 4i + 3): the batch of their next `query` tokens after `context - query` cached ones.
model::PagedBatch Batch(const std::vector<std::vector<int64_t>>& tokens,
                        const std::vector<int64_t>& context) {
  const auto lopts = at::TensorOptions().dtype(at::kLong);
  std::vector<int64_t> flat, positions, slots;
  model::PagedBatch b;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t q = static_cast<int64_t>(tokens[i].size());
    for (int64_t k = 0; k < q; ++k) {
      const int64_t p = context[i] - q + k;
      flat.push_back(tokens[i][static_cast<size_t>(k)]);
      positions.push_back(p);
      slots.push_back((4 * static_cast<int64_t>(i) + p / 4) * 4 + p % 4);
      b.logit_rows.push_back(static_cast<int64_t>(flat.size()) - 1);
    }
    b.query_lens.push_back(q);
    b.context_lens.push_back(context[i]);
  }
  b.tokens = at::tensor(flat, lopts);
  b.positions = at::tensor(positions, lopts);
  b.slots = at::tensor(slots, lopts);
  b.block_tables = at::arange(8, lopts).view({2, 4});
  return b;
}

// The whole model's or a slice's logits: a full forward of `prompt` [2, 5], then a paged prefill
// of both rows and three greedy decode steps; everything concatenated, gathered over the
// vocabulary when `group` is set.
at::Tensor RunForwards(const model::Transformer& m, model::TensorParallelGroup* group,
                       const at::Tensor& prompt) {
  at::NoGradGuard no_grad;
  const int64_t V = m.spec().vocab_size;
  auto whole = [&](const at::Tensor& logits) {
    return group != nullptr ? GatherVocabulary(logits, group, V) : logits;
  };
  std::vector<at::Tensor> out = {whole(m.Forward(prompt)).reshape({-1, V})};
  model::PagedKvCache cache = m.NewPagedCache(8, 4);
  std::vector<std::vector<int64_t>> first = {{3, 7, 1, 9, 4}, {2, 8, 5}};
  at::Tensor logits = whole(m.ForwardPaged(Batch(first, {5, 3}), &cache));  // [8, V]
  out.push_back(logits);
  std::vector<int64_t> context = {5, 3};
  at::Tensor last = at::stack({logits[4], logits[7]});
  for (int step = 0; step < 3; ++step) {
    const at::Tensor next = last.argmax(-1);
    context = {context[0] + 1, context[1] + 1};
    last = whole(m.ForwardPaged(
        Batch({{next[0].item<int64_t>()}, {next[1].item<int64_t>()}}, context), &cache));
    out.push_back(last);
  }
  return at::cat(out, 0);
}

// Runs body(rank, group) on `ranks` threads of this process, each with its own Gloo member of
// group `name` on loopback, and waits for them.
void OnRanks(int ranks, const std::string& name,
             const std::function<void(int rank, CommTensorParallel* group)>& body) {
  auto store = StoreServer::Start("127.0.0.1");
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions o;
      o.store_address = (*store)->address();
      o.group = name;
      o.rank = r;
      o.size = ranks;
      o.connect_timeout_s = 30;
      auto c = CreateGlooCommunicator(o);
      ASSERT_TRUE(c.ok()) << c.status();
      CommTensorParallel group(c->get(), 30);
      body(r, &group);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(TensorParallelForwardTest, TwoRanksComputeTheWholeModelsLogits) {
  const model::ModelSpec spec = testing::TinyQwen3Spec(26, 64);
  const auto whole = model::Transformer::Create(spec, 5, 0.2);
  const at::Tensor prompt = at::tensor({3, 7, 1, 9, 4, 2, 8, 5, 0, 25}, at::kLong).view({2, 5});
  const at::Tensor want = RunForwards(*whole, nullptr, prompt);
  const at::Tensor targets = at::tensor({7, 1, 9, 4, 2, 8, 5, 0, 25, 13}, at::kLong);
  at::Tensor want_z;
  {
    at::NoGradGuard no_grad;
    want_z = whole->Forward(prompt).reshape({-1, spec.vocab_size}) / 0.7;
  }
  const at::Tensor want_lsm = at::log_softmax(want_z, -1);
  const at::Tensor want_logp = want_lsm.gather(1, targets.unsqueeze(1)).squeeze(1);
  const at::Tensor want_entropy = -(want_lsm.exp() * want_lsm).sum(-1);
  const at::Tensor want_ok = (want_z.argmax(-1) == targets).to(at::kFloat);

  constexpr int kRanks = 2;
  std::vector<at::Tensor> got(kRanks), logp(kRanks), entropy(kRanks), ok(kRanks);
  std::vector<int64_t> kv_bytes(kRanks);
  OnRanks(kRanks, "tp-forward", [&](int r, CommTensorParallel* g) {
    CommTensorParallel& group = *g;
    const auto slice = model::Transformer::TensorParallelSlice(*whole, &group);
    kv_bytes[r] = slice->KvBytesPerToken();
    got[r] = RunForwards(*slice, &group, prompt);
    at::NoGradGuard no_grad;
    const at::Tensor local = slice->Forward(prompt).reshape(
        {-1, slice->vocabulary_range().second - slice->vocabulary_range().first});
    const model::VocabParallelStats st = model::VocabParallelTokenStats(
        local, slice->vocabulary_range().first, targets, 0.7, &group);
    logp[r] = st.logp;
    entropy[r] = st.entropy;
    ok[r] = st.argmax_ok;
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(got[r].defined()) << r;
    EXPECT_EQ(kv_bytes[r] * kRanks, whole->KvBytesPerToken()) << r;
    EXPECT_TRUE(at::allclose(got[r], want, 1e-4, 1e-5))
        << "rank " << r << ": max |diff| " << (got[r] - want).abs().max().item<float>();
    EXPECT_TRUE(at::allclose(logp[r], want_logp, 1e-5, 1e-5)) << r;
    EXPECT_TRUE(at::allclose(entropy[r], want_entropy, 1e-5, 1e-5)) << r;
    EXPECT_TRUE(at::equal(ok[r], want_ok)) << r;
  }
  // The decode steps chose the same tokens: the greedy argmax of every step's logits agrees.
  EXPECT_TRUE(at::equal(got[0].argmax(-1), want.argmax(-1)));
}

// The chunked vocabulary-parallel statistics (the trainer's, for packed micro-batches) against
// the unchunked ones on 2 ranks, and both against the whole vocabulary in one process:
// log-probs, entropies, argmax and the gradients of a loss mixing log-probs and entropies (an
// entropy bonus) with respect to the LM head's input and this rank's weight rows, chunks of 3 of
// 10 tokens.
TEST(TensorParallelForwardTest, ChunkedVocabularyStatisticsEqualTheUnchunked) {
  constexpr int kRanks = 2;
  constexpr int64_t kVocab = 26, kHidden = 16, kTokens = 10;
  OnRanks(kRanks, "tp-chunked", [&](int r, CommTensorParallel* g) {
    CommTensorParallel& group = *g;
    const int64_t begin = r * kVocab / kRanks, rows = kVocab / kRanks;
    const at::Tensor h0 =
        at::randn({kTokens, kHidden}, at::make_generator<at::CPUGeneratorImpl>(3));
    const at::Tensor w0 = at::randn({kVocab, kHidden}, at::make_generator<at::CPUGeneratorImpl>(4))
                              .narrow(0, begin, rows)
                              .contiguous();
    const at::Tensor targets = at::tensor({0, 25, 13, 12, 7, 20, 1, 14, 13, 3}, at::kLong);
    const at::Tensor a = at::linspace(-1, 1, kTokens), b = at::linspace(0.5, -0.3, kTokens);
    auto run = [&](int64_t chunk) {
      at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      const model::VocabParallelStats st =
          chunk > 0
              ? model::VocabParallelChunkedTokenStats(h, w, begin, targets, 0.7, chunk, &group)
              : model::VocabParallelTokenStats(at::linear(h, w), begin, targets, 0.7, &group);
      ((st.logp * a).sum() + (st.entropy * b).sum()).backward();
      return std::vector<at::Tensor>{st.logp.detach(), st.entropy.detach(), st.argmax_ok, h.grad(),
                                     w.grad()};
    };
    const auto want = run(0), got = run(3);
    // Both against the whole vocabulary in one process: the ranks' parts of the hidden state's
    // gradient sum to its gradient, and each rank's weight rows get theirs.
    {
      const at::Tensor whole_w0 =
          at::randn({kVocab, kHidden}, at::make_generator<at::CPUGeneratorImpl>(4));
      at::Tensor h = h0.clone().requires_grad_(true), w = whole_w0.clone().requires_grad_(true);
      const at::Tensor lsm = at::log_softmax(at::linear(h, w) / 0.7, -1);
      const at::Tensor logp = lsm.gather(1, targets.unsqueeze(1)).squeeze(1);
      const at::Tensor entropy = -(lsm.exp() * lsm).sum(-1);
      ((logp * a).sum() + (entropy * b).sum()).backward();
      at::Tensor summed = got[3].clone();
      group.AllReduceSum(summed);
      EXPECT_TRUE(at::allclose(summed, h.grad(), 1e-5, 1e-6))
          << "rank " << r << ": max |diff| " << (summed - h.grad()).abs().max().item<float>();
      const at::Tensor rows_grad = w.grad().narrow(0, begin, rows);
      EXPECT_TRUE(at::allclose(got[4], rows_grad, 1e-5, 1e-6))
          << "rank " << r << ": max |diff| " << (got[4] - rows_grad).abs().max().item<float>();
      EXPECT_TRUE(at::allclose(got[1], entropy.detach(), 1e-5, 1e-6)) << "rank " << r;
    }
    const char* names[] = {"logp", "entropy", "argmax_ok", "grad hidden", "grad weight"};
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-6))
          << "rank " << r << " " << names[i] << ": max |diff| "
          << (got[i] - want[i]).abs().max().item<float>();
    }
    const at::Tensor logp_only =
        model::VocabParallelChunkedTokenStats(h0, w0, begin, targets, 0.7, 4, &group, true).logp;
    EXPECT_TRUE(at::allclose(logp_only, want[0], 1e-5, 1e-6)) << "rank " << r;
  });
}

}  // namespace
}  // namespace gyre::comm
