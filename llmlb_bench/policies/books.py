"""The View's books as compiled code: the router's own accounting and the built-in policies' picks.

Every routed request is booked twice (sent, ended) and decided once. Interpreted, those were three
Python calls per request around a few list operations, a fifth of the compiled simulator's time
(docs/simulator.md, "fifth step"). This module is compiled with the simulator's core
(compiled_core.py), so that the :class:`~llmlb_bench.policies.router.Router` reaches all three
natively:

* :class:`Ledger` holds the very lists of a view's :class:`~llmlb_bench.policies.base.Books` (they
  are changed in place, never replaced) and books a dispatch or an end: the counts, and the tuple of
  counts the policies read (``View.outstanding_requests``);
* a :class:`Pick` is the decision of a built-in policy (least outstanding, fewest waiting, round
  robin, random) over a ledger's lists, state included (the tie rotation, the next target, the
  random stream). The policy's ``choose`` asks its pick (``base.Picked``), and a Router whose policy
  keeps that ``choose`` asks the pick directly: one implementation, the same decision either way;
* :func:`argmin` is the scan every load-aware policy shares (``select.argmin_healthy`` calls it
  with a view's tuples); :func:`fewest` is the same rule over typed lists, for the picks.

It imports nothing of the package (``base.py`` imports it), and types what users may hand it loosely
enough that a user's ``View`` of plain sequences still works: health is any truthy value, and the
values :func:`argmin` compares are whatever the caller compares.
"""

from __future__ import annotations

from random import Random
from typing import TYPE_CHECKING, Any, Final, Sequence, Sized, TypeVar

if TYPE_CHECKING:
    from _typeshed import SupportsDunderLT

    #: what :func:`argmin` compares: any values ordered by ``<`` (counts, loads, scores), as typeshed types ``min``
    _V = TypeVar("_V", bound=SupportsDunderLT[Any])

#: what a :class:`Fewest` pick counts per target
REQUESTS: Final = 0      #: the router's own in-flight requests (exact)
QUEUE: Final = 1         #: waiting + running as the targets last reported (scraped)
WAITING: Final = 2       #: waiting (queued, not yet running) as last reported: Vidur's ``lor``


def argmin(values: Sequence[_V], healthy: Sequence[object], start: int) -> int:
    """Index of the smallest value among healthy targets; ties go to the first healthy index at or
    after ``start``. With no healthy target, ``start % n``.

    When every target is healthy and ``values`` is a list or tuple (the usual case), the builtins
    ``all``, ``min`` and ``index`` do the scan in C; without raising when the first minimum lies
    before ``start`` (compiled, a raised ``ValueError`` cost more than the scan)."""
    n = len(healthy)
    if n and isinstance(values, (list, tuple)) and all(healthy):
        m = min(values)
        i = values.index(m)
        s = start % n
        return i if i >= s or m not in values[s:] else values.index(m, s)
    best = -1
    for k in range(n):
        i = (start + k) % n
        if healthy[i] and (best < 0 or values[i] < values[best]):
            best = i
    return best if best >= 0 else start % n


def fewest(counts: list[int], healthy: list[bool], start: int) -> int:
    """:func:`argmin` over a ledger's counts, the same rule in one native pass: the picks' lists are
    typed, so this loop runs on unboxed ints, several times faster than ``min`` and ``index`` called
    through the C API (a generic call each, measured: docs/simulator.md, "fifth step")."""
    n = len(healthy)
    s = start % n
    best = -1
    low = 0
    for i in range(s, n):
        if healthy[i] and (best < 0 or counts[i] < low):
            best, low = i, counts[i]
    for i in range(s):
        if healthy[i] and (best < 0 or counts[i] < low):
            best, low = i, counts[i]
    return best if best >= 0 else s


class Ledger:
    """A view's per-target lists that routing reads and books (shared with its ``Books``), and where
    the view publishes what policies read as attributes (``published``: the view's ``__dict__``)."""

    def __init__(self, targets: Sized, outstanding: list[int], tokens: list[int], healthy: list[bool],
                 waiting: list[int], running: list[int], published: dict[str, object],
                 snapshots: dict[str, tuple[object, ...]]) -> None:
        #: the targets (counted: the load-oblivious picks cycle or draw over them)
        self.targets = targets
        self.outstanding = outstanding
        self.tokens = tokens
        self.healthy = healthy
        self.waiting = waiting
        self.running = running
        self.published = published
        self.snapshots = snapshots

    def sent(self, i: int, tokens: int) -> None:
        """A request of ``tokens`` (prompt + requested output) left for target ``i``."""
        o, t = self.outstanding, self.tokens
        o[i] = o[i] + 1     # not ``+=``: compiled, an augmented item assignment is a generic call
        t[i] = t[i] + tokens
        self.published["outstanding_requests"] = tuple(o)
        if "outstanding_tokens" in self.snapshots:   # a native look-up; ``pop`` is a generic method call
            del self.snapshots["outstanding_tokens"]

    def ended(self, i: int, tokens: int) -> None:
        """A request of ``tokens`` sent to target ``i`` ended there (any status)."""
        o, t = self.outstanding, self.tokens
        o[i] = o[i] - 1
        t[i] = t[i] - tokens
        self.published["outstanding_requests"] = tuple(o)
        if "outstanding_tokens" in self.snapshots:   # a native look-up; ``pop`` is a generic method call
            del self.snapshots["outstanding_tokens"]


class Pick:
    """A built-in policy's decision over a ledger, with the policy's state; see the module docstring."""

    def choose(self, ledger: Ledger) -> int:
        raise NotImplementedError


class Fewest(Pick):
    """The healthy target with the fewest of ``load`` (:data:`REQUESTS`, :data:`QUEUE`,
    :data:`WAITING`); ties rotate with a counter advanced at each decision (``rotate``), else go to
    the lowest index."""

    def __init__(self, load: int = REQUESTS, rotate: bool = True) -> None:
        """Defaults for pickle only (a process-pool backend ships the policy): it makes the object
        with no arguments, then restores every attribute."""
        self.load = load
        self.rotate = rotate
        self.tie = 0

    def choose(self, ledger: Ledger) -> int:
        start = 0
        if self.rotate:
            self.tie += 1
            start = self.tie
        if self.load == REQUESTS:
            return fewest(ledger.outstanding, ledger.healthy, start)
        if self.load == WAITING:
            return fewest(ledger.waiting, ledger.healthy, start)
        return fewest([w + r for w, r in zip(ledger.waiting, ledger.running)], ledger.healthy, start)


class Cycle(Pick):
    """The next healthy target in cyclic order (round robin)."""

    def __init__(self) -> None:
        self.next = 0

    def choose(self, ledger: Ledger) -> int:
        healthy = ledger.healthy
        n = len(ledger.targets)
        for _ in range(n):
            i = self.next % n
            self.next += 1
            if healthy[i]:
                return i
        return self.next % n


class Uniform(Pick):
    """A uniformly random healthy target from the policy's own stream."""

    def __init__(self, seed: int = 0) -> None:
        """The default for pickle only, as :class:`Fewest`'s."""
        self.rng = Random(seed)

    def choose(self, ledger: Ledger) -> int:
        healthy = ledger.healthy
        n = len(ledger.targets)
        i = self.rng.randrange(n)
        if healthy[i]:
            return i
        live = [j for j in range(n) if healthy[j]]  # only on the rare unhealthy path
        return self.rng.choice(live) if live else i
