"""Closed-loop runs in the simulator (``--users N --think-time Z``), checked against queueing theory.

A closed system of N users with think time Z obeys the interactive response-time law
R = N / X - Z (Little's law over the whole loop). On one replica serving one request at a
time (``max_num_seqs = 1``) with identical requests, the server is a deterministic single
server of service time S, and X and R are known exactly: saturated (N S > S + Z) the server
never idles, X = 1 / S and R = N S - Z; unsaturated each request finds it idle, R = S and
X = N / (S + Z).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmlb_bench.metrics.comparable import identity_key
from llmlb_bench.metrics.identity import facets
from llmlb_bench.policies import make_policy
from llmlb_bench.schema import write_trace
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from tests.conftest import cli, make_trace

N_ROWS = 120
CFG = ClusterConfig.build(replicas=1, max_num_seqs=1)


def _closed(tmp_path, users: int | None, think_s: float, run_id: str) -> pa.Table:
    with RunStore(tmp_path, config={}, backend="sim", run_id=run_id) as run:
        simulate(make_trace(n=N_ROWS, rate=1000.0), CFG, make_policy("round_robin"), run, users=users, think_s=think_s)
    return pq.read_table(tmp_path / run_id / "requests.parquet").sort_by("scheduled_s")


@pytest.fixture(scope="module")
def service_time(tmp_path_factory) -> float:
    """S: one user, no think time, so every request has the server to itself."""
    t = _closed(tmp_path_factory.mktemp("s"), 1, 0.0, "s")
    e2e = pc_e2e(t)
    assert e2e.max() - e2e.min() < 1e-9 * e2e.max()      # deterministic: identical requests, one at a time
    # one user: each request leaves the moment the previous one ended
    assert np.allclose(t.column("scheduled_s").to_numpy()[1:], t.column("last_token_s").to_numpy()[:-1])
    return float(e2e.mean())


def pc_e2e(t: pa.Table) -> np.ndarray:
    return t.column("last_token_s").to_numpy() - t.column("scheduled_s").to_numpy()


@pytest.mark.parametrize("users,think_factor", [(4, 0.5), (6, 2.0), (2, 3.0), (3, 2.0)])
def test_response_time_law_on_a_single_server(tmp_path, service_time, users, think_factor):
    s = service_time
    z = think_factor * s
    t = _closed(tmp_path, users, z, "closed")
    assert t.num_rows == N_ROWS and set(t.column("status").to_pylist()) == {"ok"}
    # the steady state: leave out the first round (all users start together) and the last users' tail
    mid = slice(2 * users, N_ROWS - 2 * users)
    r = pc_e2e(t)[mid].mean()
    ends = np.sort(t.column("last_token_s").to_numpy())[mid]
    k = (len(ends) - 1) // users * users      # whole cycles: completions come in rounds of N
    x = k / (ends[k] - ends[0])
    saturated = users * s > s + z
    r_theory, x_theory = (users * s - z, 1 / s) if saturated else (s, users / (s + z))
    assert r == pytest.approx(r_theory, rel=1e-6)
    assert x == pytest.approx(x_theory, rel=1e-6)
    assert r == pytest.approx(users / x - z, rel=1e-6)          # the interactive response-time law
    # never more than N requests in the system: each user has at most one outstanding
    starts, stops = t.column("scheduled_s").to_numpy(), t.column("last_token_s").to_numpy()
    events = sorted([(a, 1) for a in starts] + [(b, -1) for b in stops])
    assert max(np.cumsum([d for _, d in events])) <= users


def test_closed_loop_is_deterministic_and_differs_from_open_loop(tmp_path):
    a, b = _closed(tmp_path, 5, 0.1, "a"), _closed(tmp_path, 5, 0.1, "b")
    assert a.drop(["run_id"]).equals(b.drop(["run_id"]))
    open_loop = _closed(tmp_path, None, 0.0, "open")
    assert not np.allclose(open_loop.column("scheduled_s").to_numpy(), a.column("scheduled_s").to_numpy())


def test_users_flag_of_simulate_and_run(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    write_trace(make_trace(n=30, rate=1000.0), path)
    code, _, err = cli(["simulate", str(path), "--users", "3", "--think-time", "0.25", "--replicas", "1",
                        "--results", str(tmp_path / "res"), "--run-id", "c", "--format", "json"], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "res" / "c" / "run.json").read_text())
    assert meta["config"]["closed_loop"] == {"users": 3, "think_s": 0.25}
    rows = pq.read_table(tmp_path / "res" / "c" / "requests.parquet")
    assert rows.num_rows == 30 and set(rows.column("status").to_pylist()) == {"ok"}
    code, _, err = cli(["simulate", str(path), "--users", "0", "--results", str(tmp_path / "res")], capsys)
    assert code == 2 and "--users" in err


def test_closed_loop_is_another_workload_to_compare():
    """Runs of one trace open and closed loop (or with other users) are not compared; a simulated and a
    replayed closed loop of the same users and think time are."""
    trace = {"trace": {"sha256": "ab" * 32}}
    sim = {**trace, "backend": "sim", "config": {"closed_loop": {"users": 8, "think_s": 0.5}}}
    replay = {**trace, "backend": "replay", "config": {"options": {"users": 8, "think_s": 0.5, "time_scale": 1.0}}}
    open_loop = {**trace, "backend": "sim", "config": {}}
    fewer = {**trace, "backend": "sim", "config": {"closed_loop": {"users": 4, "think_s": 0.5}}}
    assert identity_key(sim) == identity_key(replay)
    assert len({identity_key(m) for m in (sim, open_loop, fewer)}) == 3
    assert facets(sim)["closed_loop"] == "8 users, think 0.5 s" and facets(open_loop)["closed_loop"] is None
