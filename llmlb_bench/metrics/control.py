"""Control metrics: how a run's controlled signals answer a load step or a square-wave burst.

A closed loop is judged in time, by its response to a step (Ogata, *Modern Control Engineering*,
5th ed., §5-3; the definitions follow MATLAB's ``stepinfo``, relative to the size of the change).
For a run whose workload spec has a load step (``modulation = { shape = "step" }``) or a square
wave (``shape = "square"``: each edge is a step), three signals are read on a time grid:

* ``ttft``: the ``quantile`` of the TTFT (from the latency origin, metrics/origin.py) of the ok
  requests arriving in each bin of ``bin_s`` seconds (by ``scheduled_s``);
* ``queue``: the requests waiting at the engines, summed over targets, averaged over the series
  samples of each bin;
* ``replicas``: the targets sampled (in service), averaged the same way (only when it changes:
  autoscaling).

For each edge at t0, the response is the signal on [t0, next edge or the last arrival), its
*initial* value the mean over the window before t0 (as long, at most), its *final* value the mean
over the last quarter of the response. With change = final - initial and band = ``threshold`` x
|change| (the final value itself when nothing changed):

* **settling time**: from t0 to the first sample after the last one outside final ± band; when
  the last sample is still outside, or the last quarter still drifts (the mean of its second half
  differs from that of its first by more than the band: a ramp, such as the queue of an overloaded
  open loop), it never settled: ``settled`` is false and the settling time is the response's
  length (a lower bound, so a gate rule on it fails);
* **overshoot**: the largest excursion past the final value in the direction of the change,
  / |change| (0 when it never passes it);
* **steady-state error**: (final - reference) / reference, reference = the SLO's TTFT limit (TTFT
  only; a controller aiming below the SLO shows a negative error);
* **oscillation**: the error's sign changes from above the band to below it or back (a
  hysteresis count: noise inside the band does not count), and the spectral peak: the frequency
  of the strongest non-zero bin of the response's deviation from its final value and its share of
  that deviation's energy (a limit cycle puts most energy in one bin).

The run's figures are the worst over edges (longest settling, largest overshoot; settled only if
every edge settled), the last
edge's steady-state error, the sign changes summed, the spectrum over everything from the first
edge. ``tests/test_metrics_control.py`` checks each definition on synthetic signals whose values
are known exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from llmlb_bench.metrics.meta import table
from llmlb_bench.metrics.run_figures import (ControlFigures, ControlSignals, Signal, SignalResponse, SpectralPeak,
                                              StepResponse)
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import quote
from llmlb_bench.store.views import Catalog

SIGNALS: tuple[Signal, ...] = ("ttft", "queue", "replicas")
#: what each figure is called in the summary, the report and gate rules (``settling_ttft`` ...)
FIGURES = ("settling_s", "overshoot", "steady_state_error", "sign_changes", "spectral_peak_hz",
           "spectral_peak_share")


@dataclass(frozen=True)
class Options:
    bin_s: float = 5.0          # TTFT percentile bins
    quantile: float = 0.9       # which TTFT percentile
    threshold: float = 0.1      # settling band, a fraction of the change


def _number(value: object) -> float:
    """A number of a stored workload spec (written by the tool: a TOML number)."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"a workload spec holds {value!r} where a number goes")


def edges(spec: Mapping[str, object] | None) -> list[float]:
    """Times of the load steps of a workload spec (step and square modulations of any tenant),
    sorted, on the trace's clock (``time_scale`` applied); [] when it has none."""
    if not spec:
        return []
    scale = _number(spec.get("time_scale", 1.0) or 1.0)
    horizon = spec.get("duration_s")
    out: set[float] = set()
    for tenant in table(spec, "tenants").values():
        mod = table(table(tenant if isinstance(tenant, Mapping) else {}, "arrival"), "modulation")
        if mod.get("shape") == "step" and mod.get("before") != mod.get("after"):
            out.add(_number(mod["at_s"]))
        elif mod.get("shape") == "square" and mod.get("low") != mod.get("high"):
            period, on, start = _number(mod["period_s"]), _number(mod["duty"]) * _number(mod["period_s"]), _number(
                mod.get("start_s", 0.0))
            end = _number(horizon) if horizon else start + 100 * period
            k = 0
            while start + k * period < end:
                out.add(start + k * period)
                if start + k * period + on < end:
                    out.add(start + k * period + on)
                k += 1
    return sorted(t * scale for t in out)


