// Embedding Gyre as a library: this program sees only include/gyre/ and links libgyre. It
// plugs in its own C++ reward function and runs a small job; the same binary serves as the
// job's worker processes (gyre::MaybeRunWorker). docs/embedding.md shows this code.

#include <ftw.h>
#include <gyre/job.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

// rm -rf without std::filesystem (see src/common/file_util.h for why).
static void RemoveTree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}

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
  RemoveTree(out_dir);
  return ok ? 0 : 1;
}
