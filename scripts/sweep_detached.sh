#!/usr/bin/env bash
# Sweeps that outlive the shell that starts them, for a GPU machine reached through commands of limited
# length (from the repo root; the wheels and PYTHONPATH set up as README "GPU" says):
#   bash scripts/sweep_detached.sh mps                        # CUDA MPS on, if it starts and CUDA works under it
#   bash scripts/sweep_detached.sh mps-off                    # and off again, once no sweep runs
#   bash scripts/sweep_detached.sh start NAME CORES ARGS...   # scripts/sweep.py --freeze ARGS in its own session
#                                                             # (setsid), pinned to CORES (a taskset list, e.g.
#                                                             # 0-8), its console in sweeps/NAME.log
#   bash scripts/sweep_detached.sh wait SECONDS               # until every started sweep exits or SECONDS pass,
#                                                             # printing each run's last step every 60 s
#   bash scripts/sweep_detached.sh pack DEST.tar.gz ROOT...   # what the runs wrote so far, checkpoints left out
# Two sweeps started side by side get disjoint CORES: scripts/sweep.py spreads its runs over the cores it may use.
# --freeze: the runs use the sweep's own copy of run.py, conf/ and src/, because the next command may arrive with
# a fresh copy of the working tree, and a run that opens a file of the tree while it is being replaced fails.
set -uo pipefail
mkdir -p sweeps
cmd="${1:?mps | mps-off | start | wait | pack}"; shift

progress() {
    for log in sweeps/*.log; do
        [ -e "$log" ] || continue
        echo "-- ${log}: $(tail -n 1 "$log")"
    done
    for f in sweeps/*/*/*/metrics.jsonl; do
        [ -e "$f" ] || continue
        step=$(tail -n 1 "$f" | python3 -c "import json,sys; print(json.loads(sys.stdin.read() or '{}').get('step', '?'))" 2>/dev/null)
        printf '%s step %s\n' "${f%/metrics.jsonl}" "$step"
    done | sort | paste - - -
}

case "$cmd" in
mps)
    # Without MPS, processes on one GPU take turns on it; with it, their kernels run side by side. Some
    # container runtimes cannot run it: then it is stopped again and the runs share the GPU in turns.
    # (its default pipe folder, so that every later process finds it without a variable)
    if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d 2>&1 \
        && timeout 90 python3 -c "import torch; x = torch.ones(1024, device='cuda'); assert float(x.sum()) == 1024"; then
        echo "mps: on"
    else
        echo quit | nvidia-cuda-mps-control 2>/dev/null
        echo "mps: off ($(command -v nvidia-cuda-mps-control || echo 'no nvidia-cuda-mps-control'))"
    fi
    ;;
mps-off)
    if pgrep -f "scripts/sweep.py" >/dev/null; then echo "a sweep is running: mps stays on" >&2; exit 1; fi
    echo quit | nvidia-cuda-mps-control 2>/dev/null && echo "mps: off" || echo "mps: was not running"
    ;;
start)
    name="${1:?NAME}"; cores="${2:?CORES}"; shift 2
    setsid nohup taskset -c "$cores" python3 scripts/sweep.py --freeze "$@" >"sweeps/$name.log" 2>&1 </dev/null &
    echo "started $name (pid $!) on cores $cores"
    ;;
wait)
    end=$((SECONDS + ${1:?SECONDS}))
    next=$SECONDS
    while [ $SECONDS -lt $end ] && pgrep -f "scripts/sweep.py" >/dev/null; do
        if [ $SECONDS -ge $next ]; then progress; next=$((SECONDS + 60)); fi
        sleep 5
    done
    progress
    pgrep -f "scripts/sweep.py" >/dev/null && echo "sweeps still running" || echo "no sweep running"
    ;;
pack)
    dest="${1:?DEST}"; shift
    tar czf "$dest.tmp" --exclude='*.pt' --exclude='*.tmp' --exclude='_code' sweeps/*.log "$@" .cache/sft/*/summary.json 2>/dev/null
    mv "$dest.tmp" "$dest" && echo "packed $dest ($(du -h "$dest" | cut -f1))"
    ;;
*)
    echo "unknown command $cmd: mps | mps-off | start | wait | pack" >&2; exit 2 ;;
esac
