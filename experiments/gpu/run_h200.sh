#!/usr/bin/env bash
# The H200 device command (run from the repo root; the device tool sets $OUT):
#   bash experiments/gpu/run_h200.sh [suite args...]
# Writes $OUT/h200_<tag>.json, $OUT/cublaslt.json, $OUT/pytest_gpu.txt and $OUT/log.txt.
set -o pipefail
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tee "$OUT/log.txt"
python3 experiments/gpu/h200_suite.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/log.txt"
