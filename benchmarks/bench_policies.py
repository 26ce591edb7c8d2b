"""Cost of one routing decision for every built-in policy.

``choose`` runs once per request (up to a million times per simulated run),
so its cost bounds the simulator's speed. This drives each policy with a
chat-like stream (shared system prompts plus growing conversations, 16-token
prefix blocks, random completions) over 8 and 64 targets and prints the mean
microseconds of CPU time per decision, including ``on_complete``.

    python benchmarks/bench_policies.py [--requests 50000]
"""

from __future__ import annotations

import argparse
import random
import time

from llmlb_bench.errors import UserError
from llmlb_bench.policies import BUILTIN, HOLD, REJECT, RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.base import on_dispatch, on_finish, set_now


def stream(n: int, seed: int = 0) -> list[RouteRequest]:
    """Requests whose prompts share one of 20 system prompts and extend one of 2,000 conversations."""
    rng = random.Random(seed)
    turns: dict[int, list[int]] = {}
    out = []
    for i in range(n):
        session = rng.randrange(2000)
        history = turns.setdefault(session, [hash((-1, session % 20, k)) for k in range(40)])
        history.extend(hash((session, len(history), k)) for k in range(rng.randrange(2, 20)))
        prompt = history[:]
        out.append(RouteRequest(i, i * 0.01, 16 * len(prompt), rng.randrange(10, 800), tenant=f"t{session % 7}",
                                session_id=session, prefix_hashes=prompt))
    return out


def bench(name: str, requests: list[RouteRequest], n_targets: int) -> float:
    rng = random.Random(1)
    view = View([TargetInfo(f"r{i}") for i in range(n_targets)])
    policy = make_policy(name, {}, seed=0)
    inflight: list[tuple[RouteRequest, int]] = []
    start = time.process_time()
    for r in requests:
        set_now(view, r.arrival_s)
        target = policy.choose(r, view)
        if target not in (HOLD, REJECT):
            on_dispatch(view, target, r)
            inflight.append((r, target))
        if len(inflight) > 40 * n_targets or (inflight and rng.random() < 0.9):
            done, t = inflight.pop(rng.randrange(len(inflight)))
            on_finish(view, t, done)
            policy.on_complete(done, t, view)
            while (item := policy.release(view)) is not None and item[1] >= 0:
                on_dispatch(view, item[1], item[0])
                inflight.append(item)
    return (time.process_time() - start) / len(requests) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args()
    requests = stream(args.requests)
    blocks = sum(len(r.prefix_hashes) for r in requests) / len(requests)
    print(f"{args.requests:,} requests, {blocks:.0f} prefix blocks per prompt on average")
    print(f"{'policy':<22}{'8 targets':>12}{'64 targets':>12}   (CPU microseconds per decision)")
    for name in BUILTIN:
        try:
            make_policy(name, {}, seed=0)
        except UserError as exc:   # a policy that needs a file of its own (learned: path=FILE) is listed, not timed
            print(f"{name:<22}  not timed: {exc.line()}")
            continue
        print(f"{name:<22}{bench(name, requests, 8):>12.1f}{bench(name, requests, 64):>12.1f}")


if __name__ == "__main__":
    main()
