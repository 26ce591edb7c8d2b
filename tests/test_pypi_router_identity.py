"""Which backend served each request, recovered through ``llmlb serve``'s identity header and
through real PyPI routers (installed into the cached router venvs; an install failure fails the
test, it never skips)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.pypi_routers.identity import backends_from_log
from llmlb_bench.pypi_routers.launch import RouterProcess
from llmlb_bench.schema import REQUESTS, read_table
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from tests.replay_helpers import run_replay
from tests.serve_helpers import ServeThread, request
from tests.sim_helpers import poisson_trace

#: the model named explicitly: sglang-router 0.3.2 answers /v1/models with a model called "unknown"
FAST = ReplayOptions(time_scale=0.2, scrape_s=None, model="llama-3-8b")


@pytest.fixture(scope="module")
def fleet():
    st = ServeThread(ClusterConfig.build(replicas=2), ServeOptions(port_per_replica=0, speed=20.0))
    yield st
    st.close()


def test_serve_names_itself_direct_and_routed(tmp_path: Path, fleet):
    """Direct replay: every row's backend is the endpoint it was sent to; behind the routed
    --port the header names the replica after a '#'."""
    _, rows, _ = run_replay(poisson_trace(12, 40.0, seed=1, input_mean=60, output_mean=8), fleet.urls,
                            tmp_path, "round_robin", FAST)
    assert [r["status"] for r in rows] == ["ok"] * 12
    assert all(r["backend"] == r["target"] for r in rows)
    assert Counter(r["backend"] for r in rows) == {fleet.urls[0]: 6, fleet.urls[1]: 6}
    routed = ServeThread(ClusterConfig.build(replicas=2), ServeOptions(port=0, speed=20.0), make_policy("round_robin"))
    try:
        body = {"prompt": "hello there", "max_tokens": 2}
        names = {request(routed.urls[0], "POST", "/v1/completions", body)[1]["x-llmlb-backend"] for _ in range(4)}
        assert names == {f"{routed.urls[0]}#r0", f"{routed.urls[0]}#r1"}
    finally:
        routed.close()


@pytest.mark.parametrize("name", ["vllm-router", "sglang-router", "smg"])
def test_backend_recorded_through_real_router(tmp_path: Path, fleet, name: str):
    """Through each PyPI router (round_robin), every row names one of the two backends and the
    split is even; the router's debug log (sglang-router, smg), joined on X-Request-Id, names the
    same backend as the header for every request; smg's own header agrees too."""
    with RouterProcess(name, "round_robin", fleet.urls, tmp_path / f"{name}.log", debug_log=True) as router:
        n = 16
        _, rows, _ = run_replay(poisson_trace(n, 40.0, seed=2, input_mean=60, output_mean=8), [router.url],
                                tmp_path, "round_robin", FAST, run_id=name)
        counted = router.worker_counts()
        if name == "smg":
            headers = request(router.url, "POST", "/v1/completions", {"model": "llama-3-8b", "prompt": "hi", "max_tokens": 1, "stream": True})[1]
            assert headers["x-smg-routed-worker-id"] == headers["x-llmlb-backend"]
    assert [r["status"] for r in rows] == ["ok"] * n
    assert all(r["target"] == router.url for r in rows)
    counts = Counter(r["backend"] for r in rows)
    assert set(counts) == set(fleet.urls) and abs(counts[fleet.urls[0]] - counts[fleet.urls[1]]) <= 2
    # the router's own per-worker counters give the same split (per backend, not per request)
    assert {u: counted.get(u, 0) for u in fleet.urls} == {u: counts[u] for u in fleet.urls}
    if name != "vllm-router":  # vllm-router logs no per-request worker
        logged = backends_from_log(router.log)
        assert {r["request_id"]: r["backend"] for r in rows} == {int(k): v for k, v in logged.items() if k.isdigit()}


def test_older_requests_files_read_without_backend(tmp_path: Path):
    """A requests file written before the column existed reads with backend null."""
    path = tmp_path / "old.parquet"
    pq.write_table(pa.table({"run_id": ["a"], "request_id": [1], "status": ["ok"]}), path)
    table = read_table(path, REQUESTS)
    assert table.column("backend").to_pylist() == [None]
