#!/bin/sh
# Install llmlb-bench with its test extra into ./.venv and run the whole test suite.
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/python -m pytest "$@"
