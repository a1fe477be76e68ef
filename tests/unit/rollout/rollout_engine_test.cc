#include "rollout/rollout_engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "testing/tiny_model.h"

namespace gyre::rollout {
namespace {

model::ModelSpec Spec() { return testing::TinySpec(30, 32, 2, 4, 2, 48, 64); }

Request Req(std::vector<int32_t> prompt, uint64_t seed, float temperature, int max_new, int n = 1) {
  Request r;
  r.prompt = std::move(prompt);
  r.seed = seed;
  r.n = n;
  r.sampling.temperature = temperature;
  r.sampling.max_new_tokens = max_new;
  return r;
}

EngineConfig SmallConfig(int64_t num_blocks = 64, int64_t block_size = 4) {
  EngineConfig c;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.max_running = 16;
  c.max_step_tokens = 64;
  return c;
}

std::unique_ptr<RolloutEngine> MakeEngine(const model::Transformer* m, const EngineConfig& c) {
  auto e = RolloutEngine::Create(m, c);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

// Greedy continuation by repeated full forwards (no cache at all).
std::vector<int32_t> Reference(const model::Transformer& m, const std::vector<int32_t>& prompt,
                               int steps) {
  c10::InferenceMode guard;
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    at::Tensor logits = m.Forward(at::tensor(seq).unsqueeze(0));
    const int64_t next = logits[0][static_cast<int64_t>(seq.size()) - 1].argmax().item<int64_t>();
    out.push_back(static_cast<int32_t>(next));
    seq.push_back(next);
  }
  return out;
}

// Copies `from`'s parameters into `to` (a weight update).
Status CopyWeights(const model::Transformer& from, model::Transformer* to) {
  c10::InferenceMode guard;
  auto src = from.NamedParameters();
  auto dst = to->NamedParameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second.detach().copy_(src[i].second);
  return Status::Ok();
}

TEST(BlockAllocatorTest, RefCountsExhaustionAndReuse) {
  BlockAllocator a(3);
  auto b0 = a.Allocate(), b1 = a.Allocate(), b2 = a.Allocate();
  ASSERT_TRUE(b0 && b1 && b2);
  EXPECT_FALSE(a.Allocate().has_value()) << "a full pool hands out nothing";
  EXPECT_EQ(a.used_blocks(), 3);
  a.Retain(*b1);
  EXPECT_EQ(a.RefCount(*b1), 2);
  a.Release(*b1);
  EXPECT_EQ(a.free_blocks(), 0) << "still referenced once";
  a.Release(*b1);
  EXPECT_EQ(a.free_blocks(), 1);
  EXPECT_EQ(*a.Allocate(), *b1) << "the freed block is reused";
  EXPECT_EQ(a.peak_used_blocks(), 3);
}

// Greedy tokens equal the full-forward reference alone, in a batch of mixed lengths, when the
// request joins a running batch mid-flight, and as a prefix-shared group.
TEST(RolloutEngineTest, GreedyMatchesFullForwardRegardlessOfBatchMates) {
  auto model = model::Transformer::Create(Spec(), 11, 0.3);
  const std::vector<int32_t> prompt = {3, 7, 1, 22, 9, 4, 17};
  const auto want = Reference(*model, prompt, 12);

  auto engine = MakeEngine(model.get(), SmallConfig());
  auto alone = engine->Generate({Req(prompt, 0, 0.0f, 12)});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ((*alone)[0].response.tokens, want);

  auto mixed = engine->Generate({Req({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 1, 1.0f, 3),
                                 Req(prompt, 0, 0.0f, 12), Req({4}, 2, 0.7f, 20),
                                 Req({5, 5}, 3, 1.0f, 7, /*n=*/3)});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ((*mixed)[1].response.tokens, want);

  // Joins mid-flight: other sequences are decoding when the request arrives.
  ASSERT_TRUE(engine->Add({Req({8, 8, 8}, 5, 1.0f, 30), Req({2, 9}, 6, 0.0f, 25)}).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine->Step().ok());
  Request late = Req(prompt, 0, 0.0f, 12);
  late.id = 77;
  ASSERT_TRUE(engine->Add({late}).ok());
  auto rest = engine->Run();
  ASSERT_TRUE(rest.ok()) << rest.status();
  bool seen = false;
  for (const auto& r : *rest) {
    if (r.id == 77) {
      seen = true;
      EXPECT_EQ(r.response.tokens, want);
    }
  }
  EXPECT_TRUE(seen);

  // A greedy group of 4 shares one prefill; every sample equals the reference.
  auto group = engine->Generate({Req(prompt, 9, 0.0f, 12, /*n=*/4)});
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->size(), 4u);
  for (const auto& r : *group) EXPECT_EQ(r.response.tokens, want) << "sample " << r.index;
  EXPECT_EQ(engine->allocator().used_blocks(), 0) << "blocks leaked";
}

// A sampled sequence depends only on (seed, position): alone, batched, or as sample i of a
// prefix-shared group, the tokens are the same.
TEST(RolloutEngineTest, SampledTokensDoNotDependOnBatchOrSharing) {
  auto model = model::Transformer::Create(Spec(), 12, 0.5);
  auto engine = MakeEngine(model.get(), SmallConfig());
  const std::vector<int32_t> prompt = {5, 6, 7, 1, 2};
  auto target = Req(prompt, 4242, 1.0f, 10);
  target.sampling.top_k = 8;
  auto alone = engine->Generate({target});
  ASSERT_TRUE(alone.ok()) << alone.status();

  std::vector<Request> batch;
  for (int i = 0; i < 10; ++i) {
    batch.push_back(Req({static_cast<int32_t>(i + 3), 2, 9, 1}, i, 1.0f, 6 + i));
  }
  batch.insert(batch.begin() + 4, target);
  auto batched = engine->Generate(batch);
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ((*alone)[0].response.tokens, (*batched)[4].response.tokens);

  // The same stream as sample 2 of a group seeded 4240 (sample i uses seed + i).
  auto group_req = target;
  group_req.seed = 4240;
  group_req.n = 4;
  for (bool sharing : {true, false}) {
    EngineConfig c = SmallConfig();
    c.prefix_sharing = sharing;
    auto e = MakeEngine(model.get(), c);
    auto group = e->Generate({group_req});
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_EQ((*group)[2].response.tokens, (*alone)[0].response.tokens) << "sharing " << sharing;
    for (size_t t = 0; t < (*alone)[0].response.tokens.size(); ++t) {
      // Another batch width (and shared prefix blocks) reorders the math: scaled rounding.
      EXPECT_NEAR((*group)[2].response.logprobs[t], (*alone)[0].response.logprobs[t],
                  1e-5 + 1e-5 * std::fabs((*alone)[0].response.logprobs[t]));
    }
  }
}

// Drop takes chosen requests out of a running engine (a GenerateStream call that went away):
// their blocks are freed at once, and the others finish with the tokens they get alone.
TEST(RolloutEngineTest, DroppingRequestsMidRunFreesThemAndLeavesTheOthersAlone) {
  auto model = model::Transformer::Create(Spec(), 12, 0.5);
  auto engine = MakeEngine(model.get(), SmallConfig());
  Request keep = Req({4, 8, 15, 16}, 77, 1.0f, 12, 3);
  keep.id = 1;
  keep.group = 1;
  auto alone = engine->Generate({keep});
  ASSERT_TRUE(alone.ok()) << alone.status();
  std::vector<Request> batch;
  for (uint64_t id : {2, 3}) {  // one running, one still waiting once the pool is tight
    Request r = Req({23, 4, 2}, 100 + id, 1.0f, 20, 8);
    r.id = id;
    r.group = id;
    batch.push_back(r);
  }
  batch.insert(batch.begin() + 1, keep);
  ASSERT_TRUE(engine->Add(batch).ok());
  std::vector<SampleResult> kept;
  for (int step = 0; step < 3; ++step) {
    auto done = engine->Step();
    ASSERT_TRUE(done.ok()) << done.status();
    for (auto& r : *done) kept.push_back(std::move(r));
  }
  const int64_t used = engine->allocator().used_blocks();
  EXPECT_EQ(engine->Drop([](uint64_t id) { return id != 1; }), 16);
  EXPECT_LT(engine->allocator().used_blocks(), used);
  EXPECT_EQ(engine->Drop([](uint64_t id) { return id != 1; }), 0) << "dropped twice";
  while (!engine->idle()) {
    auto done = engine->Step();
    ASSERT_TRUE(done.ok()) << done.status();
    for (auto& r : *done) kept.push_back(std::move(r));
  }
  ASSERT_EQ(kept.size(), 3u);
  std::sort(kept.begin(), kept.end(),
            [](const SampleResult& a, const SampleResult& b) { return a.index < b.index; });
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].id, 1u);
    EXPECT_TRUE(kept[i].finished);
    EXPECT_EQ(kept[i].response.tokens, (*alone)[i].response.tokens) << "sample " << i;
  }
  EXPECT_EQ(engine->allocator().used_blocks(), 0) << "blocks leaked";
}

