#!/usr/bin/env bash
# Builds unit tests with sanitizers, each kind in its own build directory, and runs them
# (docs/reliability.md).
#
#   tools/sanitize.sh          AddressSanitizer + UBSan in build-asan: every test under tests/unit
#                              (what CI runs). Built with clang and GYRE_FUZZ=ON (which implies
#                              address,undefined plus libFuzzer's coverage), so that the same
#                              build directory also serves the fuzz targets: CI then runs
#                              GYRE_FUZZ_BUILD_DIR=build-asan tools/fuzz.sh and compiles every
#                              library once for both instead of twice.
#   tools/sanitize.sh thread   ThreadSanitizer (GYRE_SANITIZE=thread) in build-tsan: the
#                              controller, comm and rollout unit tests
#
# The CUDA kernels are left out (GYRE_WITH_CUDA=OFF): these builds check the CPU paths. Any
# sanitizer report fails its test: UBSan halts on the first error, ASan and TSan exit non-zero.
# Environment: GYRE_JOBS (default: cores), GYRE_SANITIZE_BUILD_DIR (default build-asan or
# build-tsan); extra arguments go to ctest (e.g. -R CheckpointTest).
set -euo pipefail
cd "$(dirname "$0")/.."
KIND="${1:-address}"
if [[ "${KIND}" == address || "${KIND}" == thread ]]; then shift || true; else KIND=address; fi
JOBS="${GYRE_JOBS:-$(nproc)}"

if [[ "${KIND}" == address ]]; then
  BUILD_DIR="${GYRE_SANITIZE_BUILD_DIR:-build-asan}"
  SANITIZERS="address,undefined"
  DIRS=(tests/unit)
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=${PWD}/tools/lsan.supp:print_suppressions=0}"
else
  BUILD_DIR="${GYRE_SANITIZE_BUILD_DIR:-build-tsan}"
  SANITIZERS="thread"
  DIRS=(tests/unit/controller tests/unit/comm tests/unit/rollout)
  export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

t0=$(date +%s)
bash tools/install-deps.sh
# An AddressSanitizer directory configured before it was built with clang (GCC's, without the
# fuzz targets) cannot switch compilers in place: it is made anew.
if [[ "${KIND}" == address && -f "${BUILD_DIR}/CMakeCache.txt" ]] &&
    ! grep -q '^GYRE_FUZZ:BOOL=ON$' "${BUILD_DIR}/CMakeCache.txt"; then
  echo "[sanitize] ${BUILD_DIR} was configured without GYRE_FUZZ (GCC): configuring it again with clang" >&2
  rm -rf "${BUILD_DIR}"
fi
if [[ ! -f "${BUILD_DIR}/build.ninja" ]]; then
  if [[ "${KIND}" == address ]]; then
    CC=clang CXX=clang++ cmake -S . -B "${BUILD_DIR}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DGYRE_SANITIZE="${SANITIZERS}" -DGYRE_FUZZ=ON -DGYRE_WITH_CUDA=OFF >/dev/null
  else
    cmake -S . -B "${BUILD_DIR}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DGYRE_SANITIZE="${SANITIZERS}" -DGYRE_WITH_CUDA=OFF >/dev/null
  fi
fi
targets=()
for d in "${DIRS[@]}"; do targets+=("${d}/all"); done
cmake --build "${BUILD_DIR}" -j "${JOBS}" --target "${targets[@]}"
t1=$(date +%s)
echo "[sanitize] ${SANITIZERS}: built in $((t1 - t0)) s" >&2
status=0
for d in "${DIRS[@]}"; do
  ctest --test-dir "${BUILD_DIR}/${d}" --output-on-failure -j "${JOBS}" "$@" || status=1
done
echo "[sanitize] ${SANITIZERS}: tests ran in $(($(date +%s) - t1)) s" >&2
exit "${status}"
