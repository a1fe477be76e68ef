#!/usr/bin/env bash
# Measures the rollout-budget policies (rollout.budget.policy; docs/algorithms.md, "Sampling
# policies, measured") on the quickstart task: for every policy and seed, the quickstart job runs
# GRPO until it has generated the same number of tokens (trainer.max_generated_tokens), then
# evaluates on the held-out set. Prints one row per run and the mean per policy: samples generated
# per useful (non-zero-variance) group, GRPO steps, and held-out accuracy before and after RL.
#
#   tools/budget-figures.sh [OUT_DIR]
#
# Environment: POLICIES (default "uniform pilot variance greso"), SEEDS (default "1 2 3"),
# TOKENS (generated-token budget per run, default 150000), GYRE_BIN (default build/bin/gyre).
# Writes OUT_DIR (default runs/budget-figures)/<policy>-s<seed>/ run directories and
# OUT_DIR/figures.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/budget-figures}"
GYRE="${GYRE_BIN:-build/bin/gyre}"
POLICIES="${POLICIES:-uniform pilot variance greso}"
SEEDS="${SEEDS:-1 2 3}"
TOKENS="${TOKENS:-150000}"
if [[ ! -x "${GYRE}" ]]; then
  echo "budget-figures: ${GYRE} not found; build first (./dev build) or set GYRE_BIN" >&2
  exit 2
fi
mkdir -p "${OUT}"
for policy in ${POLICIES}; do
  for seed in ${SEEDS}; do
    name="${policy}-s${seed}"
    echo "budget-figures: ${name} (${TOKENS} generated tokens)" >&2
    "${GYRE}" train configs/quickstart.yaml \
      --set "job.output_dir=${OUT}" --set "job.name=${name}" --set "job.seed=${seed}" \
      --set "rollout.budget.policy=${policy}" --set "trainer.steps=100000" \
      --set "trainer.max_generated_tokens=${TOKENS}" --set "metrics.eval_every=0" \
      > "${OUT}/${name}.log" 2>&1 || { echo "budget-figures: ${name} failed, see ${OUT}/${name}.log" >&2; exit 1; }
  done
done
python3 - "${OUT}" "${POLICIES}" "${SEEDS}" <<'EOF'
import json, sys, statistics
out, policies, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = []
for p in policies:
    for s in seeds:
        d = f"{out}/{p}-s{s}"
        steps = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"phase":"grpo"' in l]
        summary = json.load(open(f"{d}/summary.json"))
        made = sum(x["samples_generated"] for x in steps)
        useful = sum(x["useful_groups"] for x in steps)
        rows.append({"policy": p, "seed": int(s), "grpo_steps": len(steps),
                     "generated_tokens": sum(x["generated_tokens"] for x in steps),
                     "samples_generated": made, "useful_groups": useful,
                     "samples_per_useful_group": made / useful if useful else None,
                     "accuracy_before_rl": summary["accuracy_before_rl"],
                     "accuracy_after_rl": summary["accuracy_after_rl"]})
json.dump(rows, open(f"{out}/figures.json", "w"), indent=1)
print("| policy | seed | GRPO steps | tokens | samples / useful group | accuracy before | after | gain |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    spg = "-" if r["samples_per_useful_group"] is None else f'{r["samples_per_useful_group"]:.2f}'
    print(f'| {r["policy"]} | {r["seed"]} | {r["grpo_steps"]} | {r["generated_tokens"]} | {spg} | '
          f'{r["accuracy_before_rl"]:.3f} | {r["accuracy_after_rl"]:.3f} | '
          f'{100 * (r["accuracy_after_rl"] - r["accuracy_before_rl"]):+.1f} |')
print()
print("| policy | samples / useful group (mean) | accuracy after RL (mean) | gain, points (mean) |")
print("|---|---|---|---|")
for p in policies:
    rs = [r for r in rows if r["policy"] == p]
    spg = [r["samples_per_useful_group"] for r in rs if r["samples_per_useful_group"]]
    print(f'| {p} | {statistics.mean(spg):.2f} | {statistics.mean(r["accuracy_after_rl"] for r in rs):.3f} | '
          f'{statistics.mean(100 * (r["accuracy_after_rl"] - r["accuracy_before_rl"]) for r in rs):+.1f} |')
EOF
