#!/usr/bin/env python3
"""A calculator tool environment for Gyre (docs/agents.md).

Task records carry a question and its numeric answer, e.g.
    {"prompt": "What is 347 * 29?", "answer": "10063"}
The model may call the `calculate` tool (the result comes back as a tool message) and ends the
episode with a reply that calls no tool: reward 1 if that reply's final number equals the answer,
else 0. Run: python3 calculator_env.py --port 50100 [--step-delay SECONDS]
(--step-delay makes every step wait, like a slow tool: tests use it to kill the server while
episodes wait for it. --system-prompt opens each episode with a system message that describes the
tool, for chat templates that do not render tool definitions; see calculator_tool.py.)
"""
import argparse
import ast
import operator
import re
import time

import gyre_env

import calculator_tool

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str):
    """Arithmetic on numbers only (no names, calls or attributes); bounded exponents."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element: {type(node).__name__}")
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    value = ev(ast.parse(expression, mode="eval"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def final_number(text: str) -> str:
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return numbers[-1].replace(",", "") if numbers else ""


def same_number(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    except ValueError:
        return False


class Calculator(gyre_env.Env):
    name = "calculator"
    tools = calculator_tool.TOOLS
    max_steps = 6
    step_delay = 0.0
    system_prompt = False

    def reset(self, task, seed):
        self.answer = str(task["answer"])
        self.steps = 0
        return calculator_tool.opening(task, self.system_prompt)

    def step(self, action):
        if self.step_delay > 0:
            time.sleep(self.step_delay)
        self.steps += 1
        if action.tool_call_error:
            return self._observe([{"role": "tool", "name": "calculate",
                                   "content": f"error: {action.tool_call_error}"}])
        if not action.tool_calls:  # the final answer
            ok = same_number(final_number(action.text), self.answer)
            return gyre_env.StepResult(reward=1.0 if ok else 0.0, terminated=True,
                                       info={"correct": ok, "steps": self.steps})
        results = []
        for call in action.tool_calls:
            if call.name != "calculate":
                content = f"error: unknown tool {call.name!r}; the tool is 'calculate'"
            else:
                try:
                    content = str(evaluate(str(call.arguments.get("expression", ""))))
                except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
                    content = f"error: {e}"
            results.append({"role": "tool", "name": call.name, "tool_call_id": call.id,
                            "content": content})
        return self._observe(results)

    def _observe(self, messages):
        if self.steps >= self.max_steps:
            return gyre_env.StepResult(messages=messages, truncated=True,
                                       info={"reason": "step limit"})
        return gyre_env.StepResult(messages=messages)


if __name__ == "__main__":
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--step-delay", type=float, default=0.0)
    own.add_argument("--system-prompt", action="store_true")
    known, rest = own.parse_known_args()
    Calculator.step_delay = known.step_delay
    Calculator.system_prompt = known.system_prompt
    gyre_env.env_main(Calculator, rest)
