#!/bin/sh
# Install llmlb-bench into ./.venv and run the main job on the built-in simulator.
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
.venv/bin/llmlb run workloads/chat.toml "$@"
