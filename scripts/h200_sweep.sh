#!/usr/bin/env bash
# The reproduction sweep on one H200 (from the repo root; the device sets $OUT): install carried wheels if a
# wheel folder is given, record the machine, then scripts/sweep.py with the remaining arguments, the archive
# written to $OUT/sweep.tar.gz and the console to $OUT/log.txt.
#   bash scripts/h200_sweep.sh COMMIT WHEEL_DIR|- SWEEP_ARGS...
# e.g. bash scripts/h200_sweep.sh abc1234 ../.whl --exps math_op4_bi,math_op4_stock --seeds 0,1,2 --steps 100 \
#        --scale small --parallel 9 --deadline 480 --root sweeps/h200
set -o pipefail
OUT="${OUT:-sweeps/out}"
COMMIT="$1"; WHEELS="$2"; shift 2
mkdir -p "$OUT"
log="$OUT/log.txt"
if [ "$WHEELS" != "-" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl 2>&1 | tail -n 3 | tee -a "$log"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true
{ echo "commit $COMMIT"; date -u +%FT%TZ; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee -a "$log"
python3 scripts/sweep.py --commit "$COMMIT" --archive "$OUT/sweep.tar.gz" "$@" 2>&1 | tee -a "$log"
rc=$?
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>&1 | tee -a "$log"
echo "sweep rc=$rc in ${SECONDS}s" | tee -a "$log"
