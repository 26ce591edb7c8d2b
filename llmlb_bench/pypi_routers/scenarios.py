"""The router scenario suite: each scenario is a trace plus fleet conditions.

Why these: each one isolates a property a router is chosen for, with a control where one exists.

* ``prefix-0`` / ``-25`` / ``-50`` / ``-90``: a shared-prefix ladder. Every prompt starts with
  one of four group prefixes covering that share of its blocks; ``prefix-0`` (no reuse) is the
  control that shows what cache-aware routing costs when there is nothing to gain;
* ``sessions``: sticky multi-turn sessions (each turn's prompt extends the last one);
* ``bursty``: heavy-tailed prompt and answer lengths arriving in bursts;
* ``hetero``: backends of different speeds (``llmlb serve --speed``), where load-blind policies
  overload the slow ones;
* ``failover``: one backend killed a third of the way through the run and started again on the
  same port at two thirds.

Traces are built deterministically from a seed; lengths are kept small so that a scenario runs in
seconds against ``llmlb serve``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.metrics.cache_accounting import offered_tokens
from llmlb_bench.schema import trace_table

BLOCK = 16


@dataclass(frozen=True)
class Fleet:
    """Backends (``llmlb serve`` processes, one replica each) and what happens to them."""

    speeds: tuple[float, ...] = (4.0, 4.0, 4.0)
    #: (fraction of the trace's duration, backend index, "kill" | "start")
    events: tuple[tuple[float, int, str], ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    trace: pa.Table
    fleet: Fleet = field(default_factory=Fleet)


def _hashes(blocks: list[list[int]]) -> pa.Array:
    return pa.array(blocks, pa.list_(pa.uint64()))


def prefix_ladder(reuse: float, n: int, rate: float, seed: int) -> pa.Table:
    """Poisson arrivals, 512-token prompts whose first ``reuse`` share of blocks is one of four
    group prefixes (the rest unique), 32-token answers."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    blocks = 512 // BLOCK
    shared = round(reuse * blocks)
    groups = rng.integers(0, 4, n)
    hashes = [[(1 + int(g)) * 10**6 + k for k in range(shared)] + [10**9 + i * 1000 + k for k in range(blocks - shared)]
              for i, g in enumerate(groups)]
    return trace_table(arrival, 512, 32, "prefix", prefix_hashes=_hashes(hashes))


def sessions(n_sessions: int, turns: int, rate: float, seed: int) -> pa.Table:
    """Sessions start as a Poisson process; turn t comes 0.6-1.4 s after turn t-1 and its prompt
    is the whole conversation so far (previous prompt + answer + 64 new tokens)."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1 / rate, n_sessions))
    rows: list[tuple[float, int, int, list[int], int, int]] = []
    for s, t0 in enumerate(starts):
        t, chain = float(t0), [10**9 + s * 10**5 + k for k in range(8)]  # 128-token opening
        for turn in range(turns):
            rows.append((t, s, turn, list(chain), len(chain) * BLOCK, 32))
            chain += [10**9 + s * 10**5 + len(chain) + k for k in range(6)]  # answer + next question
            t += float(rng.uniform(0.6, 1.4))
    rows.sort(key=lambda r: r[0])
    arr, sid, turns_, hs, inp, out = zip(*rows)
    return trace_table(np.array(arr), np.array(inp), np.array(out), "sessions", session_id=np.array(sid, np.int64),
                       turn=np.array(turns_, np.int32), prefix_hashes=_hashes(list(hs)))


def bursty(n: int, seed: int) -> pa.Table:
    """Bursts of 80 req/s for 0.5 s every 2 s; lognormal lengths with heavy tails (prompt median
    200, sigma 1.2, 16..3000; answer median 24, sigma 1.0, 2..256)."""
    rng = np.random.default_rng(seed)
    per_burst = 40
    arrival = np.sort(np.concatenate([2.0 * b + rng.uniform(0, 0.5, per_burst) for b in range(-(-n // per_burst))]))[:n]
    inp = np.clip(rng.lognormal(np.log(200), 1.2, n), 16, 3000).astype(np.int32)
    out = np.clip(rng.lognormal(np.log(24), 1.0, n), 2, 256).astype(np.int32)
    return trace_table(arrival, inp, out, "bursty")


def poisson(n: int, rate: float, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return trace_table(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(64, 512, n), rng.integers(16, 64, n),
                       "poisson")


def suite(scale: float = 1.0, seed: int = 0) -> list[Scenario]:
    """All scenarios; ``scale`` multiplies request counts (0.2 for a smoke run)."""
    def k(n: int) -> int:
        return max(8, round(n * scale))

    out = [Scenario(f"prefix-{int(r * 100)}", f"{int(r * 100)}% of each prompt's blocks shared within 4 groups"
                    + (" (control)" if r == 0 else ""), prefix_ladder(r, k(240), 30.0, seed))
           for r in (0.0, 0.25, 0.5, 0.9)]
    out += [
        Scenario("sessions", "multi-turn sessions, each turn extends the conversation", sessions(k(40), 5, 6.0, seed)),
        Scenario("bursty", "heavy-tailed lengths in bursts of 80 req/s", bursty(k(240), seed)),
        Scenario("hetero", "backends at speeds 1, 2 and 6 (slow, medium, fast)", poisson(k(240), 30.0, seed),
                 Fleet(speeds=(1.0, 2.0, 6.0))),
        Scenario("failover", "backend 0 killed at 1/3 of the run, started again at 2/3", poisson(k(240), 30.0, seed),
                 Fleet(events=((1 / 3, 0, "kill"), (2 / 3, 0, "start")))),
    ]
    return out


def offered_hit_rate(trace: pa.Table, block: int = BLOCK) -> float:
    """The prompt-token share an ideal shared cache of unbounded size would serve (the cache
    accounting's *offered*, docs/prefix-cache.md), over all prompt tokens."""
    total = int(pc.sum(trace.column("input_tokens")).as_py() or 0)
    return int(offered_tokens(trace, block).sum()) / total if total else 0.0
