#!/usr/bin/env bash
# The GPU host's check, as one script: configure and build Gyre against the host's CUDA-enabled
# PyTorch (torch.utils.cmake_prefix_path) and the staged Debian packages, run the GPU tests
# (ctest label gpu; among them the sharded optimizer over a one-rank NCCL group,
# sharded_gpu_test, and NCCL's reduce-scatter and all-gather), `gyre bench kernels`, the CUDA IPC row of `gyre bench weight-sync`, the
# rollout engine against HF generate (tools/gpu-rollout-vs-hf.sh), model.dtype parity with
# transformers (tools/gpu-dtype-parity.py), the quickstart in float32 and bfloat16, and the
# SmolLM2 job when its model is present, and copy logs and JSON to $OUT (or ./gpu-out).
#
# Preparation on a machine with Debian's registry, from the repository root:
#   EXTRA_DEBS="libgloo-dev libsqlite3-dev libsqlite3-0" bash ../shared/device/stage-deps.sh
#       # -> .devdeps/ (git-ignored; carry it); Gloo's and SQLite's are not in its default list
#   mkdir -p .device && cp ../shared/device/*.sh .device/   # .device/ is git-ignored
# On the GPU host (the device tool runs commands in the repository root):
#   bash tools/gpu-check.sh [--tests-only | --bench-only] [extra bench kernels options]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"
mode=all
if [[ "${1:-}" == --tests-only || "${1:-}" == --bench-only ]]; then
  mode="${1#--}"
  shift
fi
if [[ ! -f .device/gpu-env.sh || ! -d .devdeps ]]; then
  echo "gpu-check: .device/gpu-env.sh or .devdeps/ is missing (see the top of this script)" >&2
  exit 2
fi
# shellcheck disable=SC1091
source .device/gpu-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
build=build-gpu
start=$(date +%s)
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGYRE_WITH_CUDA=ON \
    >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$(nproc)" \
  >"$out/build.log" 2>&1 || { grep -m 20 -A5 "error" "$out/build.log"; exit 1; }
echo "gpu-check: built in $(( $(date +%s) - start )) s"
rc=0
if [[ "$mode" != bench-only ]]; then
  ctest --test-dir "$build" -L gpu --output-on-failure -j 4 --timeout 300 >"$out/ctest-gpu.log" 2>&1 || rc=1
  tail -25 "$out/ctest-gpu.log"
fi
if [[ "$mode" != tests-only ]]; then
  "$build/bin/gyre" bench kernels --json "$out/bench-kernels.json" "$@" 2>"$out/bench-kernels.err" \
    | tee "$out/bench-kernels.txt" || rc=1
  # Colocated weight update of a 1 GB version over CUDA IPC, beside the naive gRPC baseline.
  "$build/bin/gyre" bench weight-sync --size 1GB --transports cuda_ipc --bucket-mb 64,256 \
    --reps 5 --json "$out/bench-weight-sync.json" 2>"$out/bench-weight-sync.err" \
    | tee "$out/bench-weight-sync.txt" || rc=1
  # The rollout engine against HF generate at batch 256 (random-init Qwen2.5-0.5B shape).
  bash tools/gpu-rollout-vs-hf.sh "$build" "$out/rollout-vs-hf" 128 >"$out/rollout-vs-hf.log" 2>&1 \
    || rc=1
  tail -8 "$out/rollout-vs-hf.log"
  # model.dtype on the GPU: log-prob parity with transformers in float32 and bfloat16.
  "${PYTHON:-python3}" tools/gpu-dtype-parity.py "$build/bin/gyre" "$out/dtype-parity" \
    "$out/dtype-parity.json" 2>&1 | tee "$out/dtype-parity.log" || rc=1
  # The quickstart on the GPU in bfloat16 beside float32, same run: wall time, accuracy, and the
  # rollout-vs-trainer mismatch (metrics.jsonl).
  for dtype in float32 bfloat16; do
    "$build/bin/gyre" train configs/quickstart.yaml --set model.device=cuda \
      --set model.dtype="$dtype" --set job.output_dir="$out/quickstart-$dtype" \
      >"$out/quickstart-$dtype.log" 2>&1 || rc=1
    echo "quickstart $dtype: $(tail -n 2 "$out/quickstart-$dtype.log" | head -n 1)"
  done
  # SmolLM2-135M-Instruct on the GPU, when its converted directory came along (runs/models is
  # written by tools/smollm2-arith.sh; the model is too large to carry with the device tool).
  if [[ -f runs/models/smollm2/config.json ]]; then
    for dtype in float32 bfloat16; do
      "$build/bin/gyre" train configs/smollm2-arith.yaml --set model.device=cuda \
        --set model.dtype="$dtype" --set job.output_dir="$out/smollm2-$dtype" \
        >"$out/smollm2-$dtype.log" 2>&1 || rc=1
      echo "smollm2 $dtype: $(tail -n 2 "$out/smollm2-$dtype.log" | head -n 1)"
    done
  else
    echo "smollm2: skipped, runs/models/smollm2 is not here (tools/smollm2-arith.sh writes it)"
  fi
fi
exit $rc
