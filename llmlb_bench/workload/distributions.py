"""Length distributions (prompt and output tokens, turns, think times, ...).

Every distribution offers the same four operations, all vectorised:

* ``sample(rng, n)``: ``n`` draws;
* ``ppf(u)``: the quantile function, so a Gaussian copula can correlate two
  lengths (``from_normal(z) = ppf(Phi(z))``) and tests can check it;
* ``cdf(x)``: for goodness-of-fit (KS) in tests and in ``trace fit``;
* ``mean()``: for sizing a generation horizon and for sanity reports.

Values are real numbers; :class:`Lengths` turns them into token counts
(rounded, then clipped to the caps ``min``/``max``). Each distribution can
write itself back as the spec table it was read from (``to_dict``), which is
how ``trace fit`` emits a spec.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from llmlb_bench.tomlfile import Value
from llmlb_bench.workload.fields import Section


class Distribution(ABC):
    """A univariate distribution over non-negative reals."""

    name: ClassVar[str]
    discrete: ClassVar[bool] = False

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.ppf(rng.random(n))

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        """Map standard normals to this distribution (the copula's marginal step)."""
        from scipy import special  # imported where used: scipy costs every CLI command ~0.5 s otherwise

        return self.ppf(special.ndtr(z))

    @abstractmethod
    def ppf(self, u: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def cdf(self, x: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def mean(self) -> float: ...

    @abstractmethod
    def to_dict(self) -> dict[str, Value]: ...


@dataclass(frozen=True)
class Lognormal(Distribution):
    """log X ~ N(mu, sigma^2); ShareGPT/LMSYS prompt and output lengths are close to this."""

    mu: float
    sigma: float
    name: ClassVar[str] = "lognormal"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.from_normal(rng.standard_normal(n))

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        return np.exp(self.mu + self.sigma * z)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        from scipy import special

        return self.from_normal(special.ndtri(u))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        from scipy import special

        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore"):
            result: np.ndarray = special.ndtr((np.log(np.maximum(x, 0.0)) - self.mu) / self.sigma)
            return result

    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "median": _r(math.exp(self.mu)), "sigma": _r(self.sigma)}


@dataclass(frozen=True)
class BoundedPareto(Distribution):
    """Pareto(alpha) truncated to [low, high]: a heavy tail with a hard maximum."""

    alpha: float
    low: float
    high: float
    name: ClassVar[str] = "pareto"

    def _mass(self) -> float:
        result: float = 1.0 - (self.low / self.high) ** self.alpha
        return result

    def ppf(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        return self.low * (1.0 - u * self._mass()) ** (-1.0 / self.alpha)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.clip(np.asarray(x, dtype=float), self.low, self.high)
        return (1.0 - (self.low / x) ** self.alpha) / self._mass()

    def mean(self) -> float:
        a, lo, hi = self.alpha, self.low, self.high
        if abs(a - 1.0) < 1e-12:
            return lo * hi / (hi - lo) * math.log(hi / lo)
        result: float = (lo**a / self._mass()) * a / (a - 1.0) * (lo ** (1 - a) - hi ** (1 - a))
        return result

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "alpha": _r(self.alpha), "low": _r(self.low), "high": _r(self.high)}


@dataclass(frozen=True)
class Exponential(Distribution):
    mean_value: float
    name: ClassVar[str] = "exponential"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean_value, n)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        result: np.ndarray = -self.mean_value * np.log1p(-np.asarray(u, dtype=float))
        return result

    def cdf(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = -np.expm1(-np.maximum(np.asarray(x, dtype=float), 0.0) / self.mean_value)
        return result

    def mean(self) -> float:
        return self.mean_value

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "mean": _r(self.mean_value)}


@dataclass(frozen=True)
class Uniform(Distribution):
    low: float
    high: float
    name: ClassVar[str] = "uniform"

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.low + (self.high - self.low) * np.asarray(u, dtype=float)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return np.clip((np.asarray(x, dtype=float) - self.low) / (self.high - self.low), 0.0, 1.0)

    def mean(self) -> float:
        return (self.low + self.high) / 2

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "low": _r(self.low), "high": _r(self.high)}


@dataclass(frozen=True)
class Fixed(Distribution):
    value: float
    name: ClassVar[str] = "fixed"
    discrete: ClassVar[bool] = True

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return np.full(np.shape(u), self.value)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=float) >= self.value).astype(float)

    def mean(self) -> float:
        return self.value

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "value": _r(self.value)}


