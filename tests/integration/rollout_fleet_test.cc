// RolloutFleet (include/gyre/rollout.h) with real rollout worker processes on loopback: weights
// published from this process reach every worker intact (the samples' log-probs are the ones a
// forward pass of the published model gives, version by version), receipts carry the workers'
// checksums, bad weight sources and requests are refused without changing anything, and a
// cancelled token stops a call.

#include <dirent.h>
#include <gtest/gtest.h>
#include <gyre/rollout.h>
#include <gyre/task.h>
#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "integration/run_util.h"
#include "model/transformer.h"
#include "rpc/rpc_util.h"
#include "test_paths.h"
#include "text/tokenizer.h"

namespace gyre {
namespace {

// The parameters of a Transformer as a weight source (host memory, float32).
class ModelSource final : public WeightSource {
 public:
  explicit ModelSource(const model::Transformer& m) : params_(m.NamedParameters()) {}
  std::vector<TensorView> Tensors() const override {
    std::vector<TensorView> out;
    for (const auto& [name, t] : params_) {
      TensorView v;
      v.name = name;
      v.shape = t.sizes().vec();
      v.data = t.data_ptr();
      v.bytes = static_cast<uint64_t>(t.numel()) * 4;
      out.push_back(v);
    }
    return out;
  }
  model::NamedTensors params_;
};

// A source that edits another's tensor list (to make it bad).
class EditedSource final : public WeightSource {
 public:
  EditedSource(const WeightSource& base, std::function<void(std::vector<TensorView>*)> edit)
      : base_(base), edit_(std::move(edit)) {}
  std::vector<TensorView> Tensors() const override {
    auto t = base_.Tensors();
    edit_(&t);
    return t;
  }

 private:
  const WeightSource& base_;
  std::function<void(std::vector<TensorView>*)> edit_;
};

JobConfig FleetConfig(const std::string& dir, const std::string& transport) {
  JobConfig c;
  c.job.name = "fleet";
  c.job.output_dir = dir;
  c.rollout.workers = 2;
  c.rollout.max_new_tokens = 6;
  c.cluster.weight_transport = transport;
  return c;
}

std::unique_ptr<model::Transformer> MakeModel(const JobConfig& c, uint64_t seed) {
  const auto spec = model::SpecFromConfig(c.model, text::CharTokenizer().vocab_size());
  return model::Transformer::Create(spec, seed, 0.3);  // large init: peaked, distinct outputs
}

// Every sampled token's log-prob (temperature 1) must be the one `m` gives, and every sample
// must carry `version` on each token.
void ExpectFromModel(const std::vector<Sample>& samples, const model::Transformer& m,
                     int64_t version) {
  torch::NoGradGuard no_grad;
  for (const Sample& s : samples) {
    ASSERT_FALSE(s.response_ids.empty());
    ASSERT_EQ(s.logprobs.size(), s.response_ids.size());
    std::vector<int64_t> ids(s.prompt_ids.begin(), s.prompt_ids.end());
    ids.insert(ids.end(), s.response_ids.begin(), s.response_ids.end());
    auto logits = m.Forward(torch::tensor(ids).unsqueeze(0));
    auto logp = torch::log_softmax(logits[0], -1);
    const size_t p = s.prompt_ids.size();
    for (size_t j = 0; j < s.response_ids.size(); ++j) {
      const float want = logp[static_cast<int64_t>(p + j - 1)][s.response_ids[j]].item<float>();
      EXPECT_NEAR(s.logprobs[j], want, 1e-3 * std::max(1.0f, std::fabs(want)))
          << "sample " << s.sample_id << " token " << j;
      EXPECT_EQ(s.versions[j], version);
      EXPECT_EQ(s.loss_mask[j], 1.0f);
    }
  }
}

std::vector<PromptGroup> Groups(const RolloutFleet& fleet, int count, int n) {
  std::vector<PromptGroup> groups;
  for (int g = 0; g < count; ++g) {
    PromptGroup pg;
    pg.group_id = 100 + g;
    pg.prompt_ids = *fleet.EncodePrompt(std::to_string(g * 7) + "+" + std::to_string(g) + "=");
    pg.n = n;
    pg.first_sample_id = pg.group_id * 10;
    pg.seed = 1000 + g;
    groups.push_back(pg);
  }
  return groups;
}

void RunFleet(const std::string& transport) {
  const std::string dir = testing::MakeTempDir("fleet_" + transport);
  RolloutFleetOptions opts;
  opts.config = FleetConfig(dir, transport);
  opts.worker_binary = GYRE_BINARY;
  auto fleet = RolloutFleet::Open(opts);
  ASSERT_TRUE(fleet.ok()) << fleet.status();
  RolloutFleet& f = **fleet;
  EXPECT_EQ(f.Workers(), (std::vector<std::string>{"rollout-0", "rollout-1"}));
  EXPECT_EQ(f.version(), -1);
  {
    auto m = MakeModel(opts.config, 1);
    const auto params = m->NamedParameters();
    const auto specs = f.Parameters();
    ASSERT_EQ(specs.size(), params.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(specs[i].name, params[i].first);
      EXPECT_EQ(specs[i].shape, params[i].second.sizes().vec());
    }
  }

  // No weights yet.
  auto early = f.Generate(Groups(f, 2, 2), f.DefaultSampling());
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition) << early.status();

