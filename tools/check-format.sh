#!/usr/bin/env bash
# Fails if any C++/CUDA source differs from .clang-format (Google base, 100 columns).
# Skips (exit 0 with a message) when clang-format is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format not installed; skipped"
  exit 0
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || true)
if ((${#files[@]} == 0)); then
  mapfile -t files < <(find include src kernels tests -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
fi
clang-format --dry-run -Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
