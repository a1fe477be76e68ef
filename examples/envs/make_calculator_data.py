#!/usr/bin/env python3
"""Writes the calculator tool task for examples/envs/calculator_env.py (docs/agents.md).

Each record is a multiplication the model is asked to answer, e.g.
    {"prompt": "347*29", "answer": "10063", "demonstration": [...]}
`demonstration` is the conversation an expert would have with the environment: the model calls
the `calculate` tool in the Hermes format, reads the result and answers with it. A job's
supervised warm-up (trainer.warmup_sft_steps) trains on it; GRPO then trains on the
environment's rewards alone.

    python3 examples/envs/make_calculator_data.py --out runs/data/calculator
writes train.jsonl and eval.jsonl there (the same files for the same --seed).
"""
import argparse
import json
import os
import random

import calculator_tool


def record(rng, a_digits, b_digits, compact, system_prompt):
    a = rng.randint(10 ** (a_digits - 1), 10 ** a_digits - 1)
    b = rng.randint(10 ** (b_digits - 1), 10 ** b_digits - 1)
    prompt = f"{a}*{b}"
    answer = str(a * b)
    sep = (",", ":") if compact else (", ", ": ")
    call = json.dumps({"name": "calculate", "arguments": {"expression": prompt}}, separators=sep)
    task = {"prompt": prompt, "answer": answer}
    demo = calculator_tool.opening(task, system_prompt) + [
        {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
        {"role": "tool", "name": "calculate", "content": answer},
        {"role": "assistant", "content": answer},
    ]
    return dict(task, demonstration=demo)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for train.jsonl and eval.jsonl")
    p.add_argument("--train", type=int, default=4000, help="training records")
    p.add_argument("--eval", type=int, default=200, help="held-out records")
    p.add_argument("--a-digits", type=int, default=3, help="digits of the first factor")
    p.add_argument("--b-digits", type=int, default=2, help="digits of the second factor")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--spaced", action="store_true",
                   help="JSON with spaces after ',' and ':' (as chat models write it)")
    p.add_argument("--system-prompt", action="store_true",
                   help="demonstrations open with the tool's system message, as the environment "
                        "does when started with --system-prompt")
    args = p.parse_args()
    rng = random.Random(args.seed)
    seen = set()
    rows = []
    while len(rows) < args.train + args.eval:
        r = record(rng, args.a_digits, args.b_digits, not args.spaced, args.system_prompt)
        if r["prompt"] in seen:
            continue
        seen.add(r["prompt"])
        rows.append(r)
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("eval.jsonl", rows[:args.eval]), ("train.jsonl", rows[args.eval:])):
        with open(os.path.join(args.out, name), "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    print(f"wrote {args.train} training and {args.eval} held-out records to {args.out}")


if __name__ == "__main__":
    main()