def step_response(t: np.ndarray, y: np.ndarray, at: float, end: float, *, before: float | None = None,
                  threshold: float = 0.1, reference: float | None = None) -> StepResponse | None:
    """The figures of one step at ``at`` of the signal ``y`` sampled at times ``t`` (sorted), the
    response read on [at, end) and its initial value on [before, at) (default: as long as the
    response); None when either window holds no sample."""
    t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    keep = ~np.isnan(y)
    t, y = t[keep], y[keep]
    start = at - (end - at) if before is None else before
    pre = y[(t >= start) & (t < at)]
    inside = (t >= at) & (t < end)
    ts, ys = t[inside], y[inside]
    if not pre.size or not ys.size:
        return None
    initial = float(pre.mean())
    tail = ys[len(ys) - max(1, len(ys) // 4):]
    final = float(tail.mean())
    change = final - initial
    band = threshold * (abs(change) if change != 0 else abs(final))
    dev = ys - final
    outside = np.flatnonzero(np.abs(dev) > band)
    half = len(tail) // 2
    drift = abs(float(tail[half:].mean() - tail[:half].mean())) if half else 0.0
    settled = (not outside.size or outside[-1] < len(ys) - 1) and drift <= band
    settling = 0.0 if not outside.size else float((ts[outside[-1] + 1] if settled else end) - at)
    direction = 1.0 if change >= 0 else -1.0
    overshoot = max(0.0, float((direction * dev).max())) / abs(change) if change != 0 else None
    return {"at_s": at, "end_s": end, "initial": initial, "final": final, "change": change,
            "settling_s": settling, "settled": bool(settled), "overshoot": overshoot,
            "steady_state_error": (final - reference) / reference if reference else None,
            "sign_changes": sign_changes(dev, band), **spectral_peak(ts, dev)}


def sign_changes(dev: np.ndarray, band: float) -> int:
    """Crossings of the error from above +band to below -band or back (hysteresis: wiggles inside
    the band do not count)."""
    count, side = 0, 0
    for d in dev:
        s = 1 if d > band else (-1 if d < -band else 0)
        if s and side and s != side:
            count += 1
        if s:
            side = s
    return count


def spectral_peak(t: np.ndarray, dev: np.ndarray) -> SpectralPeak:
    """The strongest non-zero frequency of a uniformly sampled deviation and its share of the
    deviation's energy over the non-zero frequencies (the mean is removed first)."""
    if len(dev) < 4:
        return {"spectral_peak_hz": None, "spectral_peak_share": None}
    dt = float(np.median(np.diff(t)))
    power = np.abs(np.fft.rfft(dev - dev.mean())) ** 2
    power = power[1:]
    total = float(power.sum())
    if not total > 0 or not dt > 0:
        return {"spectral_peak_hz": None, "spectral_peak_share": None}
    k = int(np.argmax(power))
    return {"spectral_peak_hz": (k + 1) / (len(dev) * dt), "spectral_peak_share": float(power[k]) / total}


def combine(responses: Sequence[StepResponse], spectrum: SpectralPeak) -> SignalResponse:
    """A run's figures from its edges' responses (see the module docstring)."""
    over = [r["overshoot"] for r in responses if r["overshoot"] is not None]
    return {"edges": len(responses),
            "settling_s": max(r["settling_s"] for r in responses),
            "settled": all(r["settled"] for r in responses),
            "overshoot": max(over) if over else None,
            "steady_state_error": responses[-1]["steady_state_error"],
            "sign_changes": sum(r["sign_changes"] for r in responses),
            **spectrum, "responses": list(responses)}


def ttft_sql(run_ids: Sequence[str], bin_s: float, quantile: float) -> str:
    """Per run and bin of arrival time: the TTFT percentile of the ok requests (docs/metrics.md)."""
    ids = ", ".join(quote(r) for r in run_ids)
    return f"""
SELECT run_id, floor(scheduled_s / {bin_s!r}) * {bin_s!r} AS t_s, quantile_cont(ttft_s, {quantile!r}) AS value
FROM request_metrics WHERE status = 'ok' AND run_id IN ({ids}) GROUP BY ALL ORDER BY run_id, t_s
"""


def series_sql(run_ids: Sequence[str], bin_s: float) -> str:
    """Per run and bin: the mean over its series samples of the waiting requests summed over targets,
    and of the targets sampled (docs/metrics.md)."""
    ids = ", ".join(quote(r) for r in run_ids)
    return f"""
WITH s AS (SELECT run_id, t_s, sum(waiting) AS queue, count(DISTINCT target) AS replicas
           FROM series WHERE run_id IN ({ids}) GROUP BY ALL)
SELECT run_id, floor(t_s / {bin_s!r}) * {bin_s!r} AS t_s, avg(queue) AS queue, avg(replicas) AS replicas
FROM s GROUP BY ALL ORDER BY run_id, t_s
"""


def control(cat: Catalog, runs: Mapping[str, Mapping[str, object]], slo: Slo | None,
            options: Options | None = None) -> dict[str, ControlFigures]:
    """run id -> ``{signal: figures}`` for runs with load steps; ``runs`` maps run ids to
    ``{spec (the trace's workload spec), t1 (last scheduled time)}``."""
    opt = options or Options()
    stepped: dict[str, tuple[list[float], float]] = {}
    for run_id, info in runs.items():
        spec, last = info.get("spec"), info.get("t1")
        found = edges(spec if isinstance(spec, Mapping) else None)
        if found and isinstance(last, (int, float)) and found[0] < last:
            stepped[run_id] = (found, float(last))
    if not stepped:
        return {}
    ids = sorted(stepped)
    signals: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for row in cat.rows(ttft_sql(ids, opt.bin_s, opt.quantile)):
        ts, vs = signals.setdefault((row["run_id"], "ttft"), ([], []))
        ts.append(row["t_s"])
        vs.append(math.nan if row["value"] is None else row["value"])
    for row in cat.rows(series_sql(ids, opt.bin_s)):
        for name in ("queue", "replicas"):
            ts, vs = signals.setdefault((row["run_id"], name), ([], []))
            ts.append(row["t_s"])
            vs.append(math.nan if row[name] is None else float(row[name]))
    reference: float | None = slo.limits_for(None).get("ttft") if slo is not None else None
    out: dict[str, ControlFigures] = {}
    for run_id, (steps, t1) in stepped.items():
        figures: ControlSignals = {}
        for name in SIGNALS:
            if (run_id, name) not in signals:
                continue
            ts_, ys_ = signals[(run_id, name)]
            t, y = np.asarray(ts_, dtype=float), np.asarray(ys_, dtype=float)
            if name == "replicas" and np.nanmin(y) == np.nanmax(y):
                continue            # a fixed fleet: nothing to read
            bounds = [s for s in steps if s < t1] + [t1]
            responses: list[StepResponse] = []
            for k in range(len(bounds) - 1):
                before = bounds[k - 1] if k else None
                resp = step_response(t, y, bounds[k], bounds[k + 1], before=before, threshold=opt.threshold,
                                     reference=reference if name == "ttft" else None)
                if resp is not None:
                    responses.append(resp)
            if responses:
                inside = (t >= bounds[0]) & (t < t1) & ~np.isnan(y)
                final = responses[-1]["final"]
                figures[name] = combine(responses, spectral_peak(t[inside], y[inside] - final))
        if figures:
            out[run_id] = {"bin_s": opt.bin_s, "quantile": opt.quantile, "threshold": opt.threshold,
                           "steps": [s for s in steps if s < t1], **figures}
    return out
