#!/usr/bin/env bash
# Gyre as an installed C++ library, end to end (docs/embedding.md): installs the build tree into a
# fresh prefix (cmake --install), builds examples/custom_trainer out of tree against it with
# find_package(Gyre), and runs it on its job file, which must raise held-out accuracy by at
# least MIN_GAIN points (default 15). Runs as the ctest `install_test`.
#
#   tools/check-install.sh [BUILD_DIR]      (default: build)
#
# Environment: MIN_GAIN (points), KEEP=1 keeps the prefix and the example's build, EXTRA_SET
# (a --set override for the example's job, e.g. trainer.steps=20 for a quick look).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-${root}/build}" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/gyre_install_XXXXXX")"
[[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "${work}"' EXIT
step() { echo "[check-install] $*"; }

step "cmake --install ${build} --prefix ${work}/prefix"
cmake --install "${build}" --prefix "${work}/prefix" >"${work}/install.log"
for f in include/gyre/rollout.h include/gyre/algorithms.h include/gyre/torch.h lib/libgyre.so \
         lib/cmake/Gyre/GyreConfig.cmake bin/gyre; do
  [[ -e "${work}/prefix/${f}" ]] || { echo "check-install: ${f} was not installed" >&2; exit 1; }
done
# libgyre.so is the library (src/runtime and the modules under it): no benchmark (gyre::bench),
# command-line (gyre::cli) or launcher code, which live in the gyre executable only.
if nm -C --defined-only "${work}/prefix/lib/libgyre.so" | grep -E "gyre::(bench|cli)::" >"${work}/cli.syms"; then
  echo "check-install: libgyre.so holds benchmark or command-line code:" >&2
  head -5 "${work}/cli.syms" >&2
  exit 1
fi
# The torch-free headers must compile without torch (and without Gyre's sources).
for h in "${work}"/prefix/include/gyre/*.h; do
  [[ "$(basename "$h")" == torch.h ]] && continue
  echo "#include <gyre/$(basename "$h")>" | c++ -std=c++17 -fsyntax-only -x c++ - \
    -I"${work}/prefix/include" || { echo "check-install: ${h} does not stand alone" >&2; exit 1; }
done

step "configure examples/custom_trainer against the prefix (find_package(Gyre))"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
# The prefix is a new temporary folder each run: CCACHE_BASEDIR makes its paths relative, so the
# example's objects come from the cache the second time.
command -v ccache >/dev/null &&
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=cmake;-E;env;CCACHE_BASEDIR=${work};CCACHE_NOHASHDIR=1;ccache")
# Built from a copy inside the work directory: every path on its compile lines is then relative to
# CCACHE_BASEDIR, so that a clone in another folder hits the cache too.
cp -r "${root}/examples/custom_trainer" "${work}/src"
cmake -S "${work}/src" -B "${work}/example" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="${work}/prefix" >"${work}/configure.log" ||
  { cat "${work}/configure.log" >&2; exit 1; }
step "build"
cmake --build "${work}/example" >"${work}/build.log" || { cat "${work}/build.log" >&2; exit 1; }

step "run: custom_trainer job.yaml (must gain >= ${MIN_GAIN:-15} points)"
cd "${work}"
extra=()
[[ -n "${EXTRA_SET:-}" ]] && extra=(--set "${EXTRA_SET}")
"${work}/example/custom_trainer" "${root}/examples/custom_trainer/job.yaml" \
  --set job.output_dir="${work}/runs" "${extra[@]}" --min-gain "${MIN_GAIN:-15}"
step "ok"
