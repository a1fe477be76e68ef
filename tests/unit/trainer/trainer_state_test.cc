#include "trainer/trainer_state.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

#include "common/file_util.h"
#include "testing/tiny_model.h"

namespace gyre::trainer {
namespace {

model::ModelSpec Spec(int64_t hidden = 32) { return testing::TinySpec(24, hidden, 1, 4, 2, 48); }

std::unique_ptr<PolicyTrainer> MakeTrainer(uint64_t seed, int64_t hidden = 32) {
  return std::make_unique<PolicyTrainer>(model::Transformer::Create(Spec(hidden), seed, 0.1), 1e-2,
                                         0.01, 0.9, 0.999);
}

std::vector<TrainSample> Batch(int k) {
  std::vector<TrainSample> b;
  for (int i = 0; i < 5; ++i) {
    TrainSample s;
    s.prompt = {1, static_cast<int32_t>(3 + (i + k) % 7), 5};
    s.response.assign(2 + i % 3, static_cast<int32_t>(7 + (i * k) % 11));
    s.rollout_logprobs.assign(s.response.size(), -1.0f);
    s.advantage = (i % 2 == 0 ? 1.0f : -0.5f) * static_cast<float>(1 + i + k);
    b.push_back(s);
  }
  return b;
}

// Alternates supervised and policy-gradient steps, as a job's warm-up and GRPO phases do.
std::vector<double> Train(PolicyTrainer* t, int first, int steps) {
  TrainOptions o;
  o.micro_batch_size = 2;
  o.mini_batches = 2;
  std::vector<double> losses;
  for (int k = first; k < first + steps; ++k) {
    const Objective obj = k % 2 == 0 ? Objective::kSft : Objective::kPolicyGradient;
    auto m = t->Step(Batch(k), obj, 1e-2, o);
    EXPECT_TRUE(m.ok()) << m.status();
    losses.push_back(m.ok() ? (*m)["loss"] : 0.0);
  }
  return losses;
}

at::Tensor Flat(const PolicyTrainer& t) {
  std::vector<at::Tensor> parts;
  for (const auto& [n, p] : t.model().NamedParameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts).clone();
}

std::string TempDir(const std::string& tag) {
  const std::string dir =
      TempDirectory() + "/gyre_trainer_state_" + tag + "_" + std::to_string(::getpid());
  EXPECT_TRUE(RemoveTree(dir).ok());
  return dir;
}

TEST(TrainerStateTest, RestoredTrainerContinuesBitForBit) {
  const std::string dir = TempDir("resume");
  auto a = MakeTrainer(3);
  Train(a.get(), 0, 3);
  const int64_t saved_version = a->version();
  ASSERT_EQ(saved_version, 4);  // SFT, PG (2 mini-batches), SFT
  ASSERT_TRUE(SaveTrainerState(dir, *a, "").ok());
  for (const char* f :
       {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(PathExists(dir + "/" + f)) << f;
  }
  const at::Tensor rng_after_save = at::rand({8});
  const std::vector<double> losses_a = Train(a.get(), 3, 4);

  // A trainer built from another seed: only the loaded state can make it match.
  auto b = MakeTrainer(77);
  ASSERT_FALSE(at::equal(Flat(*a), Flat(*b)));
  ASSERT_TRUE(LoadTrainerState(dir, b.get()).ok());
  EXPECT_EQ(b->version(), saved_version);
  EXPECT_TRUE(at::equal(at::rand({8}), rng_after_save)) << "torch's CPU generator not restored";
  const std::vector<double> losses_b = Train(b.get(), 3, 4);
  EXPECT_EQ(losses_a, losses_b);
  EXPECT_TRUE(at::equal(Flat(*a), Flat(*b)));
  EXPECT_EQ(a->version(), b->version());
  const auto sa = a->OptimizerState(), sb = b->OptimizerState();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].step, sb[i].step);
    EXPECT_TRUE(at::equal(sa[i].exp_avg, sb[i].exp_avg));
    EXPECT_TRUE(at::equal(sa[i].exp_avg_sq, sb[i].exp_avg_sq));
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// A trainer that has not stepped yet has no optimizer moments; that round-trips too.
TEST(TrainerStateTest, FreshTrainerRoundTrips) {
  const std::string dir = TempDir("fresh");
  auto a = MakeTrainer(5);
  ASSERT_TRUE(SaveTrainerState(dir, *a, "").ok());
  auto b = MakeTrainer(6);
  ASSERT_TRUE(LoadTrainerState(dir, b.get()).ok());
  EXPECT_EQ(b->version(), 0);
  EXPECT_TRUE(at::equal(Flat(*a), Flat(*b)));
  EXPECT_EQ(Train(a.get(), 0, 2), Train(b.get(), 0, 2));
  EXPECT_TRUE(at::equal(Flat(*a), Flat(*b)));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// Each corruption is rejected with the file's name, and the trainer keeps its state.
TEST(TrainerStateTest, CorruptStateIsRejectedAndChangesNothing) {
  const std::string dir = TempDir("corrupt");
  auto a = MakeTrainer(3);
  Train(a.get(), 0, 2);
  ASSERT_TRUE(SaveTrainerState(dir, *a, "").ok());
  const std::string good_json = *ReadFileToString(dir + "/trainer_state.json");
  const std::string good_model = *ReadFileToString(dir + "/model.safetensors");

  auto expect_rejected = [&](PolicyTrainer* t, const std::string& file, const std::string& what) {
    const at::Tensor before = Flat(*t);
    const int64_t version = t->version();
    const Status s = LoadTrainerState(dir, t);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(file), std::string::npos) << what << ": " << s.message();
    EXPECT_TRUE(at::equal(before, Flat(*t))) << what;
    EXPECT_EQ(version, t->version()) << what;
  };
  auto b = MakeTrainer(9);

  // A model of another shape (config mismatch).
  auto wide = MakeTrainer(9, 64);
  expect_rejected(wide.get(), "trainer_state.json", "shape mismatch");

  ASSERT_TRUE(WriteFileAtomic(dir + "/trainer_state.json", "{\"format\": ").ok());
  expect_rejected(b.get(), "trainer_state.json", "bad JSON");

  std::string bad = good_json;
  bad.replace(bad.find("\"format_version\": 1"), 19, "\"format_version\": 7");
  ASSERT_TRUE(WriteFileAtomic(dir + "/trainer_state.json", bad).ok());
  expect_rejected(b.get(), "trainer_state.json", "unknown format version");

  bad = good_json;
  bad.replace(bad.find("\"name\""), 6, "\"nome\"");
  ASSERT_TRUE(WriteFileAtomic(dir + "/trainer_state.json", bad).ok());
  expect_rejected(b.get(), "trainer_state.json", "a parameter without a name");

  // One parameter claims no optimizer state: optimizer.safetensors then has extra tensors.
  bad = good_json;
  const std::string step = "\"step\": " + std::to_string(a->OptimizerState()[0].step);
  const size_t step_at = bad.find(step);
  ASSERT_NE(step_at, std::string::npos) << bad;
  bad.replace(step_at, step.size(), "\"step\": 0");
  ASSERT_TRUE(WriteFileAtomic(dir + "/trainer_state.json", bad).ok());
  expect_rejected(b.get(), "optimizer.safetensors", "extra moments");

  ASSERT_TRUE(WriteFileAtomic(dir + "/trainer_state.json", good_json).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/model.safetensors", good_model.substr(0, 300)).ok());
  expect_rejected(b.get(), "model.safetensors", "truncated weights");

  ASSERT_TRUE(WriteFileAtomic(dir + "/model.safetensors", good_model).ok());
  ASSERT_TRUE(RemoveTree(dir + "/optimizer.safetensors").ok());
  expect_rejected(b.get(), "optimizer.safetensors", "missing optimizer file");

  EXPECT_FALSE(LoadTrainerState(dir + "/nowhere", b.get()).ok());
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// With the KL term the reference policy (frozen at the first policy-gradient step) is part of the
// state: a restored trainer continues bit for bit, KL included; a state without one drops a
// reference the loading trainer had; a broken reference file is refused and changes nothing.
TEST(TrainerStateTest, TheKlReferencePolicyIsSavedAndRestored) {
  const std::string dir = TempDir("reference");
  TrainOptions o;
  o.micro_batch_size = 2;
  o.loss.kl = kernels::KlKind::kK3;
  o.loss.kl_coef = 0.5f;
  auto steps = [&](PolicyTrainer* t, int first, int n) {
    std::vector<double> out;
    for (int k = first; k < first + n; ++k) {
      auto m = t->Step(Batch(k), Objective::kPolicyGradient, 1e-2, o);
      EXPECT_TRUE(m.ok()) << m.status();
      out.push_back(m.ok() ? (*m)["kl_ref"] : -1.0);
      out.push_back(m.ok() ? (*m)["loss"] : -1.0);
    }
    return out;
  };
  auto a = MakeTrainer(3);
  ASSERT_EQ(a->reference(), nullptr);
  Train(a.get(), 0, 1);  // a supervised step first: the reference is what GRPO starts from
  const at::Tensor start = Flat(*a);
  const std::vector<double> first = steps(a.get(), 1, 2);
  ASSERT_NE(a->reference(), nullptr);
  EXPECT_EQ(first[0], 0.0);  // the first step's policy is the reference
  EXPECT_GT(first[2], 0.0);  // the second has moved away from it
  ASSERT_TRUE(SaveTrainerState(dir, *a, "").ok());
  EXPECT_TRUE(PathExists(dir + "/reference.safetensors"));

  auto b = MakeTrainer(77);
  ASSERT_TRUE(LoadTrainerState(dir, b.get()).ok());
  ASSERT_NE(b->reference(), nullptr);
  std::vector<at::Tensor> ref_parts;
  for (const auto& [n, p] : b->reference()->NamedParameters()) ref_parts.push_back(p.flatten());
  EXPECT_TRUE(at::equal(at::cat(ref_parts), start));
  EXPECT_EQ(steps(a.get(), 3, 2), steps(b.get(), 3, 2));
  EXPECT_TRUE(at::equal(Flat(*a), Flat(*b)));

  // A reference file whose tensor has the wrong shape: refused, naming the file, no change.
  auto wide_ref = MakeTrainer(5, 64);
  wide_ref->FreezeReference();
  const std::string good_ref = *ReadFileToString(dir + "/reference.safetensors");
  const std::string other = TempDir("reference_wide");
  ASSERT_TRUE(SaveTrainerState(other, *wide_ref, "").ok());
  ASSERT_TRUE(CopyFile(other + "/reference.safetensors", dir + "/reference.safetensors").ok());
  const at::Tensor before = Flat(*b);
  Status s = LoadTrainerState(dir, b.get());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("reference.safetensors"), std::string::npos) << s.message();
  EXPECT_TRUE(at::equal(before, Flat(*b)));
  ASSERT_TRUE(RemoveTree(dir + "/reference.safetensors").ok());
  s = LoadTrainerState(dir, b.get());
  EXPECT_NE(s.message().find("reference.safetensors"), std::string::npos) << s.message();
  ASSERT_TRUE(WriteFileAtomic(dir + "/reference.safetensors", good_ref).ok());

  // A state saved without a reference drops the loading trainer's, and the save removes the
  // stale file of an earlier save into the same directory.
  auto plain = MakeTrainer(8);
  ASSERT_TRUE(SaveTrainerState(dir, *plain, "").ok());
  EXPECT_FALSE(PathExists(dir + "/reference.safetensors"));
  ASSERT_TRUE(LoadTrainerState(dir, b.get()).ok());
  EXPECT_EQ(b->reference(), nullptr);
  EXPECT_TRUE(RemoveTree(dir).ok());
  EXPECT_TRUE(RemoveTree(other).ok());
}

// Found by fuzz_controller_state in the controller's reader (docs/reliability.md); the trainer's
// reader had the same line: a "format" that is not a string threw instead of being refused.
TEST(TrainerStateTest, NonStringFormatIsAnErrorNotAnException) {
  const std::string dir = TempDir("format_type");
  auto a = MakeTrainer(3);
  ASSERT_TRUE(SaveTrainerState(dir, *a, "").ok());
  for (const char* json : {"{\"format\": 7}", "{\"format\": {}}"}) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/trainer_state.json", json).ok());
    const Status s = LoadTrainerState(dir, a.get());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("not a trainer state"), std::string::npos) << s;
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre::trainer
