"""Where the frontend's CPU per request lands in the arriving request's own life (``frontend_wait_share``).

``frontend_cpu_s`` (sim/profile.py) is what each arrival's frontend work takes from a busy
engine's steps on a shared core; the interference probe measures how much the BATCH loses per
arrival (calibrate/fit.py). Whether the ARRIVING request waits for that time too is another
question, and it decides its time to first token: charged to the step the request waits behind,
vLLM CPU's TTFT came out +15 to +35% in every fidelity cell; zeroed, -18 to -37%
(docs/fidelity.md). The same probe answers it: its lone arrivals' own times to first token were
measured, under the batch. :func:`wait_share` simulates the probe's runs (its arrival times, each
moved by a random part of a step (:data:`PHASES`), the calibrated profile, the per-step jitter
drawn but no drift, which one short run cannot average)
with the whole term on the arrival's wait (share 1) and with all of it after the arrival's first
token (share 0; the batch pays the same either way, so only where the arrivals wait differs), and
reads the share as (real - after) / (whole - after) of the arrivals' mean time to first token,
clipped to 0-1: where between the two placements the real arrivals' wait lies. (Against the term
zeroed instead, share 0 would read 0.2: the batch's extra steps delay later arrivals too.) The
simulator then charges that share to the step the request waits behind and the rest after the next
first token (sim/replica.py), so the batch still pays the whole term.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.calibrate.probes import ProbeRun
from llmlb_bench.schema import ArrowRow
from llmlb_bench.sim.profile import ProfileDoc

#: simulations of each run, every arrival moved by a random part of a decode step each time: a
#: simulated arrival's wait for the step in progress depends on where in that step it lands, and a
#: probe's evenly spaced arrivals against a steady step land on a few phases only (one simulation
#: read a share of 0.57 off rows made with none); the real ones land anywhere
PHASES = 8
#: the share is read only where the whole term moves the arrivals' mean TTFT by this part of it at least
#: (a term too small to move them leaves nothing to divide)
MIN_EFFECT = 0.25


class WaitShare(TypedDict):
    """The share and what it rests on (the profile's ``fit.frontend_wait``)."""

    share: float | None
    arrivals: int
    ttft_mean_ms: dict[str, float]


def _ttft(rows: Sequence[ArrowRow], ids: set[int]) -> list[float]:
    return [r["first_token_s"] - r["sent_s"] for r in rows
            if r["request_id"] in ids and r["status"] == "ok" and r["first_token_s"] is not None]


def wait_share(runs: Sequence[ProbeRun], profile: ProfileDoc, seed: int = 0) -> WaitShare:
    """The part of ``frontend_cpu_s`` the interference probe's arrivals waited for (module
    docstring); ``share`` None when the probe gave no arrivals or the term is too small to read."""
    from llmlb_bench.policies import make_policy
    from llmlb_bench.sim import ClusterConfig, simulate
    from llmlb_bench.store import RunStore

    loaded = [r for r in runs if r.kind == "interference" and r.params.get("arrivals") and r.trace is not None]
    jitter = profile["jitter"]
    steady: ProfileDoc = {**profile, "jitter": {**jitter, "drift_sigma": 0.0} if jitter is not None else None}
    whole: ProfileDoc = {**steady, "frontend_wait_share": 1.0}
    after: ProfileDoc = {**steady, "frontend_wait_share": 0.0}
    sides = {"whole": whole, "after": after}
    times: dict[str, list[float]] = {"real": [], "whole": [], "after": []}
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="llmlb-frontend-") as tmp:
        for n, run in enumerate(loaded):
            assert run.trace is not None
            b = run.params["batch"]
            came = set(run.trace.column("request_id").to_pylist()[b:])
            times["real"] += _ttft(run.rows, came)
            step = profile["step"]
            decode_s = step["base_s"] + b * (step["per_token_s"] + step["per_sample_s"])
            arrival = run.trace.column("arrival_s").to_numpy()
            for k in range(PHASES):
                # each arrival moved by up to one decode step: its phase in the step it waits behind
                shift = np.concatenate([np.zeros(b), rng.uniform(0.0, decode_s, arrival.size - b)])
                trace = run.trace.set_column(run.trace.schema.get_field_index("arrival_s"), "arrival_s",
                                             pa.array(arrival + shift))
                for side, prof in sides.items():
                    cfg = ClusterConfig.build(replicas=1).with_profile(prof)
                    store = RunStore(Path(tmp), config={"cluster": cfg.to_dict()}, backend="sim",
                                     run_id=f"{side}-{n}-{k}")
                    with store:
                        simulate(trace, cfg, make_policy("round_robin"), store, seed=seed + k)
                    times[side] += _ttft(pq.read_table(store.dir / "requests.parquet").to_pylist(), came)
    mean = {k: float(np.mean(v)) for k, v in times.items() if v}
    out: WaitShare = {"share": None, "arrivals": len(times["real"]),
                      "ttft_mean_ms": {k: round(1e3 * v, 3) for k, v in mean.items()}}
    if len(mean) == 3 and mean["whole"] - mean["after"] >= MIN_EFFECT * profile["frontend_cpu_s"] > 0:
        share = (mean["real"] - mean["after"]) / (mean["whole"] - mean["after"])
        out["share"] = round(min(1.0, max(0.0, share)), 3)
    return out