  auto m0 = MakeModel(opts.config, 7);
  ModelSource s0(*m0);
  auto r0 = f.PublishWeights(0, s0);
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(r0->transport, transport);
  ASSERT_EQ(r0->receipts.size(), 2u);
  for (const WeightReceipt& r : r0->receipts) {
    EXPECT_TRUE(r.ok) << r.worker << ": " << r.error;
    EXPECT_EQ(r.version, 0);
    EXPECT_EQ(r.bytes, r0->bytes);
    EXPECT_FALSE(r.bucket_crc32.empty());
    EXPECT_EQ(r.bucket_crc32, r0->receipts[0].bucket_crc32);
  }

  // Sampled at temperature 1: the log-probs are the published model's.
  GenerateStats stats;
  auto groups = Groups(f, 6, 3);
  auto out0 = f.Generate(groups, f.DefaultSampling(), &stats);
  ASSERT_TRUE(out0.ok()) << out0.status();
  ASSERT_EQ(out0->size(), 18u);
  for (size_t i = 0; i < out0->size(); ++i) {
    const Sample& s = (*out0)[i];
    EXPECT_EQ(s.group_id, groups[i / 3].group_id);
    EXPECT_EQ(s.sample_id, groups[i / 3].first_sample_id + i % 3);
    EXPECT_EQ(s.prompt_ids, groups[i / 3].prompt_ids);
    EXPECT_NE(s.finish_reason, FinishReason::kUnspecified);
  }
  EXPECT_GT(stats.generated_tokens, 0);
  ExpectFromModel(*out0, *m0, 0);

  // Bad sources are refused before anything is sent; the fleet keeps version 0.
  auto missing = f.PublishWeights(1, EditedSource(s0, [](auto* t) { t->pop_back(); }));
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("is missing"), std::string::npos) << missing.status();
  auto shape =
      f.PublishWeights(1, EditedSource(s0, [](auto* t) { t->front().shape.push_back(1); }));
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("has shape"), std::string::npos) << shape.status();
  auto dtype = f.PublishWeights(1, EditedSource(s0, [](auto* t) { t->back().dtype = "bfloat16"; }));
  EXPECT_NE(dtype.status().message().find("float32"), std::string::npos) << dtype.status();
  auto stale = f.PublishWeights(0, s0);
  EXPECT_EQ(stale.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.version(), 0);
  auto bad_sampling = f.DefaultSampling();
  bad_sampling.top_p = 0;
  EXPECT_EQ(f.Generate(groups, bad_sampling).status().code(), StatusCode::kInvalidArgument);
  auto dup = groups;
  dup[1].group_id = dup[0].group_id;
  EXPECT_EQ(f.Generate(dup, f.DefaultSampling()).status().code(), StatusCode::kInvalidArgument);

  // The same groups after version 1 (other weights): same seeds, the new model's log-probs.
  auto m1 = MakeModel(opts.config, 8);
  ModelSource s1(*m1);
  auto r1 = f.PublishWeights(1, s1);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_NE(r1->receipts[0].bucket_crc32, r0->receipts[0].bucket_crc32);
  auto out1 = f.Generate(groups, f.DefaultSampling());
  ASSERT_TRUE(out1.ok()) << out1.status();
  ExpectFromModel(*out1, *m1, 1);

  // Greedy: each token is the model's argmax.
  auto greedy = f.DefaultSampling();
  greedy.temperature = 0;
  auto out2 = f.Generate(Groups(f, 4, 1), greedy);
  ASSERT_TRUE(out2.ok()) << out2.status();
  torch::NoGradGuard no_grad;
  for (const Sample& s : *out2) {
    std::vector<int64_t> ids(s.prompt_ids.begin(), s.prompt_ids.end());
    ids.insert(ids.end(), s.response_ids.begin(), s.response_ids.end());
    auto logits = m1->Forward(torch::tensor(ids).unsqueeze(0))[0];
    for (size_t j = 0; j < s.response_ids.size(); ++j) {
      EXPECT_EQ(logits[static_cast<int64_t>(s.prompt_ids.size() + j - 1)].argmax().item<int64_t>(),
                s.response_ids[j]);
    }
  }

  f.Close();
  EXPECT_EQ(f.Generate(groups, greedy).status().code(), StatusCode::kFailedPrecondition);
  (void)RemoveTree(dir);
}

