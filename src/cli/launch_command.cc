#include "cli/launch_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/file_util.h"
#include "common/subprocess.h"
#include "gyre/job.h"

namespace gyre::cli {

namespace {

constexpr char kHelp[] =
    "usage: gyre launch slurm JOB.yaml [--set KEY=VALUE ...] [--dry-run]\n"
    "                         [--partition P] [--time T] [--account A] [--gpus-per-worker N]\n"
    "                         [--cpus-per-worker N] [--controller-cpus N] [--sbatch OPTION ...]\n"
    "                         [--gyre PATH]\n"
    "\n"
    "Runs the job on a Slurm cluster as one heterogeneous job of three components: the\n"
    "controller (1 task), the rollout group (rollout.workers tasks) and the trainer group\n"
    "(trainer.workers tasks). The batch script starts `gyre train` on the first component and,\n"
    "once it listens, one srun step per group whose tasks are `gyre worker` processes; each\n"
    "finds the controller in $GYRE_CONTROLLER and its index in $SLURM_PROCID, and listens on\n"
    "its node's address. GPUs come from the allocation (--gpus-per-worker, default 1 when\n"
    "model.device is cuda, else 0).\n"
    "\n"
    "Writes RUN_DIR/slurm/job.yaml (the job as it will run: cluster.mode external, the\n"
    "controller on every interface) and RUN_DIR/slurm/job.sbatch, then submits the script with\n"
    "sbatch and prints the Slurm job id. The job's output goes to RUN_DIR/slurm/slurm-<id>.out;\n"
    "`scancel <id>` stops the controller and every worker cleanly. The run directory must be\n"
    "on a file system every node sees, and the gyre binary (--gyre, default this one) on every\n"
    "node at the same path.\n"
    "\n"
    "  --dry-run            write the files and print the script; submit nothing\n"
    "  --partition, --time, --account   passed to every component\n"
    "  --cpus-per-worker N  CPUs of each worker task (default 2)\n"
    "  --controller-cpus N  CPUs of the controller task (default 2)\n"
    "  --sbatch OPTION      one more #SBATCH option for every component (repeatable)\n";

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "gyre launch: %s (see gyre launch slurm --help)\n", msg.c_str());
  return 2;
}

bool PositiveInt(const std::string& s, int max, int* out) {
  if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *out = std::stoi(s);
  return *out <= max;
}

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
};

std::string Script(const JobConfig& cfg, const SlurmOptions& o, const std::string& run_dir,
                   const std::string& job_file) {
  std::string common;
  if (!o.partition.empty()) common += " --partition=" + o.partition;
  if (!o.time.empty()) common += " --time=" + o.time;
  if (!o.account.empty()) common += " --account=" + o.account;
  for (const auto& e : o.extra) common += " " + e;
  const int gpus =
      o.gpus_per_worker >= 0 ? o.gpus_per_worker : (cfg.model.device == "cuda" ? 1 : 0);
  const std::string worker_res = " --cpus-per-task=" + std::to_string(o.cpus_per_worker) +
                                 (gpus > 0 ? " --gpus-per-task=" + std::to_string(gpus) : "");
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
    << "# Component 0: the controller; 1: " << cfg.rollout.workers
    << " rollout worker(s); 2: " << cfg.trainer.workers << " trainer worker(s).\n"
    << "#SBATCH --job-name=gyre-" << cfg.job.name << "\n"
    << "#SBATCH --output=" << run_dir << "/slurm/slurm-%j.out\n"
    << "#SBATCH --ntasks=1 --cpus-per-task=" << o.controller_cpus << common << "\n"
    << "#SBATCH hetjob\n"
    << "#SBATCH --ntasks=" << cfg.rollout.workers << worker_res << common << "\n"
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

}  // namespace

int RunLaunch(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kHelp, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "slurm") {
    return UsageError("unknown launcher '" + args[0] +
                      "': `gyre launch slurm` (Kubernetes: deploy/k8s, docs/cluster.md)");
  }
  std::string job_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  SlurmOptions o;
  o.gyre = SelfExecutable();
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= args.size()) return false;
      *v = args[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (a == "--dry-run") {
      dry_run = true;
    } else if (a == "--set") {
      if (!value(&v)) return UsageError("--set needs KEY=VALUE");
      overrides.push_back(v);
    } else if (a == "--partition" || a == "--time" || a == "--account" || a == "--gyre") {
      if (!value(&v)) return UsageError(a + " needs a value");
      (a == "--partition" ? o.partition
       : a == "--time"    ? o.time
       : a == "--account" ? o.account
                          : o.gyre) = v;
    } else if (a == "--sbatch") {
      if (!value(&v) || v.rfind("--", 0) != 0) {
        return UsageError("--sbatch needs an sbatch option, e.g. --sbatch --qos=high");
      }
      o.extra.push_back(v);
    } else if (a == "--gpus-per-worker" || a == "--cpus-per-worker" || a == "--controller-cpus") {
      int n = 0;
      if (!value(&v) || !PositiveInt(v, 1024, &n) || (n == 0 && a != "--gpus-per-worker")) {
        return UsageError(a + " needs a whole number" +
                          (a == "--gpus-per-worker" ? std::string(" >= 0") : " >= 1"));
      }
      (a == "--gpus-per-worker"   ? o.gpus_per_worker
       : a == "--cpus-per-worker" ? o.cpus_per_worker
                                  : o.controller_cpus) = n;
    } else if (!a.empty() && a[0] == '-') {
      return UsageError("unknown option '" + a + "'");
    } else if (job_path.empty()) {
      job_path = a;
    } else {
      return UsageError("unexpected argument '" + a + "'");
    }
  }
  if (job_path.empty()) return UsageError("missing JOB.yaml");
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
  const std::string cmd = "sbatch --parsable " + Quote(script_file) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    std::fprintf(stderr, "gyre launch: cannot run sbatch\n");
    return 1;
  }
  std::string out;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "gyre launch: sbatch failed%s: %s\n",
                 WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (is Slurm installed?)" : "",
                 out.c_str());
    return 1;
  }
  const std::string id = out.substr(0, out.find(';'));  // "id" or "id;cluster"
  std::printf("submitted Slurm job %s\n  output: %s/slurm-%s.out\n  cancel: scancel %s\n",
              id.c_str(), dir.c_str(), id.c_str(), id.c_str());
  return 0;
}

}  // namespace gyre::cli
