"""Arrival processes: when requests (or sessions) start.

Each process returns sorted arrival times in ``[0, horizon)`` for a given
``rate_scale`` (which multiplies its rate levels but keeps its time
structure: a diurnal period stays 24 h, an MMPP burst stays as long).

Time-varying rates use *time rescaling*: a process with unit-mean intensity
runs in "operational time" u, and u is mapped back to clock time through the
inverse of the cumulative rate factor Lambda(t) = integral of m(s) ds. For a
Poisson base process this is exactly a non-homogeneous Poisson process; for a
renewal base it keeps the local inter-arrival CV. MMPP is the same mechanism
with a random piecewise-constant factor (the hidden state path).

Draws are vectorised: gaps are drawn in blocks sized from the expected count
and summed with ``cumsum``, so cost is linear in the number of arrivals.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
from scipy import optimize, special

from llmlb_bench.workload.fields import Section


class ArrivalProcess(ABC):
    """A point process on [0, infinity) at ``rate_scale`` = 1."""

    name: ClassVar[str]

    @abstractmethod
    def times(self, rng: np.random.Generator, horizon: float, rate_scale: float) -> np.ndarray:
        """Sorted arrival times in ``[0, horizon)``."""

    @abstractmethod
    def expected_count(self, horizon: float, rate_scale: float) -> float:
        """Mean number of arrivals in ``[0, horizon)`` (used to size a run of N requests)."""

    def horizon_limit(self) -> float:
        """Beyond this time the process has no arrivals (finite tables, replays)."""
        return math.inf

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- modulation

class Modulation(ABC):
    """A deterministic rate factor m(t) >= 0 with a closed-form integral."""

    kind: ClassVar[str]

    @abstractmethod
    def factor(self, t: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def cumulative(self, t: np.ndarray) -> np.ndarray:
        """Lambda(t) = integral of m over [0, t]."""

    def breakpoints(self, horizon: float) -> np.ndarray:
        return np.empty(0)

    def invert(self, u: np.ndarray, horizon: float) -> np.ndarray:
        """Map operational times u (< Lambda(horizon)) back to clock times."""
        grid = np.union1d(np.linspace(0.0, horizon, 1 << 16), self.breakpoints(horizon))
        lam = self.cumulative(grid)
        return np.interp(u, lam, grid)

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Diurnal(Modulation):
    """m(t) = 1 + amplitude * sin(2 pi (t - peak_s) / period_s + pi/2): peaks at ``peak_s``."""

    period_s: float
    amplitude: float
    peak_s: float
    kind: ClassVar[str] = "diurnal"

    def factor(self, t: np.ndarray) -> np.ndarray:
        return 1.0 + self.amplitude * np.cos(2 * np.pi * (np.asarray(t) - self.peak_s) / self.period_s)

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        w = 2 * np.pi / self.period_s
        t = np.asarray(t, dtype=float)
        return t + self.amplitude / w * (np.sin(w * (t - self.peak_s)) - np.sin(-w * self.peak_s))

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.kind, "period_s": self.period_s, "amplitude": self.amplitude, "peak_s": self.peak_s}


@dataclass(frozen=True)
class Piecewise(Modulation):
    """Piecewise-constant factor: ``factor[i]`` from ``at_s[i]`` until the next point."""

    at_s: tuple[float, ...]
    values: tuple[float, ...]
    kind: ClassVar[str] = "piecewise"

    def factor(self, t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.at_s, np.asarray(t, dtype=float), side="right") - 1
        return np.where(idx < 0, 0.0, np.asarray(self.values)[np.maximum(idx, 0)])

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        at, f = np.asarray(self.at_s), np.asarray(self.values)
        knots = np.concatenate([[0.0], np.cumsum(f[:-1] * np.diff(at))])
        t = np.asarray(t, dtype=float)
        idx = np.searchsorted(at, t, side="right") - 1
        safe = np.maximum(idx, 0)
        return np.where(idx < 0, 0.0, knots[safe] + f[safe] * (t - at[safe]))

    def breakpoints(self, horizon: float) -> np.ndarray:
        return np.asarray([a for a in self.at_s if a < horizon])

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.kind, "at_s": list(self.at_s), "factor": list(self.values)}


@dataclass(frozen=True)
class Ramp(Modulation):
    """Factor rising (or falling) linearly from ``start`` to ``end`` over [start_s, end_s]."""

    start: float
    end: float
    start_s: float
    end_s: float
    kind: ClassVar[str] = "ramp"

    def factor(self, t: np.ndarray) -> np.ndarray:
        frac = np.clip((np.asarray(t, dtype=float) - self.start_s) / (self.end_s - self.start_s), 0.0, 1.0)
        return self.start + (self.end - self.start) * frac

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        a, b = self.start_s, self.end_s
        inside = np.clip(t, a, b)
        ramp = self.start * (inside - a) + (self.end - self.start) * (inside - a) ** 2 / (2 * (b - a))
        return self.start * np.minimum(t, a) + ramp + self.end * np.maximum(t - b, 0.0)

    def breakpoints(self, horizon: float) -> np.ndarray:
        return np.asarray([x for x in (self.start_s, self.end_s) if x < horizon])

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.kind, "from": self.start, "to": self.end, "start_s": self.start_s, "end_s": self.end_s}


# --------------------------------------------------------------------------- renewal processes

def gamma_shape(cv: float) -> float:
    return 1.0 / cv**2


def weibull_shape(cv: float) -> float:
    """Weibull shape k whose CV is ``cv`` (CV decreases monotonically in k)."""
    def f(log_k: float) -> float:
        k = math.exp(log_k)
        g1 = special.gammaln(1 + 1 / k)
        g2 = special.gammaln(1 + 2 / k)
        return math.log(math.exp(g2 - 2 * g1) - 1.0) - 2 * math.log(cv)

    return math.exp(optimize.brentq(f, math.log(0.02), math.log(500.0), xtol=1e-12))


def gap_sampler(family: str, cv: float) -> Callable[[np.random.Generator, int], np.ndarray]:
    """Unit-mean inter-arrival gaps of the given family and CV."""
    if family == "poisson":
        return lambda rng, n: rng.standard_exponential(n)
    if family == "gamma":
        k = gamma_shape(cv)
        return lambda rng, n: rng.standard_gamma(k, n) / k
    if family == "weibull":
        k = weibull_shape(cv)
        scale = 1.0 / math.exp(special.gammaln(1 + 1 / k))
        return lambda rng, n: scale * rng.weibull(k, n)
    raise ValueError(family)


def renewal_points(sampler: Callable[[np.random.Generator, int], np.ndarray], rate: float,
                   horizon: float, rng: np.random.Generator) -> np.ndarray:
    """Points of a renewal process with mean rate ``rate`` in [0, horizon)."""
    if rate <= 0 or horizon <= 0:
        return np.empty(0)
    expected = rate * horizon
    block = int(expected + 6 * math.sqrt(expected) + 16)
    parts, last = [], 0.0
    while last < horizon:
        pts = last + np.cumsum(sampler(rng, block)) / rate
        parts.append(pts)
        last = float(pts[-1])
        block = max(16, int((horizon - last) * rate * 1.2) + 16)
    out = np.concatenate(parts)
    return out[: np.searchsorted(out, horizon)]


@dataclass(frozen=True)
class Renewal(ArrivalProcess):
    """Poisson (CV 1), Gamma or Weibull renewal at ``rate`` req/s, optionally modulated."""

    family: str
    rate: float
    cv: float = 1.0
    modulation: Modulation | None = None
    name: ClassVar[str] = "renewal"

    def times(self, rng: np.random.Generator, horizon: float, rate_scale: float) -> np.ndarray:
        sampler = gap_sampler(self.family, self.cv)
        if self.modulation is None:
            return renewal_points(sampler, self.rate * rate_scale, horizon, rng)
        u_end = float(self.modulation.cumulative(np.array([horizon]))[0])
        u = renewal_points(sampler, self.rate * rate_scale, u_end, rng)
        return self.modulation.invert(u, horizon)

    def expected_count(self, horizon: float, rate_scale: float) -> float:
        scale = horizon if self.modulation is None else float(self.modulation.cumulative(np.array([horizon]))[0])
        return self.rate * rate_scale * scale

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"process": self.family, "rate": self.rate}
        if self.family != "poisson":
            out["cv"] = self.cv
        if self.modulation is not None:
            out["modulation"] = self.modulation.to_dict()
        return out


# --------------------------------------------------------------------------- parsing

def _modulation(s: Section) -> Modulation:
    shape = s.string("shape", choices=("diurnal", "piecewise", "ramp"))
    if shape == "diurnal":
        period = s.number("period_s", 86400.0, gt=0)
        mod: Modulation = Diurnal(period_s=period, amplitude=s.number("amplitude", ge=0, lt=1),
                                  peak_s=s.number("peak_s", period / 2))
    elif shape == "piecewise":
        at = s.numbers("at_s", ge=0)
        factor = s.numbers("factor", ge=0)
        if len(at) != len(factor):
            raise s.error("factor", f"has {len(factor)} entries but at_s has {len(at)}")
        if at[0] != 0 or any(b <= a for a, b in zip(at, at[1:])):
            raise s.error("at_s", "must start at 0 and increase strictly")
        mod = Piecewise(tuple(at), tuple(factor))
    else:
        start_s = s.number("start_s", 0.0, ge=0)
        mod = Ramp(start=s.number("from", ge=0), end=s.number("to", ge=0), start_s=start_s,
                   end_s=s.number("end_s", gt=start_s))
    s.finish()
    return mod


def parse_arrival(s: Section) -> ArrivalProcess:
    """Read an ``arrival`` table: ``process = "poisson" | "gamma" | "weibull" | ...``."""
    process = s.string("process", choices=sorted(PROCESSES))
    proc = PROCESSES[process](s, process)
    s.finish()
    return proc


def _renewal(s: Section, family: str) -> ArrivalProcess:
    rate = s.number("rate", gt=0)
    cv = 1.0 if family == "poisson" else s.number("cv", gt=0.05, lt=20)
    mod = s.section("modulation", None)
    return Renewal(family=family, rate=rate, cv=cv, modulation=_modulation(mod) if mod else None)


PROCESSES: dict[str, Callable[[Section, str], ArrivalProcess]] = {
    "poisson": _renewal,
    "gamma": _renewal,
    "weibull": _renewal,
}