// Logprobs are log softmax(logits / T) over the full vocabulary of the real context. The wide
// model's larger matrices (>= 64K weights, >= 16 rows) take the engine's CPU inference matmuls
// (W x^T, feature-major MLP) while its k/v projections keep at::linear.
void ExpectLogprobsMatchTheFullForward(const model::ModelSpec& spec, int n, double init_std) {
  auto model = model::Transformer::Create(spec, 13, init_std);
  auto engine = MakeEngine(model.get(), SmallConfig());
  auto r = Req({8, 3, 14, 2, 2, 9}, 7, 0.8f, 9, n);
  r.sampling.top_p = 0.9f;
  auto out = engine->Generate({r});
  ASSERT_TRUE(out.ok()) << out.status();
  c10::InferenceMode guard;
  for (const auto& s : *out) {
    std::vector<int64_t> seq = {8, 3, 14, 2, 2, 9};
    for (size_t t = 0; t < s.response.tokens.size(); ++t) {
      at::Tensor logits =
          model->Forward(at::tensor(seq).unsqueeze(0))[0][static_cast<int64_t>(seq.size()) - 1];
      const int32_t tok = s.response.tokens[t];
      const float want = at::log_softmax(logits / 0.8, -1)[tok].item<float>();
      // Float rounding of a differently ordered sum, relative to the logits' size.
      const float scale = (logits / 0.8).abs().max().item<float>();
      EXPECT_NEAR(s.response.logprobs[t], want, 1e-5 + 1e-5 * std::fabs(want) + 1e-6 * scale)
          << "sample " << s.index << " position " << t << ", largest |logit / T| " << scale;
      seq.push_back(tok);
    }
  }
}

TEST(RolloutEngineTest, LogprobsMatchTheFullForward) {
  ExpectLogprobsMatchTheFullForward(Spec(), 3, 0.5);
}

