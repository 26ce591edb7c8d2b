"""Green controllers: lower the GPUs' SM clock while the latency SLO has slack, raise it when it has none.

Every ``interval_s`` the simulator asks a :class:`GreenController` for each pool's SM clock
(a fraction of the maximum; sim/cost.py ``CostModel.set_clock``), after feeding it, as
requests finish, their measured TTFT (from reaching the router to the first token) and TPOT.
Steps planned after a decision run at the new clock (a decode run in flight keeps its own).
This is the knob DynamoLLM (Stojkovic et al., HPCA 2025) and VoltanaLLM (arXiv 2509.04827)
act on: decode is memory-bound, so a lower clock costs it little time and saves much power.

Built-in: ``slo_slack``, a feedback controller on the measured latency percentile against
its SLO (:class:`SloSlackController`); users name their own subclass as
``package.module:Class`` in ``ClusterConfig.green``.
"""

from __future__ import annotations

import math
import typing
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.plugins import make_instance
from llmlb_bench.run_summary import ClockSummary
from llmlb_bench.tomlfile import as_table, check_fields, check_types, construct


class GreenController:
    """Base class: observes nothing, keeps every pool's clock."""

    name: ClassVar[str] = "none"

    def observe(self, pool: str, now: float, ttft_s: float | None, tpot_s: float | None) -> None:
        """A request served by ``pool`` finished at ``now``; None for a figure the pool does not
        answer for (disaggregated: a prefill pool gets TTFTs only, a decode pool TPOTs only) or
        that does not exist (TPOT of a one-token output)."""

    def decide(self, now: float, clocks: Mapping[str, float]) -> Mapping[str, float]:
        """New clock per pool name (a fraction of the maximum in (0, 1]); pools left out keep theirs."""
        return {}


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank (no interpolation: a measured value)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class SloSlackController(GreenController):
    """Clock control on SLO slack, per pool.

    The controlled signal is the pool's worst latency ratio r = max(TTFT p / ``ttft_s``,
    TPOT p / ``tpot_s``), p the ``percentile`` of the requests that finished in the last
    ``window_s`` (an SLO left at 0 is not watched). Each decision:

    * r > 1 (the SLO is missed): the clock rises at once by ``up_gain`` x (r - 1), at least
      one ``step``, at most to 1 (multiplicative-decrease's mirror: leave the danger fast);
    * r < ``slack`` (comfortably met): the clock falls by one ``step``, not below ``min_clock``
      (additive: probe slowly, since a lower clock shows in the latency only after the
      window has seen it);
    * otherwise, or with fewer than ``min_samples`` finished requests in the window, it holds.

    The asymmetry is AIMD's (TCP, Netflix concurrency-limits) turned around: here the costly
    direction is a missed SLO, so the controller backs off from it fast and saves energy slowly.
    VoltanaLLM's EcoFreq is the same idea per phase (prefill on TTFT, decode on ITL); on a
    disaggregated cluster this one is too, since a prefill pool sees only TTFTs and a decode
    pool only TPOTs."""

    name: ClassVar[str] = "slo_slack"
    ttft_s: float = 1.0
    tpot_s: float = 0.1
    percentile: float = 0.9
    window_s: float = 30.0
    slack: float = 0.8
    step: float = 0.05
    up_gain: float = 0.5
    min_clock: float = 0.3
    min_samples: int = 10
    pool: str | None = None
    _seen: dict[str, deque[tuple[float, float | None, float | None]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.tpot_s < 0 or not (self.ttft_s or self.tpot_s):
            raise ValueError("need ttft_s >= 0 and tpot_s >= 0, not both 0")
        if not 0 < self.percentile <= 1 or not 0 < self.slack < 1 or self.window_s <= 0:
            raise ValueError("need 0 < percentile <= 1, 0 < slack < 1 and window_s > 0")
        if not 0 < self.step < 1 or self.up_gain < 0 or not 0 < self.min_clock <= 1 or self.min_samples < 1:
            raise ValueError("need 0 < step < 1, up_gain >= 0, 0 < min_clock <= 1 and min_samples >= 1")

    def observe(self, pool: str, now: float, ttft_s: float | None, tpot_s: float | None) -> None:
        if self.pool is None or pool == self.pool:
            self._seen.setdefault(pool, deque()).append((now, ttft_s, tpot_s))

    def ratio(self, pool: str, now: float) -> float | None:
        """The pool's worst latency percentile over its SLO in the window (None: too few requests)."""
        seen = self._seen.get(pool)
        if seen is None:
            return None
        while seen and seen[0][0] < now - self.window_s:
            seen.popleft()
        if len(seen) < self.min_samples:
            return None
        r = 0.0
        ttfts = [s[1] for s in seen if s[1] is not None]
        if self.ttft_s and ttfts:
            r = _percentile(ttfts, self.percentile) / self.ttft_s
        tpots = [s[2] for s in seen if s[2] is not None]
        if self.tpot_s and tpots:
            r = max(r, _percentile(tpots, self.percentile) / self.tpot_s)
        return r

    def decide(self, now: float, clocks: Mapping[str, float]) -> Mapping[str, float]:
        out = {}
        for pool, clock in clocks.items():
            if self.pool is not None and pool != self.pool:
                continue
            r = self.ratio(pool, now)
            if r is None:
                continue
            if r > 1:
                want = min(1.0, clock + max(self.step, self.up_gain * (r - 1)))
            elif r < self.slack:
                want = max(self.min_clock, clock - self.step)
            else:
                continue
            if want != clock:
                out[pool] = round(want, 6)
        return out


BUILTIN_GREEN: dict[str, type[GreenController]] = {c.name: c for c in (GreenController, SloSlackController)}


@dataclass(frozen=True)
class GreenSpec:
    """``ClusterConfig.green``: which controller, how often it decides, and its arguments."""

    policy: str = "slo_slack"
    interval_s: float = 5.0
    args: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> "GreenSpec":
        where = "cluster.green"
        check_fields(raw, {"policy", "interval_s", "args"}, where)
        check_types(raw, typing.get_type_hints(cls), where)
        args = dict(as_table(raw.get("args") or {}, f"{where}.args"))
        spec = construct(cls, {**{k: v for k, v in raw.items() if k != "args"}, "args": args})
        if not spec.interval_s > 0:
            raise UserError("interval_s must be > 0", where)
        spec.make()
        return spec

    def make(self) -> GreenController:
        return make_instance(self.policy, BUILTIN_GREEN, "green controller", "cluster.green.policy", GreenController,
                             self.args, "cluster.green.args")


@dataclass
class ClockLog:
    """Each pool's clock over a run, for the summary: time-weighted mean and changes."""

    start: dict[str, float]
    _area: dict[str, float] = field(default_factory=dict)
    _last: dict[str, tuple[float, float]] = field(default_factory=dict)
    changes: int = 0

    def __post_init__(self) -> None:
        self._last = {p: (0.0, c) for p, c in self.start.items()}
        self._area = {p: 0.0 for p in self.start}

    def set(self, pool: str, now: float, clock: float) -> None:
        t0, c0 = self._last[pool]
        self._area[pool] += c0 * (now - t0)
        self._last[pool] = (now, clock)
        self.changes += 1

    def summary(self, end: float) -> ClockSummary:
        mean = {p: (self._area[p] + c * (end - t)) / end if end > 0 else c for p, (t, c) in self._last.items()}
        return {"clock_changes": self.changes, "mean_clock": mean,
                "final_clock": {p: c for p, (_, c) in self._last.items()}}
