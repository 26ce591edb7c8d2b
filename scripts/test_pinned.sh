#!/bin/sh
# The test suite on one busy core: scripts/test.sh pinned to CPU ${LLMLB_PIN_CPU:-0}, with a busy
# loop on that same core for the whole run, so every test and every server it starts gets about half
# of one core. This is how the suite shows it does not depend on the machine's speed (issue 26): a
# test that holds only by a margin of time fails here. Takes about 45 minutes on a 2-core machine
# where the plain run takes 15 (docs/engines.md, "On any machine").
set -eu
cd "$(dirname "$0")/.."
cpu=${LLMLB_PIN_CPU:-0}
command -v taskset >/dev/null || { echo "scripts/test_pinned.sh: needs taskset (util-linux)" >&2; exit 2; }
taskset -c "$cpu" sh -c 'while :; do :; done' &
busy=$!
trap 'kill "$busy" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
taskset -c "$cpu" sh scripts/test.sh "$@"