TEST(RolloutFleetTest, GrpcWeightsReachEveryWorker) { RunFleet("grpc"); }
TEST(RolloutFleetTest, GlooWeightsReachEveryWorker) { RunFleet("gloo"); }

// The pid of the live process whose command line holds every one of `parts`, or 0.
pid_t FindProcess(const std::vector<std::string>& parts) {
  DIR* proc = ::opendir("/proc");
  pid_t found = 0;
  while (struct dirent* e = proc ? ::readdir(proc) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0 || !testing::ProcessAlive(pid)) continue;
    std::string cmd = testing::ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    bool all = true;
    for (const auto& p : parts) all = all && cmd.find(p) != std::string::npos;
    if (all) found = pid;
  }
  if (proc) ::closedir(proc);
  return found;
}

// A worker killed with SIGKILL between calls: its groups go to the survivor, it is started again
// (cluster.max_worker_restarts) and caught up to the current version before it gets work.
TEST(RolloutFleetTest, KilledWorkerIsRestartedAndCaughtUp) {
  const std::string dir = testing::MakeTempDir("fleet_restart");
  RolloutFleetOptions opts;
  opts.config = FleetConfig(dir, "grpc");
  opts.config.cluster.heartbeat_interval_s = 0.5;
  opts.config.cluster.heartbeat_timeout_s = 2;
  opts.worker_binary = GYRE_BINARY;
  auto fleet = RolloutFleet::Open(opts);
  ASSERT_TRUE(fleet.ok()) << fleet.status();
  RolloutFleet& f = **fleet;
  auto m0 = MakeModel(opts.config, 7), m1 = MakeModel(opts.config, 8);
  ASSERT_TRUE(f.PublishWeights(0, ModelSource(*m0)).ok());
  ASSERT_TRUE(f.PublishWeights(1, ModelSource(*m1)).ok());
  const pid_t victim =
      FindProcess({"worker", "--role rollout", "--index 1", f.controller_address()});
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  // Until the restarted worker is back, the survivor runs every group; then both do, at v1.
  bool both_back = false;
  for (int round = 0; round < 60 && !both_back; ++round) {
    auto out = f.Generate(Groups(f, 4, 2), f.DefaultSampling());
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectFromModel(*out, *m1, 1);
    both_back = f.Workers().size() == 2;
    if (!both_back) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_TRUE(both_back) << "rollout-1 was not taken back";
  const pid_t again =
      FindProcess({"worker", "--role rollout", "--index 1", f.controller_address()});
  EXPECT_GT(again, 0);
  EXPECT_NE(again, victim);
  auto out = f.Generate(Groups(f, 6, 2), f.DefaultSampling());
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectFromModel(*out, *m1, 1);
  const std::string log = testing::ReadFile(dir + "/fleet/logs/rollout-1.log");
  EXPECT_NE(log.find("received policy version 1 "), std::string::npos) << log;
  f.Close();
  EXPECT_FALSE(testing::ProcessAlive(again));
  (void)RemoveTree(dir);
}

// cluster.mode: external: the fleet starts nothing; workers started by hand dial its address.
TEST(RolloutFleetTest, ExternalWorkersDialTheFleet) {
  const std::string dir = testing::MakeTempDir("fleet_external");
  auto port = rpc::PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  RolloutFleetOptions opts;
  opts.config = FleetConfig(dir, "gloo");
  opts.config.cluster.mode = "external";
  opts.config.cluster.controller_port = *port;
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  std::vector<testing::GyreProcess> workers;
  for (int i = 0; i < 2; ++i) {
    const std::string wdir = dir + "/w" + std::to_string(i);
    ASSERT_TRUE(MakeDirs(wdir).ok());
    workers.push_back(testing::GyreProcess::Start(
        {"worker", "--role", "rollout", "--index", std::to_string(i), "--controller", address},
        wdir));
  }
  auto fleet = RolloutFleet::Open(opts);
  ASSERT_TRUE(fleet.ok()) << fleet.status();
  EXPECT_EQ((*fleet)->controller_address(), address);
  auto m = MakeModel(opts.config, 9);
  auto r = (*fleet)->PublishWeights(0, ModelSource(*m));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->receipts.size(), 2u);
  auto out = (*fleet)->Generate(Groups(**fleet, 4, 2), (*fleet)->DefaultSampling());
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectFromModel(*out, *m, 0);
  (*fleet)->Close();
  for (auto& w : workers) {
    ASSERT_TRUE(w.Wait(30)) << "worker did not stop with the fleet: " << w.Output();
    EXPECT_EQ(WEXITSTATUS(w.wait_status), 0) << w.Output();
  }
  (void)RemoveTree(dir);
}

