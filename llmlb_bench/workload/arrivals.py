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
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.schema import read_trace
from llmlb_bench.tomlfile import Value
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

    def horizon_limit(self, rate_scale: float) -> float:
        """Beyond this time the process has no arrivals (finite tables, replays)."""
        return math.inf

    @abstractmethod
    def to_dict(self) -> dict[str, Value]: ...


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
        result: np.ndarray = np.interp(u, lam, grid)
        return result

    @abstractmethod
    def to_dict(self) -> dict[str, Value]: ...


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
        result: np.ndarray = t + self.amplitude / w * (np.sin(w * (t - self.peak_s)) - np.sin(-w * self.peak_s))
        return result

    def to_dict(self) -> dict[str, Value]:
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

    def invert(self, u: np.ndarray, horizon: float) -> np.ndarray:
        # Lambda is piecewise linear: its knots alone invert it exactly.
        grid = np.append(self.breakpoints(horizon), horizon)
        result: np.ndarray = np.interp(u, self.cumulative(grid), grid)
        return result

    def to_dict(self) -> dict[str, Value]:
        return {"shape": self.kind, "at_s": list(self.at_s), "factor": list(self.values)}


@dataclass(frozen=True)
class Step(Piecewise):
    """A load step: factor ``before`` until ``step_s``, ``after`` from then on (a piecewise factor
    that keeps its name, so reports find the step: metrics/control.py)."""

    kind: ClassVar[str] = "step"

    @classmethod
    def of(cls, step_s: float, before: float, after: float) -> "Step":
        return cls((0.0, step_s), (before, after))

    @property
    def step_s(self) -> float:
        return self.at_s[-1]

    def to_dict(self) -> dict[str, Value]:
        return {"shape": self.kind, "at_s": self.step_s, "before": self.values[0], "after": self.values[-1]}


