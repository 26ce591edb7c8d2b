"""The cluster simulation: arrivals, routing and replica events in one time-ordered loop.

Three event sources are merged by time: trace arrivals (in arrival order),
replica run boundaries (a heap with one live entry per busy replica; a moved
boundary bumps the replica's ``version`` and leaves a stale entry behind),
and series sampling ticks. Work per event is O(log replicas) plus the
policy's own cost, and the number of events grows with requests and batch
changes, not with tokens.

Routing goes through the shared :class:`~llmlb_bench.policies.View`: the
simulator keeps the router's own accounting (``on_dispatch`` / ``on_finish``)
and refreshes each replica's waiting / running / KV-usage signals at every
one of its boundaries and at every dispatch, i.e. the router sees fresh
signals (``signal_time`` = now).
"""

from __future__ import annotations

import math
import time
from heapq import heappop, heappush
from typing import Any

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.policies import RouteRequest, TargetInfo, View
from llmlb_bench.schema import TRACE
from llmlb_bench.sim.config import ClusterConfig
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.replica import Replica, Request
from llmlb_bench.sim.results import RequestRecorder
from llmlb_bench.sim.series import SeriesSampler


def build_replicas(cfg: ClusterConfig) -> list[Replica]:
    """The replicas of ``cfg``, named ``r0``, ``r1``, ..."""
    cost = CostModel(cfg.model_spec, cfg.gpu_spec, cfg.tp, max_num_batched_tokens=cfg.max_num_batched_tokens,
                     max_num_seqs=cfg.max_num_seqs, gpu_memory_utilization=cfg.gpu_memory_utilization,
                     block_size=cfg.block_size)
    return [Replica(i, f"r{i}", cost, max_num_seqs=cfg.max_num_seqs,
                    max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
                    chunked_prefill=cfg.chunked_prefill) for i in range(cfg.replicas)]


def _strings(col: pa.ChunkedArray) -> list[str]:
    """A dictionary/string column as Python strings, decoding each distinct value once."""
    arr = col.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        values = arr.dictionary.to_pylist()
        return [values[i] for i in arr.indices.fill_null(0).to_numpy(zero_copy_only=False).tolist()]
    return arr.fill_null("default").to_pylist()