TEST(RolloutEngineTest, LogprobsMatchTheFullForwardOnAWideModel) {
  // 16 samples: every decode step has the 16 rows the engine's own matmuls need. Weights of std
  // 1/sqrt(256), as a trained model's: the tiny model's 0.5 would make a 256-wide model's logits
  // so large that rounding alone exceeds the tolerance (with at::linear as much as without).
  ExpectLogprobsMatchTheFullForward(testing::TinySpec(300, 256, 2, 4, 2, 512, 64), 16, 0.0625);
}

// The n samples of a group prefill the prompt once; the partially filled last prompt block is
// copied when they diverge, full blocks stay shared.
TEST(RolloutEngineTest, GroupPrefixSharingPrefillsOnceAndCopiesOnWrite) {
  auto model = model::Transformer::Create(Spec(), 14, 0.5);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2.5 blocks of 4
  auto shared = MakeEngine(model.get(), SmallConfig());
  auto a = shared->Generate({Req(prompt, 100, 1.0f, 6, /*n=*/4)});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(shared->stats().prefill_tokens, 10);
  EXPECT_EQ(shared->stats().prefix_shared_tokens, 30);
  EXPECT_EQ(shared->stats().cow_copies, 3) << "the last writer owns the block alone";
  EXPECT_EQ(shared->allocator().used_blocks(), 0);
  // 2 full prompt blocks + 4 copies of the third; each sample's 6 tokens end in position 15,
  // inside its own third/fourth block: 2 + 4 * 2 = 10 blocks at most.
  EXPECT_LE(shared->allocator().peak_used_blocks(), 10);

  EngineConfig c = SmallConfig();
  c.prefix_sharing = false;
  auto separate = MakeEngine(model.get(), c);
  auto b = separate->Generate({Req(prompt, 100, 1.0f, 6, /*n=*/4)});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(separate->stats().prefill_tokens, 40);
  EXPECT_EQ(separate->stats().prefix_shared_tokens, 0);
  EXPECT_GT(separate->allocator().peak_used_blocks(), shared->allocator().peak_used_blocks());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ((*a)[i].response.tokens, (*b)[i].response.tokens);
}

// A pool too small for the whole batch: requests wait or are preempted, never more blocks than
// the budget, same tokens as with a large pool, and every block back at the end.
TEST(RolloutEngineTest, SmallPoolWaitsAndPreemptsWithinBudgetWithoutChangingOutputs) {
  auto model = model::Transformer::Create(Spec(), 15, 0.3);
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(Req({static_cast<int32_t>(1 + i), 4, 5, static_cast<int32_t>(20 - i)},
                       static_cast<uint64_t>(i), i % 2 ? 0.0f : 1.0f, 20 + i, i % 3 == 0 ? 3 : 1));
  }
  auto big = MakeEngine(model.get(), SmallConfig(256));
  auto want = big->Generate(reqs);
  ASSERT_TRUE(want.ok()) << want.status();

  auto small = MakeEngine(model.get(), SmallConfig(/*num_blocks=*/16));
  auto got = small->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].response.tokens, (*want)[i].response.tokens) << "sample " << i;
  }
  EXPECT_LE(small->allocator().peak_used_blocks(), 16);
  EXPECT_GT(small->stats().preemptions, 0) << "the test should exercise preemption";
  EXPECT_EQ(small->allocator().used_blocks(), 0);
  EXPECT_TRUE(small->idle());
}

TEST(RolloutEngineTest, StopTokensStopStringsMaxTokensAndEos) {
  auto model = model::Transformer::Create(Spec(), 16, 0.3);
  auto engine = MakeEngine(model.get(), SmallConfig());
  const std::vector<int32_t> prompt = {1, 2, 3};
  const auto ref = Reference(*model, prompt, 8);

  auto length = engine->Generate({Req(prompt, 0, 0.0f, 8)});
  ASSERT_TRUE(length.ok());
  EXPECT_EQ((*length)[0].finish, Finish::kLength);
  EXPECT_EQ((*length)[0].response.tokens, ref);

  auto eos = Req(prompt, 0, 0.0f, 8);
  eos.sampling.stop_token_ids = {ref[2]};  // e.g. the tokenizer's EOS
  auto stopped = engine->Generate({eos});
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ((*stopped)[0].finish, Finish::kStop);
  const size_t first = std::find(ref.begin(), ref.end(), ref[2]) - ref.begin();
  EXPECT_EQ((*stopped)[0].response.tokens,
            std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));

  // Stop strings on the decoded text (here: token t decodes to the letter 'a' + t).
  auto with_string = Req(prompt, 0, 0.0f, 8);
  std::string text;
  for (int32_t t : ref) text.push_back(static_cast<char>('a' + t));
  with_string.sampling.stop_strings = {text.substr(3, 2)};
  EXPECT_EQ(engine->Generate({with_string}).status().code(), StatusCode::kInvalidArgument)
      << "stop strings without a decoder are refused";
  engine->SetDecoder([](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s.push_back(static_cast<char>('a' + t));
    return s;
  });
  auto by_string = engine->Generate({with_string});
  ASSERT_TRUE(by_string.ok()) << by_string.status();
  EXPECT_EQ((*by_string)[0].finish, Finish::kStop);
  const size_t end = text.find(text.substr(3, 2)) + 2;
  EXPECT_EQ((*by_string)[0].response.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + end));

  // Per-sample limits.
  auto limits = Req(prompt, 3, 1.0f, 8, /*n=*/3);
  limits.sample_max_new_tokens = {1, 5, 8};
  auto limited = engine->Generate({limits});
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ((*limited)[0].response.tokens.size(), 1u);
  EXPECT_EQ((*limited)[1].response.tokens.size(), 5u);
  EXPECT_EQ((*limited)[2].response.tokens.size(), 8u);
  EXPECT_EQ(engine->allocator().used_blocks(), 0);
}

