#!/usr/bin/env python3
"""Gyre's quickstart GRPO step against Hugging Face TRL's GRPOTrainer, same machine, same run.

1. Runs `gyre train configs/quickstart.yaml` for STEPS GRPO steps with one generation round per
   step (dynamic sampling off, so every step generates and trains exactly 64 prompts x 8
   samples), and reads each step's wall time (step_time_s) from its metrics.jsonl; once per
   value of --gyre-threads (trainer.torch_threads: 1 is Gyre's default, 0 lets each phase use
   every core, as TRL does).
2. Loads the model that run ended with (its final/ directory is a Hugging Face directory) into
   TRL's GRPOTrainer with the same batch and hyperparameters: 64 prompts x 8 generations per
   step, max 5 new tokens, temperature 1, lr 5e-4, one optimizer step per batch, no KL term,
   the same task (sums of 1- and 2-digit numbers, prompt BOS "A+B=") and reward (1 for the exact
   answer), on the CPU with every core, and times each step (generation, reward, loss,
   backward and optimizer) with a callback. Equal work: TRL's gradient checkpointing (on by
   default in GRPOConfig) is turned off, since it only recomputes activations that a model this
   small keeps anyway. --trl-defaults adds a second TRL run with GRPOConfig's own default (on),
   reported as its own row, never as the baseline.
3. Prints the medians and the ratios against the equal-work TRL run, with the host and the
   versions of TRL, transformers and torch, and writes them as JSON.

TRL is test-side only: `pip install trl` into the venv when it is missing (the script does it).

usage: trl-compare.py GYRE_BINARY WORK_DIR [--steps N] [--gyre-threads 1,0] [--trl-defaults]
                      [--json FILE]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time


def run_gyre(binary, work, steps, threads):
    out = os.path.join(work, f"gyre-threads{threads}")
    cmd = [binary, "train", "configs/quickstart.yaml",
           "--set", f"job.output_dir={out}",
           "--set", f"trainer.steps={steps}",
           "--set", f"trainer.torch_threads={threads}",
           "--set", "algorithm.filter_zero_variance=false",
           "--set", "metrics.eval_every=0"]
    print("trl-compare: " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    rows = [json.loads(l) for l in open(os.path.join(out, "quickstart", "metrics.jsonl"))]
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    return os.path.join(out, "quickstart", "final"), grpo


def ensure_trl():
    try:
        import trl  # noqa: F401
    except ImportError:
        print("trl-compare: installing trl (pip)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "trl", "datasets"],
                       check=True)


def run_trl(model_dir, work, steps, threads, gradient_checkpointing):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    rng = random.Random(1234)

    def operand():
        d = rng.randint(1, 2)
        return rng.randint(0, 9) if d == 1 else rng.randint(10, 99)

    rows = []
    for _ in range(64 * (steps + 2)):
        a, b = operand(), operand()
        # Gyre prepends the tokenizer's BOS to every prompt of the built-in task.
        rows.append({"prompt": f"{tok.bos_token}{a}+{b}=", "answer": str(a + b)})
    data = Dataset.from_list(rows)

    def exact(completions, answer, **_):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir=os.path.join(work, "trl-gc" if gradient_checkpointing else "trl"),
        gradient_checkpointing=gradient_checkpointing,
        per_device_train_batch_size=512,
        num_generations=8,
        max_completion_length=5,
        temperature=1.0,
        learning_rate=5e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        beta=0.0,
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=1234,
        dataloader_num_workers=0,
    )

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=exact, args=cfg, train_dataset=data,
                          processing_class=tok, callbacks=[timer])
    trainer.train()
    return timer.times


def host():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch
    import transformers
    import trl
    return {"cpu": cpu, "cpus": os.cpu_count(), "trl": trl.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binary")
    p.add_argument("work")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--gyre-threads", default="1,0",
                   help="trainer.torch_threads values, one Gyre run each [1,0]")
    p.add_argument("--trl-defaults", action="store_true",
                   help="also time TRL with GRPOConfig's default gradient checkpointing (a "
                        "second row; the equal-work run stays the baseline)")
    p.add_argument("--json")
    a = p.parse_args()
    try:
        gyre_threads = [int(t) for t in a.gyre_threads.split(",")]
    except ValueError:
        p.error("--gyre-threads takes comma-separated integers, e.g. 1,0")
    if a.steps < 3:
        p.error("--steps must be at least 3 (the first step of each run is left out)")
    os.makedirs(a.work, exist_ok=True)
    ensure_trl()
    runs = [(t, *run_gyre(a.binary, a.work, a.steps, t)) for t in gyre_threads]
    threads = os.cpu_count() or 1
    # The first step of each run warms caches and allocators: left out of every median.
    trl_s = statistics.median(run_trl(runs[0][1], a.work, a.steps, threads, False)[1:])
    result = {"steps": a.steps, "samples_per_step": 512, "host": host(), "trl_step_s": trl_s,
              "trl_gradient_checkpointing": False, "trl_threads": threads, "gyre": []}
    if a.trl_defaults:
        result["trl_defaults_step_s"] = statistics.median(
            run_trl(runs[0][1], a.work, a.steps, threads, True)[1:])
    for t, _, grpo in runs:
        gyre_s = statistics.median(r["step_time_s"] for r in grpo[1:])
        gyre_train = statistics.median(r["train_s"] for r in grpo[1:])
        gyre_gen = statistics.median(r["generate_s"] for r in grpo[1:])
        result["gyre"].append({"torch_threads": t, "step_s": gyre_s, "generate_s": gyre_gen,
                               "train_s": gyre_train, "speedup": trl_s / gyre_s})
        print(f"gyre (trainer.torch_threads {t}) step {gyre_s:.3f} s (generate {gyre_gen:.3f} s, "
              f"train {gyre_train:.3f} s): {trl_s / gyre_s:.2f}x faster than TRL (equal work)")
    h = result["host"]
    print(f"TRL GRPOTrainer step {trl_s:.3f} s ({threads} threads, no gradient checkpointing; "
          f"trl {h['trl']}, transformers {h['transformers']}, torch {h['torch']})")
    if a.trl_defaults:
        print(f"TRL GRPOTrainer with its default gradient checkpointing: "
              f"{result['trl_defaults_step_s']:.3f} s (not the baseline)")
    print(f"host: {h['cpu']}, {h['cpus']} CPUs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
