#!/usr/bin/env bash
# Tool-use RL on SmolLM2-135M-Instruct (configs/smollm2-tools.yaml): converts the model once
# (tools/smollm2-model.sh), writes the calculator task with the tool's system message into
# runs/data/calculator-chat, and trains against the calculator environment, run by the shared
# venv's Python with the SDK that the build installs (build/python). Extra arguments go to
# `gyre train` (e.g. --set trainer.steps=10).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GYRE_VENV:-${HOME}/.cache/gyre/venv}"
tools/smollm2-model.sh
[[ -d build/python/gyre_env ]] || { echo "smollm2-tools: build/python has no gyre_env; run ./dev build first" >&2; exit 2; }
"${VENV}/bin/python" examples/envs/make_calculator_data.py --out runs/data/calculator-chat \
  --spaced --system-prompt --eval 50
command="[\"/usr/bin/env\", \"PYTHONPATH=${PWD}/build/python\", \"${VENV}/bin/python\", \"examples/envs/calculator_env.py\", \"--port\", \"{port}\", \"--system-prompt\"]"
exec "${GYRE_BIN:-build/bin/gyre}" train configs/smollm2-tools.yaml --set "env.command=${command}" "$@"
