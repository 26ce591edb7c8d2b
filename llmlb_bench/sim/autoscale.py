"""Autoscaling hooks: add or remove replicas of a pool while the simulation runs.

Every ``interval_s`` the simulator asks an :class:`Autoscaler` for the
number of replicas each pool should have, given the router's view and each
pool's status. It then

* adds replicas: each new one draws idle power and costs GPU-hours from the
  decision on, and becomes routable (``View.healthy``) after ``cold_start_s``
  (weights loading, CUDA graph capture);
* removes replicas: it first cancels pending removals, else picks the
  routable replicas with the fewest requests in flight (latest first on
  ties), stops routing to them and retires each once it has drained (its
  power and cost end there).

Targets are only ever appended, so ``View`` indices stay valid.

Built-in policies: Knative-style concurrency targeting (``concurrency``),
threshold scaling on a scraped signal with a cooldown (``threshold``: the
waiting queue or KV-cache use per replica, as KEDA/AIBrix-style autoscalers
read them from the engines' metrics) and a PID controller on either
(``pid``, docs/control.md); users name their own subclass as
``package.module:Class`` in ``ClusterConfig.autoscale``.
"""

from __future__ import annotations

import math
import typing
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.plugins import make_instance
from llmlb_bench.policies import View
from llmlb_bench.tomlfile import as_table, check_fields, check_types, construct


@dataclass(frozen=True)
class PoolStatus:
    """What an autoscaler sees of one pool at a decision."""

    name: str
    #: routable replicas (indices into the view)
    ready: tuple[int, ...]
    #: added, still in their cold start
    starting: tuple[int, ...] = ()
    #: being removed, still finishing their requests
    draining: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        """The count the pool is heading to (ready + starting)."""
        return len(self.ready) + len(self.starting)


class Autoscaler:
    """Base class: keeps every pool as it is."""

    name: ClassVar[str] = "none"

    def decide(self, now: float, view: View, pools: Mapping[str, PoolStatus]) -> Mapping[str, int]:
        """Desired replica count per pool name (pools left out keep their size)."""
        return {}


