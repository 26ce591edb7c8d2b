"""Shared fixtures: small hand-built traces and result runs."""

from __future__ import annotations

import signal
from pathlib import Path

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
