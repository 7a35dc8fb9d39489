#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels that a GPU machine without one needs to run the
# jobs: the project's runtime packages that the H200 image (Python 3.12, torch 2.11, CUDA 13) does not hold,
# each pinned to the version CI tests here. Installed there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site DIR/*.whl
# and PYTHONPATH=/tmp/site:src (--no-deps: the image's own numpy, torch, transformers, ... stay as they are).
#   bash scripts/gpu_wheels.sh [DIR=.whl]            # the base set (~28 MB)
#   bash scripts/gpu_wheels.sh DIR --ray RAYDIR      # and Ray for rl.backend=ray, slimmed (below), into RAYDIR
#   bash scripts/gpu_wheels.sh DIR --debs DEBDIR     # and bubblewrap's Debian package (the terminal agent's
#                                                    # sandbox), unpacked there with dpkg -x (README "GPU")
set -euo pipefail
DIR="${1:-.whl}"
RAYDIR="" DEBDIR=""
case "${2:-}" in
    --ray) RAYDIR="${3:?--ray needs a folder}" ;;
    --debs) DEBDIR="${3:?--debs needs a folder}" ;;
    "") ;;
    *) echo "gpu_wheels.sh: unknown option ${2}: --ray DIR | --debs DIR" >&2; exit 2 ;;
esac

download() {  # download DEST NAME==VERSION...: py3.12 manylinux x86-64 binaries, or pure-Python wheels
    local dest="$1"; shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest" "$@"
}

mkdir -p "$DIR"
download "$DIR" \
    hydra-core==1.3.8 omegaconf==2.3.1 \
    wandb==0.31.0 platformdirs==4.14.9 cwevals==0.0.1b1 distro==1.9.0 sniffio==1.3.1 \
    opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
    opentelemetry-proto==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
    opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-http-transport==0.66b2 \
    opentelemetry-exporter-otlp-common==0.66b2 googleapis-common-protos==1.76.0 \
    pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
    datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 \
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
    bm25s==0.3.16 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 \
    py-spy==0.4.3  # the profiler of results/agent_h200 (a static binary: /tmp/site/bin/py-spy there)
# hydra 1.3 needs antlr4 4.9.3, published as a source archive only (pure Python): built into a wheel here
python3 -m pip wheel -q --no-deps --no-binary=:all: -w "$DIR" antlr4-python3-runtime==4.9.3
echo "$DIR: $(ls "$DIR" | wc -l) wheels, $(du -sh "$DIR" | cut -f1)"

if [ -n "$RAYDIR" ]; then
    # Ray's wheel (~79 MB) is over what one transfer to the GPU machine may carry. Its Java worker jar (32 MB),
    # the dashboard's web client and the libraries the project does not import (rllib, tune, serve, train,
    # data, llm) are not needed by Python actors on a local cluster: scripts/slim_wheel.py drops them.
    mkdir -p "$RAYDIR"
    tmp="$(mktemp -d)"
    download "$tmp" ray==2.60.0
    python3 "$(dirname "$0")/slim_wheel.py" "$tmp"/ray-2.60.0-*.whl "$RAYDIR" \
        ray/jars/ ray/dashboard/client/ ray/rllib/ ray/tune/ ray/serve/ ray/train/ ray/data/ ray/llm/
    rm -rf "$tmp"
    download "$RAYDIR" jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
    echo "$RAYDIR: $(ls "$RAYDIR" | wc -l) wheels, $(du -sh "$RAYDIR" | cut -f1)"
fi

if [ -n "$DEBDIR" ]; then
    # bwrap alone: its dependencies (libc6, libcap2, libselinux1) are in every Debian / Ubuntu base image
    mkdir -p "$DEBDIR"
    (cd "$DEBDIR" && apt-get download bubblewrap)
    echo "$DEBDIR: $(ls "$DEBDIR")"
fi