class Discrete(Distribution):
    """A finite discrete distribution given by support points and probabilities."""

    discrete: ClassVar[bool] = True

    def __init__(self, values: np.ndarray, probs: np.ndarray) -> None:
        order = np.argsort(values, kind="stable")
        self.values = np.asarray(values, dtype=float)[order]
        p = np.asarray(probs, dtype=float)[order]
        self.probs = p / p.sum()
        self._cum = np.cumsum(self.probs)
        self._cum[-1] = 1.0

    def ppf(self, u: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self._cum, np.asarray(u, dtype=float), side="right")
        return self.values[np.minimum(idx, len(self.values) - 1)]

    def cdf(self, x: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.values, np.asarray(x, dtype=float), side="right")
        return np.concatenate([[0.0], self._cum])[idx]

    def mean(self) -> float:
        return float(self.values @ self.probs)


class Zipf(Discrete):
    """P(k) proportional to k^-s for k = 1..n (e.g. turns per session, popularity ranks)."""

    name: ClassVar[str] = "zipf"

    def __init__(self, s: float, n: int) -> None:
        self.s, self.n = s, n
        k = np.arange(1, n + 1, dtype=float)
        super().__init__(k, k**-s)

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "s": _r(self.s), "n": self.n}


class EmpiricalPdf(Discrete):
    """A measured discrete PDF (value -> probability), e.g. from ServeGen's datasets."""

    name: ClassVar[str] = "empirical"

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "values": [_r(v) for v in self.values], "probs": [_r(p, 8) for p in self.probs]}


class EmpiricalQuantiles(Distribution):
    """A piecewise-linear quantile function through measured (probability, value) points."""

    name: ClassVar[str] = "empirical"

    def __init__(self, probs: np.ndarray, values: np.ndarray) -> None:
        self.q = np.asarray(probs, dtype=float)
        self.v = np.asarray(values, dtype=float)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        result: np.ndarray = np.interp(u, self.q, self.v)
        return result

    def cdf(self, x: np.ndarray) -> np.ndarray:
        # Flat stretches of the quantile function (repeated values) are atoms:
        # take the right-most probability so the CDF is right-continuous.
        x = np.asarray(x, dtype=float)
        idx = np.searchsorted(self.v, x, side="right")
        inner = (idx > 0) & (idx < len(self.v))
        out = np.where(idx >= len(self.v), 1.0, 0.0)
        i = idx[inner]
        v0, v1, q0, q1 = self.v[i - 1], self.v[i], self.q[i - 1], self.q[i]
        out[inner] = q0 + (q1 - q0) * (x[inner] - v0) / (v1 - v0)
        return out

    def mean(self) -> float:
        return float(np.sum(np.diff(self.q) * (self.v[1:] + self.v[:-1]) / 2))

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name, "quantiles": [[_r(q, 6), _r(v)] for q, v in zip(self.q, self.v)]}


class Mixture(Distribution):
    """A weighted mixture, e.g. reasoning outputs: short answers plus long chains of thought."""

    name: ClassVar[str] = "mixture"

    def __init__(self, weights: np.ndarray, components: list[Distribution]) -> None:
        w = np.asarray(weights, dtype=float)
        self.weights = w / w.sum()
        self.components = components
        self._grid: tuple[np.ndarray, np.ndarray] | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        which = np.searchsorted(np.cumsum(self.weights)[:-1], rng.random(n), side="right")
        out = np.empty(n)
        for i, comp in enumerate(self.components):
            mask = which == i
            out[mask] = comp.sample(rng, int(mask.sum()))
        return out

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        result: np.ndarray = sum(w * c.cdf(x) for w, c in zip(self.weights, self.components))
        return result

    def ppf(self, u: np.ndarray) -> np.ndarray:
        # No closed form: invert the CDF numerically on a grid made of every
        # component's own quantiles (dense where any component has mass).
        if self._grid is None:
            probe = np.linspace(0.0, 1.0, 4097)[1:-1]
            xs = np.unique(np.concatenate([c.ppf(probe) for c in self.components]))
            self._grid = (self.cdf(xs), xs)
        cum, xs = self._grid
        result: np.ndarray = np.interp(u, cum, xs)
        return result

    def mean(self) -> float:
        return float(sum(w * c.mean() for w, c in zip(self.weights, self.components)))

    def to_dict(self) -> dict[str, Value]:
        return {"dist": self.name,
                "components": [{"weight": _r(w, 6), **c.to_dict()} for w, c in zip(self.weights, self.components)]}


