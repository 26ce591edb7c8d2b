"""The learning policies outside the simulator: a policy file and the bandit route live traffic
in ``llmlb route`` in front of ``llmlb serve`` (both backends running the policy) on loopback, the
bandit learning from each measured outcome, and in the replayer."""

from __future__ import annotations


import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from tests.conftest import make_trace
from tests.replay_helpers import ServerThread, run_replay, servers  # noqa: F401  (fixture)
from tests.serve_helpers import ServeThread, request, route_over_serve
from tests.learning_helpers import audit, route_with_policy
from tests.sim_helpers import learned_policy_file


def test_a_policy_file_routes_through_llmlb_route_in_front_of_llmlb_serve(tmp_path):
    # join-the-shortest-queue as a file; requests go one at a time, so every score ties and decisions
    # rotate over both replicas; the rows are an ordinary run's
    path = learned_policy_file(tmp_path, {"outstanding_requests": -1.0})
    rows = route_over_serve(tmp_path, None, make_policy("learned", {"path": str(path)}), 6)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    assert len({r["target"] for r in rows}) == 2           # sequential requests: every score ties, ties rotate
    assert all(r["output_tokens"] == 4 for r in rows)


def test_the_bandit_learns_from_every_live_outcome_in_llmlb_route(tmp_path):
    bandit, inner = make_policy("bandit", {"seed": 1}), make_policy("bandit", {"seed": 1})
    rows = route_over_serve(tmp_path, inner, bandit, 8)
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    for b in (bandit, inner):                                # llmlb route's and llmlb serve's
        assert b.updates == 8                                # one measured reward per request
        assert not b._pending                                # nothing left waiting for an outcome


def test_the_bandit_and_a_policy_file_in_the_replayer(servers, tmp_path):  # noqa: F811
    urls = [servers.noop()[0], servers.noop()[0]]
    bandit = make_policy("bandit", {"seed": 2})
    run_replay(make_trace(n=20, rate=100.0, output_tokens=5), urls, tmp_path, bandit, run_id="b")
    assert bandit.updates == 20
    learned = make_policy("learned", {"path": str(learned_policy_file(tmp_path))})
    run_replay(make_trace(n=20, rate=100.0, output_tokens=5), urls, tmp_path, learned, run_id="l")
    rows = pq.read_table(tmp_path / "l" / "requests.parquet").to_pylist()
    assert len(rows) == 20 and {r["status"] for r in rows} == {"ok"}


def test_llmlb_route_with_a_policy_file_decides_as_the_file_does_on_its_logged_observations(tmp_path):
    """``llmlb route -p learned --policy-arg path=... --policy-arg log=...`` as a process over two
    ``llmlb serve`` replicas: each decision, recomputed offline from the logged observation with the
    file alone, is the one it took, and the request's row names that backend."""
    fleet = ServeThread(ClusterConfig.build(replicas=2), ServeOptions(port_per_replica=0, speed=1.0))
    path = learned_policy_file(tmp_path, {"outstanding_requests": -1.0, "waiting": -0.5})

    def send(url: str, i: int) -> None:
        status, _, _ = request(url, "POST", "/v1/completions",
                               {"prompt": f"request {i} " + "x " * (20 + 7 * i), "max_tokens": 8 + i % 5,
                                "stream": True})
        assert status == 200
    try:
        rows, log = route_with_policy(fleet.urls, path, tmp_path, send, n=16)
    finally:
        fleet.close()
    assert len(rows) == 16 and {r["status"] for r in rows} == {"ok"}
    decisions = audit(path, log, rows, fleet.urls)
    assert len(decisions) == 16
    assert {d["target"] for d in decisions} == {0, 1}
    assert max(max(row[2] for row in d["targets"]) for d in decisions) > 0   # in-flight counts were seen


def test_a_policy_file_needing_scraped_signals_is_refused_when_nothing_is_scraped(tmp_path):
    """Trained on queues and KV use, it would see zeros in deployment: one line, before any work."""
    import subprocess
    import sys

    path = learned_policy_file(tmp_path)          # the default layout: waiting, running, kv_usage ...
    trace = tmp_path / "t.parquet"
    from llmlb_bench.schema import write_trace
    write_trace(make_trace(n=3), trace)
    for args in (["route", "-b", "http://127.0.0.1:9", "--port", "0"],
                 ["replay", str(trace), "-e", "http://127.0.0.1:9"]):
        out = subprocess.run([sys.executable, "-m", "llmlb_bench", *args, "-p", "learned", "--policy-arg",
                              f"path={path}", "--scrape-interval", "0", "--results", str(tmp_path / "r")],
                             capture_output=True, text=True)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines() == [
            f"error: --scrape-interval: policy file {path} needs waiting, running, kv_usage, adapter_resident, "
            f"adapter_slots_free, signal_age_s, which this backend cannot fill without scraping the engines' "
            f"metrics"], out.stderr
        assert not (tmp_path / "r").exists()
