"""The spread of an engine's steps around their typical length, from the decode probes.

The profile's step model is fitted to the engine's typical (median) step; the
simulator draws the rest (sim/jitter.py) from what this module measures. A
decode probe window (calibrate/fit.py) is a run of steps of one batch, all of
the same model cost give or take a few tokens of context, so each of its
inter-token gaps divided by the window's median gap is one step's factor:

* **jitter**: ``sigma`` is the standard deviation of the log factors of the
  ordinary steps, estimated robustly (1.4826 x their median absolute
  deviation), so a few stalls do not inflate it;
* **slow phases**: a step more than ``max(SLOW_RATIO, exp(4 sigma))`` times
  the window's median is slow (four sigmas: one ordinary step in 30,000 is
  above it); consecutive slow steps of a window are one phase. Their rate is
  phases per second of the windows' time outside phases, their mean length
  the slow time per phase, their factor the slow time over what the same
  steps would have taken at the median (the time they really cost).

Each window is read as one stream of the engine's steps, from all its requests
together (calibrate/fit.py ``engine_steps``: all of a window's requests see the
same engine steps, so reading them separately would count every phase several
times, and one request alone misses the steps whose token streamed no text,
which read as 2x steps: issue 28, docs/fidelity.md). What windows of a
few tenths of a second cannot show: phases longer than a window (they move the
window's median instead) and phases between the windows; docs/fidelity.md says so.
On vLLM's CPU build the slow phases are the frontend's turns (API server, engine-core
process) on the worker's core: with the frontend on another core the probes show 0-3.5
per second instead of 15-58 (docs/fidelity-runs.md, 2026-12-02 22:08).

**Drift** is what moves the windows' medians: the engine's speed over seconds
to minutes (on vLLM's CPU build base steps of 3.1-3.7 ms, once 6.1 ms, between
calibrations minutes apart). Windows that repeat one probe (a decode group's
``--repeats``, and the reference probe sent all through the calibration) have
the same model step, so the differences of their log median steps are the
engine's drift between their times, plus each median's own sampling noise,
which the window's steps say: pi/2 x (its steps' robust log sd)^2 / its steps.
Over the pairs of windows of each group, with lag d between them, the
squared difference of the log medians is on average

    2 drift_sigma^2 (1 - exp(-d / drift_period_s)) + the two windows' noise

for a log speed that is an Ornstein-Uhlenbeck process (what sim/jitter.py
draws); :func:`drift` averages the pairs' excess over their noise in
log-spaced lag bins (most pairs are far apart, where the curve is flat; the
few close ones tell the period) and fits ``drift_sigma`` (least squares over
the bins, closed form for each period) and ``drift_period_s`` (a grid from a
tenth of the shortest lag to the longest: a period longer than the
calibration cannot be told from one as long with a smaller sigma; the
table's ``drift_span_s`` says how long the calibration looked). No
assumption of the step model enters: only repeats of one probe are compared.
One calibration is one path of the drift: its estimate scatters (tests:
about 20% on sigma, 2-4x on the period over 200 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence, TypedDict

import numpy as np

#: a step this many times its window's median (or 4 sigma, whichever is more) is slow
SLOW_RATIO = 1.5
#: fewest steps a window needs to count (its median must mean something)
MIN_STEPS = 8
#: fewest pairs of repeated windows a drift estimate needs
MIN_DRIFT_PAIRS = 6
#: drift periods tried between a tenth of the shortest lag and the longest (log-spaced)
DRIFT_GRID = 97
#: log-spaced lag bins of the pairs (each bin's mean is one point of the fit)
DRIFT_BINS = 12


@dataclass(frozen=True)
class DriftSample:
    """One decode window's typical step at one time (see the module docstring)."""

    group: str          # the probe it repeats: windows of one group have the same model step
    at_s: float         # when, on the calibration's clock (the window's middle)
    log_step: float     # log of the window's median inter-token gap
    noise_var: float    # the sampling variance of ``log_step``, from the window's own steps


def drift_sample(group: str, at_s: float, gaps: np.ndarray) -> DriftSample | None:
    """A window's drift sample; None when it is too short or has no positive median."""
    if gaps.size < MIN_STEPS or not np.median(gaps) > 0:
        return None
    logs = np.log(np.maximum(gaps, 1e-9))
    med = float(np.median(logs))
    s = 1.4826 * float(np.median(np.abs(logs - med)))
    return DriftSample(group, at_s, math.log(float(np.median(gaps))), math.pi / 2 * s * s / gaps.size)


class Drift(TypedDict):
    """The drift's part of the ``jitter`` table (sim/jitter.py reads the first two)."""

    drift_sigma: float
    drift_period_s: float
    drift_windows: int
    drift_pairs: int
    drift_span_s: float


