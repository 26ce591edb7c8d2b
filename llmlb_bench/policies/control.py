"""Feedback controllers as routing policies: act on the measured error between TTFT and its target.

The other admission policies are open loop: a fixed in-flight limit (``admission_control``,
``fcfs_queue``) or a predicted TTFT (``predicted_ttft``). These close the loop on what the
backend measured: every backend sets ``RouteRequest.outcome`` (first token, end, status) just
before ``Router.complete``, so ``on_complete`` sees each request's real TTFT in the simulator,
``llmlb serve``, the replayer and ``llmlb route`` alike.

The controlled signal is the TTFT a request saw *from its dispatch to a target* (the router
remembers when it sent each request): that is the part a concurrency limit moves. The wait in
the router's own queue is bounded separately (``max_queue``, ``max_wait_s``), since holding more
requests longer can never bring a request's TTFT from arrival down.

* ``pi_admission``: a PI controller on a sliding-window TTFT percentile of completed requests,
  whose output is the fleet's admitted concurrency (requests in flight), wrapped around an inner
  routing policy that picks the target of each admitted request. Discrete time, velocity form
  (Åström & Hägglund, *Advanced PID Control*, ISA 2006, ch. 3 and 13: the increment form, with the
  output clamped, cannot wind up). Requests above the limit are held and released as completions
  and the loop allow; past ``max_queue`` held they are rejected.
* ``concurrency_limit``: a limit per target learned from that target's TTFTs, as TCP learns its
  congestion window (AIMD: Chiu & Jain, Computer Networks and ISDN Systems 17, 1989; Jacobson,
  SIGCOMM 1988) or as Netflix's concurrency-limits library does for RPC servers (``AIMDLimit``,
  ``Gradient2Limit``, updated once per sampling window as its ``WindowedLimit``); requests go to
  the least loaded target relative to its limit, and wait at the router while every target is at
  its limit.

Both update once per sampling period ``period_s`` on the period's boundaries ``k x period_s``
(a tick is handled at the first hook call at or after it, with exactly the samples that arrived
before it), so a run is deterministic and the controller's behaviour does not depend on how
often the backend calls it. ``history`` keeps each update (time, measurement, output) for plots
and tests.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from llmlb_bench.policies.base import HOLD, REJECT, Decision, Policy, Released, RouteRequest, View
from llmlb_bench.policies.router import PolicyError
from llmlb_bench.policies.select import argmin_healthy


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (``numpy.percentile``'s default, as the report's)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class _Controlled(Policy):
    """What both controllers share: the router-side FIFO queue, dispatch times, measured TTFTs, ticks.

    Subclasses implement ``_target(req, view)`` (a target index, or -1 when none may take a request
    now), ``_tick(t, view)`` (one controller update at the period boundary ``t``) and ``_sample``
    (one completed request's measurement)."""

    def __init__(self, period_s: float, max_queue: int, max_wait_s: float) -> None:
        if not period_s > 0 or max_queue < 0 or max_wait_s < 0:
            raise ValueError("need period_s > 0, max_queue >= 0 and max_wait_s >= 0")
        self.period_s, self.max_queue, self.max_wait_s = period_s, max_queue, max_wait_s
        self._queue: deque[RouteRequest] = deque()
        self._sent_at: dict[int, float] = {}
        self._now = 0.0
        self._next_tick = period_s
        #: one entry per controller update: (tick time, measured signal or None, output)
        self.history: list[tuple[float, float | None, float]] = []
        #: requests held at some point during the current period (the limit was binding)
        self._held_in_period = False

    # ---- hooks the subclasses fill ---------------------------------------------------------------

    def _target(self, req: RouteRequest, view: View) -> int:
        raise NotImplementedError

    def _tick(self, t: float, view: View) -> None:
        raise NotImplementedError

    def _sample(self, t: float, target: int, ttft: float | None, ok: bool, view: View) -> None:
        raise NotImplementedError

    # ---- time --------------------------------------------------------------------------------------

    def _advance(self, t: float, view: View) -> None:
        """Move the clock to ``t`` (never back), running every period boundary passed on the way."""
        if t > self._now:
            self._now = t
        while self._now >= self._next_tick:
            self._tick(self._next_tick, view)
            self._held_in_period = bool(self._queue)
            self._next_tick += self.period_s

    # ---- the Policy protocol ---------------------------------------------------------------------

    def choose(self, req: RouteRequest, view: View) -> Decision:
        self._advance(view.now, view)
        if not self._queue:
            target = self._target(req, view)
            if target >= 0:
                self._sent_at[req.request_id] = self._now
                return target
        if len(self._queue) >= self.max_queue:
            return REJECT
        self._queue.append(req)
        self._held_in_period = True
        return HOLD

    def release(self, view: View) -> Released | None:
        self._advance(view.now, view)
        if not self._queue:
            return None
        head = self._queue[0]
        if self.max_wait_s and self._now - head.arrival_s > self.max_wait_s:
            self._queue.popleft()
            return head, REJECT
        target = self._target(head, view)
        if target < 0:
            return None
        self._queue.popleft()
        self._sent_at[head.request_id] = self._now
        return head, target

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        outcome = req.outcome
        sent = self._sent_at.pop(req.request_id, None)
        end = outcome.end_s if outcome is not None else view.now
        self._advance(end, view)
        if outcome is None or sent is None:
            return
        first = outcome.first_token_s
        ttft = first - sent if first is not None and outcome.status == "ok" else None
        self._sample(end, target, ttft, outcome.status == "ok", view)

    @property
    def held(self) -> int:
        """Requests waiting at the router now."""
        return len(self._queue)


class PiAdmission(_Controlled):
    """PI control of the fleet's admitted concurrency on a measured TTFT percentile.

    Every ``period_s`` (tick k at t_k = k x period_s):

    * y_k = the ``quantile`` of the TTFTs (from dispatch) of requests that completed in
      [t_k - window_s, t_k); no completion in the window: no update (nothing was measured);
    * e_k = (target_ttft_s - y_k) / target_ttft_s, the relative error (positive: room to spare);
    * L_k = clamp(L_{k-1} + kp (e_k - e_{k-1}) + ki period_s e_k, min_limit, max_limit).

    The velocity form has no integrator state apart from L itself, so clamping L is the
    anti-windup. A second guard keeps the limit from growing while it is not what holds
    demand back (no request waited at the router during the period): then L may not rise, and it
    falls to ``headroom`` x the period's peak in flight if it stood above that (TCP's congestion
    window validation for application-limited periods, RFC 7661; the "inflight * 2 >= limit"
    test of Netflix's limits), so that a load step meets a limit near the load, not one inflated
    through an idle stretch.

    A request is admitted while fewer than ``ceil(L)`` requests it admitted are in flight and
    nothing is held before it; the ``inner`` policy
    (with ``inner_args``, ``key=value`` pairs separated by commas) picks its target.

    On a saturated FIFO server that serves one request at a time in S seconds, with a prefill of
    p, a request admitted at concurrency n waits for the n - 1 ahead of it: y = (n - 1) S + p.
    With kp = 0 the loop is then L_{k+1} - L* = (1 - ki period_s S / target) (L_k - L*), a
    geometric approach to L* = (target - p) / S + 1 at rate 1 - ki period_s S / target
    (``tests/test_control_policies.py`` checks the simulator against it).
    """

    name = "pi_admission"
    summary = "PI control of admitted concurrency on a windowed TTFT percentile; holds the rest; inner policy routes."
    params = {
        "inner": ("least_outstanding", "routing policy that picks the target of an admitted request"),
        "inner_args": ("", "the inner policy's parameters, key=value separated by commas"),
        "target_ttft_s": (0.5, "TTFT (from dispatch) the percentile is held at; leave room for the router wait"),
        "quantile": (0.9, "percentile of the window's TTFTs that is controlled (0.5 = median)"),
        "window_s": (5.0, "sliding window of completions the percentile is taken over (s)"),
        "period_s": (1.0, "sampling period: one controller update per period (s)"),
        "kp": (4.0, "proportional gain: requests of limit per unit of relative error"),
        "ki": (8.0, "integral gain: requests of limit per unit of relative error per second"),
        "initial_limit": (64.0, "admitted concurrency at the start"),
        "min_limit": (1.0, "lowest admitted concurrency"),
        "max_limit": (4096.0, "highest admitted concurrency"),
        "headroom": (2.0, "while not binding, the limit falls to headroom x the period's peak in flight"),
        "max_queue": (4096, "requests held at the router beyond which new ones are rejected"),
        "max_wait_s": (0.0, "reject a held request that waited longer than this (0 = never)"),
        "seed": (0, "seed of a randomised inner policy (the run's seed unless set)"),
    }

    def __init__(self, inner: str = "least_outstanding", inner_args: str = "", target_ttft_s: float = 0.5,
                 quantile: float = 0.9, window_s: float = 5.0, period_s: float = 1.0, kp: float = 4.0,
                 ki: float = 8.0, initial_limit: float = 64.0, min_limit: float = 1.0, max_limit: float = 4096.0,
                 headroom: float = 2.0, max_queue: int = 4096, max_wait_s: float = 0.0, seed: int = 0) -> None:
        super().__init__(period_s, max_queue, max_wait_s)
        if not target_ttft_s > 0 or not 0 <= quantile <= 1 or not window_s > 0:
            raise ValueError("need target_ttft_s > 0, 0 <= quantile <= 1 and window_s > 0")
        if kp < 0 or ki < 0 or not 0 < min_limit <= initial_limit <= max_limit or headroom < 1:
            raise ValueError("need kp, ki >= 0, 0 < min_limit <= initial_limit <= max_limit and headroom >= 1")
        self.inner, self.inner_args = inner, inner_args
        self.target_ttft_s, self.quantile, self.window_s = target_ttft_s, quantile, window_s
        self.kp, self.ki = kp, ki
        self.initial_limit, self.min_limit, self.max_limit, self.headroom = (initial_limit, min_limit, max_limit,
                                                                             headroom)
        self.seed = seed
        self._inner = make_inner(inner, inner_args, seed)
        self.limit = initial_limit
        self._error: float | None = None          # e_{k-1}; None before the first measurement
        self._window: deque[tuple[float, float]] = deque()   # (completion time, TTFT)
        self._in_flight = 0
        self._peak = 0

    def _target(self, req: RouteRequest, view: View) -> int:
        if self._in_flight >= math.ceil(self.limit - 1e-9):
            return -1
        d = self._inner.choose(req, view)
        if isinstance(d, int):
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            return d
        raise PolicyError(f"pi_admission: the inner policy {self.inner!r} must pick a target, not "
                          f"{'reject' if d is REJECT else 'hold'} (admission is the controller's)")

    def _sample(self, t: float, target: int, ttft: float | None, ok: bool, view: View) -> None:
        if ttft is not None:
            self._window.append((t, ttft))

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        if req.request_id in self._sent_at:
            self._in_flight -= 1
        super().on_complete(req, target, view)
        self._inner.on_complete(req, target, view)

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        return self._inner.predicted_cached(req, target, view)

    def _tick(self, t: float, view: View) -> None:
        window = self._window
        while window and window[0][0] < t - self.window_s:
            window.popleft()
        inside = [v for s, v in window if s < t]
        y = _quantile(inside, self.quantile) if inside else None
        limit = self.limit
        if y is not None:
            e = (self.target_ttft_s - y) / self.target_ttft_s
            prev = e if self._error is None else self._error
            step = self.kp * (e - prev) + self.ki * self.period_s * e
            if not self._held_in_period:       # the limit did not bind: it must not grow (anti-windup)
                step = min(step, 0.0)
            limit += step
            self._error = e
        if not self._held_in_period:
            limit = min(limit, max(self.headroom * self._peak, self.min_limit))
        self.limit = min(max(limit, self.min_limit), self.max_limit)
        self._peak = self._in_flight
        self.history.append((t, y, self.limit))


class ConcurrencyLimit(_Controlled):
    """A concurrency limit per target, learned from that target's measured TTFTs.

    Every ``period_s``, for each target with completions in the period (TTFT from dispatch):

    * ``algorithm="aimd"`` (Netflix ``AIMDLimit``; TCP Reno's window): if any request failed or
      had a TTFT above ``target_ttft_s``, L <- max(min_limit, min(L - 1, backoff x L)); else, if
      the limit was in use (peak in flight >= L / 2: not application-limited), L <- L + increase;
    * ``algorithm="gradient2"`` (Netflix ``Gradient2Limit``): short = the period's mean TTFT,
      long = its exponential average over ``long_window`` periods (pulled down by 10% whenever it
      exceeds twice the short one); gradient = clamp(tolerance x long / short, 0.5, 1);
      L <- (1 - smoothing) L + smoothing (gradient L + queue_size), unless application-limited.

    Requests go to the healthy target with the smallest in-flight / limit among those below their
    limit; none below: held at the router (rejected past ``max_queue``).
    """

    name = "concurrency_limit"
    summary = "Per-target in-flight limit learned from measured TTFT (AIMD or Gradient2); routes around full targets."
    params = {
        "algorithm": ("aimd", "aimd or gradient2"),
        "target_ttft_s": (1.0, "aimd: a TTFT (from dispatch) above this counts as congestion"),
        "period_s": (1.0, "sampling period: one limit update per target per period (s)"),
        "initial_limit": (16.0, "each target's limit at the start"),
        "min_limit": (1.0, "lowest limit"),
        "max_limit": (1024.0, "highest limit"),
        "backoff": (0.9, "aimd: multiplicative decrease factor on congestion"),
        "increase": (1.0, "aimd: additive increase per period without congestion"),
        "tolerance": (1.5, "gradient2: TTFT growth over the long-term average tolerated before the limit falls"),
        "smoothing": (0.2, "gradient2: weight of the new estimate"),
        "queue_size": (4.0, "gradient2: requests of growth allowed per update"),
        "long_window": (60, "gradient2: periods the long-term TTFT average spans"),
        "max_queue": (4096, "requests held at the router beyond which new ones are rejected"),
        "max_wait_s": (0.0, "reject a held request that waited longer than this (0 = never)"),
    }

    def __init__(self, algorithm: str = "aimd", target_ttft_s: float = 1.0, period_s: float = 1.0,
                 initial_limit: float = 16.0, min_limit: float = 1.0, max_limit: float = 1024.0,
                 backoff: float = 0.9, increase: float = 1.0, tolerance: float = 1.5, smoothing: float = 0.2,
                 queue_size: float = 4.0, long_window: int = 60, max_queue: int = 4096,
                 max_wait_s: float = 0.0) -> None:
        super().__init__(period_s, max_queue, max_wait_s)
        if algorithm not in ("aimd", "gradient2"):
            raise ValueError(f"algorithm must be aimd or gradient2 (got {algorithm!r})")
        if not target_ttft_s > 0 or not 0 < min_limit <= initial_limit <= max_limit:
            raise ValueError("need target_ttft_s > 0 and 0 < min_limit <= initial_limit <= max_limit")
        if not 0.5 <= backoff < 1 or increase <= 0 or tolerance < 1 or not 0 < smoothing <= 1:
            raise ValueError("need 0.5 <= backoff < 1, increase > 0, tolerance >= 1 and 0 < smoothing <= 1")
        if queue_size < 0 or long_window < 1:
            raise ValueError("need queue_size >= 0 and long_window >= 1")
        self.algorithm, self.target_ttft_s = algorithm, target_ttft_s
        self.initial_limit, self.min_limit, self.max_limit = initial_limit, min_limit, max_limit
        self.backoff, self.increase = backoff, increase
        self.tolerance, self.smoothing, self.queue_size, self.long_window = tolerance, smoothing, queue_size, long_window
        self.limits: list[float] = []
        self._sum: list[float] = []       # this period, per target: TTFT sum, count, congestion seen, peak in flight
        self._n: list[int] = []
        self._congested: list[bool] = []
        self._peak: list[int] = []
        self._long: list[float | None] = []
        self._tie = 0

    def _ensure(self, n: int) -> None:
        k = n - len(self.limits)
        if k > 0:       # targets only ever get appended (autoscaling)
            self.limits += [self.initial_limit] * k
            self._sum += [0.0] * k
            self._n += [0] * k
            self._congested += [False] * k
            self._peak += [0] * k
            self._long += [None] * k

    def _target(self, req: RouteRequest, view: View) -> int:
        self._ensure(len(view))
        out = view.outstanding_requests
        load = [out[i] / self.limits[i] if out[i] < math.ceil(self.limits[i] - 1e-9) else math.inf
                for i in range(len(view))]
        self._tie += 1
        i = argmin_healthy(load, view, self._tie)
        if load[i] == math.inf or not view.healthy[i]:
            return -1
        self._peak[i] = max(self._peak[i], out[i] + 1)
        return i

    def _sample(self, t: float, target: int, ttft: float | None, ok: bool, view: View) -> None:
        self._ensure(len(view))
        if ttft is None:
            self._congested[target] |= not ok
            return
        self._sum[target] += ttft
        self._n[target] += 1
        self._congested[target] |= ttft > self.target_ttft_s

    def _tick(self, t: float, view: View) -> None:
        self._ensure(len(view))
        out = view.outstanding_requests
        for i, limit in enumerate(self.limits):
            busy = 2 * self._peak[i] >= limit
            if self.algorithm == "aimd":
                if self._congested[i]:
                    limit = min(limit - 1, self.backoff * limit)
                elif busy and self._n[i]:
                    limit += self.increase
            elif self._n[i]:
                short = self._sum[i] / self._n[i]
                long = self._long[i]
                alpha = 2.0 / (self.long_window + 1)
                long = short if long is None else (1 - alpha) * long + alpha * short
                if long > 2 * short:
                    long *= 0.9
                self._long[i] = long
                if busy:
                    gradient = max(0.5, min(1.0, self.tolerance * long / short)) if short > 0 else 1.0
                    limit = (1 - self.smoothing) * limit + self.smoothing * (gradient * limit + self.queue_size)
            self.limits[i] = min(max(limit, self.min_limit), self.max_limit)
            self._sum[i], self._n[i], self._congested[i], self._peak[i] = 0.0, 0, False, out[i]
        self.history.append((t, None, sum(self.limits)))


#: builds a policy from its name, its ``key=value,...`` parameters and a seed; the registry sets it
#: when it loads (it lists the controllers themselves, so importing it from here would be a cycle)
inner_factory: Callable[[str, str, int], Policy] | None = None


def make_inner(name: str, args: str, seed: int) -> Policy:
    """The policy a controller wraps, from its name and ``key=value,key=value`` parameters."""
    if name in ("pi_admission", "concurrency_limit"):
        raise ValueError(f"inner policy {name!r} is itself a controller; wrap a routing policy")
    if inner_factory is None:
        raise RuntimeError("llmlb_bench.policies.registry sets inner_factory when imported; it was not")
    return inner_factory(name, args, seed)
