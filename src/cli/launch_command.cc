#include "cli/launch_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/command_line.h"
#include "common/file_util.h"
#include "common/subprocess.h"
#include "controller/slurm_fit.h"
#include "gyre/job.h"

namespace gyre::cli {

namespace {

constexpr char kLaunchSummary[] =
    "Runs a job under a cluster's scheduler. One launcher: slurm (see gyre launch slurm\n"
    "--help); for Kubernetes, see deploy/k8s and docs/cluster.md.";

constexpr char kSlurmSummary[] =
    "Runs the job on a Slurm cluster as one heterogeneous job of three components: the\n"
    "controller (1 task), the rollout group (rollout.workers tasks) and the trainer group\n"
    "(trainer.workers tasks). The batch script starts `gyre train` on the first component and,\n"
    "once it listens, one srun step per group whose tasks are `gyre worker` processes; each\n"
    "finds the controller in $GYRE_CONTROLLER and its index in $SLURM_PROCID, and listens on\n"
    "its node's address.";

constexpr char kSlurmDetails[] =
    "Writes RUN_DIR/slurm/job.yaml (the job as it will run: cluster.mode external, the\n"
    "controller on every interface) and RUN_DIR/slurm/job.sbatch, then submits the script with\n"
    "sbatch and prints the Slurm job id. The job's output goes to RUN_DIR/slurm/slurm-<id>.out;\n"
    "`scancel <id>` stops the controller and every worker cleanly. The run directory must be\n"
    "on a file system every node sees, and the gyre binary (--gyre) on every node at the same\n"
    "path. --partition, --time, --account and every --sbatch option go to every component.\n"
    "Before submitting it asks Slurm whether the job can ever start: every task runs at once,\n"
    "each on one node, so it places the tasks on the partition's nodes (sinfo) and then has\n"
    "Slurm check the script (sbatch --test-only); a job that could never start is not\n"
    "submitted, and the error names the short resource and the options that change it.\n"
    "Exit status: 0, 1 when the job is invalid, can never start or sbatch fails, 2 on a usage\n"
    "error.";

// Single-quotes `s` for a shell.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

struct SlurmOptions {
  std::string partition, time, account, gyre;
  int gpus_per_worker = -1, cpus_per_worker = 2, controller_cpus = 2;
  std::vector<std::string> extra;
  bool no_check = false;
};

// Runs `cmd` through the shell; its output (stdout and stderr) in *out, its exit status
// returned (-1 when it could not run or did not exit).
int RunCommand(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = ::pclose(p);
  while (!out->empty() && (out->back() == '\n' || out->back() == '\r')) out->pop_back();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// GPUs of each worker task.
int WorkerGpus(const JobConfig& cfg, const SlurmOptions& o) {
  return o.gpus_per_worker >= 0 ? o.gpus_per_worker : (cfg.model.device == "cuda" ? 1 : 0);
}

// Whether the job can ever start (docs/cluster.md#slurm): the tasks placed on the partition's
// nodes, then Slurm's own check of the script. "" when it can; otherwise the reason.
std::string CheckItCanStart(const JobConfig& cfg, const SlurmOptions& o,
                            const std::string& script_file) {
  std::string out;
  const std::string partition = o.partition.empty() ? "" : " -p " + Quote(o.partition);
  const int rc = RunCommand("sinfo -h -N -o '%N %c %G'" + partition, &out);
  if (rc == 0) {
    auto nodes = controller::ParseSinfoNodes(out);
    if (!nodes.ok()) return nodes.status().message();
    if (nodes->empty()) {
      return (o.partition.empty() ? std::string("the cluster")
                                  : "partition '" + o.partition + "'") +
             " has no nodes (sinfo" + partition + " lists none): name another with --partition";
    }
    controller::SlurmRequest r;
    r.controller_cpus = o.controller_cpus;
    r.rollout_workers = static_cast<int>(cfg.rollout.workers);
    r.trainer_workers = static_cast<int>(cfg.trainer.workers);
    r.cpus_per_worker = o.cpus_per_worker;
    r.gpus_per_worker = WorkerGpus(cfg, o);
    r.rollout_tensor_parallel = cfg.rollout.tensor_parallel;
    const std::string why = controller::WhyItCannotRun(r, *nodes, o.partition);
    if (!why.empty()) return why;
  } else {
    std::fprintf(stderr,
                 "gyre launch: cannot list the partition's nodes (sinfo%s: %s); leaving the check "
                 "to sbatch --test-only\n",
                 rc == 127 ? ", not installed?" : "", out.c_str());
  }
  if (RunCommand("sbatch --test-only " + Quote(script_file), &out) != 0) {
    return "Slurm says the job cannot run (sbatch --test-only): " + out;
  }
  return "";
}

std::string Script(const JobConfig& cfg, const SlurmOptions& o, const std::string& run_dir,
                   const std::string& job_file) {
  std::string common;
  if (!o.partition.empty()) common += " --partition=" + o.partition;
  if (!o.time.empty()) common += " --time=" + o.time;
  if (!o.account.empty()) common += " --account=" + o.account;
  for (const auto& e : o.extra) common += " " + e;
  const int gpus = WorkerGpus(cfg, o);
  const std::string gpu_res = gpus > 0 ? " --gpus-per-task=" + std::to_string(gpus) : "";
  const std::string worker_res = " --cpus-per-task=" + std::to_string(o.cpus_per_worker) + gpu_res;
  // A tensor-parallel rollout worker's task starts its other ranks on its node.
  const std::string rollout_res =
      " --cpus-per-task=" + std::to_string(o.cpus_per_worker * cfg.rollout.tensor_parallel) +
      gpu_res;
  std::string security;
  const ClusterSection& c = cfg.cluster;
  if (!c.tls_cert.empty()) {
    security += " --tls-cert " + Quote(AbsolutePath(c.tls_cert)) + " --tls-key " +
                Quote(AbsolutePath(c.tls_key)) + " --tls-ca " + Quote(AbsolutePath(c.tls_ca)) +
                " --tls-server-name " + Quote(c.tls_server_name);
  }
  if (!c.auth_token_file.empty())
    security += " --token-file " + Quote(AbsolutePath(c.auth_token_file));
  const std::string timeout = std::to_string(static_cast<int>(c.register_timeout_s));
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Written by `gyre launch slurm` for job '" << cfg.job.name
    << "' (docs/cluster.md#slurm). Submit with sbatch.\n"
    << "# Component 0: the controller; 1: " << cfg.rollout.workers << " rollout worker(s)"
    << (cfg.rollout.tensor_parallel > 1
            ? " (each starts " + std::to_string(cfg.rollout.tensor_parallel - 1) +
                  " more tensor-parallel process(es) on its node)"
            : std::string())
    << "; 2: " << cfg.trainer.workers << " trainer worker(s)"
    << (cfg.trainer.tensor_parallel > 1
            ? " (" + std::to_string(cfg.trainer.workers / cfg.trainer.tensor_parallel) +
                  " data-parallel x " + std::to_string(cfg.trainer.tensor_parallel) +
                  " tensor-parallel: task r is tensor-parallel rank r % " +
                  std::to_string(cfg.trainer.tensor_parallel) + ")"
            : std::string())
    << ".\n"
    << "#SBATCH --job-name=gyre-" << cfg.job.name << "\n"
    << "#SBATCH --output=" << run_dir << "/slurm/slurm-%j.out\n"
    << "#SBATCH --ntasks=1 --cpus-per-task=" << o.controller_cpus << common << "\n"
    << "#SBATCH hetjob\n"
    << "#SBATCH --ntasks=" << cfg.rollout.workers << rollout_res << common << "\n"
    << "#SBATCH hetjob\n"
    << "#SBATCH --ntasks=" << cfg.trainer.workers << worker_res << common << "\n"
    << "set -u\n"
    << "GYRE=" << Quote(o.gyre) << "\n"
    << "RUN=" << Quote(run_dir) << "\n"
    << "rm -f \"$RUN/controller.address\"\n"
    << "\"$GYRE\" train " << Quote(job_file) << " &\n"
    << "controller=$!\n"
    << "# scancel (SIGTERM) and Ctrl-C reach the controller, which stops its workers.\n"
    << "trap 'kill -TERM \"$controller\" 2>/dev/null' TERM INT\n"
    << "for _ in $(seq 1 1200); do\n"
    << "  [ -s \"$RUN/controller.address\" ] && break\n"
    << "  kill -0 \"$controller\" 2>/dev/null || break\n"
    << "  sleep 0.5\n"
    << "done\n"
    << "if [ ! -s \"$RUN/controller.address\" ]; then wait \"$controller\"; exit $?; fi\n"
    << "port=$(sed 's/.*://' \"$RUN/controller.address\")\n"
    << "host=${GYRE_CONTROLLER_HOST:-$(hostname -I 2>/dev/null | awk '{print $1}')}\n"
    << "[ -n \"$host\" ] || host=$(hostname)\n"
    << "export GYRE_CONTROLLER=\"$host:$port\"\n"
    << "echo \"gyre launch: controller at $GYRE_CONTROLLER (Slurm job $SLURM_JOB_ID)\"\n"
    << "# One step per group; a task's index is its $SLURM_PROCID in the step. A task that dies\n"
    << "# does not end its step's other tasks: the controller handles the death.\n"
    << "srun --het-group=1 --kill-on-bad-exit=0 \"$GYRE\" worker --role rollout --bind-host "
       "0.0.0.0 --register-timeout "
    << timeout << security << " &\n"
    << "srun --het-group=2 --kill-on-bad-exit=0 \"$GYRE\" worker --role trainer --bind-host "
       "0.0.0.0 --register-timeout "
    << timeout << security << " &\n"
    << "rc=0\n"
    << "while kill -0 \"$controller\" 2>/dev/null; do wait \"$controller\"; rc=$?; done\n"
    << "# The controller has stopped its workers; give their steps a moment to end.\n"
    << "for _ in $(seq 1 60); do [ -z \"$(jobs -pr)\" ] && break; sleep 0.5; done\n"
    << "[ -z \"$(jobs -pr)\" ] || kill $(jobs -pr) 2>/dev/null\n"
    << "wait\n"
    << "exit $rc\n";
  return s.str();
}

int RunLaunchSlurm(const std::vector<std::string>& args) {
  std::string job_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  SlurmOptions o;
  o.gyre = SelfExecutable();
  auto app = NewCommand("gyre launch slurm", kSlurmSummary, kSlurmDetails);
  app->add_option("JOB.yaml", job_path, "the job file")->required();
  app->add_option("--set", overrides, "override a config field (repeatable)")
      ->type_name("KEY=VALUE")
      ->take_all()
      ->allow_extra_args(false);
  app->add_flag("--dry-run", dry_run, "write the files and print the script; submit nothing");
  app->add_option("--partition", o.partition, "the Slurm partition")->type_name("P");
  app->add_option("--time", o.time, "the time limit")->type_name("T");
  app->add_option("--account", o.account, "the account to charge")->type_name("A");
  app->add_option("--gpus-per-worker", o.gpus_per_worker,
                  "GPUs of each worker task in [0, 1024]; auto: 1 with cuda, else 0")
      ->type_name("N")
      ->default_str("auto")
      ->check(NumberIn(0, 1024));
  app->add_option("--cpus-per-worker", o.cpus_per_worker, "CPUs of each worker task, in [1, 1024]")
      ->type_name("N")
      ->check(NumberIn(1, 1024));
  app->add_option("--controller-cpus", o.controller_cpus,
                  "CPUs of the controller task, in [1, 1024]")
      ->type_name("N")
      ->check(NumberIn(1, 1024));
  app->add_option("--sbatch", o.extra, "another sbatch option for every component, e.g. --qos=high")
      ->type_name("OPTION")
      ->take_all()
      ->allow_extra_args(false)
      ->check(CLI::Validator(
          [](std::string& option) -> std::string {
            return option.rfind("--", 0) == 0 ? "" : "'" + option + "' is not an sbatch option";
          },
          ""));
  app->add_option("--gyre", o.gyre, "the gyre executable every node runs")->type_name("PATH");
  app->add_flag("--no-check", o.no_check,
                "submit without asking Slurm first whether the job can ever start");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  auto loaded = LoadJobConfig(job_path, overrides);
  if (!loaded.ok()) {
    std::fprintf(stderr, "gyre launch: %s\n", loaded.status().message().c_str());
    return 1;
  }
  JobConfig cfg = *loaded;
  // The job as it runs under Slurm: workers are launched, the controller listens everywhere
  // (unless the job names a routable address), the run directory is absolute.
  cfg.cluster.mode = "external";
  if (IsLoopback(cfg.cluster.bind_host)) cfg.cluster.bind_host = "0.0.0.0";
  cfg.job.output_dir = AbsolutePath(cfg.job.output_dir);
  if (access(o.gyre.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "gyre launch: --gyre %s is not an executable\n", o.gyre.c_str());
    return 1;
  }
  o.gyre = AbsolutePath(o.gyre);
  const std::string run_dir = cfg.job.output_dir + "/" + cfg.job.name;
  const std::string dir = run_dir + "/slurm";
  if (Status st = MakeDirs(dir); !st.ok()) {
    std::fprintf(stderr, "gyre launch: %s\n", st.message().c_str());
    return 1;
  }
  const std::string job_file = dir + "/job.yaml";
  const std::string script_file = dir + "/job.sbatch";
  const std::string script = Script(cfg, o, run_dir, job_file);
  if (Status st = WriteFileAtomic(job_file, JobConfigToYaml(cfg)); !st.ok()) {
    std::fprintf(stderr, "gyre launch: %s\n", st.message().c_str());
    return 1;
  }
  if (Status st = WriteFileAtomic(script_file, script); !st.ok()) {
    std::fprintf(stderr, "gyre launch: %s\n", st.message().c_str());
    return 1;
  }
  if (dry_run) {
    std::fputs(script.c_str(), stdout);
    std::printf("# dry run: wrote %s and %s; submit with: sbatch %s\n", job_file.c_str(),
                script_file.c_str(), script_file.c_str());
    return 0;
  }
  if (!o.no_check) {
    const std::string why = CheckItCanStart(cfg, o, script_file);
    if (!why.empty()) {
      std::fprintf(stderr, "gyre launch: not submitted: %s\n", why.c_str());
      return 1;
    }
  }
  std::string out;
  const int rc = RunCommand("sbatch --parsable " + Quote(script_file), &out);
  if (rc != 0) {
    std::fprintf(stderr, "gyre launch: sbatch failed%s: %s\n",
                 rc == 127 ? " (is Slurm installed?)" : "", out.c_str());
    return 1;
  }
  const std::string id = out.substr(0, out.find(';'));  // "id" or "id;cluster"
  std::printf("submitted Slurm job %s\n  output: %s/slurm-%s.out\n  cancel: scancel %s\n",
              id.c_str(), dir.c_str(), id.c_str(), id.c_str());
  return 0;
}

}  // namespace

int RunLaunch(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "slurm") return RunLaunchSlurm({args.begin() + 1, args.end()});
  // `gyre launch --help`, or a usage error naming what is wrong.
  std::string launcher;
  auto app = NewCommand("gyre launch", kLaunchSummary);
  app->add_option("LAUNCHER", launcher, "the cluster's scheduler")
      ->required()
      ->check(CLI::IsMember({"slurm"}));
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  return RunLaunchSlurm({});  // `gyre launch -- slurm`: JOB.yaml is missing
}

}  // namespace gyre::cli