// Reference for stop strings: the length, in characters, of the shortest prefix of `text` that
// contains one of `stops`; nullopt when none ever does.
std::optional<size_t> FirstStopEnd(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    for (const std::string& s : stops) {
      if (text.substr(0, end).find(s) != std::string::npos) return end;
    }
  }
  return std::nullopt;
}

std::string Letters(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) s.push_back(static_cast<char>('a' + t));
  return s;
}

// Two stop strings: either one ends a response, and when both occur the match that ends first
// wins whatever the order of the list, even against a longer match that starts earlier. The
// response is cut exactly as with one string (the completing token kept, nothing after it), and
// its earlier tokens are the ones the unstopped run drew.
TEST(RolloutEngineTest, EitherOfTwoStopStringsEndsAResponseAndTheEarliestMatchWins) {
  auto model = model::Transformer::Create(Spec(), 21, 0.3);
  auto engine = MakeEngine(model.get(), SmallConfig());
  engine->SetDecoder(Letters);  // token t decodes to the letter 'a' + t
  const std::vector<int32_t> prompt = {4, 8, 15};
  auto free_run = engine->Generate({Req(prompt, 77, 1.0f, 12)});
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  const std::vector<int32_t> full = (*free_run)[0].response.tokens;
  ASSERT_EQ(full.size(), 12u);
  const std::string text = Letters(full);

  // `late`: six letters starting at position 1, so its match ends at position 7. `early`: the
  // first letter after `late`'s start that has not appeared before, so it ends before 7.
  const std::string late = text.substr(1, 6);
  ASSERT_EQ(text.find(late), 1u) << text;
  size_t k = 2;
  while (k < 7 && text.find(text[k]) != k) ++k;
  ASSERT_LT(k, 7u) << "no fresh letter in " << text;
  const std::string early(1, text[k]);
  ASSERT_EQ(FirstStopEnd(text, {early}), k + 1);
  ASSERT_EQ(FirstStopEnd(text, {late}), 7u);

  auto run = [&](const std::vector<std::string>& stops) {
    Request r = Req(prompt, 77, 1.0f, 12);
    r.sampling.stop_strings = stops;
    auto got = engine->Generate({r});
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? (*got)[0] : SampleResult{};
  };
  for (const auto& stops : std::vector<std::vector<std::string>>{
           {late}, {early}, {late, early}, {early, late}, {late, "zzzz"}, {"zzzz", early}}) {
    const SampleResult r = run(stops);
    const size_t end = FirstStopEnd(text, stops).value();
    EXPECT_EQ(r.finish, Finish::kStop) << stops[0];
    EXPECT_EQ(r.response.tokens, std::vector<int32_t>(full.begin(), full.begin() + end))
        << "stops " << stops[0] << (stops.size() > 1 ? ", " + stops[1] : "");
    EXPECT_EQ(r.response.logprobs.size(), end);
    EXPECT_EQ(r.response.versions.size(), end);
  }
  EXPECT_EQ(run({late, early}).response.tokens.size(), k + 1) << "the earlier end wins";
  // Neither string occurs: the response runs to its length limit.
  ASSERT_FALSE(FirstStopEnd(text, {"zzzz", "yyyyy"}).has_value()) << text;
  const SampleResult none = run({"zzzz", "yyyyy"});
  EXPECT_EQ(none.finish, Finish::kLength);
  EXPECT_EQ(none.response.tokens, full);
  EXPECT_EQ(engine->allocator().used_blocks(), 0);
}

