#!/usr/bin/env bash
# Gyre's rollout engine against Hugging Face transformers' generate() in one invocation, on the
# same random-init model, float32, the same number of sequences and threads: the figures the
# README quotes. Two workloads:
#   equal    every sequence generates exactly NEW tokens (HF generate's best case: no row idles)
#   longtail lognormal response lengths (median NEW/4, sigma 1, capped at NEW) in gyre; HF
#            generate has no per-row stop here, so its batch runs to the longest drawn length
#            (measured as such): its useful tokens/s is the drawn lengths' sum over that time
#   bash tools/rollout-vs-hf.sh BUILD_DIR OUT_DIR [DEVICE=cpu] [SEQS=64] [NEW=64] [THREADS=2]
#                               [PRESET=tiny]
# Writes OUT_DIR/{model/, *.json, summary.txt}; prints tokens/s of each row and each against HF
# generate and against the engine's static schedule, and on the CPU the fraction of the matmul
# ceiling (gyre bench rollout --help).
set -euo pipefail
build=${1:?build dir}
out=${2:?output dir}
device=${3:-cpu}
seqs=${4:-64}
new=${5:-64}
threads=${6:-2}
preset=${7:-tiny}
prompt=32
py=${GYRE_PYTHON:-${HOME}/.cache/gyre/venv/bin/python}
mkdir -p "$out"
gyre="$build/bin/gyre"
"$gyre" init-model --arch qwen2 --preset "$preset" --out "$out/model" --force >/dev/null
groups=$((seqs / 8))
common=(--model "$out/model" --device "$device" --groups "$groups" --group-size 8
        --max-running "$seqs" --prompt-len "$prompt" --threads "$threads")
echo "== equal lengths: $seqs sequences x $new tokens, $threads threads, $device" >&2
"$gyre" bench rollout "${common[@]}" --median-len "$new" --sigma 0 --max-new-tokens "$new" \
  --json "$out/gyre-equal.json" >/dev/null
"$py" "$(dirname "$0")/bench_hf_generate.py" --model "$out/model" --batch "$seqs" \
  --prompt-len "$prompt" --new-tokens "$new" --device "$device" --threads "$threads" \
  --json "$out/hf-equal.json" >/dev/null
echo "== long tail: median $((new / 4)), sigma 1, cap $new" >&2
"$gyre" bench rollout "${common[@]}" --median-len $((new / 4)) --sigma 1 --max-new-tokens "$new" \
  --json "$out/gyre-longtail.json" >/dev/null
# HF generate has no per-row length limit: the same 64 rows run together to the longest drawn
# length. Measure exactly that batch; its useful tokens are the drawn lengths' sum.
longest=$("$py" -c 'import json,sys; g=json.load(open(sys.argv[1])); print(g.get("context", g)["response_len_max"])' "$out/gyre-longtail.json")
"$py" "$(dirname "$0")/bench_hf_generate.py" --model "$out/model" --batch "$seqs" \
  --prompt-len "$prompt" --new-tokens "$longest" --device "$device" --threads "$threads" \
  --json "$out/hf-longtail.json" >/dev/null
"$py" - "$out" <<'PY' | tee "$out/summary.txt"
import json, sys
out = sys.argv[1]
h = json.load(open(f"{out}/hf-equal.json"))
print(f"HF generate {h['transformers']}: {h['batch']} sequences x {h['new_tokens']} tokens, "
      f"{h['threads']} threads: {h['tokens_per_s']:.0f} tokens/s ({h['seconds']:.2f} s)")
for work in ("equal", "longtail"):
    g = json.load(open(f"{out}/gyre-{work}.json"))
    rows = {r["mode"]: r for r in g["results"]}
    comp = rows["static"]["tokens_per_s"]
    if work == "equal":
        hf = h["tokens_per_s"]
    else:
        # HF generate ran the batch to the longest drawn length (measured, hf-longtail.json);
        # its useful tokens are the drawn lengths' sum.
        ctx = g.get("context", g)
        hl = json.load(open(f"{out}/hf-longtail.json"))
        useful = rows["static"]["generated_tokens"]
        hf = useful / hl["seconds"]
        print(f"-- longtail: {useful} tokens, mean length {ctx['response_len_mean']:.1f}, "
              f"longest {ctx['response_len_max']}; HF generate ran {hl['batch']} x "
              f"{hl['new_tokens']} tokens in {hl['seconds']:.2f} s")
    print(f"-- {work}: HF generate {hf:.0f} useful tokens/s")
    for mode, r in rows.items():
        ceiling = r.get("matmul_ceiling_fraction")
        print(f"   gyre {mode:18s} {r['tokens_per_s']:8.0f} tokens/s = {r['tokens_per_s'] / hf:5.2f}x HF "
              f"generate, {r['tokens_per_s'] / comp:5.2f}x static"
              + (f", {ceiling:.2f} of the matmul ceiling" if ceiling is not None else ""))
PY