def simulate(trace: pa.Table, cfg: ClusterConfig, policy: Any, run: Any, seed: int = 0) -> dict[str, Any]:
    """Simulate ``trace`` on the cluster ``cfg`` routed by ``policy``; stream rows into ``run``.

    ``run`` has ``.requests`` and ``.series`` sinks (a :class:`~llmlb_bench.store.RunStore`).
    Every trace row yields one REQUESTS row. The simulation is deterministic: it
    draws no random numbers, so the same trace, config and policy give identical
    rows; ``seed`` is recorded for the stochastic extensions (failure injection).
    Returns a summary dict for run.json.
    """
    wall0 = time.perf_counter()
    trace = TRACE.conform(trace, "trace")
    n = trace.num_rows
    replicas = build_replicas(cfg)
    cost = replicas[0].cost
    view = View(targets=[TargetInfo(name=r.name, pool="default", gpu=cfg.gpu, capacity=1.0) for r in replicas])
    limit = cfg.context_limit

    rid = trace.column("request_id").to_numpy().tolist()
    arrival = trace.column("arrival_s").to_numpy().astype(np.float64)
    inp = trace.column("input_tokens").to_numpy().tolist()
    out = trace.column("output_tokens").to_numpy().tolist()
    tenant = _strings(trace.column("tenant"))
    slo = _strings(trace.column("slo_class"))
    prio = trace.column("priority").fill_null(0).to_numpy().tolist()
    session_col = trace.column("session_id")
    session = (session_col.fill_null(-1).to_numpy().tolist() if session_col.null_count < n else None)
    order = np.lexsort((trace.column("request_id").to_numpy(), arrival)).tolist()
    sent_s = arrival.copy()

    recorder = RequestRecorder(trace, run.requests, replicas, sent_s)
    sampler = SeriesSampler(run.series, replicas, cfg.series_interval_s)
    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    events = 0
    done: list[Request] = []
    n_targets = len(replicas)

    def finish(r: int, reqs: list[Request]) -> None:
        for req in reqs:
            view.on_finish(r, req.route)
            policy.on_complete(req.route, r, view)
            recorder.finished(r, req)
        reqs.clear()

    def signals(rep: Replica, t: float) -> None:
        i = rep.index
        view.waiting[i] = len(rep.waiting)
        view.running[i] = len(rep.running)
        view.kv_usage[i] = rep.used / rep.total_blocks
        view.signal_time[i] = t

    inf = math.inf
    k = 0
    while True:
        while heap and heap[0][3] != replicas[heap[0][2]].version:
            heappop(heap)
        th = heap[0][0] if heap else inf
        ta = arrival[order[k]] if k < n else inf
        t = ta if ta <= th else th
        if t == inf:
            break
        if t >= sampler.next_t:
            sampler.sample_until(t)
        events += 1
        if ta <= th:
            row = order[k]
            k += 1
            sess = session[row] if session is not None else -1
            route = RouteRequest(rid[row], ta, inp[row], out[row], tenant[row], None if sess < 0 else sess,
                                 prio[row], slo[row])
            view.now = ta
            i = policy.choose(route, view)
            if not (isinstance(i, int) and 0 <= i < n_targets):
                raise UserError(f"policy {getattr(policy, 'name', policy)!r} chose target {i!r}; "
                                f"there are {n_targets} targets (0..{n_targets - 1})", "--policy")
            view.on_dispatch(i, route)
            rep = replicas[i]
            error = _admission_error(inp[row], out[row], limit, rep, cfg)
            if error:
                view.on_finish(i, route)
                policy.on_complete(route, i, view)
                recorder.reject(row, rep.name, error)
                continue
            nt = rep.enqueue(Request(row, route, inp[row], out[row]), ta)
            if nt is not None:
                seq += 1
                heappush(heap, (nt, seq, i, rep.version))
            signals(rep, ta)
        else:
            _, _, i, _ = heappop(heap)
            rep = replicas[i]
            nt = rep.boundary(done)
            if done:
                finish(i, done)
            if nt is not None:
                seq += 1
                heappush(heap, (nt, seq, i, rep.version))
            signals(rep, th)
    end = float(max((r.t for r in replicas), default=0.0))
    sampler.sample_until(end, final=True)
    recorder.flush()
    sampler.flush()
    return {
        "sim_time_s": end,
        "wall_s": time.perf_counter() - wall0,
        "requests": n,
        "ok": recorder.ok,
        "rejected": recorder.rejected,
        "events": events,
        "steps": sum(r.step for r in replicas),
        "preemptions": sum(r.preemptions for r in replicas),
        "kv_blocks_per_replica": replicas[0].total_blocks if replicas else 0,
        "kv_tokens_per_replica": (replicas[0].total_blocks * cfg.block_size) if replicas else 0,
        "weights_gib_per_gpu": cost.weight_bytes / (1 << 30),
        "seed": seed,
    }


def _admission_error(prompt: int, output: int, limit: int, rep: Replica, cfg: ClusterConfig) -> str | None:
    """Why a request can never be served by ``rep`` (vLLM rejects these up front), or None."""
    if prompt < 1 or output < 1:
        return f"input_tokens ({prompt}) and output_tokens ({output}) must both be >= 1"
    total = prompt + output
    if total > limit:
        return f"input + output = {total} tokens exceeds the maximum model length {limit}"
    if not rep.fits(total - 1):
        return (f"needs {-(-(total - 1) // cfg.block_size)} KV blocks, more than the replica's "
                f"{rep.total_blocks}")
    if not cfg.chunked_prefill and total - 1 > cfg.max_num_batched_tokens:
        return (f"{total - 1} tokens to prefill exceed max_num_batched_tokens "
                f"{cfg.max_num_batched_tokens} with chunked prefill off")
    return None