@dataclass(frozen=True)
class Square(Modulation):
    """A square wave: ``low`` until ``start_s``, then periods of ``high`` for ``duty`` x ``period_s``
    followed by ``low`` for the rest of the period (bursts of a known length and spacing)."""

    period_s: float
    duty: float
    low: float
    high: float
    start_s: float = 0.0
    kind: ClassVar[str] = "square"

    def factor(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        phase = np.mod(t - self.start_s, self.period_s)
        return np.where((t >= self.start_s) & (phase < self.duty * self.period_s), self.high, self.low)

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        on = self.duty * self.period_s
        since = np.maximum(t - self.start_s, 0.0)
        whole = np.floor(since / self.period_s)
        high_time = whole * on + np.minimum(since - whole * self.period_s, on)
        return self.low * t + (self.high - self.low) * high_time

    def breakpoints(self, horizon: float) -> np.ndarray:
        if horizon <= self.start_s:
            return np.empty(0)
        starts = np.arange(self.start_s, horizon, self.period_s)
        return np.sort(np.concatenate([starts, starts + self.duty * self.period_s]))

    def invert(self, u: np.ndarray, horizon: float) -> np.ndarray:
        # Lambda is piecewise linear: its knots alone invert it exactly.
        grid = np.concatenate([[0.0], self.breakpoints(horizon), [horizon]])
        grid = np.unique(np.minimum(grid, horizon))
        result: np.ndarray = np.interp(u, self.cumulative(grid), grid)
        return result

    def to_dict(self) -> dict[str, Value]:
        return {"shape": self.kind, "period_s": self.period_s, "duty": self.duty, "low": self.low,
                "high": self.high, "start_s": self.start_s}


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
        result: np.ndarray = self.start * np.minimum(t, a) + ramp + self.end * np.maximum(t - b, 0.0)
        return result

    def breakpoints(self, horizon: float) -> np.ndarray:
        return np.asarray([x for x in (self.start_s, self.end_s) if x < horizon])

    def to_dict(self) -> dict[str, Value]:
        return {"shape": self.kind, "from": self.start, "to": self.end, "start_s": self.start_s, "end_s": self.end_s}


# --------------------------------------------------------------------------- renewal processes

def gamma_shape(cv: float) -> float:
    return 1.0 / cv**2


def weibull_shape(cv: float) -> float:
    """Weibull shape k whose CV is ``cv`` (CV decreases monotonically in k)."""
    from scipy import optimize, special  # imported where used: scipy costs every CLI command ~0.5 s otherwise

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
        from scipy import special

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

    def to_dict(self) -> dict[str, Value]:
        out: dict[str, Value] = {"process": self.family, "rate": self.rate}
        if self.family != "poisson":
            out["cv"] = self.cv
        if self.modulation is not None:
            out["modulation"] = self.modulation.to_dict()
        return out


@dataclass(frozen=True)
class MMPP(ArrivalProcess):
    """Markov-modulated Poisson: a hidden state chain picks the current rate (on/off bursts).

    State i lasts an exponential time with mean ``mean_s[i]``, then jumps to j
    with probability ``transitions[i][j]``. Given the state path, arrivals are
    Poisson at ``rates[state]``: a piecewise-constant modulation of a unit-rate
    Poisson process, inverted exactly.
    """

    rates: tuple[float, ...]
    mean_s: tuple[float, ...]
    transitions: tuple[tuple[float, ...], ...]
    name: ClassVar[str] = "mmpp"

    def stationary(self) -> np.ndarray:
        """Long-run fraction of time in each state."""
        p = np.asarray(self.transitions)
        w, v = np.linalg.eig(p.T)
        nu = np.abs(np.real(v[:, np.argmin(np.abs(w - 1.0))]))
        pi = nu * np.asarray(self.mean_s)
        result: np.ndarray = pi / pi.sum()
        return result

    def state_path(self, rng: np.random.Generator, horizon: float) -> tuple[np.ndarray, np.ndarray]:
        """Start times and states of the sojourns covering [0, horizon)."""
        cum = np.cumsum(np.asarray(self.transitions), axis=1)
        state = int(np.searchsorted(np.cumsum(self.stationary()), rng.random(), side="right"))
        state = min(state, len(self.rates) - 1)
        starts, states, t = [], [], 0.0
        # The first sojourn is a fresh exponential: by memorylessness that is
        # exactly the residual sojourn of a chain already in steady state.
        while t < horizon:
            starts.append(t)
            states.append(state)
            t += rng.exponential(self.mean_s[state])
            state = min(int(np.searchsorted(cum[state], rng.random(), side="right")), len(self.rates) - 1)
        return np.asarray(starts), np.asarray(states)

    def times(self, rng: np.random.Generator, horizon: float, rate_scale: float) -> np.ndarray:
        starts, states = self.state_path(rng, horizon)
        mod = Piecewise(tuple(starts), tuple(np.asarray(self.rates)[states] * rate_scale))
        u_end = float(mod.cumulative(np.array([horizon]))[0])
        u = renewal_points(gap_sampler("poisson", 1.0), 1.0, u_end, rng)
        return mod.invert(u, horizon)

    def expected_count(self, horizon: float, rate_scale: float) -> float:
        return float(self.stationary() @ np.asarray(self.rates)) * rate_scale * horizon

    def to_dict(self) -> dict[str, Value]:
        return {"process": self.name,
                "states": [{"rate": r, "mean_s": m} for r, m in zip(self.rates, self.mean_s)],
                "transitions": [list(row) for row in self.transitions]}


@dataclass(frozen=True)
class Hawkes(ArrivalProcess):
    """Self-exciting arrivals: each request triggers on average ``branching`` more.

    Intensity mu + sum over past events of (branching / decay_s) * exp(-(t - t_i) / decay_s).
    ``rate`` is the long-run mean, so mu = rate * (1 - branching). Generated by
    the cluster (branching-process) representation, one vectorised pass per
    generation of offspring, after a burn-in that removes the start-up ramp.
    """

    rate: float
    branching: float
    decay_s: float
    name: ClassVar[str] = "hawkes"

    def times(self, rng: np.random.Generator, horizon: float, rate_scale: float) -> np.ndarray:
        mu = self.rate * rate_scale * (1.0 - self.branching)
        burn = 10.0 * self.decay_s / (1.0 - self.branching)
        span = horizon + burn
        gen = renewal_points(gap_sampler("poisson", 1.0), mu, span, rng)
        events = [gen]
        while gen.size:
            kids = rng.poisson(self.branching, gen.size)
            gen = np.repeat(gen, kids) + rng.exponential(self.decay_s, int(kids.sum()))
            gen = gen[gen < span]
            events.append(gen)
        out = np.sort(np.concatenate(events)) - burn
        return out[out >= 0.0]

    def expected_count(self, horizon: float, rate_scale: float) -> float:
        return self.rate * rate_scale * horizon

    def to_dict(self) -> dict[str, Value]:
        return {"process": self.name, "rate": self.rate, "branching": self.branching, "decay_s": self.decay_s}


@dataclass(frozen=True)
class Windows(ArrivalProcess):
    """A table of windows, each a renewal process with its own rate, CV and family.

    This is how ServeGen describes each client (600 s windows, Gamma or
    Weibull inter-arrivals) and what ``trace fit`` emits, so a fitted spec
    follows the original's rate curve and burstiness window by window.
    """

    window_s: float
    rates: tuple[float, ...]
    cvs: tuple[float, ...]
    families: tuple[str, ...]
    name: ClassVar[str] = "windows"

    def times(self, rng: np.random.Generator, horizon: float, rate_scale: float) -> np.ndarray:
        parts = []
        for i, (rate, cv, family) in enumerate(zip(self.rates, self.cvs, self.families)):
            start = i * self.window_s
            if start >= horizon:
                break
            if rate <= 0:
                continue
            span = min(self.window_s, horizon - start)
            parts.append(start + renewal_points(gap_sampler(family, cv), rate * rate_scale, span, rng))
        return np.concatenate(parts) if parts else np.empty(0)

    def expected_count(self, horizon: float, rate_scale: float) -> float:
        edges = np.arange(len(self.rates)) * self.window_s
        covered = np.clip(horizon - edges, 0.0, self.window_s)
        return float(covered @ np.asarray(self.rates)) * rate_scale

    def horizon_limit(self, rate_scale: float) -> float:
        return len(self.rates) * self.window_s

    def to_dict(self) -> dict[str, Value]:
        fam = self.families[0] if len(set(self.families)) == 1 else list(self.families)
        return {"process": self.name, "window_s": self.window_s, "rate": list(self.rates), "cv": list(self.cvs),
                "family": fam}


@dataclass(frozen=True)
class Replay(ArrivalProcess):
    """Imported timestamps, replayed as they are (``rate_scale`` compresses time)."""

    times_s: np.ndarray
    spec: dict[str, Value]
    name: ClassVar[str] = "replay"

    def times(self, rng: np.random.Generator, horizon: float, rate_scale: float) -> np.ndarray:
        t = self.times_s / rate_scale
        return t[: np.searchsorted(t, horizon)]

    def expected_count(self, horizon: float, rate_scale: float) -> float:
        return float(np.searchsorted(self.times_s / rate_scale, horizon))

    def horizon_limit(self, rate_scale: float) -> float:
        return float(self.times_s[-1] / rate_scale) + 1e-9 if self.times_s.size else 0.0

    def to_dict(self) -> dict[str, Value]:
        return dict(self.spec)


# --------------------------------------------------------------------------- parsing

def _modulation(s: Section) -> Modulation:
    shape = s.string("shape", choices=("diurnal", "piecewise", "ramp", "step", "square"))
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
    elif shape == "step":
        mod = Step.of(s.number("at_s", gt=0), s.number("before", ge=0), s.number("after", ge=0))
    elif shape == "square":
        period = s.number("period_s", gt=0)
        low, high = s.number("low", ge=0), s.number("high", ge=0)
        if not low + high > 0:
            raise s.error("high", "low and high cannot both be 0")
        mod = Square(period_s=period, duty=s.number("duty", 0.5, gt=0, lt=1), low=low, high=high,
                     start_s=s.number("start_s", 0.0, ge=0))
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


def _mmpp(s: Section, _: str) -> ArrivalProcess:
    states = s.sections("states")
    if len(states) < 2:
        raise s.error("states", "an MMPP needs at least two states")
    rates, means = [], []
    for st in states:
        rates.append(st.number("rate", ge=0))
        means.append(st.number("mean_s", gt=0))
        st.finish()
    k = len(states)
    if s.has("transitions"):
        rows = s.raw("transitions")
        if not isinstance(rows, list) or len(rows) != k:
            raise s.error("transitions", f"expected a {k}x{k} matrix (list of {k} rows)")
        matrix = []
        for i, row in enumerate(rows):
            sub = Section({"row": row}, s.dotted("transitions"), s.source)
            vals = sub.numbers("row", ge=0)
            if len(vals) != k or vals[i] != 0 or abs(sum(vals) - 1.0) > 1e-6:
                raise s.error("transitions", f"row {i} must have {k} probabilities summing to 1, 0 on the diagonal")
            matrix.append(tuple(vals))
    else:
        matrix = [tuple(0.0 if j == i else 1.0 / (k - 1) for j in range(k)) for i in range(k)]
    if not any(rates):
        raise s.error("states", "at least one state needs a rate > 0")
    return MMPP(tuple(rates), tuple(means), tuple(matrix))


def _hawkes(s: Section, _: str) -> ArrivalProcess:
    return Hawkes(rate=s.number("rate", gt=0), branching=s.number("branching", ge=0, lt=0.98),
                  decay_s=s.number("decay_s", gt=0))


def _windows(s: Section, _: str) -> ArrivalProcess:
    rates = s.numbers("rate", ge=0)
    n = len(rates)
    cvs = s.numbers("cv", [1.0] * n, gt=0)
    fam = s.raw("family", "gamma")
    families = [fam] * n if isinstance(fam, str) else fam
    if len(cvs) != n or not isinstance(families, list) or len(families) != n:
        raise s.error("cv" if len(cvs) != n else "family", f"needs one entry per window ({n})")
    for i, f in enumerate(families):
        if f not in ("poisson", "gamma", "weibull"):
            raise s.error("family", f"window {i}: unknown family {f!r} (choose from poisson, gamma, weibull)")
    for i, cv in enumerate(cvs):
        if not 0.05 < cv < 20 and rates[i] > 0:
            raise s.error("cv", f"window {i}: cv {cv:g} outside (0.05, 20)")
    return Windows(window_s=s.number("window_s", gt=0), rates=tuple(rates), cvs=tuple(cvs),
                   families=tuple(families))


def _replay(s: Section, _: str) -> ArrivalProcess:
    spec: dict[str, Value] = {"process": "replay"}
    if s.has("path") == s.has("times_s"):
        raise s.error("path", "give exactly one of path (a trace file) or times_s (a list)")
    if s.has("times_s"):
        times = np.asarray(s.numbers("times_s", ge=0))
        spec["times_s"] = times.tolist()
    else:
        raw_path = s.string("path")
        path = Path(raw_path) if Path(raw_path).is_absolute() else Path(s.source).parent / raw_path
        table = read_trace(path)
        tenant = s.string("tenant", None)
        times = table.column("arrival_s").to_numpy()
        if tenant is not None:
            mask = pc.equal(table.column("tenant").cast(pa.string()), tenant).to_numpy(zero_copy_only=False)
            if not mask.any():
                raise s.error("tenant", f"no requests of tenant {tenant!r} in {raw_path}")
            times = times[mask]
            spec["tenant"] = tenant
        spec["path"] = raw_path
    return Replay(times_s=np.sort(times), spec=spec)


PROCESSES: dict[str, Callable[[Section, str], ArrivalProcess]] = {
    "poisson": _renewal,
    "gamma": _renewal,
    "weibull": _renewal,
    "mmpp": _mmpp,
    "hawkes": _hawkes,
    "windows": _windows,
    "replay": _replay,
}
