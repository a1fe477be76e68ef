#!/usr/bin/env python3
"""Hugging Face transformers' generate() on a Gyre model directory: the baseline that
`gyre bench rollout --device cuda` is compared with on a GPU host (tools/gpu-rollout-vs-hf.sh).

Loads DIR (for example one written by `gyre init-model --preset qwen2.5-0.5b`) in float32, as
Gyre runs it, generates exactly --new-tokens tokens for --batch random prompts of --prompt-len
tokens (min_new_tokens = max_new_tokens, so every row runs to the end), and prints JSON:
{"tokens_per_s", "seconds", "batch", "prompt_len", "new_tokens", "device", "transformers"}.
One untimed warm-up call first; the GPU is synchronised around the timed one.
"""
import argparse
import json
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sample", type=int, default=1, help="1: temperature-1 sampling; 0: greedy")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU intra-op threads (torch.set_num_threads); 0 = torch's default")
    p.add_argument("--json", help="also write the result to this file")
    a = p.parse_args()
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(f"bench_hf_generate: needs torch and transformers ({e})", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_hf_generate: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 1
    torch.manual_seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    except TypeError:  # transformers before `dtype` replaced `torch_dtype`
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    model.to(a.device).eval()
    vocab = model.config.vocab_size
    prompts = torch.randint(0, min(vocab, 256), (a.batch, a.prompt_len), device=a.device)
    mask = torch.ones_like(prompts)
    kwargs = dict(attention_mask=mask, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                  do_sample=bool(a.sample), temperature=1.0 if a.sample else None, top_k=0,
                  top_p=1.0, pad_token_id=0)

    def run(n):
        with torch.inference_mode():
            return model.generate(prompts, **dict(kwargs, max_new_tokens=n, min_new_tokens=n))

    run(min(4, a.new_tokens))  # warm-up
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = run(a.new_tokens)
    if a.device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    generated = (out.shape[1] - a.prompt_len) * a.batch
    result = {"tokens_per_s": generated / secs, "seconds": secs, "batch": a.batch,
              "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "device": a.device,
              "transformers": transformers.__version__, "generated_tokens": generated,
              "threads": torch.get_num_threads()}
    text = json.dumps(result, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
