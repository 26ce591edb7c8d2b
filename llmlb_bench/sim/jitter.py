"""Step-time jitter: a measured engine's steps are not all the same length.

A profile's step model (:mod:`llmlb_bench.sim.profile`) gives the engine's
TYPICAL (median) step for a batch. A real engine's steps scatter around it:
every step a little (timer and scheduler noise, cache effects, the client's
reads), and now and then a run of much slower steps (a garbage-collection
pause, a neighbour taking the core, a compile). Without this the simulator
sees only the typical step: its inter-token latencies have no tail and its
mean step is too short by exactly the slow steps' share. ``llmlb calibrate``
measures both parts (calibrate/dispersion.py) into the profile's ``jitter``
table:

* ``sigma``: each step's time is the model's times ``exp(sigma x Z)``, Z a
  standard normal drawn per step (a lognormal factor with median 1, so the
  median step stays the model's);
* ``slow_rate_hz``, ``slow_mean_s``, ``slow_factor``: slow phases start at
  rate ``slow_rate_hz`` per second of time outside them, last an exponential
  time of mean ``slow_mean_s``, and every step that starts inside one is
  ``slow_factor`` times longer (on top of its lognormal factor);
* ``drift_sigma``, ``drift_period_s``: the engine's speed itself wanders, more
  slowly than a step or a slow phase: the log of a factor common to all of a
  replica's steps is an Ornstein-Uhlenbeck process with stationary standard
  deviation ``drift_sigma`` and correlation time ``drift_period_s`` (the
  correlation of the log factor at two times ``d`` apart is
  ``exp(-d / drift_period_s)``), started from its stationary law (a normal
  of mean 0, so the median engine stays the model's). On a CPU replica whose
  frontend shares the model's core this is what makes whole replays of one
  trace differ by 20-40%; a GPU host measures it small (docs/fidelity.md).

The draws are per replica, from a stream of their own derived from the run's
seed and the replica's index (``numpy.random.SeedSequence``), so a run is
reproducible, and turning jitter on or off moves no other random draw (the
engine schedulers', speculative acceptance, failures). A replica with jitter
plans every decode step as its own event (sim/replica.py): a run of equal
steps is exactly what jitter removes. The drift has a stream of its own
besides (same seed and replica, another tag), so a profile without drift, or
with ``drift_sigma`` 0, draws exactly what it drew before the drift existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, TypedDict

import numpy as np

from llmlb_bench.errors import UserError

#: the jitter stream's tag in the seed sequence (keeps it apart from every other stream of the run)
_STREAM = 0x6A697474
#: the drift stream's tag (its own stream: drift on or off moves none of the per-step draws)
_DRIFT_STREAM = 0x64726966
#: normal draws fetched at a time (a NumPy call per step would cost more than the step's bookkeeping)
_BLOCK = 4096
#: the profile's jitter fields
FIELDS = ("sigma", "slow_rate_hz", "slow_mean_s", "slow_factor", "drift_sigma", "drift_period_s")
#: the counts llmlb calibrate measured them on (calibrate/dispersion.py's Jitter; ``drift_span_s`` beside them)
COUNTS: tuple[Literal["steps", "windows", "slow_phases", "drift_windows", "drift_pairs"], ...] = (
    "steps", "windows", "slow_phases", "drift_windows", "drift_pairs")


class _JitterFields(TypedDict):
    sigma: float
    slow_rate_hz: float
    slow_mean_s: float
    slow_factor: float
    drift_sigma: float
    drift_period_s: float


class JitterTable(_JitterFields, total=False):
    """A parsed profile's ``jitter`` table: the fields this module draws from (:data:`FIELDS`) and,
    where ``llmlb calibrate`` wrote them, what it measured them on (carried for the reader; the
    simulator never reads them)."""

    steps: int
    windows: int
    slow_phases: int
    drift_windows: int
    drift_pairs: int
    drift_span_s: float


@dataclass(frozen=True)
class JitterSpec:
    """The profile's ``jitter`` table (see the module docstring)."""

    sigma: float = 0.0
    slow_rate_hz: float = 0.0
    slow_mean_s: float = 0.0
    slow_factor: float = 1.0
    drift_sigma: float = 0.0
    drift_period_s: float = 0.0

    @classmethod
    def from_dict(cls, d: object, where: str = "profile.jitter") -> "JitterSpec":
        if not isinstance(d, Mapping):
            raise UserError("must be a table of sigma, slow_rate_hz, slow_mean_s, slow_factor, drift_sigma and "
                            "drift_period_s", where)
        values: dict[str, float] = {}
        for k in FIELDS:
            v = d.get(k, getattr(cls, k))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UserError(f"must be a number >= 0, got {v!r}", f"{where}.{k}")
            values[k] = float(v)
        if values["slow_factor"] < 1:
            raise UserError(f"a slow phase's steps are longer: must be >= 1, got {values['slow_factor']!r}",
                            f"{where}.slow_factor")
        if values["slow_rate_hz"] > 0 and not values["slow_mean_s"] > 0:
            raise UserError("slow phases need a duration > 0 when slow_rate_hz > 0", f"{where}.slow_mean_s")
        if values["drift_sigma"] > 0 and not values["drift_period_s"] > 0:
            raise UserError("a drift needs a correlation time > 0 when drift_sigma > 0", f"{where}.drift_period_s")
        return cls(**values)

    @property
    def active(self) -> bool:
        """Whether any step is ever other than the model's."""
        return self.sigma > 0 or (self.slow_rate_hz > 0 and self.slow_factor > 1) or self.drift_sigma > 0

    @classmethod
    def of(cls, table: JitterTable) -> "JitterSpec":
        """The spec of a table :meth:`from_dict` checked (a parsed profile's)."""
        return cls(table["sigma"], table["slow_rate_hz"], table["slow_mean_s"], table["slow_factor"],
                   table["drift_sigma"], table["drift_period_s"])

    def to_dict(self) -> JitterTable:
        return {"sigma": self.sigma, "slow_rate_hz": self.slow_rate_hz, "slow_mean_s": self.slow_mean_s,
                "slow_factor": self.slow_factor, "drift_sigma": self.drift_sigma,
                "drift_period_s": self.drift_period_s}


