// Embedding Gyre as a library: this program sees only include/gyre/ and links libgyre. It
// plugs in its own C++ reward function and runs a small job; the same binary serves as the
// job's worker processes (gyre::MaybeRunWorker). docs/embedding.md shows this code.

#include <ftw.h>
#include <gyre/cancel.h>
#include <gyre/job.h>
#include <gyre/torch.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "test_paths.h"

// rm -rf without std::filesystem (see src/common/file_util.h for why).
static void RemoveTree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}

// Cancels `token` from inside the job after `after` reward calls, and records whether SIGINT's
// handler at that moment was the program's own (RunOptions::install_signal_handlers).
class CancellingReward final : public gyre::RewardFn {
 public:
  CancellingReward(std::shared_ptr<gyre::CancellationToken> token, long after)
      : token_(std::move(token)), after_(after) {}
  gyre::StatusOr<double> Score(const gyre::RewardInput& in) override {
    if (++calls == after_) {
      struct sigaction now = {};
      ::sigaction(SIGINT, nullptr, &now);
      own_handler_during_job = now.sa_handler == OwnHandler;
      token_->Cancel("enough for this test");
    }
    return in.response == in.answer ? 1.0 : 0.0;
  }
  static void OwnHandler(int) {}
  std::atomic<long> calls{0};
  std::atomic<bool> own_handler_during_job{false};

 private:
  std::shared_ptr<gyre::CancellationToken> token_;
  const long after_;
};

// Partial credit: the fraction of answer digits the response gets right, position by position.
class DigitMatchReward final : public gyre::RewardFn {
 public:
  gyre::StatusOr<double> Score(const gyre::RewardInput& in) override {
    ++calls;
    if (in.answer.empty()) return gyre::InvalidArgument("no reference answer");
    size_t right = 0;
    for (size_t i = 0; i < in.answer.size() && i < in.response.size(); ++i) {
      right += in.response[i] == in.answer[i];
    }
    const double len_penalty = in.response.size() == in.answer.size() ? 0.0 : 0.5;
    return std::max(0.0, static_cast<double>(right) / in.answer.size() - len_penalty);
  }
  std::atomic<long> calls{0};
};

int main(int argc, char** argv) {
  // A policy loss of this program's own, differentiated by autograd. Registered before
  // MaybeRunWorker: the trainer workers run this program too.
  const gyre::Status registered = gyre::RegisterPolicyLoss(
      "embed_reinforce", "-A sg(clip(r)) logp", [](const gyre::TokenLossInputs& in) {
        const at::Tensor w = (in.logp - in.logp_old)
                                 .exp()
                                 .clamp(1.0 - in.clip_eps_low, 1.0 + in.clip_eps_high)
                                 .detach();
        return -in.advantages * w * in.logp;
      });
  if (!registered.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", registered.ToString().c_str());
    return 1;
  }
  int worker_exit = 0;
  if (gyre::MaybeRunWorker(argc, argv, &worker_exit)) return worker_exit;

  char tmpl[] = "/tmp/gyre_embed_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string out_dir = tmpl;
  auto config =
      gyre::LoadJobConfig(std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml",
                          {"job.output_dir=" + out_dir, "job.name=embed", "reward.type=custom",
                           "trainer.warmup_sft_steps=5", "trainer.steps=2",
                           "rollout.prompts_per_step=4", "data.eval_size=10",
                           // every group trains (the quickstart filters zero-variance ones)
                           "algorithm.filter_zero_variance=false"});
  if (!config.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", config.status().ToString().c_str());
    return 1;
  }
  auto reward = std::make_shared<DigitMatchReward>();
  gyre::RunOptions options;
  options.reward = reward;
  auto result = gyre::RunJob(*config, options);
  if (!result.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", result.status().ToString().c_str());
    return 1;
  }
  // 2 steps x 4 prompts x 8 samples, plus 2 evaluations of 10 prompts.
  const long expected_calls = 2 * 4 * 8 + 2 * 10;
  bool ok = result->grpo_steps == 2 && reward->calls.load() == expected_calls &&
            ::access((result->run_dir + "/final/model.safetensors").c_str(), R_OK) == 0;
  std::printf("%s: %d GRPO steps, %ld reward calls (expected %ld), run dir %s\n",
              ok ? "PASS" : "FAIL", result->grpo_steps, reward->calls.load(), expected_calls,
              result->run_dir.c_str());

  // Without a RewardFn, reward.type: custom is a clear error and starts nothing.
  auto refused = gyre::RunJob(*config, gyre::RunOptions{});
  if (refused.ok() || refused.status().message().find("RewardFn") == std::string::npos) {
    std::printf("FAIL: custom reward without a RewardFn was not refused\n");
    ok = false;
  }
  // A RewardFn with reward.type: builtin used to be taken silently instead of the built-in
  // verifier: now it is refused too, before anything starts.
  auto builtin = *config;
  builtin.reward.type = "builtin";
  auto mixed = gyre::RunJob(builtin, options);
  if (mixed.ok() || mixed.status().message().find("reward.type: custom") == std::string::npos) {
    std::printf("FAIL: reward.type builtin with a custom RewardFn was not refused: %s\n",
                mixed.ok() ? "ran" : mixed.status().ToString().c_str());
    ok = false;
  }
  // The registered loss by name, end to end: the trainer worker (this program) finds it.
  auto own_loss = *config;
  own_loss.algorithm.policy_loss = "embed_reinforce";
  own_loss.job.name = "own_loss";
  auto trained = gyre::RunJob(own_loss, options);
  const bool own_ok = trained.ok() && trained->grpo_steps == 2;
  std::printf("%s: algorithm.policy_loss embed_reinforce: %s\n", own_ok ? "PASS" : "FAIL",
              trained.ok() ? "2 GRPO steps" : trained.status().ToString().c_str());
  ok = ok && own_ok;

  // A caller-owned cancellation token stops the job mid-way with its reason, and with
  // install_signal_handlers = false RunJob leaves the program's own SIGINT handler in place.
  for (bool install : {true, false}) {
    struct sigaction own = {}, before = {}, after = {};
    own.sa_handler = CancellingReward::OwnHandler;
    ::sigaction(SIGINT, &own, &before);
    auto token = std::make_shared<gyre::CancellationToken>();
    auto cancelling = std::make_shared<CancellingReward>(token, 40);
    auto long_job = *config;
    long_job.trainer.steps = 50;
    long_job.job.name = install ? "cancel_signals" : "cancel_own_signals";
    gyre::RunOptions cancel_options;
    cancel_options.reward = cancelling;
    cancel_options.cancel = token;
    cancel_options.install_signal_handlers = install;
    auto cancelled = gyre::RunJob(long_job, cancel_options);
    ::sigaction(SIGINT, &before, &after);
    const bool stopped =
        !cancelled.ok() && cancelled.status().code() == gyre::StatusCode::kAborted &&
        cancelled.status().message().find("cancelled: enough for this test") != std::string::npos;
    const bool handler_ok = cancelling->own_handler_during_job.load() == !install;
    std::printf(
        "%s: cancel with install_signal_handlers=%d: %s; SIGINT handler during the job was "
        "%s\n",
        stopped && handler_ok ? "PASS" : "FAIL", install ? 1 : 0,
        cancelled.ok() ? "ran to the end" : cancelled.status().ToString().c_str(),
        cancelling->own_handler_during_job.load() ? "the program's" : "Gyre's");
    ok = ok && stopped && handler_ok;
  }
  RemoveTree(out_dir);
  return ok ? 0 : 1;
}
