"""Prefix-cache accounting (llmlb_bench.metrics.cache_accounting): where each request's hits went.

Each loss is made on purpose in the simulator and checked against what the trace and the routing
say it must be; every run's buckets must add up to the offered reuse exactly, per request.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cli
from sim_helpers import TINY_GPU
from shape_check import mismatches
from test_metrics_docs import find

from llmlb_bench.experiment import simulate_run
from llmlb_bench.metrics.cache_accounting import LOSSES, _SPREAD, account, accounting_summary
from llmlb_bench.metrics.run_figures import PrefixCacheFigures
from llmlb_bench.schema import trace_table, write_trace
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.store.views import Catalog

BLOCK = 16


def _trace(tmp_path: Path, groups: list[int], shared_blocks: int, own_blocks: int, gap_s: float,
           output_tokens: int = 8, extra_tokens: int = 5) -> tuple[pa.Table, Path]:
    """One request every ``gap_s``; request i shares ``shared_blocks`` blocks with its group."""
    hashes = [[10_000 * (g + 1) + k for k in range(shared_blocks)] + [10**9 + 1000 * i + k for k in range(own_blocks)]
              for i, g in enumerate(groups)]
    n = len(groups)
    table = trace_table(np.arange(n) * gap_s, (shared_blocks + own_blocks) * BLOCK + extra_tokens, output_tokens,
                        prefix_hashes=pa.array(hashes, pa.list_(pa.uint64())))
    path = tmp_path / "trace.parquet"
    write_trace(table, path, block_size=BLOCK)
    return pq.read_table(path), path


def _run(tmp_path: Path, table: pa.Table, path: Path, cluster: ClusterConfig, policy: str,
         run_id: str) -> tuple[list[dict], list[dict]]:
    """(accounting rows, requests rows), both by request id."""
    store = simulate_run(table, path, cluster, policy, {}, 0, tmp_path / "results", run_id=run_id)
    acc = sorted(pq.read_table(store.dir / "cache_accounting.parquet").to_pylist(), key=lambda r: r["request_id"])
    req = sorted(pq.read_table(store.dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    return acc, req


def _check_sums(acc: list[dict], req: list[dict]) -> None:
    """offered = the losses + achieved for every request; achieved + beyond = cached_tokens."""
    for a, r in zip(acc, req):
        assert a["request_id"] == r["request_id"]
        parts = sum(a[f"{b}_tokens"] for b in LOSSES) + a["achieved_tokens"]
        assert parts == a["offered_tokens"], a
        if r["status"] == "ok":
            assert a["achieved_tokens"] + a["beyond_tokens"] == r["cached_tokens"]
        assert min(a[k] for k in a if k.endswith("_tokens")) >= 0, a


def _total(acc: list[dict], name: str) -> int:
    return sum(a[f"{name}_tokens"] for a in acc)


def test_round_robin_loses_to_routing_what_cache_aware_keeps(tmp_path):
    # 4 groups x 6 requests, one every 2 s (no request overlaps another: nothing in flight), a
    # large KV cache (nothing evicted): the only loss round robin can have is routing
    groups = [i % 4 for i in range(24)]
    table, path = _trace(tmp_path, groups, shared_blocks=30, own_blocks=4, gap_s=2.0)
    cluster = ClusterConfig.build(replicas=3)
    rr, rr_rows = _run(tmp_path, table, path, cluster, "round_robin", "rr")
    ca, ca_rows = _run(tmp_path, table, path, cluster, "cache_aware", "ca")
    _check_sums(rr, rr_rows)
    _check_sums(ca, ca_rows)
    # theory: every request after its group's first is offered the 30 shared blocks (480 tokens,
    # whole 16-token units, below the prompt's last token)
    assert [a["offered_tokens"] for a in rr] == [0] * 4 + [30 * BLOCK] * 20
    # round robin over 3 replicas: request i goes to replica i % 3, group i % 4, so a request is
    # reachable iff an earlier request with the same (i % 3, i % 4), i.e. i - 12, exists
    reach = [30 * BLOCK if i >= 12 else 0 for i in range(24)]
    assert [a["reachable_tokens"] for a in rr] == reach
    assert [a["routing_tokens"] for a in rr] == [o - r for o, r in zip([a["offered_tokens"] for a in rr], reach)]
    assert _total(rr, "achieved") == sum(reach) and _total(rr, "eviction") == _total(rr, "in_flight") == 0
    # the cache-aware router sends each group where it went first: nothing lost to routing
    assert _total(ca, "routing") == 0 and _total(ca, "achieved") == _total(ca, "offered") == 20 * 30 * BLOCK
    # its prediction is the tree's match, and here it is exactly what was delivered
    assert [r["predicted_cached_tokens"] for r in ca_rows] == [r["cached_tokens"] for r in ca_rows]
    assert all(r["predicted_cached_tokens"] is None for r in rr_rows)


def _tiny_kv(tmp_path: Path) -> ClusterConfig:
    (tmp_path / "tiny.toml").write_text(TINY_GPU)
    return ClusterConfig.build(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0,
                               catalogs=(str(tmp_path / "tiny.toml"),))


def test_a_tiny_kv_cache_loses_to_eviction_and_a_router_index_that_kept_the_blocks_is_stale(tmp_path):
    # 12 groups cycled one request at a time, each prompt ~125 KV blocks: a ~585-block cache holds
    # four, so every group's blocks are evicted before it comes back (LRU)
    groups = [i % 12 for i in range(36)]
    table, path = _trace(tmp_path, groups, shared_blocks=110, own_blocks=14, gap_s=2.0)
    cluster = _tiny_kv(tmp_path)
    rr, rr_rows = _run(tmp_path, table, path, cluster, "round_robin", "rr")
    _check_sums(rr, rr_rows)
    offered = _total(rr, "offered")
    assert offered == 24 * 110 * BLOCK
    # one replica: routing loses nothing; the cache's capacity loses it all
    assert _total(rr, "routing") == 0 and _total(rr, "reachable") == offered
    assert _total(rr, "eviction") == offered and _total(rr, "achieved") == 0 and _total(rr, "stale") == 0
    # cache_aware's tree (no capacity limit it knows of) still says the replica holds the prefix:
    # it predicted every one of those hits, so the loss is its stale index
    ca, ca_rows = _run(tmp_path, table, path, cluster, "cache_aware", "ca")
    _check_sums(ca, ca_rows)
    assert _total(ca, "stale") == offered and _total(ca, "eviction") == 0
    assert sum(r["predicted_cached_tokens"] for r in ca_rows) == offered
    assert sum(r["cached_tokens"] for r in ca_rows) == 0
    # Dynamo's KV-cost router reads the replicas' KV events (exact in the simulator): it knows the
    # blocks are gone, predicts no hit, and the same loss is plain eviction
    kv, kv_rows = _run(tmp_path, table, path, cluster, "dynamo_kv", "kv")
    _check_sums(kv, kv_rows)
    assert _total(kv, "eviction") == offered and _total(kv, "stale") == 0
    assert sum(r["predicted_cached_tokens"] for r in kv_rows) == 0


def test_a_prefix_still_being_computed_is_lost_in_flight(tmp_path):
    # pairs of requests with the same 2,000-token prefix, pairs 5 s apart, one replica
    groups = [i // 2 for i in range(8)]
    table, path = _trace(tmp_path, groups, shared_blocks=125, own_blocks=3, gap_s=0.0)

    def pairs(second_after_s: float, max_num_batched_tokens: int, run_id: str) -> list[dict]:
        arrivals = pa.array([(i // 2) * 5.0 + (i % 2) * second_after_s for i in range(8)])
        write_trace(table.set_column(1, "arrival_s", arrivals), path, block_size=BLOCK)
        acc, rows = _run(tmp_path, pq.read_table(path), path,
                         ClusterConfig.build(replicas=1, max_num_batched_tokens=max_num_batched_tokens), "round_robin",
                         run_id)
        _check_sums(acc, rows)
        assert all(a["offered_tokens"] == a["reachable_tokens"] == 125 * BLOCK for a in acc[1::2])
        assert _total(acc, "eviction") == _total(acc, "routing") == 0
        return acc[1::2]

    # 1 ms later, a 1,500-token step budget: the first's prefill takes two steps (1,500 + 593
    # tokens); the second is admitted at the second, when the first's blocks up to token 1,488 (93
    # whole blocks) are cached, as vLLM caches full blocks step by step: 1,488 hit, the other 512
    # shared tokens were still being computed — lost in flight
    assert all(a["achieved_tokens"] == 1500 // BLOCK * BLOCK and a["in_flight_tokens"] == 125 * BLOCK - 1488
               for a in pairs(1e-3, 1500, "chunked"))
    # with a 2,048-token budget the first's shared prefix is all cached after its first step, when
    # the second is admitted: waiting in the queue behind it is not a loss
    assert all(a["in_flight_tokens"] == 0 and a["achieved_tokens"] == 125 * BLOCK
               for a in pairs(1e-3, 2048, "queued"))


def test_engine_blocks_larger_than_the_trace_blocks_lose_to_granularity_and_failures_are_their_own(tmp_path):
    # shared 30 blocks of 16 = 480 tokens; the engine caches in 128-token blocks (vLLM's CPU build):
    # 3 x 128 = 384 can hit, 96 are granularity. A last request too long for the model fails.
    groups = [0, 0, 0]
    table, path = _trace(tmp_path, groups, shared_blocks=30, own_blocks=4, gap_s=2.0)
    acc, rows = _run(tmp_path, table, path, ClusterConfig.build(replicas=1, block_size=128), "round_robin", "g128")
    _check_sums(acc, rows)
    assert [a["granularity_tokens"] for a in acc] == [0, 96, 96]
    assert [a["achieved_tokens"] for a in acc] == [0, 384, 384] == [r["cached_tokens"] for r in rows]
    assert {a["unit_tokens"] for a in acc} == {128}
    big = trace_table([0.0, 1.0], [600, 60_000], 8, prefix_hashes=pa.array([list(range(1, 38)), list(range(1, 3751))],
                                                                              pa.list_(pa.uint64())))
    write_trace(big, path, block_size=BLOCK)
    acc, rows = _run(tmp_path, pq.read_table(path), path, ClusterConfig.build(replicas=1), "round_robin", "fail")
    _check_sums(acc, rows)
    assert rows[1]["status"] != "ok" and acc[1]["failed_tokens"] == acc[1]["offered_tokens"] == 37 * BLOCK


def test_the_view_report_and_query_show_the_accounting(tmp_path, capsys):
    groups = [i % 4 for i in range(24)]
    table, path = _trace(tmp_path, groups, shared_blocks=30, own_blocks=4, gap_s=2.0)
    _run(tmp_path, table, path, ClusterConfig.build(replicas=3), "round_robin", "rr")
    results = str(tmp_path / "results")
    sql = ("select run_id, sum(offered_tokens)::int o, sum(routing_tokens)::int r, sum(achieved_tokens)::int a "
           "from cache_accounting group by 1")
    code, out, err = cli(["query", "-r", results, "--format", "json", sql], capsys)   # the confined catalog
    assert code == 0, err
    assert json.loads(out) == [{"run_id": "rr", "o": 20 * 480, "r": 8 * 480, "a": 12 * 480}]
    code, out, err = cli(["report", results, "--format", "json"], capsys)
    assert code == 0, err
    cache = json.loads(out)["runs"][0]["prefix_cache"]
    prompt = 24 * (34 * BLOCK + 5)
    assert cache["tokens"]["prompt"] == prompt
    assert mismatches(cache, PrefixCacheFigures, "prefix_cache") == []   # every bucket, as run_figures.py declares
    assert cache["offered"] == pytest.approx(20 * 480 / prompt) and cache["routing"] == pytest.approx(8 * 480 / prompt)
    # the SQL of docs/metrics.md gives the report's figures
    [row] = Catalog([results], confined=True).query_read_only(find("a.stale_tokens")).to_pylist()
    assert {k: row[k] for k in ("offered", "reachable", "achieved", "routing", "eviction", "stale", "in_flight")} == \
        pytest.approx({k: cache[k] for k in ("offered", "reachable", "achieved", "routing", "eviction", "stale",
                                             "in_flight")})
    code, out, err = cli(["report", results, "--format", "md"], capsys)
    assert code == 0 and "Prefix cache (% of prompt tokens)" in out and "lost to routing" in out


def test_a_trace_without_prefix_hashes_writes_no_accounting(tmp_path):
    table = trace_table([0.0, 1.0], 100, 8)
    path = tmp_path / "t.parquet"
    write_trace(table, path)
    store = simulate_run(pq.read_table(path), path, ClusterConfig.build(replicas=1), "round_robin", {}, 0,
                         tmp_path / "results", run_id="plain")
    assert not (store.dir / "cache_accounting.parquet").exists()
    # the catalog knows the view is empty, and the report has no accounting to show (without asking DuckDB)
    cat = Catalog([store.dir])
    assert cat.empty == {"cache_accounting"}
    assert accounting_summary(cat) == {}
    with_one = tmp_path / "with"
    with_one.mkdir()
    _run(with_one, *_trace(with_one, [0, 0], shared_blocks=4, own_blocks=2, gap_s=1.0), ClusterConfig.build(replicas=1),
         "round_robin", "rr")
    cat = Catalog([with_one / "results", store.dir])
    assert cat.empty == set() and set(accounting_summary(cat)) == {"rr"}


def test_a_replay_against_llmlb_serve_is_accounted_in_the_servers_blocks(tmp_path):
    """experiment.replay_run over real loopback HTTP to ``llmlb serve`` (which publishes vLLM's
    cache_config_info and usage.prompt_tokens_details): the accounting uses the engine's block
    read from /metrics, its achieved hits are the server's cached tokens, and the buckets add up."""
    from llmlb_bench.experiment import replay_run
    from llmlb_bench.replay import ReplayOptions, preflight
    from llmlb_bench.serve import ServeOptions
    from serve_helpers import ServeThread

    groups = [i % 3 for i in range(18)]
    table, path = _trace(tmp_path, groups, shared_blocks=24, own_blocks=6, gap_s=0.05)
    st = ServeThread(ClusterConfig.build(replicas=2, block_size=32), ServeOptions(port_per_replica=0, speed=10.0))
    try:
        options = ReplayOptions(time_scale=1.0, scrape_s=None)
        store = replay_run(table, path, preflight(st.urls, options), "cache_aware", {}, 0, tmp_path / "results",
                           options, run_id="serve")
    finally:
        st.close()
    acc = sorted(pq.read_table(store.dir / "cache_accounting.parquet").to_pylist(), key=lambda r: r["request_id"])
    rows = sorted(pq.read_table(store.dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert [r["status"] for r in rows] == ["ok"] * 18
    _check_sums(acc, rows)
    assert {a["unit_tokens"] for a in acc} == {32}          # the server's block, not the trace's 16
    assert {a["holder"] for a in acc} <= set(st.urls)
    assert _total(acc, "achieved") == sum(r["cached_tokens"] for r in rows) > 0
    assert all(a["reachable_tokens"] >= a["achieved_tokens"] for a in acc)
    assert all(r["predicted_cached_tokens"] is not None for r in rows)


def test_a_next_turn_is_offered_the_previous_turns_reply(tmp_path):
    # turn 1: 480 prompt tokens (30 blocks), 200 output tokens; turn 2 (its child) extends the
    # prompt and the reply: its blocks 30..41 lie within turn 1's prompt + reply less the last
    # token ((480 + 200 - 1) // 16 = 42 blocks), so one unbounded cache holds 42 of its blocks
    first = list(range(1, 31))
    second = first + list(range(100, 119))             # 49 blocks: 780 tokens
    table = trace_table([0.0, 0.0], [480, 780], [200, 8],
                        prefix_hashes=pa.array([first, second], pa.list_(pa.uint64())),
                        parent_id=pa.array([None, 0], pa.int64()), after_parent_s=pa.array([None, 1.0]))
    path = tmp_path / "t.parquet"
    write_trace(table, path, block_size=BLOCK)
    acc, rows = _run(tmp_path, pq.read_table(path), path, ClusterConfig.build(replicas=2), "round_robin", "turns")
    _check_sums(acc, rows)
    # round robin sends turn 2 to the other replica: all 672 tokens lost to routing
    assert acc[1]["offered_tokens"] == 42 * BLOCK and acc[1]["routing_tokens"] == 42 * BLOCK
    acc, rows = _run(tmp_path, pq.read_table(path), path, ClusterConfig.build(replicas=1), "round_robin", "one")
    _check_sums(acc, rows)
    # on one replica the simulator keeps the reply's KV (sim/simulation._cache_reply): all achieved,
    # none of it "beyond" the trace
    assert acc[1]["achieved_tokens"] == rows[1]["cached_tokens"] == 42 * BLOCK and acc[1]["beyond_tokens"] == 0
    # a reply that opens with reasoning offers the next turn nothing beyond the prompt's 30 blocks
    # (its history keeps the answer only), and the simulator agrees
    reasoned = table.set_column(table.schema.get_field_index("reasoning_tokens"), "reasoning_tokens", pa.array([120, 0], pa.int32()))
    write_trace(reasoned, path, block_size=BLOCK)
    acc, rows = _run(tmp_path, pq.read_table(path), path, ClusterConfig.build(replicas=1), "round_robin", "reasoned")
    _check_sums(acc, rows)
    assert acc[1]["offered_tokens"] == acc[1]["achieved_tokens"] == rows[1]["cached_tokens"] == 30 * BLOCK
    assert acc[1]["beyond_tokens"] == 0


def test_llmlb_route_records_the_routers_prediction(tmp_path):
    """``llmlb route`` goes through the same Router: its cache_aware rows carry the prediction (a
    real proxy on loopback in front of a fixed-stream backend)."""
    from llmlb_bench.store import RunStore
    from serve_helpers import request
    from replay_helpers import ServerThread
    from test_proxy import fixed_stream_app, rows_of, start_proxy

    st = ServerThread()
    try:
        backend = st.aiohttp(fixed_stream_app())
        with RunStore(tmp_path, config={}, backend="route", run_id="r") as run:
            proxy = start_proxy(st, [backend], run, "cache_aware")
            prompt = " ".join(["the"] * 40 + ["of"] * 8)          # 48 words: 3 blocks of 16
            for _ in range(2):
                status, _, _ = request(proxy.url, "POST", "/v1/completions",
                                       {"prompt": prompt, "max_tokens": 3, "stream": True})
                assert status == 200
            st.call(proxy.drain)
        first, second = rows_of(run.dir)
        # the first finds nothing in the tree; the second all three of its blocks: 48 tokens
        assert (first["predicted_cached_tokens"], second["predicted_cached_tokens"]) == (0, 48)
    finally:
        st.close()


def test_each_rows_holder_and_unit_follow_its_target():
    """The holder is the prefill target where there is one, else the target; its unit the larger of
    the trace block and that target's engine block (the trace block for targets not named, or none)."""
    targets = ["b", None, "a", "c", "b", None]
    prefill = [None, None, "pa", None, "pa", "pb"]
    n = len(targets)
    rows = pa.table({
        "request_id": np.arange(n), "target": pa.array(targets, pa.string()),
        "prefill_target": pa.array(prefill, pa.string()), "status": pa.array(["ok"] * n),
        "scheduled_s": np.arange(n, dtype=float), "sent_s": np.arange(n, dtype=float),
        "first_token_s": np.arange(n) + 0.5, "input_tokens": np.full(n, 100, np.int32),
        "output_tokens": np.full(n, 4, np.int32), "reasoning_tokens": np.zeros(n, np.int32),
        "cached_tokens": np.zeros(n, np.int32), "predicted_cached_tokens": pa.nulls(n, pa.int32())})
    hashes = pa.array([[1, 2, 3]] * n, pa.list_(pa.uint64()))
    out = account(hashes, np.full(n, -1, np.int64), BLOCK, rows, {"a": 32, "pa": 64, "b": 8})
    assert out.column("holder").to_pylist() == ["b", None, "pa", "c", "pa", "pb"]
    assert out.column("unit_tokens").to_pylist() == [16, 16, 64, 16, 64, 16]


def _walk(hashes: list[list[int]], parent: list[int], rows: dict, block: int, unit_of: dict[str, int]) -> dict:
    """The buckets by their definitions (docs/prefix-cache.md), request by request and block by block
    in Python: an independent check of the sorted, vectorised :func:`account`."""
    n = len(hashes)
    holder = [p if p is not None else t for p, t in zip(rows["prefill_target"], rows["target"])]
    inp, out = rows["input_tokens"], [0 if r else o for o, r in zip(rows["output_tokens"], rows["reasoning_tokens"])]
    first, sent = rows["first_token_s"], rows["sent_s"]
    arrival = sorted(range(n), key=lambda i: (rows["scheduled_s"][i], rows["request_id"][i]))
    rank = {i: k for k, i in enumerate(arrival)}
    done_order = sorted(range(n), key=lambda i: (np.inf if np.isnan(first[i]) else first[i], rows["request_id"][i]))
    done = {i: k for k, i in enumerate(done_order)}
    finished = sorted(np.inf if np.isnan(f) else f for f in first)
    blocks = [set(h) for h in hashes]            # what each request computed: its prompt, then its replies
    for c, p in enumerate(parent):
        own = inp[p] // block if p >= 0 else 0
        upto = min((inp[p] + out[p] - 1) // block, len(hashes[c])) if p >= 0 else 0
        if p >= 0 and 1 <= own <= len(hashes[p]) and upto > own and hashes[c][own - 1] == hashes[p][own - 1]:
            blocks[p] |= set(hashes[c][own:upto])
    count: dict[int, int] = {}
    for c, p in enumerate(parent):                # a hash counts once per block naming it
        for h in hashes[c]:
            count[h] = count.get(h, 0) + 1
        own = inp[p] // block if p >= 0 else 0
        upto = min((inp[p] + out[p] - 1) // block, len(hashes[c])) if p >= 0 else 0
        if p >= 0 and 1 <= own <= len(hashes[p]) and upto > own and hashes[c][own - 1] == hashes[p][own - 1]:
            for h in hashes[c][own:upto]:
                count[h] = count.get(h, 0) + 1

    def leading(flags: list[bool]) -> int:
        return next((j for j, f in enumerate(flags) if not f), len(flags))

    res: dict[str, list[int]] = {k: [] for k in ("offered", "reach", "ready")}
    for i in range(n):
        earlier = [k for k in range(n) if rank[k] < rank[i]]
        res["offered"].append(leading([any(h in blocks[k] for k in earlier) for h in hashes[i]]))
        reach, ready = [], []
        for h in hashes[i]:
            givers = [k for k in earlier if holder[k] is not None and holder[k] == holder[i] and h in blocks[k]]
            if holder[i] is None or count[h] < 2 or not givers:
                reach.append(False)
                ready.append(False)
                continue
            earliest = min(n + 1 if np.isnan(first[k]) else done[k] for k in givers)
            hit = earliest < done[i]
            reach.append(hit)
            ready.append(hit and finished[min(earliest, n - 1)] <= sent[i])
        res["reach"].append(leading(reach))
        res["ready"].append(leading(ready))
    unit = [max(block, unit_of.get(h, block)) if h is not None else block for h in holder]
    tokens = lambda b, i: min(b * block, inp[i])  # noqa: E731
    engine = lambda x, i: max(min(x, inp[i] - 1), 0) // unit[i] * unit[i]  # noqa: E731
    want: dict[str, list[int]] = {k: [] for k in ("offered_tokens", "reachable_tokens", "achieved_tokens",
                                                   "granularity_tokens", "failed_tokens", "routing_tokens",
                                                   "in_flight_tokens", "eviction_tokens", "stale_tokens",
                                                   "unmeasured_tokens", "beyond_tokens")}
    for i in range(n):
        offered = tokens(res["offered"][i], i)
        o2, r2, v2 = engine(offered, i), engine(tokens(res["reach"][i], i), i), engine(tokens(res["ready"][i], i), i)
        ok, cached = rows["status"][i] == "ok", rows["cached_tokens"][i]
        good = ok and cached is not None
        achieved = min(cached, r2) if good else 0
        gone = max(v2, achieved) - achieved if good else 0
        predicted = rows["predicted_cached_tokens"][i] or 0
        stale = min(gone, max(engine(predicted, i) - achieved, 0))
        for k, v in (("offered_tokens", offered), ("reachable_tokens", r2 if ok else 0),
                     ("achieved_tokens", achieved), ("granularity_tokens", offered - o2),
                     ("failed_tokens", 0 if ok else o2), ("routing_tokens", o2 - r2 if ok else 0),
                     ("in_flight_tokens", r2 - max(v2, achieved) if good else 0),
                     ("eviction_tokens", gone - stale), ("stale_tokens", stale),
                     ("unmeasured_tokens", r2 if ok and cached is None else 0),
                     ("beyond_tokens", cached - achieved if good else 0)):
            want[k].append(v)
    return want


def _random_case(seed: int, near: bool = False) -> tuple[list[list[int]], list[int], dict, pa.Table]:
    """A random trace's (hashes, parents, rows as lists, rows as a table): prefixes shared by families
    of prompts, repeated hashes (small integers and 64-bit ones), next turns that extend a parent or
    not, ties in arrival time, requests without a first token, failures, unmeasured rows, several
    targets, disaggregated pairs. ``near``: every hash replaced by one whose spread (the sort key's
    hash bits) differs from that of its neighbour value in the last bit only, so distinct hashes share
    the key's bits everywhere."""
    rng = np.random.default_rng(seed)
    n = 90
    big = seed % 2 == 1                      # 64-bit hashes, or small integers
    roots = [int(x) for x in (rng.integers(0, 2**60, 8, dtype=np.int64) if big else rng.integers(0, 40, 8))]
    hashes, parent = [], []
    for i in range(n):
        p = int(rng.integers(0, i)) if i and rng.random() < 0.3 else -1
        if p >= 0 and rng.random() < 0.8:        # a next turn: the parent's prompt, then more
            h = hashes[p] + [int(x) for x in rng.integers(1, 2**40 if big else 60, int(rng.integers(0, 6)))]
        else:
            stem = roots[int(rng.integers(0, len(roots)))]
            h = [stem * 7 + k for k in range(int(rng.integers(0, 7)))]
            h += [int(x) for x in rng.integers(1, 2**40 if big else 60, int(rng.integers(0, 4)))]
        h = list(dict.fromkeys(h))               # a request names a hash at most once
        hashes.append(h)
        parent.append(p)
    if near:
        # 2m and 2m + 1 become hashes whose spreads are m << 20 and (m << 20) + 1
        inverse = pow(int(_SPREAD), -1, 2**64)
        hashes = [[(((v % 2**40 >> 1) << 20) + (v & 1)) * inverse % 2**64 for v in h] for h in hashes]
    inp = [len(h) * BLOCK + int(rng.integers(0, 20)) for h in hashes]
    first = np.round(rng.uniform(0, 30, n), 1) + 0.5
    first[rng.random(n) < 0.1] = np.nan
    rows = {
        "request_id": list(rng.permutation(n) + 100), "scheduled_s": list(np.round(rng.uniform(0, 20, n))),
        "target": [None if x == 3 else f"r{x}" for x in rng.integers(0, 4, n)],
        "prefill_target": [f"p{x}" if x < 2 else None for x in rng.integers(0, 6, n)],
        "status": ["ok" if x > 0.15 else "error" for x in rng.random(n)],
        "sent_s": list(np.round(rng.uniform(0, 25, n), 1)), "first_token_s": list(first),
        "input_tokens": inp, "output_tokens": [int(x) for x in rng.integers(0, 60, n)],
        "reasoning_tokens": [int(x) if x > 40 else 0 for x in rng.integers(0, 60, n)],
        "cached_tokens": [None if x < 0.1 else int(x * 200) for x in rng.random(n)],
        "predicted_cached_tokens": [None if x < 0.5 else int(x * 200) for x in rng.random(n)]}
    types = {"request_id": pa.int64(), "scheduled_s": pa.float64(), "sent_s": pa.float64(),
             "first_token_s": pa.float64(), "target": pa.string(), "prefill_target": pa.string(), "status": pa.string()}
    table = pa.table({k: pa.array(v, types.get(k, pa.int32())) for k, v in rows.items()})
    return hashes, parent, rows, table


def _check_against_walk(hashes: list[list[int]], parent: list[int], rows: dict, table: pa.Table) -> None:
    """account, in one part and in parts of about 16 blocks (16-32 parts here: memory bounded by the
    part, not the run), gives the walk's buckets; so does it with the rows in another order than the
    hashes (``order``: what write_accounting passes for a whole run)."""
    unit_of = {"r0": 32, "p1": 48, "r2": 8}
    want = _walk(hashes, parent, rows, BLOCK, unit_of)
    assert sum(want["reachable_tokens"]) > 0 and sum(want["offered_tokens"]) > sum(want["reachable_tokens"])
    lists = pa.array(hashes, pa.list_(pa.uint64()))
    for chunk in (1 << 30, 16):
        got = account(lists, np.array(parent), BLOCK, table, unit_of, chunk_blocks=chunk)
        for k, v in want.items():
            assert got.column(k).to_pylist() == v, (chunk, k)
    order = np.random.default_rng(len(hashes)).permutation(len(hashes))
    got = account(lists, np.array(parent), BLOCK, table.take(order), unit_of, order=order)
    for k, v in want.items():
        assert got.column(k).to_pylist() == [v[i] for i in order], ("order", k)


@pytest.fixture(params=["numpy", "c"])
def piece_path(request, monkeypatch):
    """Each walk test twice: the pieces' pass in NumPy (the reference) and in C (``cache_kernels.c``,
    skipped where the compiled core is not built)."""
    import llmlb_bench.metrics.cache_accounting as ca

    if request.param == "numpy":
        monkeypatch.setattr(ca, "native", None)
    elif ca.native is None:
        pytest.skip("the compiled core (cache_kernels) is not built")
    return request.param


@pytest.mark.parametrize("seed", range(6))
def test_account_gives_the_buckets_of_a_walk_block_by_block(seed, piece_path):
    """Random traces (:func:`_random_case`), against the walk."""
    _check_against_walk(*_random_case(seed))


@pytest.mark.parametrize("seed", range(4))
def test_distinct_hashes_that_share_the_sort_keys_bits_are_told_apart(seed, monkeypatch, piece_path):
    """Distinct hashes whose spreads differ only below the sort key's hash bits (which the name of
    the block fills): the accounting finds them and puts them in order by value; the walk agrees."""
    import llmlb_bench.metrics.cache_accounting as ca

    shared: list[int] = []

    def counted(s, key, fields, values, replies):
        shared.append(len(fields))
        return split(s, key, fields, values, replies)

    split = ca._split_shared
    monkeypatch.setattr(ca, "_split_shared", counted)
    _check_against_walk(*_random_case(seed, near=True))
    assert sum(shared) > 10                  # key bits shared by distinct hashes, in both part sizes


@pytest.mark.parametrize("seed", range(4))
def test_the_hash_numbers_of_a_cumulative_sum_give_the_same_buckets(seed, monkeypatch, piece_path):
    """Where the key's hash bits times the groups' stride would overflow, a hash's number is its
    number in the piece (a cumulative sum), as in pieces with shared key bits: forced everywhere here."""
    import dataclasses

    import llmlb_bench.metrics.cache_accounting as ca

    slots = ca._slots
    monkeypatch.setattr(ca, "_slots", lambda *a: dataclasses.replace(slots(*a), wide=False))
    _check_against_walk(*_random_case(seed))


@pytest.mark.parametrize("seed", range(4))
def test_the_c_pass_over_a_piece_gives_the_numpy_passs_counts(seed, monkeypatch):
    """The passes in C and in NumPy give the same leading counts, array for array, on larger random
    runs (every request's rows shuffled, hashes shared by families, several targets), in one part, in
    32 parts (two groups of :data:`GROUP_PARTS` in C) and in 4,096 (more than a byte names: the parts
    as 16-bit words), with and without targets (``offered_tokens``)."""
    import llmlb_bench.metrics.cache_accounting as ca

    if ca.native is None:
        pytest.skip("the compiled core (cache_kernels) is not built")
    rng = np.random.default_rng(seed)
    n = 3000
    stems = rng.integers(0, 2**62, 40, dtype=np.int64) if seed % 2 else rng.integers(0, 200, 40)
    hashes = []
    for _ in range(n):
        stem = int(stems[int(rng.integers(0, len(stems)))])
        h = [(stem * 13 + k) % 2**64 for k in range(int(rng.integers(0, 30)))] + [int(x) for x in rng.integers(1, 2**40, 3)]
        hashes.append(list(dict.fromkeys(h)))
    lists = pa.array(hashes, pa.list_(pa.uint64()))
    parent = np.where(rng.random(n) < 0.2, rng.integers(0, n, n), -1)
    parent[parent >= np.arange(n)] = -1
    table = pa.table({"request_id": pa.array(rng.permutation(n)), "scheduled_s": pa.array(np.round(rng.uniform(0, 50, n))),
                      "target": pa.array([f"r{x}" for x in rng.integers(0, 5, n)]),
                      "prefill_target": pa.array([None] * n, pa.string()),
                      "status": pa.array(["ok"] * n), "sent_s": pa.array(rng.uniform(0, 60, n)),
                      "first_token_s": pa.array(np.round(rng.uniform(0, 70, n), 1)),
                      "input_tokens": pa.array([len(h) * BLOCK + 3 for h in hashes], pa.int32()),
                      "output_tokens": pa.array(rng.integers(0, 200, n), pa.int32()),
                      "reasoning_tokens": pa.array([0] * n, pa.int32()),
                      "cached_tokens": pa.array(rng.integers(0, 500, n), pa.int32()),
                      "predicted_cached_tokens": pa.array([None] * n, pa.int32())})
    trace = pa.table({"request_id": pa.array(np.arange(n)), "arrival_s": pa.array(np.round(rng.uniform(0, 50, n))),
                      "input_tokens": pa.array([len(h) * BLOCK + 3 for h in hashes]), "prefix_hashes": lists})
    got = {}
    for path in ("c", "numpy"):
        if path == "numpy":
            monkeypatch.setattr(ca, "native", None)
        got[path] = ([account(lists, parent, BLOCK, table, {}, chunk_blocks=c) for c in (1 << 30, 2048, 16)],
                     ca.offered_tokens(trace, BLOCK))
    (c_tables, c_offered), (np_tables, np_offered) = got["c"], got["numpy"]
    for c_table, np_table in zip(c_tables, np_tables):
        assert c_table.equals(np_table)
    assert c_table.column("reachable_tokens").to_numpy().sum() > 0
    assert np.array_equal(c_offered, np_offered) and c_offered.sum() > 0


def test_the_c_select_writes_each_distinct_hash_of_a_part_and_drops_repeats():
    """``select`` writes every block's key, but a part's spread hashes (read only for the collision
    check, which needs each distinct hash once) without the repeats it has met lately: the distinct
    spreads are the NumPy pass's, fewer are written, and a hash of 0 (an empty entry's value) is kept."""
    import llmlb_bench.metrics.cache_accounting as ca

    k = ca.native
    if k is None:
        pytest.skip("the compiled core (cache_kernels) is not built")
    rng = np.random.default_rng(3)
    values = np.r_[rng.integers(0, 2**63, 500, dtype=np.int64).astype(np.uint64)[rng.integers(0, 500, 20_000)],
                   np.zeros(3, dtype=np.uint64)]
    offsets = np.arange(0, len(values) + 1, 7)
    offsets[-1] = len(values)
    base = np.arange(len(offsets) - 1, dtype=np.int64) << 10
    for index in (None, np.flatnonzero(values % 3 != 1).astype(np.uint32)):
        chosen = values if index is None else values[index]
        spread, key = np.empty(len(chosen), dtype=np.uint64), np.empty(len(chosen), dtype=np.uint64)
        written = k.select(index, chosen, offsets, base, 2, 40, spread, key)
        want = (chosen * ca._SPREAD) << np.uint64(2)
        assert np.array_equal(np.unique(spread[:written]), np.unique(want))
        assert len(np.unique(want)) < written < len(chosen) // 10
        assert np.array_equal(key >> np.uint64(40), want >> np.uint64(40))


def test_the_c_passes_refuse_arrays_that_would_take_them_out_of_bounds():
    """The C passes check their arrays against each other before they read or write through them:
    counts that do not match the parts (found by ``spill`` as it lists, never writing past a part's
    end), arrays of different lengths, offsets out of order, indices out of order or range, names of
    slots that do not exist, arrays of the wrong type: a clear error (the pass over sorted keys writes
    nothing)."""
    import llmlb_bench.metrics.cache_accounting as ca

    k = ca.native
    if k is None:
        pytest.skip("the compiled core (cache_kernels) is not built")
    values, part, none = np.arange(10, dtype=np.uint64), np.zeros(10, dtype=np.uint8), np.zeros(0, dtype=np.int64)
    index, hashes = np.empty(5, dtype=np.uint32), np.zeros(5, dtype=np.uint64)
    with pytest.raises(ValueError, match="more items in a part than its count"):
        k.spill(part, values, 0, np.array([0, 5]), index, hashes, False)
    with pytest.raises(ValueError, match="bad part starts"):
        k.spill(part, values, 0, np.array([0, 12]), np.empty(10, dtype=np.uint32), np.zeros(10, dtype=np.uint64), False)
    with pytest.raises(ValueError, match="arrays of different lengths"):
        k.spill(part, values[:9], 0, np.array([0, 5]), index, hashes, False)
    with pytest.raises(ValueError, match="bad row offsets"):
        k.select(None, values, np.array([0, 11, 10]), np.zeros(2, dtype=np.int64), 0, 20, None,
                 np.empty(10, dtype=np.uint64))
    with pytest.raises(ValueError, match="arrays of different lengths"):
        k.select(None, values, np.array([0, 11]), np.zeros(1, dtype=np.int64), 0, 20, None, np.empty(10, dtype=np.uint64))
    with pytest.raises(ValueError, match="bad item index"):
        k.select(np.array([3, 12], dtype=np.uint32), values[:2], np.array([0, 10]), np.zeros(1, dtype=np.int64), 0, 20,
                 None, np.empty(2, dtype=np.uint64))
    with pytest.raises(ValueError, match="bad item index"):
        k.select(np.array([4, 3], dtype=np.uint32), values[:2], np.array([0, 10]), np.zeros(1, dtype=np.int64), 0, 20,
                 None, np.empty(2, dtype=np.uint64))
    table = np.zeros((2, 8), dtype=np.int64)
    with pytest.raises(ValueError, match="a key names no slot"):
        k.piece(np.array([5 << 4]), none, table, 20, 4, 3, 1, 0, 1)
    with pytest.raises(ValueError, match="eight words per slot"):
        k.piece(np.array([0]), none, np.zeros(12, dtype=np.int64), 20, 4, 3, 1, 0, 1)
    with pytest.raises(TypeError, match="uint64"):
        k.parts(values.astype(np.int64), 2, part, np.empty(4, dtype=np.int64))
    assert not table.any()