// Tokens that decode to several characters: a match may end inside a token. As with one stop
// string, the response keeps that whole token (and the text it carries after the match); each
// sample of a group stops on its own text.
TEST(RolloutEngineTest, StopStringsEndingInsideATokenKeepTheWholeTokenPerSample) {
  auto model = model::Transformer::Create(Spec(), 22, 0.3);
  auto engine = MakeEngine(model.get(), SmallConfig());
  // Token t decodes to two characters: 'a' + t, then 'A' + t.
  auto decode = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) {
      s.push_back(static_cast<char>('a' + t));
      s.push_back(static_cast<char>('A' + t));
    }
    return s;
  };
  engine->SetDecoder(decode);
  const std::vector<int32_t> prompt = {2, 3, 5, 7};
  auto free_run = engine->Generate({Req(prompt, 9, 1.0f, 10, /*n=*/4)});
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  const std::vector<int32_t>& tokens0 = (*free_run)[0].response.tokens;
  const std::string text0 = decode(tokens0);
  // Stop strings from sample 0. Listed second: the upper half of its 2nd token and the lower
  // half of its 3rd, a match that ends inside the 3rd token. Listed first: the lower half of a
  // later token whose letter has not appeared before, a match that ends later.
  size_t j = 3;
  while (j < tokens0.size() && text0.find(text0[2 * j]) != 2 * j) ++j;
  ASSERT_LT(j, tokens0.size()) << "no fresh letter in " << text0;
  const std::vector<std::string> stops = {text0.substr(2 * j, 1), text0.substr(3, 2)};
  ASSERT_EQ(FirstStopEnd(text0, {stops[1]}), 5u) << text0;
  ASSERT_EQ(FirstStopEnd(text0, {stops[0]}), 2 * j + 1) << text0;
  Request r = Req(prompt, 9, 1.0f, 10, /*n=*/4);
  r.sampling.stop_strings = stops;
  auto stopped = engine->Generate({r});
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  ASSERT_EQ(stopped->size(), 4u);
  int stopped_samples = 0;
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<int32_t>& full = (*free_run)[i].response.tokens;
    const std::string text = decode(full);
    const std::optional<size_t> chars = FirstStopEnd(text, stops);
    // The token holding the match's last character ends the response.
    const size_t tokens = chars ? (*chars + 1) / 2 : full.size();
    EXPECT_EQ((*stopped)[i].response.tokens,
              std::vector<int32_t>(full.begin(), full.begin() + tokens))
        << "sample " << i << " text " << text;
    EXPECT_EQ((*stopped)[i].finish, chars ? Finish::kStop : (*free_run)[i].finish)
        << "sample " << i;
    stopped_samples += chars.has_value();
  }
  EXPECT_GE(stopped_samples, 1);
  // Sample 0 stops on the second string, inside its 3rd token, and keeps that token whole: its
  // text goes one character past the match.
  EXPECT_EQ((*stopped)[0].finish, Finish::kStop);
  EXPECT_EQ((*stopped)[0].response.tokens,
            std::vector<int32_t>(tokens0.begin(), tokens0.begin() + 3));
  EXPECT_EQ(decode((*stopped)[0].response.tokens), text0.substr(0, 6));
  EXPECT_EQ(engine->allocator().used_blocks(), 0);
}

TEST(RolloutEngineTest, BadInputIsRejectedAndChangesNothing) {
  auto model = model::Transformer::Create(Spec(), 17, 0.3);
  auto engine = MakeEngine(model.get(), SmallConfig(/*num_blocks=*/8));
  const Request good = Req({1, 2}, 0, 0.0f, 4);
  auto expect_error = [&](Request bad, const std::string& text) {
    Status s = engine->Add({good, bad});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
    EXPECT_TRUE(engine->idle()) << "a rejected batch queues nothing";
  };
  expect_error(Req({}, 0, 0.0f, 4), "empty prompt");
  expect_error(Req({1, 30}, 0, 0.0f, 4), "token id 30 outside the vocabulary of 30");
  expect_error(Req({1}, 0, 0.0f, 0), "max_new_tokens must be >= 1");
  expect_error(Req(std::vector<int32_t>(60, 1), 0, 0.0f, 10), "exceeds max_seq_len 64");
  expect_error(Req(std::vector<int32_t>(30, 1), 0, 0.0f, 10),
               "needs 10 KV blocks; the cache holds 8");
  expect_error(Req({1}, 0, 0.0f, 4, /*n=*/0), "n must be in");
  auto bad_p = Req({1}, 0, 1.0f, 4);
  bad_p.sampling.top_p = 0;
  expect_error(bad_p, "top_p");
  auto bad_resume = Req({1}, 0, 1.0f, 4);
  bad_resume.resume.tokens = {1, 2};
  bad_resume.resume.logprobs = {0.0f};
  expect_error(bad_resume, "resumed response has 2 tokens but 1 log-probs");
  auto done = Req({1}, 0, 1.0f, 2);
  done.resume = {{1, 2}, {0, 0}, {1, 1}, {0, 0}};
  expect_error(done, "already has 2 tokens");
  auto scan = Req({1}, 0, 1.0f, 4);
  scan.resume = {{1, 2}, {0, 0}, {1, 1}, {0, 0}};
  scan.stop_scan_from = 3;
  expect_error(scan, "stop_scan_from 3 is outside the resumed response's 2 tokens");
  auto limits = Req({1}, 0, 1.0f, 4, 2);
  limits.sample_max_new_tokens = {3};
  expect_error(limits, "sample_max_new_tokens has 1 entries");
  EXPECT_EQ(engine->stats().steps, 0);
  EXPECT_EQ(engine->allocator().used_blocks(), 0);

  EngineConfig bad;
  bad.num_blocks = 0;
  EXPECT_EQ(RolloutEngine::Create(model.get(), bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlocksForBudget(*model, 10, 16).status().code(), StatusCode::kInvalidArgument);
  // 2 layers * 2 kv heads * 8 dims * 2 (k, v) * 4 bytes = 256 bytes per position.
  EXPECT_EQ(*BlocksForBudget(*model, 256 * 16 * 5 + 100, 16), 5);
}

// Multi-turn groundwork: a finished turn parks its KV (park_on_finish); the next turn resumes
// with the turn's tokens plus tokens an environment inserted, computes only what is new, and
// samples exactly what an engine without the parked KV samples. Inserted text never triggers a
// stop string (stop_scan_from).
TEST(RolloutEngineTest, AContinuationAfterInsertedTokensReusesTheFinishedTurnsKv) {
  auto model = model::Transformer::Create(Spec(), 23, 0.4);
  auto decode = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s.push_back(static_cast<char>('a' + t));
    return s;
  };
  const std::vector<int32_t> prompt = {4, 9, 2, 7, 7, 1, 3};
  const std::vector<int32_t> inserted = {5, 11, 6};  // decodes to "flg"
  auto turn2_of = [&](const SampleResult& turn1) {
    Request r = Req(prompt, turn1.seed, 0.0f, 24);
    r.resume = turn1.response;
    for (int32_t t : inserted) {
      r.resume.tokens.push_back(t);
      r.resume.logprobs.push_back(0.0f);
      r.resume.kept_mass.push_back(1.0f);
      r.resume.versions.push_back(0);
    }
    r.stop_scan_from = static_cast<int32_t>(turn1.response.tokens.size() + inserted.size());
    r.sampling.stop_strings = {"lg"};  // inside the inserted tokens only
    r.park_on_finish = true;
    return r;
  };
  std::vector<SampleResult> turn2;
  for (bool reuse : {true, false}) {
    auto engine = MakeEngine(model.get(), SmallConfig());
    engine->SetDecoder(decode);
    Request r1 = Req(prompt, 77, 0.0f, 6);
    r1.park_on_finish = true;
    auto turn1 = engine->Generate({r1});
    ASSERT_TRUE(turn1.ok()) << turn1.status();
    ASSERT_EQ((*turn1)[0].response.tokens.size(), 6u);
    EXPECT_EQ(engine->parked_sequences(), 1);
    if (!reuse) engine->ClearParked();
    engine->ResetStats();
    auto got = engine->Generate({turn2_of((*turn1)[0])});
    ASSERT_TRUE(got.ok()) << got.status();
    const int64_t context = static_cast<int64_t>(prompt.size() + 6 + inserted.size());
    if (reuse) {
      // The turn's context up to its last sampled token came from the parked KV.
      EXPECT_EQ(engine->stats().parked_reused_tokens, static_cast<int64_t>(prompt.size()) + 5);
      EXPECT_EQ(engine->stats().prefill_tokens, 1 + static_cast<int64_t>(inserted.size()));
    } else {
      EXPECT_EQ(engine->stats().parked_reused_tokens, 0);
      EXPECT_EQ(engine->stats().prefill_tokens, context);
    }
    EXPECT_EQ(engine->parked_sequences(), 1) << "turn 2 is parked for a turn 3";
    turn2.push_back((*got)[0]);
  }
  // Same tokens with and without the parked KV; the inserted tokens stay in place.
  EXPECT_EQ(turn2[0].response.tokens, turn2[1].response.tokens);
  ASSERT_EQ(turn2[0].response.tokens.size(), 24u) << "the inserted \"lg\" stopped nothing";
  EXPECT_EQ(std::vector<int32_t>(turn2[0].response.tokens.begin() + 6,
                                 turn2[0].response.tokens.begin() + 9),
            inserted);
  for (size_t t = 9; t < 24; ++t) {
    EXPECT_NEAR(turn2[0].response.logprobs[t], turn2[1].response.logprobs[t],
                1e-5 * (1 + std::abs(turn2[1].response.logprobs[t])))
        << t;
  }
}

