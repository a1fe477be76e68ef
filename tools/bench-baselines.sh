#!/usr/bin/env bash
# Measures the reference results under bench/baselines/ (one gyre-bench/1 JSON file per
# benchmark) and regenerates the documentation's tables from them (gyre bench docs). Run it on
# a quiet machine after a change that moves the figures, then commit the JSON files with the
# docs; compare a later build against them with
#   gyre bench SUBCOMMAND ... --json new.json && gyre bench compare bench/baselines/X.json new.json
#
#   tools/bench-baselines.sh [NAME...]     NAME from: kernels weight-sync rollout rollout-smollm2
#                                          train memory dp-step e2e (default: all of them)
# Environment: GYRE_BIN (default build/bin/gyre). About 15 minutes on the 2-core dev host.
set -euo pipefail
cd "$(dirname "$0")/.."
GYRE="${GYRE_BIN:-build/bin/gyre}"
OUT=bench/baselines
[[ -x "${GYRE}" ]] || { echo "bench-baselines: ${GYRE} not found; run ./dev build first" >&2; exit 2; }
mkdir -p "${OUT}" runs/models

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(kernels weight-sync rollout rollout-smollm2 train memory dp-step e2e)

for name in "${names[@]}"; do
  echo "== ${name} ($(date -u +%H:%M:%S))" >&2
  json="${OUT}/${name}.json"
  case "${name}" in
    kernels) "${GYRE}" bench kernels --device cpu --json "${json}" ;;
    weight-sync) "${GYRE}" bench weight-sync --size 512MB --json "${json}" ;;
    rollout)
      # A random-init model (256 wide, 4 layers) on long-tail lengths, where continuous
      # batching and prefix sharing earn their keep against static batching.
      [[ -f runs/models/bench-small/config.json ]] ||
        "${GYRE}" init-model --arch qwen2 --preset small --out runs/models/bench-small
      "${GYRE}" bench rollout --model runs/models/bench-small --groups 16 --threads 2 --json "${json}" ;;
    rollout-smollm2)
      # The real model, batch 64, equal lengths: the fraction of the matmul ceiling (issue 14).
      bash tools/smollm2-model.sh
      "${GYRE}" bench rollout --model runs/models/smollm2 --groups 8 --group-size 8 \
        --max-running 64 --prompt-len 32 --median-len 32 --sigma 0 --max-new-tokens 32 \
        --threads 2 --json "${json}" ;;
    train) "${GYRE}" bench train --json "${json}" ;;
    memory) "${GYRE}" bench memory --json "${json}" ;;
    dp-step) "${GYRE}" bench dp-step --json "${json}" ;;
    e2e) "${GYRE}" bench e2e --simulate --steps 8 --staleness 0,1,2,4 --json "${json}" ;;
    *) echo "bench-baselines: unknown benchmark '${name}'" >&2; exit 2 ;;
  esac
done
"${GYRE}" bench docs README.md docs/*.md
