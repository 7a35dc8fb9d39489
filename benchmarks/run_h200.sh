#!/usr/bin/env bash
# The H200 run (from the repo root; the device sets $OUT): tests/gpu, then the parity numbers and the kernel
# and model timings, one after another (they share the GPU), each under its own time limit so the whole run
# fits one 10-minute run; every JSON is written as its sections finish.
#   bash benchmarks/run_h200.sh COMMIT        (the device copy of the tree may have no .git: pass the commit)
# TESTS (pytest arguments, default tests/gpu; none: no tests) and BENCH (which benchmarks, default "parity gdn gemm model moe
# attention"; add trainer and generator, or set WITH_TRAINER / WITH_GENERATOR) select a smaller run; ARGS_<name>
# adds arguments to one benchmark (ARGS_trainer="--models qwen3_5_mid --reps 2"), LIMIT_<name> sets its time limit.
# Writes to $OUT: log.txt, pytest_gpu.txt, parity_presets.json, parity_sweep.json, gdn.json, gemm.json,
# model_forward.json, moe.json, h200_trainer.json + .png (WITH_TRAINER=1: benchmarks/trainer.py, over 4 minutes:
# qwen3_5_mid alone took 220 s), h200_generator.json + .png (the generator's decode vs its memory floor: benchmarks/generator.py,
# ~5 minutes alone: run it on its own when the rest takes the 10 minutes).
set -o pipefail
OUT="${OUT:-results/gpu/latest}"
COMMIT="${1:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
log="$OUT/log.txt"
{ echo "commit $COMMIT"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } 2>&1 | tee -a "$log"  # appended: runs into one $OUT keep every log

step() {  # step SECONDS NAME COMMAND...: run under a time limit (SIGINT first; the JSON so far is kept)
    local limit=$1 name=$2; shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$log"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$log" | tail -n 3
    echo "== $name rc=$? in $((SECONDS - t0))s" | tee -a "$log"
}

if [ "${TESTS:-}" != none ]; then
    echo "== tests_gpu (limit 240s)" | tee -a "$log"
    t0=$SECONDS
    # shellcheck disable=SC2086
    timeout --signal=INT --kill-after=20 240 python -m pytest -q -rA --durations=15 -p no:cacheprovider \
        ${TESTS:-tests/gpu} > "$OUT/pytest_gpu.txt" 2>&1
    echo "== tests_gpu rc=$? in $((SECONDS - t0))s; summary:" | tee -a "$log"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_gpu.txt" | tail -n 20 | tee -a "$log"
fi
BENCH="${BENCH:-parity gdn gemm model moe attention}"
[ -n "$WITH_TRAINER" ] && BENCH="$BENCH trainer"
[ -n "$WITH_GENERATOR" ] && BENCH="$BENCH generator"
declare -A LIMIT=([parity]=110 [gdn]=60 [gemm]=50 [model]=40 [moe]=90 [attention]=60 [trainer]=300 [generator]=330)
for b in $BENCH; do
    extra="ARGS_$b"  # e.g. ARGS_trainer="--models qwen3_5_mid --reps 2"
    # shellcheck disable=SC2086
    limit="LIMIT_$b"  # e.g. LIMIT_gemm=120 (seconds)
    step "${!limit:-${LIMIT[$b]:-120}}" "$b" python "benchmarks/$b.py" --out "$OUT" --commit "$COMMIT" ${!extra:-}
done
echo "== done in ${SECONDS}s" | tee -a "$log"
