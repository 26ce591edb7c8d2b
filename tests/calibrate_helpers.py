"""What a calibration must satisfy on any machine, whatever its probes measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmlb_bench.calibrate.fit import DENSE, FRONTEND, UNKNOWNS, Fit
from llmlb_bench.calibrate.probes import ProbeParams, ProbeRun, Prober
from llmlb_bench.replay import ReplayOptions

#: an engine's settings as calibrate reads them, small enough for a plan of a few probes
SETTINGS = {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256, "num_kv_blocks": 1000,
            "max_model_len": 2048}


class RecordingProber(Prober):
    """A Prober that sends nothing: it records the kind of each probe it would send (``sent``) and
    answers with no rows, so a plan's order and counts can be checked without an engine (no decode
    window: an interference pair stops after its control)."""

    def __init__(self) -> None:
        super().__init__("http://unused", None, ReplayOptions(api="completions"), Path("unused"))  # type: ignore[arg-type]
        self.sent: list[str] = []

    def _run(self, kind: str, params: ProbeParams, table: Any, options: Any, block_size: int,
             keep_trace: bool = False) -> ProbeRun:
        self.sent.append(kind)
        return ProbeRun(kind, params, [])


def assert_least_squares_optimum(result: Fit) -> None:
    """The fit minimises the sum of squared relative errors of its kept observations over
    non-negative coefficients (calibrate/fit.py): at that minimum the gradient of each column is zero
    where the coefficient is positive and not negative where it is zero (the Karush-Kuhn-Tucker
    conditions). True on any machine whatever the probes measured; a fit that stopped short, or
    predictions not made with the coefficients reported, fails it. The interference pairs are read after
    the fit, one by one (calibrate/fit.py), and are not among its observations. Where the F-test left
    the dense attention term out, the optimum is the one without its column. ``frontend_cpu_s`` is no
    unknown of the least squares (the pairs give it): a known part of the mixed steps that carry it,
    so its column is in the residual and out of the conditions."""
    kept = [o for o in result.observations if not o.outlier and o.in_fit]
    a = np.array([o.features / o.measured_s for o in kept])
    theta = np.array([result.coefficients[k] for k in UNKNOWNS])
    assert result.dense is not None
    if not result.dense["kept"]:
        assert theta[DENSE] == 0.0
        a[:, DENSE] = 0.0
    residual = a @ theta - 1.0
    assert np.allclose(residual, [o.error for o in kept], rtol=0, atol=1e-9)   # the errors it reports
    free = np.arange(len(UNKNOWNS)) != FRONTEND
    a, theta = a[:, free], theta[free]
    gradient = a.T @ residual
    size = np.linalg.norm(a, axis=0) * np.linalg.norm(residual) + 1e-300
    active = theta > 0
    assert active.any() and np.all(np.abs(gradient[active]) <= 1e-6 * size[active]), (gradient, theta)
    assert np.all(gradient[~active] >= -1e-6 * size[~active]), (gradient, theta)


def server_rows(ended: list, runs: list) -> list:
    """The probe runs as the server made them: each client row replaced by the server's own record
    of the request (its arrival and simulated token times, its prompt and cached tokens), so the
    observations carry no delivery time at all. Probes run one after another, so the server's
    requests, in arrival order and without the unused warm-up probe's, fall into the runs in turn."""
    from llmlb_bench.calibrate.probes import ProbeRun

    served = sorted(ended, key=lambda live: live.seq)
    served = served[len(served) - sum(len(run.rows) for run in runs):]
    out = []
    for run in runs:
        mine, served = served[:len(run.rows)], served[len(run.rows):]
        out.append(ProbeRun(run.kind, run.params, [
            {"status": "ok", "error": None, "sent_s": live.arrival_s, "first_token_s": live.first_token_s,
             "last_token_s": live.last_token_s, "cached_tokens": live.cached_tokens,
             "input_tokens": live.sub.prompt_tokens, "server_input_tokens": live.sub.prompt_tokens,
             "requested_output_tokens": live.sub.max_tokens,
             "token_times": [{"start_s": t, "gap_s": g, "count": c} for t, g, c in live.segments]}
            for live in mine], run.at_s))
    return out
