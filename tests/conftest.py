"""Shared fixtures: small hand-built traces and result runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from llmlb_bench.schema import TRACE

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def make_trace(n: int = 10, rate: float = 2.0, input_tokens: int = 100, output_tokens: int = 20) -> pa.Table:
    """A tiny deterministic trace: evenly spaced arrivals, fixed lengths."""
    return TRACE.conform(pa.table({
        "request_id": pa.array(range(n), pa.int64()),
        "arrival_s": pa.array([i / rate for i in range(n)], pa.float64()),
        "input_tokens": pa.array([input_tokens] * n, pa.int32()),
        "output_tokens": pa.array([output_tokens] * n, pa.int32()),
    }), "test")


def _ctrl_c_at_its_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: Popen keywords for a child a test sends Ctrl-C (SIGINT) to: SIGINT at its default, as under a terminal.
#: A test suite run in the background of a non-interactive shell (a CI script's ``cmd &``, ``nohup``) hands its
#: children SIGINT *ignored*, and a command started so rightly stays deaf to Ctrl-C: it finished with exit 0
#: where the test expected 130, on a machine whose CI script ran the suite that way.
CTRL_C = {"preexec_fn": _ctrl_c_at_its_default}


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr), the code 0 when it returns normally."""
    from llmlb_bench.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent (real public traces are only on the team's machines)")
    return SHARED_DATA


#: Units of work of more than one module, under pytest-xdist (scripts/test.sh runs ``-n 2 --dist
#: loadfile``): the modules of a unit run one after another on one worker, while the other worker runs
#: the rest. Every other module is a unit of its own, so a module-scoped engine, fleet or server starts
#: once. tests/test_xdist_units.py checks that every module starting vLLM or Ray is in its unit.
SHARED_UNITS = {
    # a vLLM replica takes about 4 GB and its start-up one core for half a minute: no two fleets at once
    # (test_validate_transformers starts transformers serve from the same virtualenv, about 1 GB)
    "vllm fleets": frozenset({
        "test_calibrate_vllm", "test_engines", "test_learned_vllm", "test_lora_vllm", "test_reasoning_vllm",
        "test_replay_spec_vllm", "test_replay_vllm", "test_validate_transformers", "test_validate_vllm",
    }),
    # a Ray cluster is several processes and an object store; test_crash_signals needs none to be up
    # (its ``--address auto`` found the cluster test_replay_ray had started on the other worker)
    "ray clusters": frozenset({
        "test_env_rllib", "test_replay_multihost", "test_replay_ray", "test_sweep_executors", "test_crash_signals",
    }),
}


def xdist_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: the name of its module's SHARED_UNITS entry, else its module."""
    path = nodeid.split("::", 1)[0]
    return next((unit for unit, modules in SHARED_UNITS.items() if Path(path).stem in modules), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` with the units of :func:`xdist_unit`; other ``--dist`` modes are xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedUnits(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            # the shared units first, the vLLM fleets' (the longest, 7-8 min on a quiet machine) first of
            # all: started late, a long unit would leave one worker running it alone at the end
            for unit in reversed(SHARED_UNITS):
                if unit in self.workqueue:
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

    return SharedUnits(config, log)


#: Modules whose tests time a real-time server (``llmlb serve``, or a real vLLM) against what the
#: simulator or a profile predicts. With ``--phase parallel`` they are left out, with ``--phase solo``
#: only they run: scripts/test.sh runs them alone after the parallel part, so that no other test's CPU
#: delays the server they time (three of them failed when run beside other tests on a machine at a
#: load average of 15-18; alone they are held to what they were measured at, load 7-10).
SOLO_MODULES = frozenset({
    "test_calibrate_serve", "test_calibrate_dispersion", "test_serve_replay", "test_capacity_endpoint",
    "test_validate",
})


#: the terminal size variables: an xdist worker is started with COLUMNS=80 and LINES=24 in its
#: environment whatever the run's own environment holds, and the CLI lays stdout out at COLUMNS
#: (llmlb_bench/console.py), so tests that check a report survives a pipe (COLUMNS unset: 160
#: columns) saw 80-column tables under ``-n 2`` only
TERMINAL_SIZE = ("COLUMNS", "LINES")


def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker which terminal size variables the run itself has."""
    node.workerinput["terminal_size"] = {name: os.environ.get(name) for name in TERMINAL_SIZE}


def pytest_configure(config: pytest.Config) -> None:
    """xdist worker: the terminal size variables as the run has them, not as the worker got them."""
    given = getattr(config, "workerinput", {}).get("terminal_size")
    if given is None:
        return
    for name, value in given.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--phase", choices=("parallel", "solo"), default=None,
                     help="parallel: every test but the timing ones of tests/conftest.py's SOLO_MODULES; "
                          "solo: only those (scripts/test.sh runs one, then the other)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = config.getoption("phase")
    if phase is None:
        return
    keep, dropped = [], []
    for item in items:
        solo = Path(item.nodeid.split("::", 1)[0]).stem in SOLO_MODULES
        (keep if solo == (phase == "solo") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