def drift(samples: Sequence[DriftSample]) -> Drift:
    """The engine's speed drift from repeated windows (see the module docstring); zeros when fewer
    than MIN_DRIFT_PAIRS pairs repeat a probe or the pairs differ by no more than their noise."""
    groups: dict[str, list[DriftSample]] = {}
    for x in samples:
        groups.setdefault(x.group, []).append(x)
    pairs = [(abs(a.at_s - b.at_s), (a.log_step - b.log_step) ** 2 - a.noise_var - b.noise_var)
             for g in groups.values() for a, b in combinations(g, 2)]
    lags = np.array([p[0] for p in pairs])
    excess = np.array([p[1] for p in pairs])
    used = sum(len(g) for g in groups.values() if len(g) > 1)
    none: Drift = {"drift_sigma": 0.0, "drift_period_s": 0.0, "drift_windows": used, "drift_pairs": len(pairs),
                   "drift_span_s": round(float(lags.max()), 2) if pairs else 0.0}
    if len(pairs) < MIN_DRIFT_PAIRS or not np.any(lags > 0):
        return none
    # the pairs' mean excess in log-spaced lag bins, each bin one point of equal weight: most pairs
    # are far apart, where the curve is flat; the short lags, few, are what tell the period
    shortest, longest = float(lags[lags > 0].min()), float(lags.max())
    edges = np.geomspace(shortest, longest * (1 + 1e-9), DRIFT_BINS + 1)
    which = np.clip(np.searchsorted(edges, lags, side="right") - 1, 0, DRIFT_BINS - 1)
    filled = np.bincount(which, minlength=DRIFT_BINS) > 0
    lag_bin = (np.bincount(which, lags, DRIFT_BINS)[filled] / np.bincount(which, minlength=DRIFT_BINS)[filled])
    excess_bin = (np.bincount(which, excess, DRIFT_BINS)[filled] / np.bincount(which, minlength=DRIFT_BINS)[filled])
    best = (math.inf, 0.0, 0.0)
    for period in np.geomspace(0.1 * shortest, longest, DRIFT_GRID):
        g = 2.0 * -np.expm1(-lag_bin / period)
        var = max(0.0, float(g @ excess_bin) / float(g @ g))
        sse = float(np.sum((excess_bin - var * g) ** 2))
        if sse < best[0]:
            best = (sse, var, float(period))
    _, var, period = best
    if not var > 0:
        return none
    return {**none, "drift_sigma": round(math.sqrt(var), 4), "drift_period_s": round(period, 3)}


class Steps(TypedDict):
    """The per-step part of the ``jitter`` table (sim/jitter.py reads the first four) and the counts it
    rests on."""

    sigma: float
    slow_rate_hz: float
    slow_mean_s: float
    slow_factor: float
    steps: int
    windows: int
    slow_phases: int


class Jitter(Steps, Drift):
    """The profile's ``jitter`` table: the steps' spread and the engine's drift."""


def dispersion(windows: Sequence[np.ndarray], samples: Sequence[DriftSample] = ()) -> Jitter:
    """The profile's ``jitter`` table from decode windows' inter-token gaps (seconds, in order)
    and the drift samples of repeated windows, with the counts it rests on (see the module
    docstring)."""
    return {**steps(windows), **drift(samples)}


def steps(windows: Sequence[np.ndarray]) -> Steps:
    """The per-step part of the ``jitter`` table (see the module docstring)."""
    ratios = [w / np.median(w) for w in windows if w.size >= MIN_STEPS and np.median(w) > 0]
    if not ratios:
        return {"sigma": 0.0, "slow_rate_hz": 0.0, "slow_mean_s": 0.0, "slow_factor": 1.0, "steps": 0,
                "windows": 0, "slow_phases": 0}
    logs = np.log(np.maximum(np.concatenate(ratios), 1e-9))
    med = float(np.median(logs))
    sigma = 1.4826 * float(np.median(np.abs(logs - med)))
    cut = max(SLOW_RATIO, math.exp(4 * sigma))
    phases, slow_s, slow_base_s, normal_s = 0, 0.0, 0.0, 0.0
    for w, r in zip((w for w in windows if w.size >= MIN_STEPS and np.median(w) > 0), ratios):
        slow = r > cut
        phases += int(np.count_nonzero(slow[1:] & ~slow[:-1]) + slow[0])
        slow_s += float(w[slow].sum())
        slow_base_s += float(np.median(w)) * int(slow.sum())
        normal_s += float(w[~slow].sum())
    return {"sigma": round(sigma, 4),
            "slow_rate_hz": round(phases / normal_s, 4) if normal_s > 0 else 0.0,
            "slow_mean_s": round(slow_s / phases, 6) if phases else 0.0,
            "slow_factor": round(slow_s / slow_base_s, 3) if phases else 1.0,
            "steps": int(sum(r.size for r in ratios)), "windows": len(ratios), "slow_phases": phases}
