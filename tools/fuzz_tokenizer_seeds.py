#!/usr/bin/env python3
"""Small fuzz seeds from real tokenizer.json files (tools/fuzz.sh, docs/reliability.md).

Usage: fuzz_tokenizer_seeds.py --shared DIR --out DIR [--keep N]

For each DIR/<name>/tokenizer.json.xz (the Qwen2.5 and Qwen3 files in ../shared/data/tokenizers)
writes OUT/<name>_trimmed.json: the same normalizer, pre-tokenizer, decoder and added tokens, with
the vocabulary cut to its first N ids (default 512: the 256 byte tokens and the first merges) and
only the merges that stay inside it; the added tokens are renumbered to follow. A full file is
7 MB, which would make every fuzz input megabytes long; the trimmed one keeps the structure in
about 15 KB. When the merges are "a b" strings (the legacy form), also writes
OUT/<name>_pairs.json with them as [a, b] pairs (the newer form).
Files are decompressed in memory; nothing is written next to the sources.
"""

import argparse
import json
import lzma
import os
import sys


def trim(tok, keep):
    model = tok["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < keep}
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["vocab"] = vocab
    model["merges"] = merges
    next_id = max(vocab.values()) + 1
    for added in tok.get("added_tokens", []):
        added["id"] = next_id
        next_id += 1
    return tok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--keep", type=int, default=512)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    written = 0
    for name in sorted(os.listdir(args.shared)) if os.path.isdir(args.shared) else []:
        src = os.path.join(args.shared, name, "tokenizer.json.xz")
        if not os.path.exists(src):
            continue
        with lzma.open(src, "rt", encoding="utf-8") as f:
            tok = trim(json.load(f), args.keep)
        with open(os.path.join(args.out, name + "_trimmed.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)
        written += 1
        if any(isinstance(m, str) for m in tok["model"]["merges"]):
            tok["model"]["merges"] = [m.split(" ", 1) if isinstance(m, str) else m
                                      for m in tok["model"]["merges"]]
            with open(os.path.join(args.out, name + "_pairs.json"), "w", encoding="utf-8") as f:
                json.dump(tok, f, ensure_ascii=False)
            written += 1
    print(f"fuzz_tokenizer_seeds: {written} files from {args.shared}", file=sys.stderr)


if __name__ == "__main__":
    main()