TEST(RolloutFleetTest, CancelledTokenStopsCalls) {
  const std::string dir = testing::MakeTempDir("fleet_cancel");
  RolloutFleetOptions opts;
  opts.config = FleetConfig(dir, "grpc");
  opts.config.rollout.workers = 1;
  opts.worker_binary = GYRE_BINARY;
  opts.cancel = std::make_shared<CancellationToken>();
  auto fleet = RolloutFleet::Open(opts);
  ASSERT_TRUE(fleet.ok()) << fleet.status();
  auto m = MakeModel(opts.config, 7);
  ASSERT_TRUE((*fleet)->PublishWeights(0, ModelSource(*m)).ok());
  opts.cancel->Cancel("test over");
  auto out = (*fleet)->Generate(Groups(**fleet, 2, 2), (*fleet)->DefaultSampling());
  EXPECT_EQ(out.status().code(), StatusCode::kAborted);
  EXPECT_NE(out.status().message().find("cancelled: test over"), std::string::npos) << out.status();
  (void)RemoveTree(dir);
}

TEST(RolloutFleetTest, OpenRefusesABadConfig) {
  RolloutFleetOptions opts;
  opts.config.rollout.workers = 0;
  auto fleet = RolloutFleet::Open(opts);
  ASSERT_FALSE(fleet.ok());
  EXPECT_EQ(fleet.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fleet.status().message().find("rollout.workers"), std::string::npos) << fleet.status();
}

TEST(ProblemStreamTest, BuiltinTaskAndVerifier) {
  DataSection data;
  auto a = ProblemStream::Open(data, 5);
  auto b = ProblemStream::Open(data, 5);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->held_out().size(), static_cast<size_t>(data.eval_size));
  for (int i = 0; i < 20; ++i) {
    Problem p = (*a)->Next(), q = (*b)->Next();
    EXPECT_EQ(p.prompt, q.prompt);
    EXPECT_EQ(p.answer, q.answer);
    // "37+5=" -> "42"
    const size_t plus = p.prompt.find('+');
    ASSERT_NE(plus, std::string::npos) << p.prompt;
    EXPECT_EQ(std::stoi(p.prompt.substr(0, plus)) + std::stoi(p.prompt.substr(plus + 1)),
              std::stoi(p.answer));
  }
  auto verifier = ExactMatchVerifier();
  EXPECT_EQ(*verifier->Score({"1+1=", " 2 ", "2", true}), 1.0);
  EXPECT_EQ(*verifier->Score({"1+1=", "2", "2", false}), 0.0);  // cut at max_new_tokens
  EXPECT_EQ(*verifier->Score({"1+1=", "3", "2", true}), 0.0);
  data.train_path = "/nonexistent/train.jsonl";
  EXPECT_FALSE(ProblemStream::Open(data, 5).ok());
}

}  // namespace
}  // namespace gyre
