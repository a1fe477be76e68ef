#pragma once
// Child processes for local launch: spawn with output to a log file, poll for exit, describe
// how a process ended. Children die with their parent (PR_SET_PDEATHSIG), so a controller that
// is killed outright leaves no orphans.
//
// Thread-safe: these are thin wrappers over fork/exec/waitpid. Only the thread that spawned a
// child should reap it (PollExit / WaitExit).

#include <sys/types.h>

#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre {

// Starts argv[0] (a path) with argv. stdout and stderr are appended to `log_path` (created if
// missing); stdin is /dev/null. The child gets SIGTERM when the spawning thread's process dies.
StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv, const std::string& log_path);

// If `pid` has exited, reaps it, stores its wait status and returns true. Never blocks.
bool PollExit(pid_t pid, int* wait_status);

// Sends SIGTERM, waits up to `grace_s` for the process to exit, then SIGKILLs and reaps it.
// Returns the wait status (or -1 if the pid was already reaped elsewhere).
int TerminateProcess(pid_t pid, double grace_s);

// "exited with status 0", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

// The executable `name` as a shell would find it: `name` itself when it has a slash, otherwise
// the first executable file of that name in a $PATH directory; "" when there is none.
std::string FindInPath(const std::string& name);

// Absolute path of the running executable (/proc/self/exe).
std::string SelfExecutable();

}  // namespace gyre