class StepJitter:
    """One replica's jitter draws (see the module docstring)."""

    __slots__ = ("spec", "_rng", "_z", "_k", "_slow_start", "_slow_end", "_drift")

    def __init__(self, spec: JitterSpec, seed: int, replica: int) -> None:
        self.spec = spec
        self._rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_STREAM, seed, replica])))
        self._z: list[float] = []
        self._k = 0
        # the slow phase in view: [start, end); the first starts an exponential time after 0
        self._slow_start = self._slow_end = 0.0
        if spec.slow_rate_hz > 0:
            self._next_phase(0.0)
        self._drift = SpeedDrift(spec.drift_sigma, spec.drift_period_s, seed, replica) if spec.drift_sigma > 0 else None

    def _next_phase(self, after: float) -> None:
        s = self.spec
        self._slow_start = after + float(self._rng.exponential(1.0 / s.slow_rate_hz))
        self._slow_end = self._slow_start + float(self._rng.exponential(s.slow_mean_s))

    def factor(self, t: float) -> float:
        """The factor of the step that starts at ``t`` (non-decreasing from call to call)."""
        s = self.spec
        f = 1.0
        if s.sigma > 0:
            if self._k == len(self._z):
                self._z = self._rng.standard_normal(_BLOCK).tolist()
                self._k = 0
            f = math.exp(s.sigma * self._z[self._k])
            self._k += 1
        if s.slow_rate_hz > 0:
            while t >= self._slow_end:
                self._next_phase(self._slow_end)
            if t >= self._slow_start:
                f *= s.slow_factor
        if self._drift is not None:
            f *= self._drift.factor(t)
        return f


class SpeedDrift:
    """One replica's slowly varying speed factor: ``exp(x(t))``, x an Ornstein-Uhlenbeck process of
    stationary standard deviation ``sigma`` and correlation time ``period_s``, drawn exactly at the
    times asked (x(t + d) = x(t) a + sigma sqrt(1 - a^2) Z with a = exp(-d / period_s): no
    discretisation error, whatever the steps' lengths)."""

    __slots__ = ("sigma", "period_s", "_rng", "_z", "_k", "_x", "_t")

    def __init__(self, sigma: float, period_s: float, seed: int, replica: int) -> None:
        self.sigma, self.period_s = sigma, period_s
        self._rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_DRIFT_STREAM, seed, replica])))
        self._z: list[float] = []
        self._k = 0
        self._x = sigma * self._normal()        # the stationary law at the first time asked
        self._t = 0.0

    def _normal(self) -> float:
        if self._k == len(self._z):
            self._z = self._rng.standard_normal(_BLOCK).tolist()
            self._k = 0
        z = self._z[self._k]
        self._k += 1
        return z

    def log_factor(self, t: float) -> float:
        """x(t), for ``t`` not earlier than the last time asked (an earlier one reads the last value)."""
        d = t - self._t
        if d > 0:
            a = math.exp(-d / self.period_s)
            self._x = self._x * a + self.sigma * math.sqrt(1.0 - a * a) * self._normal()
            self._t = t
        return self._x

    def factor(self, t: float) -> float:
        """The speed factor (a step-time multiplier) at ``t``."""
        return math.exp(self.log_factor(t))
