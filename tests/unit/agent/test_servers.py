#!/usr/bin/env python3
"""Servers for agent_services_test: an environment and a reward function that misbehave on
request (hang, raise), written with the gyre_env SDK like any user's server.

    test_servers.py env --port P      # "sleep:S" as the action sleeps S seconds, then echoes
    test_servers.py turns --port P    # task["turns"] turns of "obs<k>" observations
    test_servers.py reward --port P   # response "hang" sleeps 60 s, "raise" raises, else len
"""
import sys
import time

import gyre_env


class Sleepy(gyre_env.Env):
    name = "sleepy"

    def reset(self, task, seed):
        return [{"role": "user", "content": f"seed {seed}"}]

    def step(self, action):
        if action.text.startswith("sleep:"):
            time.sleep(float(action.text[len("sleep:"):]))
        return gyre_env.StepResult(messages=[{"role": "user", "content": action.text}])


class Turns(gyre_env.Env):
    """Answers each step with the tool message "obs<k>" (reward 0.1) until task["turns"] model
    turns, then terminates with reward 1; sleeps task["sleep"] seconds in each step."""
    name = "turns"

    def reset(self, task, seed):
        self.task = task
        self.k = 0
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, action):
        time.sleep(float(self.task.get("sleep", 0)))
        self.k += 1
        if self.k >= int(self.task["turns"]):
            return gyre_env.StepResult(reward=1.0, terminated=True)
        return gyre_env.StepResult(
            messages=[{"role": "tool", "content": f"obs{self.k - 1}"}], reward=0.1)


def misbehaving(item):
    if item.response == "hang":
        time.sleep(60)
    if item.response == "raise":
        raise RuntimeError("asked to fail")
    return float(len(item.response))


if __name__ == "__main__":
    kind, rest = sys.argv[1], sys.argv[2:]
    if kind == "env":
        gyre_env.env_main(Sleepy, rest)
    elif kind == "turns":
        gyre_env.env_main(Turns, rest)
    else:
        gyre_env.reward_main(misbehaving, rest)
