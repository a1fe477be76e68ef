#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ (GYRE_FUZZ=ON, Debian's clang, with AddressSanitizer and
# UBSan), collects their seed corpora and runs every target for a fixed time
# (docs/reliability.md).
#
#   tools/fuzz.sh                       every target for 10 s (what CI runs)
#   tools/fuzz.sh 600                   every target for 10 minutes (the long run)
#   tools/fuzz.sh 600 fuzz_jsonl ...    only the named targets
#
# Environment: GYRE_FUZZ_BUILD_DIR (default build-fuzz), GYRE_JOBS (build jobs, default: cores),
# GYRE_FUZZ_NICE (nice level of the fuzzers, default 10), GYRE_FUZZ_PARALLEL (targets run at
# once, default: cores; each uses one), GYRE_FUZZ_SEED (libFuzzer's -seed; default 0, a new
# random seed each run; CI uses 1 so its short run is repeatable), GYRE_BIN (a built `gyre`, default
# build/bin/gyre: when present, a 2-step job's checkpoint files join the seeds), GYRE_VENV.
#
# Everything goes under $GYRE_FUZZ_BUILD_DIR/fuzz-out/: seeds/<target>/ (made afresh each run),
# corpus/<target>/ (what the fuzzer found; kept between runs, so long runs build on each other),
# crashes/<target>/ (crash-*, leak-*, timeout-*, oom-* reproducers), logs/<target>.log and
# summary.tsv. Exit status 1 when a target crashed: rerun the reproducer with
#   $GYRE_FUZZ_BUILD_DIR/fuzz/<target> <crash file>
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-10}"
shift || true
BUILD_DIR="${GYRE_FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${GYRE_JOBS:-$(nproc)}"
NICE="${GYRE_FUZZ_NICE:-10}"
PARALLEL="${GYRE_FUZZ_PARALLEL:-$(nproc)}"
SEED="${GYRE_FUZZ_SEED:-0}"
VENV="${GYRE_VENV:-${HOME}/.cache/gyre/venv}"
GYRE_BIN="${GYRE_BIN:-build/bin/gyre}"
OUT="${BUILD_DIR}/fuzz-out"

log() { printf '[fuzz] %s\n' "$*" >&2; }

