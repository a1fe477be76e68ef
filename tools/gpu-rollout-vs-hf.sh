#!/usr/bin/env bash
# On a GPU host: Gyre's rollout engine against Hugging Face transformers' generate() in the same
# run, on a random-init model of Qwen2.5-0.5B's shape, batch 256, equal response lengths.
#   bash tools/gpu-rollout-vs-hf.sh BUILD_DIR OUT_DIR [NEW_TOKENS]
# Writes OUT_DIR/{model/, rollout-gpu.json, hf-generate.json, rollout-vs-hf.txt} and prints
# tokens/s of both, the ratio, and Gyre's fraction of the HBM roofline.
set -euo pipefail
build=${1:?build dir}
out=${2:?output dir}
new=${3:-128}
prompt=32
mkdir -p "$out"
gyre="$build/bin/gyre"
"$gyre" init-model --arch qwen2 --preset qwen2.5-0.5b --out "$out/model" --force >/dev/null
"$gyre" bench rollout --model "$out/model" --device cuda --groups 32 --group-size 8 \
  --max-running 256 --prompt-len "$prompt" --median-len "$new" --sigma 0 \
  --max-new-tokens "$new" --max-step-tokens 8192 --json "$out/rollout-gpu.json" \
  | tee "$out/rollout-gpu.txt"
python3 "$(dirname "$0")/bench_hf_generate.py" --model "$out/model" --batch 256 \
  --prompt-len "$prompt" --new-tokens "$new" --json "$out/hf-generate.json" >/dev/null
python3 - "$out" <<'PY' | tee "$out/rollout-vs-hf.txt"
import json, sys
out = sys.argv[1]
g = json.load(open(f"{out}/rollout-gpu.json"))
h = json.load(open(f"{out}/hf-generate.json"))
rows = {r["mode"]: r for r in g["results"]}
best = rows["continuous+prefix"]
print(f"HF generate (batch {h['batch']}, {h['new_tokens']} new tokens): "
      f"{h['tokens_per_s']:.0f} tokens/s")
for mode, r in rows.items():
    print(f"gyre {mode:18s}: {r['tokens_per_s']:.0f} tokens/s = "
          f"{r['tokens_per_s'] / h['tokens_per_s']:.2f}x HF; roofline {r['hbm_roofline_fraction']}")
print(f"gyre continuous+prefix vs HF generate: {best['tokens_per_s'] / h['tokens_per_s']:.2f}x")
PY
