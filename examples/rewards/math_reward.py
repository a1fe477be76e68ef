#!/usr/bin/env python3
"""A math-answer reward server for Gyre (docs/agents.md).

Scores a response 1.0 when the model stopped on its own and its final answer equals the task's
reference answer as a number, else 0.0 (the rule of Gyre's built-in `reward.type: math`). The final answer is the content of the last \\boxed{...} if there is one, else the last
number in the response. Numbers are normalised before comparing: thousands separators, a leading
'+', surrounding '$', trailing zeros after the decimal point and a final '.' do not matter, and
simple fractions (\\frac{a}{b}, a/b) compare by value. A reference answer that is not a number is
an error (the item comes back SCORE_ERROR), never a 0.
Run: python3 math_reward.py --port 50200
"""
import re
from fractions import Fraction

import gyre_env

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def last_boxed(text: str):
    """Content of the last \\boxed{...}, braces balanced, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    begin = i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


def to_number(text: str):
    """The value `text` states (a Fraction), or None when it is not one number."""
    t = text.strip().strip("$").strip()
    t = re.sub(r"\\[,!; ]", "", t).replace("\\left", "").replace("\\right", "")
    frac = re.fullmatch(r"(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", t)
    if frac:
        num, den = to_number(frac.group(2)), to_number(frac.group(3))
        if num is None or den is None or den == 0:
            return None
        value = num / den
        return -value if frac.group(1) else value
    slash = re.fullmatch(r"\s*([-+]?[\d,.]+)\s*/\s*([\d,.]+)\s*", t)
    if slash:
        num, den = to_number(slash.group(1)), to_number(slash.group(2))
        return None if num is None or den is None or den == 0 else num / den
    t = t.rstrip(".")
    if not re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-+]?\d+(?:\.\d+)?", t):
        return None
    return Fraction(t.replace(",", ""))


def final_answer(response: str):
    boxed = last_boxed(response)
    if boxed is not None:
        return to_number(boxed)
    numbers = _NUMBER.findall(response)
    return to_number(numbers[-1]) if numbers else None


def score(item: gyre_env.RewardItem):
    reference = to_number(str(item.task.get("answer", "")))
    if reference is None:
        raise ValueError(f"the reference answer {item.task.get('answer')!r} is not a number")
    if not item.task.get("finished", True):  # cut at the length limit
        return 0.0, {"extracted": None, "finished": False}
    got = final_answer(item.response)
    return (1.0 if got == reference else 0.0), {"extracted": None if got is None else str(got)}


if __name__ == "__main__":
    gyre_env.reward_main(score)
