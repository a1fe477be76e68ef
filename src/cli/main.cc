// The `gyre` command-line tool.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "cli/launch_command.h"
#include "cli/ledger_command.h"
#include "cli/model_commands.h"
#include "cli/report_command.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "controller/job_inputs.h"
#include "gyre/job.h"

namespace {

constexpr char kUsage[] =
    "gyre: reinforcement-learning post-training of language models\n"
    "\n"
    "usage:\n"
    "  gyre train JOB.yaml [--set KEY=VALUE ...] [--quiet] [--resume]\n"
    "      Run a training job: the controller starts its rollout and trainer workers as child\n"
    "      processes, runs the supervised warm-up and the GRPO steps, and writes metrics and\n"
    "      the final model to job.output_dir/job.name. --resume continues an interrupted job\n"
    "      from the newest checkpoint in that directory (trainer.checkpoint_every > 0) and ends\n"
    "      exactly as an uninterrupted run would (docs/checkpoints.md).\n"
    "  gyre launch slurm JOB.yaml [--set KEY=VALUE ...] [--dry-run] [--sbatch OPTION ...]\n"
    "      Submit the job to Slurm as a heterogeneous job: controller, rollout and trainer\n"
    "      groups (see gyre launch slurm --help; docs/cluster.md).\n"
    "  gyre validate JOB.yaml [--set KEY=VALUE ...] [--print]\n"
    "      Check a job file without running it; --print shows every field's effective value.\n"
    "  gyre worker --role rollout|trainer --controller HOST:PORT [--index N]\n"
    "      One worker process (what `train` spawns, or what a cluster launcher starts).\n"
    "  gyre generate --model DIR --prompt TEXT [--temperature T --top-p P ...]\n"
    "      Stream a continuation from a Hugging Face model directory (see generate --help).\n"
    "  gyre tokenize --tokenizer PATH [--text TEXT | --jsonl]\n"
    "      Token ids of text under a tokenizer.json, as JSON.\n"
    "  gyre init-model --arch qwen2|qwen3|llama --out DIR [--preset tiny|small|...]\n"
    "      Write a random-init Hugging Face model directory (for tests and benchmarks).\n"
    "  gyre convert gguf FILE.gguf --out DIR\n"
    "      Convert a llama-architecture GGUF file into a Hugging Face model directory.\n"
    "  gyre logprobs --model DIR [--ids \"ID ...\"] [--full] [--dtype DTYPE] [--device DEV]\n"
    "      Per-position next-token log-probs of a Hugging Face model directory, as JSON.\n"
    "  gyre ledger RUN_DIR [--sample ID | --prompts | --state STATE] [--json]\n"
    "      Where each training sample is, and which prompts were trained how often.\n"
    "  gyre report RUN_DIR [--out FILE.html] [--png FILE.png]\n"
    "      The run's curves (reward, accuracy, KL, timings, ...) as an HTML page of SVG charts.\n"
    "  gyre bench SUBCOMMAND [--json FILE]\n"
    "      Benchmarks against same-run baselines (see gyre bench --help).\n"
    "  gyre sim-workers --controller HOST:PORT --rollout N --trainer M [cost options]\n"
    "      Simulated workers without models, for end-to-end benchmarks at scale.\n"
    "  gyre help | --help        This text.\n"
    "  gyre --version            The version.\n"
    "\n"
    "--set overrides any config field, e.g. --set trainer.steps=10 --set rollout.workers=1.\n"
    "Config fields and defaults: docs/config.md. Exit status: 0 on success, 1 when the job\n"
    "fails (one line on stderr says why), 2 on a usage error, 130 when interrupted.\n";

int Usage(const char* msg) {
  std::fprintf(stderr, "gyre: %s (see gyre help)\n", msg);
  return 2;
}

struct JobArgs {
  std::string path;
  std::vector<std::string> overrides;
  bool quiet = false;
  bool print = false;
  bool resume = false;
};

// Parses "JOB.yaml [--set K=V]... [--quiet] [--print | --resume]" for `gyre validate`
// (validate: --print) or `gyre train` (--resume); returns -1 to go on, or an exit code.
int ParseJobArgs(const std::string& command, const std::vector<std::string>& args, JobArgs* out) {
  const bool validate = command == "validate";
  auto app = gyre::NewCommand(
      "gyre " + command,
      validate ? "Checks a job file without running it."
               : "Runs a training job: the controller starts its rollout and trainer workers as\n"
                 "child processes, runs the supervised warm-up and the GRPO steps, and writes\n"
                 "metrics and the final model to job.output_dir/job.name.",
      "--set overrides any config field, e.g. --set trainer.steps=10 --set rollout.workers=1.\n"
      "Config fields and defaults: docs/config.md.");
  app->add_option("JOB.yaml", out->path, "the job file")->required();
  app->add_option("--set", out->overrides, "override a config field (repeatable)")
      ->type_name("KEY=VALUE")
      ->take_all()
      ->allow_extra_args(false);
  app->add_flag("--quiet", out->quiet, "no progress output");
  if (validate) {
    app->add_flag("--print", out->print, "show every field's effective value");
  } else {
    app->add_flag("--resume", out->resume,
                  "continue an interrupted job from the newest checkpoint in its directory "
                  "(docs/checkpoints.md)");
  }
  return gyre::ParseCommandLine(*app, args);
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

}  // namespace

static int Main(int argc, char** argv) {
  int worker_rc = 0;
  if (gyre::MaybeRunWorker(argc, argv, &worker_rc)) return worker_rc;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("gyre %s\n", gyre::Version());
    return 0;
  }
  if (cmd == "tokenize") {
    return gyre::cli::RunTokenize(rest);
  }
  if (cmd == "generate") {
    return gyre::cli::RunGenerate(rest);
  }
  if (cmd == "init-model") {
    return gyre::cli::RunInitModel(rest);
  }
  if (cmd == "bench") {
    return gyre::bench::RunBench(rest);
  }
  if (cmd == "sim-workers") {
    return gyre::bench::RunSimWorkers(rest);
  }
  if (cmd == "ledger") {
    return gyre::cli::RunLedger(rest);
  }
  if (cmd == "launch") {
    return gyre::cli::RunLaunch(rest);
  }
  if (cmd == "report") {
    return gyre::cli::RunReport(rest);
  }
  if (cmd == "convert") {
    return gyre::cli::RunConvert(rest);
  }
  if (cmd == "logprobs") {
    return gyre::cli::RunLogprobs(rest);
  }
  if (cmd == "validate") {
    JobArgs args;
    if (int rc = ParseJobArgs(cmd, rest, &args); rc >= 0) return rc;
    auto cfg = gyre::LoadJobConfig(args.path, args.overrides);
    if (!cfg.ok()) {
      std::fprintf(stderr, "gyre: %s\n", OneLine(cfg.status().message()).c_str());
      return 1;
    }
    // What only the model can tell: its sequence limit, how it splits, what a trainer must hold.
    // A model directory not there yet (to be converted or copied before the run) is said, not an
    // error: `gyre train` checks it again.
    if (!cfg->model.path.empty() && !gyre::PathExists(cfg->model.path + "/config.json")) {
      std::fprintf(stderr,
                   "gyre: note: %s/config.json is not there yet, so the checks against the model "
                   "(sequence length, tensor_parallel, memory_limit_gb) were not made\n",
                   cfg->model.path.c_str());
    } else if (gyre::Status fits = gyre::controller::CheckJobModel(*cfg); !fits.ok()) {
      std::fprintf(stderr, "gyre: %s: %s\n", args.path.c_str(), OneLine(fits.message()).c_str());
      return 1;
    }
    if (args.print) std::fputs(gyre::JobConfigToYaml(*cfg).c_str(), stdout);
    std::printf("%s: OK\n", args.path.c_str());
    return 0;
  }
  if (cmd == "train") {
    JobArgs args;
    if (int rc = ParseJobArgs(cmd, rest, &args); rc >= 0) return rc;
    auto cfg = gyre::LoadJobConfig(args.path, args.overrides);
    if (!cfg.ok()) {
      std::fprintf(stderr, "gyre: %s\n", OneLine(cfg.status().message()).c_str());
      return 1;
    }
    gyre::InitLogging("controller", cfg->job.log_level);
    gyre::RunOptions opts;
    opts.print_progress = !args.quiet;
    opts.resume = args.resume;
    auto result = gyre::RunJob(*cfg, opts);
    if (!result.ok()) {
      std::fprintf(stderr, "gyre: job failed: %s\n", OneLine(result.status().message()).c_str());
      return result.status().code() == gyre::StatusCode::kAborted &&
                     result.status().message().rfind("interrupted", 0) == 0
                 ? 130
                 : 1;
    }
    std::printf(
        "done: held-out accuracy %.3f before RL -> %.3f after RL (%+.1f points), %d GRPO steps, "
        "%.1f s\nrun directory: %s\n",
        result->accuracy_before_rl, result->accuracy_after_rl,
        100.0 * (result->accuracy_after_rl - result->accuracy_before_rl), result->grpo_steps,
        result->wall_seconds, result->run_dir.c_str());
    return 0;
  }
  return Usage(("unknown command '" + cmd + "'").c_str());
}

// The module edge of the command: whatever escapes a subcommand (a libtorch or YAML exception, an
// allocation failure) ends it with one line on stderr and exit status 1, never std::terminate.
int main(int argc, char** argv) {
  gyre::InstallTerminateHandler(argc >= 2 && std::strcmp(argv[1], "worker") == 0 ? "gyre worker"
                                                                                 : "gyre");
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gyre: fatal: %s\n", gyre::FirstLine(e.what()).c_str());
  } catch (...) {
    std::fprintf(stderr, "gyre: fatal: an exception of unknown type\n");
  }
  return 1;
}