@dataclass
class ConcurrencyAutoscaler(Autoscaler):
    """Knative's concurrency target: size = ceil(mean requests in flight over the last
    ``window_s`` / ``target`` per replica), within [min_replicas, max_replicas]; it shrinks
    by at most one replica per decision. The window (Knative's stable window, 60 s) keeps
    short lulls from removing replicas that the next burst needs again."""

    name: ClassVar[str] = "concurrency"
    target: float = 32.0
    min_replicas: int = 1
    max_replicas: int = 64
    window_s: float = 60.0
    pool: str | None = None
    _history: dict[str, deque[tuple[float, int]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.target <= 0 or self.min_replicas < 1 or self.max_replicas < self.min_replicas or self.window_s < 0:
            raise ValueError("need target > 0, 1 <= min_replicas <= max_replicas and window_s >= 0")

    def decide(self, now: float, view: View, pools: Mapping[str, PoolStatus]) -> Mapping[str, int]:
        out = {}
        for name, st in pools.items():
            if self.pool is not None and name != self.pool:
                continue
            members = st.ready + st.starting + st.draining
            history = self._history.setdefault(name, deque())
            history.append((now, sum(view.outstanding_requests[i] for i in members)))
            while history[0][0] < now - self.window_s:
                history.popleft()
            mean = sum(n for _, n in history) / len(history)
            want = min(max(math.ceil(mean / self.target), self.min_replicas), self.max_replicas)
            out[name] = max(want, st.size - 1)
        return out


@dataclass
class ThresholdAutoscaler(Autoscaler):
    """Threshold scaling on a scraped signal, with a cooldown.

    The signal is the mean over a pool's routable replicas of their waiting queue
    (``metric="queue"``: vLLM's ``num_requests_waiting``) or KV-cache use
    (``metric="kv"``: ``gpu_cache_usage_perc``, 0..1), as the router's view last
    scraped them (stale with ``signal_refresh_s``, as a metrics pipeline is). Above
    ``upper`` the pool grows by ``step`` replicas, below ``lower`` it shrinks by
    one; after any change it holds still for ``cooldown_s`` (simple scaling's
    cooldown, which keeps it from reacting again before the last change shows),
    always within [min_replicas, max_replicas]."""

    name: ClassVar[str] = "threshold"
    metric: str = "queue"
    upper: float = 4.0
    lower: float = 0.5
    step: int = 1
    cooldown_s: float = 60.0
    min_replicas: int = 1
    max_replicas: int = 64
    pool: str | None = None
    _last_change: dict[str, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.metric not in ("queue", "kv"):
            raise ValueError(f"metric must be queue or kv (got {self.metric!r})")
        if not 0 <= self.lower < self.upper or self.step < 1 or self.cooldown_s < 0:
            raise ValueError("need 0 <= lower < upper, step >= 1 and cooldown_s >= 0")
        if self.min_replicas < 1 or self.max_replicas < self.min_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")

    def decide(self, now: float, view: View, pools: Mapping[str, PoolStatus]) -> Mapping[str, int]:
        out = {}
        signal = view.waiting if self.metric == "queue" else view.kv_usage
        for name, st in pools.items():
            if self.pool is not None and name != self.pool:
                continue
            want = min(max(st.size, self.min_replicas), self.max_replicas)
            if want == st.size and st.ready and now - self._last_change.get(name, -math.inf) >= self.cooldown_s:
                value = sum(signal[i] for i in st.ready) / len(st.ready)
                if value > self.upper:
                    want = min(st.size + self.step, self.max_replicas)
                elif value < self.lower:
                    want = max(st.size - 1, self.min_replicas)
            if want != st.size:
                self._last_change[name] = now
                out[name] = want
        return out


@dataclass
class PidAutoscaler(Autoscaler):
    """PID control of a pool's size on its load per replica, beside Knative's proportional rule.

    The signal is the pool's load per replica it pays for (ready + starting): requests in flight
    (``metric="concurrency"``, the router's own count, as Knative reads it), or the scraped waiting
    queue (``"queue"``) or KV use (``"kv"``, 0..1) summed over its routable replicas. The error is
    logarithmic, e_k = ln(signal / target) (the signal floored at target / 100): a load per replica
    of N / n makes e = ln(N / target) - ln n, linear in the log of the size, so the loop is linear
    however far from the target it starts. The log of the desired size x = ln u moves in velocity
    form (Åström & Hägglund, *Advanced PID Control*, ISA 2006, §3.5 and §13.4), every decision
    (dt = the time since the previous one)::

        x_k = clamp(x_{k-1} + kp (e_k - e_{k-1}) + ki dt e_k + kd (e_k - 2 e_{k-1} + e_{k-2}) / dt,
                    ln min_replicas, ln max_replicas)

    and the pool is set to round(exp(x_k)). Clamping x is the anti-windup (no integrator state beyond
    x); with ``hold_while_starting`` the integral term also rests while added replicas are in their
    cold start, as their capacity cannot show before they serve (conditional integration). On a
    fixed load N (a fluid closed population), kp = kd = 0: x_k - x* = (1 - ki dt)^k (x_0 - x*),
    x* = ln(N / target). Knative's rule is the proportional one-shot u = N / target."""

    name: ClassVar[str] = "pid"
    metric: str = "concurrency"
    target: float = 16.0
    kp: float = 0.5
    ki: float = 0.05
    kd: float = 0.0
    hold_while_starting: bool = True
    min_replicas: int = 1
    max_replicas: int = 64
    pool: str | None = None
    _state: dict[str, list[float]] = field(default_factory=dict, repr=False)   # x, e_{k-1}, e_{k-2}, t_{k-1}

    def __post_init__(self) -> None:
        if self.metric not in ("concurrency", "queue", "kv"):
            raise ValueError(f"metric must be concurrency, queue or kv (got {self.metric!r})")
        if not self.target > 0 or min(self.kp, self.ki, self.kd) < 0:
            raise ValueError("need target > 0 and kp, ki, kd >= 0")
        if self.min_replicas < 1 or self.max_replicas < self.min_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")

    def signal(self, view: View, st: PoolStatus) -> float:
        """The pool's load per replica it pays for (ready + starting)."""
        if self.metric == "concurrency":
            total: float = sum(view.outstanding_requests[i] for i in st.ready + st.starting + st.draining)
        else:
            values = view.waiting if self.metric == "queue" else view.kv_usage
            total = sum(values[i] for i in st.ready)
        return total / max(st.size, 1)

    def decide(self, now: float, view: View, pools: Mapping[str, PoolStatus]) -> Mapping[str, int]:
        out = {}
        lo, hi = math.log(self.min_replicas), math.log(self.max_replicas)
        for name, st in pools.items():
            if self.pool is not None and name != self.pool:
                continue
            e = math.log(max(self.signal(view, st), self.target / 100) / self.target)
            state = self._state.get(name)
            if state is None:                      # first decision: start from the pool as it is
                state = [math.log(max(st.size, 1)), e, e, now]
            x, e1, e2, t1 = state
            dt = now - t1
            step = self.kp * (e - e1)
            if dt > 0:
                if not (self.hold_while_starting and st.starting):
                    step += self.ki * dt * e
                step += self.kd * (e - 2 * e1 + e2) / dt
            x = min(max(x + step, lo), hi)
            self._state[name] = [x, e, e1, now]
            out[name] = int(math.floor(math.exp(x) + 0.5))
        return out


BUILTIN_AUTOSCALERS: dict[str, type[Autoscaler]] = {
    c.name: c for c in (Autoscaler, ConcurrencyAutoscaler, ThresholdAutoscaler, PidAutoscaler)}


@dataclass(frozen=True)
class AutoscaleSpec:
    """``ClusterConfig.autoscale``: which policy, how often, and the cold start."""

    policy: str = "concurrency"
    interval_s: float = 10.0
    cold_start_s: float = 60.0
    args: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> "AutoscaleSpec":
        where = "cluster.autoscale"
        check_fields(raw, {"policy", "interval_s", "cold_start_s", "args"}, where)
        check_types(raw, typing.get_type_hints(cls), where)
        args = dict(as_table(raw.get("args") or {}, f"{where}.args"))
        spec = construct(cls, {**{k: v for k, v in raw.items() if k != "args"}, "args": args})
        if not spec.interval_s > 0 or spec.cold_start_s < 0:
            raise UserError("interval_s must be > 0 and cold_start_s >= 0", where)
        spec.make()
        return spec

    def make(self) -> Autoscaler:
        return make_instance(self.policy, BUILTIN_AUTOSCALERS, "autoscaler", "cluster.autoscale.policy", Autoscaler,
                             self.args, "cluster.autoscale.args")
