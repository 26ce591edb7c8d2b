#!/bin/sh
# Install llmlb-bench into ./.venv and compare two routing policies on the built-in simulator.
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
# Multi-turn chat over shared system prompts, where the choice of router matters: round robin
# scatters each prompt family over all replicas, cache_aware keeps it where its prefix is cached.
# Nothing exceeds the model's length (prompts <= 2,000 + 1,500 tokens, outputs <= 1,024, context <= 8,192).
# The first line of the report is the decision: cache_aware vs round_robin, by how much, beyond noise or not.
.venv/bin/llmlb run workloads/shared-prefix.toml -p round_robin -p cache_aware "$@"