# --- build -------------------------------------------------------------------------------------
t0=$(date +%s)
bash tools/install-deps.sh
if [[ ! -f "${BUILD_DIR}/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S . -B "${BUILD_DIR}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGYRE_FUZZ=ON -DGYRE_BUILD_TESTS=OFF -DGYRE_WITH_CUDA=OFF >/dev/null
fi
cmake --build "${BUILD_DIR}" -j "${JOBS}" --target gyre_fuzz_all
log "built in $(($(date +%s) - t0)) s"

mapfile -t ALL < "${BUILD_DIR}/fuzz/targets.txt"
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")

# --- seeds -------------------------------------------------------------------------------------
t1=$(date +%s)
SEEDS="${OUT}/seeds"
rm -rf "${SEEDS}"
"${BUILD_DIR}/fuzz/make_seeds" "${SEEDS}" >/dev/null
cp configs/*.yaml "${SEEDS}/job_config/"
SHARED="../shared/data/tokenizers"
mkdir -p "${SEEDS}/tokenizer_json"
if [[ -d "${SHARED}" ]]; then
  python3 tools/fuzz_tokenizer_seeds.py --shared "${SHARED}" --out "${SEEDS}/tokenizer_json"
else
  log "no ${SHARED}: tokenizer seeds without the real Qwen files"
fi
# Small trained tokenizers (Qwen2-, Llama-3- and GPT-2-style), made with HF `tokenizers` by the
# tokenizer tests' reference script, when the venv has it.
if "${VENV}/bin/python" -c "import tokenizers" 2>/dev/null; then
  tmp=$(mktemp -d)
  "${VENV}/bin/python" tests/unit/tokenizer/hf_reference.py --out "${tmp}" >/dev/null 2>&1 &&
    cp "${tmp}"/*_style*.json "${SEEDS}/tokenizer_json/" || log "hf_reference.py failed; skipped"
  rm -rf "${tmp}"
fi
# A real 2-step job's checkpoint files (small ones only; the weights are the model's size).
if [[ -x "${GYRE_BIN}" ]]; then
  run=$(mktemp -d)
  if "${GYRE_BIN}" train configs/quickstart.yaml --quiet --set job.output_dir="${run}" \
      --set trainer.steps=2 --set trainer.checkpoint_every=1 --set trainer.warmup_sft_steps=1 \
      --set data.eval_size=8 --set rollout.prompts_per_step=4 --set rollout.workers=1 \
      --set rollout.partial_rollouts=true --set algorithm.max_staleness=1 >/dev/null 2>&1; then
    ck="${run}/quickstart/checkpoints/step-000002"
    cp "${ck}/controller.json" "${SEEDS}/controller_state/run_controller.json"
    cp "${ck}/trainer/trainer_state.json" "${SEEDS}/trainer_state/run_trainer_state.json"
    cp "${ck}/config.yaml" "${SEEDS}/job_config/run_config.yaml"
    cp "${run}/quickstart/metrics.jsonl" "${SEEDS}/jsonl/run_metrics.jsonl"
    { head -c 16 /dev/zero; cat "${ck}/carried_groups.pb"; } > "${SEEDS}/carried_groups/run"
  else
    log "the seed job with ${GYRE_BIN} failed; its checkpoint seeds are skipped"
  fi
  rm -rf "${run}"
fi
log "seeds in $(($(date +%s) - t1)) s: $(find "${SEEDS}" -type f | wc -l) files"

# --- run ---------------------------------------------------------------------------------------
mkdir -p "${OUT}/logs" "${OUT}/rows"
SUMMARY="${OUT}/summary.tsv"
final_stat() { sed -n "s/^stat::$2: *//p" "$1" | tail -1; }

# run_target T: fuzzes T for SECONDS_PER_TARGET and writes its summary row to rows/T.tsv.
run_target() {
  local t="$1" name="${1#fuzz_}"
  local corpus="${OUT}/corpus/${name}" crashes="${OUT}/crashes/${name}"
  local logf="${OUT}/logs/${name}.log" rc=0 started wall last cov ft found result
  mkdir -p "${corpus}" "${crashes}" "${SEEDS}/${name}"
  started=$(date +%s)
  # The hard limit covers a hang that libFuzzer's own -timeout cannot interrupt (its alarm does
  # not fire while LeakSanitizer has the process stopped). One thread for libtorch's intra-op
  # pool: the models are tiny, and a fuzzer should use one core.
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    timeout -s KILL $((SECONDS_PER_TARGET + 120)) nice -n "${NICE}" "${BUILD_DIR}/fuzz/${t}" \
    -max_total_time="${SECONDS_PER_TARGET}" -timeout=25 -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -print_final_stats=1 -seed="${SEED}" -artifact_prefix="${crashes}/" \
    "${corpus}" "${SEEDS}/${name}" >"${logf}" 2>&1 || rc=$?
  wall=$(($(date +%s) - started))
  last=$(grep -E '^#[0-9]+.*cov: ' "${logf}" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"${last}")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"${last}")
  found=$(find "${crashes}" -type f | wc -l)
  result=ok
  if ((rc != 0 || found > 0)); then
    result="FAILED (exit ${rc}, ${found} reproducers in ${crashes})"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${t}" "${wall}" \
    "$(final_stat "${logf}" number_of_executed_units)" \
    "$(final_stat "${logf}" average_exec_per_sec)" "${cov}" "${ft}" \
    "$(find "${corpus}" -type f | wc -l)" "$(final_stat "${logf}" peak_rss_mb)" "${result}" \
    > "${OUT}/rows/${t}.tsv"
  log "${t}: ${result} ($(final_stat "${logf}" number_of_executed_units) execs, cov ${cov})"
  if [[ "${result}" != ok ]]; then
    grep -E 'ERROR|SUMMARY|GYRE_CHECK' "${logf}" | head -5 >&2 || true
  fi
}

log "running ${#TARGETS[@]} targets for ${SECONDS_PER_TARGET} s each, ${PARALLEL} at a time"
rm -f "${OUT}"/rows/*.tsv
running=0
for t in "${TARGETS[@]}"; do
  run_target "${t}" &
  running=$((running + 1))
  if ((running >= PARALLEL)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
printf 'target\twall_s\texecs\texecs_per_s\tcov\tft\tcorpus\tpeak_rss_mb\tresult\n' > "${SUMMARY}"
failed=0
for t in "${TARGETS[@]}"; do
  if [[ -f "${OUT}/rows/${t}.tsv" ]]; then
    cat "${OUT}/rows/${t}.tsv" >> "${SUMMARY}"
    grep -q $'\tok$' "${OUT}/rows/${t}.tsv" || failed=1
  else
    printf '%s\t-\t-\t-\t-\t-\t-\t-\tFAILED (no result)\n' "${t}" >> "${SUMMARY}"
    failed=1
  fi
done
if command -v column >/dev/null; then column -t -s $'\t' "${SUMMARY}" >&2; else cat "${SUMMARY}" >&2; fi
log "total $(($(date +%s) - t0)) s"
exit "${failed}"
