#pragma once
// Helpers for tests that run the `gyre` binary as a real process.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "common/subprocess.h"
#include "test_paths.h"

namespace gyre::testing {

// A --set that turns off the quickstart's dynamic sampling (algorithm.filter_zero_variance): after
// a few warm-up steps every group is all wrong and would be filtered, and small jobs built on
// configs/quickstart.yaml that check resumes, data parallelism or devices need every sample to
// train.
constexpr char kEveryGroupTrains[] = "algorithm.filter_zero_variance=false";

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `cmd` under /bin/sh with stderr joined to stdout; returns the output and sets *exit_code
// (-1 when it did not exit normally).
inline std::string RunShell(const std::string& cmd, int* exit_code = nullptr) {
  std::string out;
  FILE* p = ::popen(("(" + cmd + ") 2>&1").c_str(), "r");
  if (p == nullptr) {
    if (exit_code != nullptr) *exit_code = -1;
    return "popen failed";
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (exit_code != nullptr) *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The records of one phase ("grpo", "eval", ...) of a metrics.jsonl file.
inline std::vector<nlohmann::json> MetricsRecords(const std::string& path,
                                                  const std::string& phase) {
  std::vector<nlohmann::json> out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == phase) out.push_back(std::move(j));
  }
  return out;
}

// The directories MakeTempDir made in this process. Under ctest each test runs in a process of
// its own: when it passed, its directories are removed as the process exits; when it failed they
// stay for inspection, and GYRE_KEEP_TEST_DIRS=1 keeps them always. A job's directory can hold
// gigabytes (checkpoints of a 99 M-parameter model), and a CI machine's disk is bounded. Only the
// process that made a directory removes it (a forked child that exits does not).
class TempDirs {
 public:
  static TempDirs& Get() {
    static TempDirs dirs;
    return dirs;
  }
  void Add(const std::string& dir) { dirs_.push_back(dir); }
  ~TempDirs() {
    const char* keep = std::getenv("GYRE_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || (keep != nullptr && std::string(keep) == "1")) return;
    if (::testing::UnitTest::GetInstance()->Failed()) return;
    for (const auto& d : dirs_) (void)RemoveTree(d);
  }

 private:
  TempDirs() : owner_(::getpid()) {}
  pid_t owner_;
  std::vector<std::string> dirs_;
};

inline std::string MakeTempDir(const std::string& tag) {
  const std::string dir =
      TempDirectory() + "/gyre_" + tag + "_" + std::to_string(::getpid()) + "_" +
      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (!MakeDirs(dir).ok()) std::abort();
  TempDirs::Get().Add(dir);
  return dir;
}

// A `gyre` process whose stdout+stderr go to a file.
struct GyreProcess {
  pid_t pid = 0;
  std::string output_path;
  int wait_status = 0;

  static GyreProcess Start(const std::vector<std::string>& args, const std::string& dir) {
    GyreProcess p;
    p.output_path = dir + "/gyre.out";
    std::vector<std::string> argv = {GYRE_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    auto pid = SpawnProcess(argv, p.output_path);
    if (!pid.ok()) std::abort();
    p.pid = *pid;
    return p;
  }
  std::string Output() const { return ReadFile(output_path); }
  // Waits up to `timeout_s`; returns false (and kills it) on timeout.
  bool Wait(double timeout_s) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (PollExit(pid, &wait_status)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &wait_status, 0);
    return false;
  }
  // Polls the output until `pattern` matches; returns the match groups or empty on timeout.
  std::smatch WaitForOutput(const std::string& pattern, double timeout_s, std::string* text) {
    const std::regex re(pattern);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::smatch m;
    while (std::chrono::steady_clock::now() < deadline) {
      *text = Output();
      if (std::regex_search(*text, m, re)) return m;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return {};
  }
};

// Runs `gyre args...` to completion (killed after `timeout_s`) with its output in a fresh
// subdirectory of `dir` (SpawnProcess appends to the file it is given, so calls never share
// one); returns the exit status and the output.
inline std::pair<int, std::string> RunGyre(const std::vector<std::string>& args,
                                           const std::string& dir, double timeout_s = 180) {
  static int calls = 0;
  const std::string own = dir + "/call" + std::to_string(++calls);
  if (!MakeDirs(own).ok()) std::abort();
  auto p = GyreProcess::Start(args, own);
  const bool finished = p.Wait(timeout_s);
  return {finished ? WEXITSTATUS(p.wait_status) : -1, p.Output()};
}

// True if `pid` still exists as a live (non-zombie) process.
inline bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Worker pids the controller announced ("started rollout-1 (pid 123)").
inline std::vector<pid_t> WorkerPids(const std::string& output) {
  std::vector<pid_t> pids;
  const std::regex re("started (rollout|trainer)-[0-9]+ \\(pid ([0-9]+)\\)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    pids.push_back(std::stoi((*it)[2]));
  }
  return pids;
}

inline bool AllGone(const std::vector<pid_t>& pids, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (pid_t p : pids) any = any || ProcessAlive(p);
    if (!any) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Starts `gyre args...` as the leader of a new process group, which its workers join, so the
// whole job can be killed at once like a crashed machine would stop it.
inline pid_t StartGroupLeader(const std::vector<std::string>& args,
                              const std::string& output_path) {
  std::vector<std::string> argv = {GYRE_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const int fd = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(fd);
  ::setpgid(pid, pid);  // also from the parent, so the group exists before we signal it
  return pid;
}

}  // namespace gyre::testing
