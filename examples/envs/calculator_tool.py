"""The calculator tool as the model sees it, shared by calculator_env.py and
make_calculator_data.py (no dependencies).

TOOLS is the tool list an environment returns from Reset: chat templates with tool support
(Qwen2.5, Qwen3) render it themselves. SYSTEM_PROMPT describes the same tool in words and in the
Hermes call format, for templates that ignore tools (SmolLM2): the environment opens with it as a
system message when asked to (--system-prompt).
"""
import json

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 347 * 29"}},
            "required": ["expression"],
        },
    },
}]

SYSTEM_PROMPT = (
    "You answer arithmetic questions with a calculator tool. Available tool:\n"
    + json.dumps(TOOLS[0]["function"])
    + "\nTo use it, reply with only a tool call such as "
    '<tool_call>{"name": "calculate", "arguments": {"expression": "12 * 34"}}</tool_call> '
    "and wait for its result. Then reply with the final number only."
)


def opening(task, system_prompt):
    """The environment's opening messages for `task`."""
    messages = [{"role": "user", "content": task["prompt"]}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return messages