@dataclass(frozen=True)
class Lengths:
    """A distribution plus the integer rounding and caps that make it a token count."""

    dist: Distribution
    min: int = 1
    max: int | None = None

    def to_tokens(self, values: np.ndarray) -> np.ndarray:
        out = np.rint(values) if not self.dist.discrete else values
        result: np.ndarray = np.clip(out, self.min, self.max if self.max is not None else np.iinfo(np.int32).max).astype(np.int32)
        return result

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.to_tokens(self.dist.sample(rng, n))

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        return self.to_tokens(self.dist.from_normal(z))

    def mean(self) -> float:
        """Approximate mean token count (caps ignored unless the mean exceeds them)."""
        m = self.dist.mean()
        return float(min(max(m, self.min), self.max if self.max is not None else m))

    def to_dict(self) -> dict[str, Value]:
        out = self.dist.to_dict()
        if self.min != 1:
            out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        return out


def _r(x: float, digits: int = 6) -> float:
    """Round for a readable spec without losing meaningful precision."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def _lognormal(s: Section) -> Distribution:
    if s.has("median") and s.has("mu"):
        raise s.error("mu", "give either median or mu, not both")
    mu = math.log(s.number("median", gt=0)) if s.has("median") else s.number("mu")
    return Lognormal(mu=mu, sigma=s.number("sigma", gt=0))


def _pareto(s: Section) -> Distribution:
    low = s.number("low", gt=0)
    high = s.number("high", gt=low)
    return BoundedPareto(alpha=s.number("alpha", gt=0), low=low, high=high)


def _uniform(s: Section) -> Distribution:
    low = s.number("low", ge=0)
    return Uniform(low=low, high=s.number("high", gt=low))


def _zipf(s: Section) -> Distribution:
    return Zipf(s=s.number("s", gt=0), n=s.integer("n", ge=1, le=10_000_000))


def _empirical(s: Section) -> Distribution:
    if s.has("quantiles"):
        rows = s.raw("quantiles")
        if not isinstance(rows, list) or len(rows) < 2 or not all(isinstance(r, list) and len(r) == 2 for r in rows):
            raise s.error("quantiles", "expected a list of at least two [probability, value] pairs")
        sub = Section({"p": [r[0] for r in rows], "v": [r[1] for r in rows]}, s.dotted("quantiles"), s.source)
        q = np.array(sub.numbers("p", ge=0))
        v = np.array(sub.numbers("v", ge=0))
        if q[0] != 0.0 or q[-1] != 1.0 or np.any(np.diff(q) <= 0):
            raise s.error("quantiles", "probabilities must rise strictly from 0 to 1")
        if np.any(np.diff(v) < 0):
            raise s.error("quantiles", "values must not decrease")
        return EmpiricalQuantiles(q, v)
    values = np.array(s.numbers("values", ge=0))
    probs = np.array(s.numbers("probs", ge=0))
    if len(values) != len(probs):
        raise s.error("probs", f"has {len(probs)} entries but values has {len(values)}")
    if probs.sum() <= 0:
        raise s.error("probs", "must not all be zero")
    return EmpiricalPdf(values, probs)


def _mixture(s: Section) -> Distribution:
    comps, weights = [], []
    for c in s.sections("components"):
        weights.append(c.number("weight", gt=0))
        comps.append(parse_distribution(c))
    return Mixture(np.array(weights), comps)


PARSERS: dict[str, Callable[[Section], Distribution]] = {
    "lognormal": _lognormal,
    "pareto": _pareto,
    "zipf": _zipf,
    "exponential": lambda s: Exponential(s.number("mean", gt=0)),
    "uniform": _uniform,
    "fixed": lambda s: Fixed(s.number("value", ge=0)),
    "empirical": _empirical,
    "mixture": _mixture,
}


def parse_distribution(s: Section) -> Distribution:
    """Read ``dist = "<name>"`` and that distribution's parameters (and nothing else)."""
    name = s.string("dist", choices=sorted(PARSERS))
    dist = PARSERS[name](s)
    s.finish()
    return dist


def parse_lengths(s: Section, default_min: int = 1) -> Lengths:
    """A token-count distribution: a distribution plus optional ``min``/``max`` caps."""
    lo = s.integer("min", default_min, ge=0)
    hi = s.integer("max", None, ge=max(lo, 1))
    return Lengths(parse_distribution(s), min=lo, max=hi)

