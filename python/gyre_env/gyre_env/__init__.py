"""gyre_env: environment and reward servers for Gyre, in a few lines of Python.

    import gyre_env

    class Echo(gyre_env.Env):
        name = "echo"
        def reset(self, task, seed):
            return [{"role": "user", "content": task["prompt"]}]
        def step(self, action):
            return gyre_env.StepResult(reward=1.0, terminated=True)

    if __name__ == "__main__":
        gyre_env.env_main(Echo)

See docs/agents.md in the Gyre repository for the protocol and the job configuration.
"""
from .env import Action, Env, StepResult, ToolCall, serve_env
from .env import main as env_main
from .reward import RewardItem, serve_reward
from .reward import main as reward_main

__all__ = ["Action", "Env", "StepResult", "ToolCall", "serve_env", "env_main", "RewardItem",
           "serve_reward", "reward_main"]
