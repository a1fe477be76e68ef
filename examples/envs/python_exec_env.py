#!/usr/bin/env python3
"""A Python code-execution tool environment for Gyre, sandboxed with bubblewrap (docs/agents.md).

The model calls the `python` tool with a program; the program runs in a bubblewrap sandbox
(Debian package `bubblewrap`): no network (every namespace unshared), only the system
directories and this Python's installation visible and read-only, no environment variables but
PATH and HOME, a private writable /tmp, CPU-time and memory limits, and it is killed when its
wall-clock budget ends. Its stdout and stderr (cut to 2,000 characters) come back as the tool
message. The episode ends with a reply that calls no tool: reward 1 if its final number equals
the task's answer.
Task records: {"prompt": "...", "answer": "42"}. Run: python3 python_exec_env.py --port 50101
"""
import os
import shutil
import signal
import subprocess
import sys

import gyre_env

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calculator_env import final_number, same_number  # noqa: E402

CPU_SECONDS = 5
MEMORY_BYTES = 512 << 20
WALL_SECONDS = 10.0
OUTPUT_CHARS = 2000


def run_sandboxed(code: str, wall_s: float = WALL_SECONDS) -> str:
    """Runs `code` with python3 inside bubblewrap; returns its output or why it failed."""
    bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
    if bwrap is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    if prlimit is None:
        raise RuntimeError("prlimit (util-linux) is not installed")
    # The limits are set by prlimit in the child, not by a preexec_fn: Python code between fork
    # and exec is unsafe in a threaded server (gRPC's), and crashed the child now and then.
    # CPU time: SIGXCPU at the soft limit, SIGKILL a second later.
    argv = [prlimit, f"--cpu={CPU_SECONDS}:{CPU_SECONDS + 1}", f"--as={MEMORY_BYTES}",
            f"--fsize={16 << 20}", bwrap]
    # Only the system directories and this Python's installation are visible, read-only (not
    # /root, /home or the server's working directory); a private /tmp is the only writable place.
    for path in ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc",
                 sys.base_prefix, sys.prefix]:
        argv += ["--ro-bind-try", path, path]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--chdir", "/tmp",
             "--unshare-all", "--die-with-parent", "--new-session",
             "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--", sys.executable, "-I", "-c", code]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=wall_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return f"error: killed after {wall_s:g} s (wall-clock limit)"
    text = out.decode("utf-8", "replace")
    if len(text) > OUTPUT_CHARS:
        text = text[:OUTPUT_CHARS] + "\n[output cut]"
    # bwrap exits with 128 + N when the program died of signal N.
    sig = -p.returncode if p.returncode < 0 else p.returncode - 128 if p.returncode > 128 else 0
    if sig > 0:
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        limit = " (CPU-time limit)" if name in ("SIGXCPU", "SIGKILL") else ""
        text += f"\nerror: killed by {name}{limit}"
    elif p.returncode != 0:
        text += f"\nexit status {p.returncode}"
    return text


class PythonExec(gyre_env.Env):
    name = "python_exec"
    tools = [{
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python 3 program in a sandbox (no network, no files kept) "
                           "and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"],
            },
        },
    }]
    max_steps = 8

    def reset(self, task, seed):
        self.answer = str(task["answer"])
        self.steps = 0
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, action):
        self.steps += 1
        if action.tool_call_error:
            messages = [{"role": "tool", "name": "python",
                         "content": f"error: {action.tool_call_error}"}]
        elif not action.tool_calls:
            ok = same_number(final_number(action.text), self.answer)
            return gyre_env.StepResult(reward=1.0 if ok else 0.0, terminated=True,
                                       info={"correct": ok, "steps": self.steps})
        else:
            messages = []
            for call in action.tool_calls:
                if call.name != "python":
                    content = f"error: unknown tool {call.name!r}; the tool is 'python'"
                else:
                    content = run_sandboxed(str(call.arguments.get("code", "")))
                messages.append({"role": "tool", "name": call.name, "tool_call_id": call.id,
                                 "content": content})
        truncated = self.steps >= self.max_steps
        return gyre_env.StepResult(messages=messages, truncated=truncated)


if __name__ == "__main__":
    gyre_env.env_main(PythonExec)