// Partial rollouts: stop at a target number of finished groups, hand back the rest, swap the
// weights, resume without generating the returned tokens again.
class PartialRolloutTest : public ::testing::TestWithParam<WeightUpdateKv> {};

TEST_P(PartialRolloutTest, StopAtTargetThenResumeAfterAWeightUpdate) {
  auto model = model::Transformer::Create(Spec(), 18, 0.4);
  auto next = model::Transformer::Create(Spec(), 19, 0.4);  // the "trained" weights
  EngineConfig c = SmallConfig();
  c.weight_update_kv = GetParam();
  auto engine = MakeEngine(model.get(), c);
  engine->set_version(3);
  // Group 0 is short, groups 1 and 2 long: stop after one finished group.
  std::vector<Request> reqs;
  for (uint64_t g = 0; g < 3; ++g) {
    Request r = Req({static_cast<int32_t>(2 + g), 4, 6, 8, 1}, 1000 * g, 1.0f, 40, /*n=*/2);
    r.group = g;
    if (g == 0) r.sampling.max_new_tokens = 3;
    reqs.push_back(r);
  }
  ASSERT_TRUE(engine->Add(reqs).ok());
  auto first = engine->Run(/*target_groups=*/1);
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<SampleResult> unfinished;
  int finished_group0 = 0;
  for (auto& r : *first) {
    if (r.finished) {
      EXPECT_EQ(r.group, 0u);
      ++finished_group0;
    } else {
      EXPECT_GT(r.response.tokens.size(), 0u);
      EXPECT_LT(r.response.tokens.size(), 40u);
      for (int64_t v : r.response.versions) EXPECT_EQ(v, 3);
      unfinished.push_back(r);
    }
  }
  EXPECT_EQ(finished_group0, 2);
  ASSERT_EQ(unfinished.size(), 4u);
  EXPECT_TRUE(engine->idle());
  EXPECT_EQ(engine->parked_sequences(), 4);

  ASSERT_TRUE(engine->UpdateWeights(4, [&] { return CopyWeights(*next, model.get()); }).ok());
  engine->ResetStats();
  std::vector<Request> resumes;
  int64_t context = 0;
  for (const auto& u : unfinished) {
    Request r = Req(reqs[u.group].prompt, u.seed, 1.0f, 40);
    r.group = u.group;
    r.id = u.index;
    r.resume = u.response;
    context += static_cast<int64_t>(r.prompt.size() + u.response.tokens.size());
    resumes.push_back(r);
  }
  ASSERT_TRUE(engine->Add(resumes).ok());
  auto second = engine->Run();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->size(), 4u);
  int64_t generated = 0;
  for (const auto& r : *second) {
    EXPECT_TRUE(r.finished);
    const SampleResult* before = nullptr;
    for (const auto& u : unfinished) {
      if (u.seed == r.seed) before = &u;
    }
    ASSERT_NE(before, nullptr);
    const size_t old = before->response.tokens.size();
    ASSERT_EQ(r.response.tokens.size(), 40u);
    // The returned prefix is kept as it was, and its versions say who produced each token.
    EXPECT_EQ(std::vector<int32_t>(r.response.tokens.begin(), r.response.tokens.begin() + old),
              before->response.tokens);
    for (size_t t = 0; t < r.response.versions.size(); ++t) {
      EXPECT_EQ(r.response.versions[t], t < old ? 3 : 4) << "token " << t;
    }
    generated += static_cast<int64_t>(r.response.tokens.size() - old);
    EXPECT_EQ(r.kv_version, GetParam() == WeightUpdateKv::kKeep ? 3 : 4);
  }
  EXPECT_EQ(engine->stats().generated_tokens, generated) << "no returned token is drawn again";
  if (GetParam() == WeightUpdateKv::kKeep) {
    // The parked context is reused: only the last returned token of each sample is computed.
    EXPECT_EQ(engine->stats().prefill_tokens, 0);
    EXPECT_EQ(engine->stats().parked_reused_tokens, context - 4);
  } else {
    EXPECT_EQ(engine->stats().prefill_tokens, context);
    EXPECT_EQ(engine->stats().parked_reused_tokens, 0);
  }
  EXPECT_EQ(engine->allocator().used_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(KvPolicy, PartialRolloutTest,
                         ::testing::Values(WeightUpdateKv::kKeep, WeightUpdateKv::kRecompute),
                         [](const ::testing::TestParamInfo<WeightUpdateKv>& info) {
                           return info.param == WeightUpdateKv::kKeep ? "Keep" : "Recompute";
                         });

// A weight update in the middle of generation: recompute gives exactly what a fresh engine with
// the new weights gives for the same prefix; keep continues from the old keys/values.
TEST(RolloutEngineTest, WeightUpdateMidGenerationKeepVersusRecompute) {
  const std::vector<int32_t> prompt = {4, 9, 2, 7, 7, 1};
  std::map<WeightUpdateKv, SampleResult> got;
  std::vector<int32_t> prefix_tokens;
  for (WeightUpdateKv policy : {WeightUpdateKv::kKeep, WeightUpdateKv::kRecompute}) {
    auto model = model::Transformer::Create(Spec(), 20, 0.4);
    auto next = model::Transformer::Create(Spec(), 21, 0.4);
    EngineConfig c = SmallConfig();
    c.weight_update_kv = policy;
    auto engine = MakeEngine(model.get(), c);
    ASSERT_TRUE(engine->Add({Req(prompt, 55, 1.0f, 20)}).ok());
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(engine->Step().ok());  // prefill + 5 decodes
    ASSERT_TRUE(engine->UpdateWeights(1, [&] { return CopyWeights(*next, model.get()); }).ok());
    const int64_t prefill_before = engine->stats().prefill_tokens;
    auto out = engine->Run();
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 1u);
    got[policy] = (*out)[0];
    const int64_t recomputed = engine->stats().prefill_tokens - prefill_before;
    EXPECT_EQ(recomputed, policy == WeightUpdateKv::kKeep ? 0 : 6 + 6);
  }
  const auto& keep = got[WeightUpdateKv::kKeep];
  const auto& recompute = got[WeightUpdateKv::kRecompute];
  ASSERT_EQ(keep.response.tokens.size(), 20u);
  ASSERT_EQ(recompute.response.tokens.size(), 20u);
  const std::vector<int32_t> prefix(keep.response.tokens.begin(), keep.response.tokens.begin() + 6);
  EXPECT_EQ(prefix, std::vector<int32_t>(recompute.response.tokens.begin(),
                                         recompute.response.tokens.begin() + 6));

  // A fresh engine on the new weights, resuming the same 6-token prefix.
  auto fresh_model = model::Transformer::Create(Spec(), 21, 0.4);
  auto fresh = MakeEngine(fresh_model.get(), SmallConfig());
  fresh->set_version(1);
  Request r = Req(prompt, 55, 1.0f, 20);
  r.resume.tokens = prefix;
  r.resume.logprobs = std::vector<float>(recompute.response.logprobs.begin(),
                                         recompute.response.logprobs.begin() + 6);
  r.resume.kept_mass = std::vector<float>(6, 1.0f);
  r.resume.versions = std::vector<int64_t>(6, 0);
  auto want = fresh->Generate({r});
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(recompute.response.tokens, (*want)[0].response.tokens);
  for (size_t t = 6; t < 20; ++t) {
    EXPECT_NEAR(recompute.response.logprobs[t], (*want)[0].response.logprobs[t],
                1e-5 + 1e-5 * std::fabs((*want)[0].response.logprobs[t]));
  }
  EXPECT_EQ(recompute.kv_version, 1);
  EXPECT_EQ(keep.kv_version, 0) << "kept KV is marked with the old version";
  // Keeping the old keys/values changes the distribution of the next token.
  EXPECT_GT(std::abs(keep.response.logprobs[6] - recompute.response.logprobs[6]) +
                std::abs(keep.response.logprobs[7] - recompute.response.logprobs[7]),
            1e-4);
}

