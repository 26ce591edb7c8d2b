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

Each window is read from one request (all of a window's requests see the same
engine steps, so more would count every phase several times). What windows of a
few tenths of a second cannot show: phases longer than a window (they move the
window's median instead) and phases between the windows; docs/fidelity.md says so.
"""

from __future__ import annotations

import math
from typing import Sequence, TypedDict

import numpy as np

#: a step this many times its window's median (or 4 sigma, whichever is more) is slow
SLOW_RATIO = 1.5
#: fewest steps a window needs to count (its median must mean something)
MIN_STEPS = 8


class Jitter(TypedDict):
    """The profile's ``jitter`` table (sim/jitter.py reads the first four) and the counts it rests on."""

    sigma: float
    slow_rate_hz: float
    slow_mean_s: float
    slow_factor: float
    steps: int
    windows: int
    slow_phases: int


def dispersion(windows: Sequence[np.ndarray]) -> Jitter:
    """The profile's ``jitter`` table from decode windows' inter-token gaps (seconds, in order),
    with the counts it rests on (see the module docstring)."""
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
