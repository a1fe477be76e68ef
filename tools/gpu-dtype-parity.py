#!/usr/bin/env python3
"""model.dtype parity on a GPU, for tools/gpu-check.sh.

Builds the random-init tiny Llama, Qwen2 and Qwen3 models of tests/integration/hf_parity.py
(nothing is downloaded), then for float32 and bfloat16 compares the full log-softmax rows of
`gyre logprobs --device cuda --dtype D` with transformers' from_pretrained(dtype=D) on the same
GPU, and prints one line per (model, dtype): max and mean |difference|, and the mean distance
of transformers' bfloat16 rows from its float32 ones (the scale a bfloat16 difference is judged
against). Exit status 1 when a bound is broken: float32 max 1e-3 (GPU kernels differ from the
CPU's, TF32 is off), bfloat16 max 0.05 and mean under a tenth of the bfloat16-float32 distance.

usage: gpu-dtype-parity.py GYRE_BINARY WORK_DIR [JSON_OUT]
       (PARITY_DEVICE=cpu runs the same comparison on the CPU, to check the script itself)
"""
import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import hf_parity  # noqa: E402  (the models of the CPU parity test)

DEVICE = os.environ.get("PARITY_DEVICE", "cuda")


def hf_rows(model_dir, ids, dtype):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(DEVICE).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=DEVICE)).logits[0].float()
    return torch.log_softmax(logits, -1).cpu()


def gyre_rows(binary, model_dir, ids, dtype_name):
    out = subprocess.run([binary, "logprobs", "--full", "--device", DEVICE, "--dtype", dtype_name,
                          "--model", model_dir, "--ids", " ".join(map(str, ids))],
                         check=True, capture_output=True, text=True).stdout
    return torch.tensor(json.loads(out)["full"])


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1234)
    ids = [int(x) for x in torch.randint(0, 96, (40,))]
    results, ok = [], True
    for name, cfg in hf_parity.configs():
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.15)
        d = os.path.join(work, name)
        model.save_pretrained(d, safe_serialization=True)
        ref32 = hf_rows(d, ids, torch.float32)
        ref16 = hf_rows(d, ids, torch.bfloat16)
        scale = (ref16 - ref32).abs().mean().item()
        for dtype_name, ref in (("float32", ref32), ("bfloat16", ref16)):
            diff = (gyre_rows(binary, d, ids, dtype_name) - ref).abs()
            row = {"model": name, "dtype": dtype_name, "max_diff": diff.max().item(),
                   "mean_diff": diff.mean().item(), "bf16_vs_fp32_mean": scale}
            if dtype_name == "float32":
                row["pass"] = row["max_diff"] < 1e-3
            else:
                row["pass"] = row["max_diff"] < 0.05 and row["mean_diff"] < 0.1 * scale
            ok = ok and row["pass"]
            results.append(row)
            print(f"{name:6s} {dtype_name:8s} max |diff| {row['max_diff']:.3g}  mean "
                  f"{row['mean_diff']:.3g}  (bf16 vs fp32 mean {scale:.3g})  "
                  f"{'ok' if row['pass'] else 'FAIL'}")
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