TEST(RolloutEngineTest, StaticSchedulingAdmitsOnlyIntoAnEmptyBatch) {
  auto model = model::Transformer::Create(Spec(), 22, 0.3);
  EngineConfig c = SmallConfig();
  c.scheduling = Scheduling::kStatic;
  c.max_running = 2;
  auto engine = MakeEngine(model.get(), c);
  ASSERT_TRUE(
      engine->Add({Req({1, 2}, 0, 0.0f, 2), Req({3, 4}, 1, 0.0f, 9), Req({5, 6}, 2, 0.0f, 2)})
          .ok());
  int64_t steps_with_one = 0;
  while (!engine->idle()) {
    ASSERT_TRUE(engine->Step().ok());
    if (engine->running_slots() == 1) ++steps_with_one;
    EXPECT_LE(engine->running_slots(), 2);
  }
  // The third request waits for the 9-token one although a slot is free after 2 tokens.
  EXPECT_GE(steps_with_one, 6);
  auto cont = MakeEngine(model.get(), SmallConfig());
  auto a = cont->Generate({Req({3, 4}, 1, 0.0f, 9)});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0].response.tokens, Reference(*model, {3, 4}, 9));
}

// DropAll (what Run does when a step fails) leaves an idle engine with every block free, and
// the engine keeps working afterwards.
// Preempt takes chosen samples out mid-run with their tokens so far; a resume of one on another
// engine draws the same tokens as the sample would have had (the sampling stream is the sample's
// seed and position), and the samples left behind finish as if alone. A group still waiting for
// its prefill goes only whole.
TEST(RolloutEngineTest, PreemptedSamplesContinueElsewhereToTheSameTokens) {
  auto model = model::Transformer::Create(Spec(), 12, 0.5);
  auto engine = MakeEngine(model.get(), SmallConfig());
  Request group = Req({4, 8, 15, 16}, 77, 1.0f, 12, 3);
  group.id = 1;
  group.group = 1;
  Request waiting = Req({23, 4, 2}, 5, 1.0f, 12, 2);
  waiting.id = 2;
  waiting.group = 2;
  auto alone = engine->Generate({group});
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(engine->Add({group}).ok());
  for (int step = 0; step < 4; ++step) ASSERT_TRUE(engine->Step().ok());
  ASSERT_TRUE(engine->Add({waiting}).ok());
  // Sample 1 of the running group, and half of the group not prefilled yet (left alone).
  auto taken = engine->Preempt([](uint64_t id, int32_t index) {
    return (id == 1 && index == 1) || (id == 2 && index == 0);
  });
  ASSERT_EQ(taken.size(), 1u);
  const SampleResult& cut = taken[0];
  EXPECT_EQ(cut.id, 1u);
  EXPECT_EQ(cut.index, 1);
  EXPECT_FALSE(cut.finished);
  EXPECT_EQ(cut.finish, Finish::kAbort);
  ASSERT_GT(cut.response.tokens.size(), 0u);
  ASSERT_LT(cut.response.tokens.size(), (*alone)[1].response.tokens.size());
  const std::vector<int32_t> prefix((*alone)[1].response.tokens.begin(),
                                    (*alone)[1].response.tokens.begin() +
                                        static_cast<std::ptrdiff_t>(cut.response.tokens.size()));
  EXPECT_EQ(cut.response.tokens, prefix);
  EXPECT_EQ(cut.response.versions.size(), cut.response.tokens.size());
  // The whole waiting group can go.
  auto whole = engine->Preempt([](uint64_t id, int32_t) { return id == 2; });
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].index, 0);
  EXPECT_EQ(whole[1].index, 1);
  EXPECT_TRUE(whole[0].response.tokens.empty());
  std::vector<SampleResult> rest;
  while (!engine->idle()) {
    auto done = engine->Step();
    ASSERT_TRUE(done.ok()) << done.status();
    for (auto& r : *done) rest.push_back(std::move(r));
  }
  ASSERT_EQ(rest.size(), 2u);
  for (const auto& r : rest) {
    EXPECT_NE(r.index, 1);
    EXPECT_EQ(r.response.tokens, (*alone)[static_cast<size_t>(r.index)].response.tokens);
  }
  EXPECT_EQ(engine->allocator().used_blocks(), 0) << "blocks leaked";
  // Continued on a fresh engine from its tokens: the sample it would have been.
  auto other = MakeEngine(model.get(), SmallConfig());
  Request resume = Req({4, 8, 15, 16}, cut.seed, 1.0f, 12, 1);
  resume.id = 9;
  resume.group = 1;
  resume.resume = cut.response;
  auto continued = other->Generate({resume});
  ASSERT_TRUE(continued.ok()) << continued.status();
  ASSERT_EQ(continued->size(), 1u);
  EXPECT_EQ((*continued)[0].response.tokens, (*alone)[1].response.tokens);
}

TEST(RolloutEngineTest, DropAllFreesEverything) {
  auto model = model::Transformer::Create(Spec(), 23, 0.3);
  auto engine = MakeEngine(model.get(), SmallConfig());
  ASSERT_TRUE(engine->Add({Req({1, 2, 3}, 0, 1.0f, 20, 3), Req({4, 5}, 1, 1.0f, 20)}).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->Step().ok());
  EXPECT_GT(engine->allocator().used_blocks(), 0);
  engine->DropAll();
  EXPECT_TRUE(engine->idle());
  EXPECT_EQ(engine->allocator().used_blocks(), 0);
  auto again = engine->Generate({Req({1, 2, 3}, 0, 0.0f, 5)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].response.tokens, Reference(*model, {1, 2, 3}, 5));
}

}  // namespace
}  // namespace gyre::rollout
