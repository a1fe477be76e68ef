#!/usr/bin/env bash
# RL on SmolLM2-135M-Instruct (configs/smollm2-arith.yaml): converts the model into
# runs/models/smollm2 once (tools/smollm2-model.sh), then trains. Extra arguments go to
# `gyre train` (e.g. --set trainer.steps=10).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/smollm2-model.sh
exec "${GYRE_BIN:-build/bin/gyre}" train configs/smollm2-arith.yaml "$@"
