"""Load generation through Ray actors: same rows as process workers, skewed clocks measured and
corrected, a dead actor's rows accounted for. One local Ray instance serves the whole module."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmlb_bench.policies import make_policy
from llmlb_bench.policies.routing import RoundRobin
from llmlb_bench.replay import ReplayOptions, preflight
from llmlb_bench.replay.clock import SkewedClock, measure_offset, perf_instant
from llmlb_bench.replay.noop_server import NoopConfig
from llmlb_bench.replay.ray_workers import replay_on_ray, shift_requests
from llmlb_bench.cli import main
from llmlb_bench.errors import UserError
from llmlb_bench.schema import REQUESTS, TRACE
from llmlb_bench.store import RunStore
from conftest import make_trace
from faults_helpers import Faults, interrupt_then_resume
from replay_helpers import run_replay, servers, token_count  # noqa: F401  (fixture)


class NotesPid(RoundRobin):
    """Round robin that writes its process's id to ``folder/worker<k>`` when it first routes (an
    actor's requests alternate: ``k`` is the request id's parity), so the test can kill that actor."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder
        self.noted = False

    def choose(self, req, view):  # type: ignore[no-untyped-def]
        if not self.noted:
            self.noted = True
            (Path(self.folder) / f"worker{req.request_id % 2}").write_text(str(os.getpid()))
        return super().choose(req, view)


# -- without Ray ------------------------------------------------------------------------------

def test_offset_estimate_keeps_the_fastest_round_trip_and_brackets_the_truth():
    delays = iter([(0.004, 0.001), (0.0002, 0.0003), (0.002, 0.0)])  # (outbound, return) seconds
    now = [1000.0]

    def clock() -> float:
        return now[0]

    def remote() -> float:
        out, back = next(delays)
        now[0] += out
        reading = now[0] + 3.7
        now[0] += back
        return reading

    est = measure_offset(remote, pings=3, clock=clock)
    assert est.rtt_s == pytest.approx(0.0005)
    assert abs(est.offset_s - 3.7) <= est.rtt_s / 2 + 1e-12
    assert est.describe()["uncertainty_s"] == pytest.approx(0.00025)


def test_perf_instant_turns_a_skewed_wall_instant_into_this_machines_monotonic_clock():
    """A clock 42 s behind ``perf_counter`` that notes when it was read: perf_instant reads
    ``perf_counter`` first and the clock after it, so its answer is the target's own instant less
    the time between those two reads, which lies between 0 and the time since ``before``. Exact on
    any machine, however long the test process is descheduled (a fixed 0.1 ms slack failed under load)."""
    reads: list[float] = []

    def clock() -> float:
        reads.append(time.perf_counter())
        return reads[-1] - 42.0

    target = clock() + 0.25
    before = time.perf_counter()
    found = perf_instant(target, clock)
    exact = target + 42.0   # the perf_counter reading at which clock() reads target
    assert exact - (reads[-1] - before) - 1e-9 <= found <= exact + 1e-9


def test_shift_moves_every_time_including_token_segments_and_keeps_nulls():
    table = REQUESTS.conform(pa.table({
        "run_id": ["r", "r"], "request_id": pa.array([1, 2], pa.int64()), "status": ["ok", "not_sent"],
        "scheduled_s": [0.5, 1.0], "sent_s": [0.6, None], "first_token_s": [0.7, None], "last_token_s": [0.9, None],
        "token_times": pa.array([[{"start_s": 0.7, "gap_s": 0.1, "count": 3}], None],
                                pa.list_(REQUESTS.schema.field("token_times").type.value_type))}), "t")
    rows = shift_requests(table, 2.0).to_pylist()
    assert [r["scheduled_s"] for r in rows] == [2.5, 3.0]
    assert rows[0]["sent_s"] == 2.6 and rows[0]["last_token_s"] == 2.9 and rows[1]["sent_s"] is None
    assert rows[0]["token_times"] == [{"start_s": 2.7, "gap_s": 0.1, "count": 3}] and rows[1]["token_times"] is None


# -- with a local Ray instance ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'llmlb-bench[ray]')")
    from llmlb_bench.sweep.executors import RayExecutor

    # this module's policy travels to the actors by value (they cannot import tests/)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with RayExecutor(None, workers=2):
        yield ray


def _family_trace(n: int = 60) -> pa.Table:
    """Requests in families of three (each sent when its parent ends), 200 per second."""
    return TRACE.conform(pa.table({
        "request_id": pa.array(range(n), pa.int64()), "arrival_s": [i / 200 for i in range(n)],
        "parent_id": pa.array([None if i % 3 == 0 else i - 1 for i in range(n)], pa.int64()),
        "after_parent_s": [0.0] * n, "input_tokens": pa.array([20 + i for i in range(n)], pa.int32()),
        "output_tokens": pa.array([1 + i % 7 for i in range(n)], pa.int32())}), "t")


def _accounting(rows: list[dict]) -> list[tuple]:
    return [(r["request_id"], r["status"], r["input_tokens"], r["requested_output_tokens"], r["output_tokens"],
             token_count(r)) for r in rows]


def test_ray_actors_give_the_rows_of_process_workers(ray_instance, servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(itl_s=0.002))
    trace = _family_trace()
    _, by_process, _ = run_replay(trace, [url], tmp_path, options=ReplayOptions(workers=2), run_id="p")
    summary, by_ray, run_dir = run_replay(trace, [url], tmp_path, options=ReplayOptions(workers=2, executor="ray"),
                                          run_id="r")
    assert [r["request_id"] for r in by_ray] == list(range(60)) and summary["statuses"] == {"ok": 60}
    assert _accounting(by_ray) == _accounting(by_process)
    by_id = {r["request_id"]: r for r in by_ray}
    for r in by_ray:  # dependencies held across the merge: a child leaves after its parent ended
        if r["request_id"] % 3:
            assert r["scheduled_s"] >= by_id[r["request_id"] - 1]["last_token_s"] - 1e-6
    workers = json.loads((run_dir / "run.json").read_text())["summary"]["client"]["ray_workers"]
    assert [w["rows"] for w in workers] == [30, 30]
    for w in workers:  # one machine: the clocks agree to within the measurement's uncertainty
        assert w["hostname"] and w["node_id"] and "error" not in w
        assert abs(w["offset_s"]) <= w["uncertainty_s"] + 1e-4
        assert abs(w["offset_after_s"]) <= w["uncertainty_after_s"] + 1e-4   # and again after the run


def test_skewed_actor_clocks_are_measured_and_corrected(ray_instance, servers, tmp_path):  # noqa: F811
    url, cfg = servers.noop()
    options = ReplayOptions(workers=2, executor="ray", scrape_s=None)
    trace = make_trace(n=80, rate=100.0, output_tokens=2)
    with RunStore(tmp_path, config={}, backend="replay", run_id="skew") as run:
        summary = replay_on_ray(trace, preflight([url], options), make_policy("round_robin"), run, options,
                                clocks=[SkewedClock(3.7), SkewedClock(-1.2)])
    workers = summary["client"]["ray_workers"]
    for w, skew in zip(workers, (3.7, -1.2)):
        assert abs(w["offset_s"] - skew) <= w["uncertainty_s"] + 1e-4
        # the actor started at the instant it was given: the shift is minus the time it was descheduled
        # between two adjacent clock reads (microseconds when idle, a scheduler slice or more under load),
        # never positive
        assert w["shift_s"] <= 1e-4
    rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    assert len(rows) == 80 and {r["status"] for r in rows} == {"ok"}
    # an actor never sends before its own schedule (how late it is, is the machine's: pinned to one
    # busy core both actors got the run call after its 0.5 s start margin and sent everything ~5 s late)
    late = np.array([r["sent_s"] - r["scheduled_s"] for r in rows])
    assert late.min() >= -1e-3
    # the server's own clock (this process's) agrees with the merged times: it read each request after
    # the merged sent_s and wrote its first token before the merged first_token_s, within the error the
    # run measured for that actor's mapping. Exact on any machine, however late the actors ran; an
    # offset left uncorrected puts a whole share 3.7 or 1.2 s off, on one side or the other
    t0 = summary["client"]["t0_clock_s"]
    for k, w in enumerate(workers):
        mine = [r for r in rows if r["request_id"] % 2 == k]     # request ids alternate between the actors
        err = w["uncertainty_s"] + abs(w["shift_s"]) + 1e-3
        read = np.array([cfg.records[str(r["request_id"])][0] - t0 - r["sent_s"] for r in mine])
        wrote = np.array([r["first_token_s"] - (cfg.records[str(r["request_id"])][1] - t0) for r in mine])
        assert read.size == 40 and read.min() > -err and wrote.min() > -err, (k, read.min(), wrote.min(), w)


def test_a_dead_actor_keeps_the_rows_it_had_finished_and_leaves_a_partial_run(
        ray_instance, servers, tmp_path, monkeypatch):  # noqa: F811
    """Rows travel back while the run goes on: what the lost actor finished before the parent's last
    collection is kept as it was; its other requests are error/interrupted (due before it was seen
    gone: maybe sent) or not_sent; one row per request all the same.

    The actor is lost at a point of the run's own progress, on any machine: SIGKILL (a client machine
    lost) right after the parent has collected 5 of its rows. Its first request streams until then
    (a million tokens 50 ms apart), so it is never done before the kill, however late it started
    (pinned to one busy core, actors started seconds late and sent their whole share in a burst)."""
    import llmlb_bench.replay.ray_workers as ray_workers

    url, _ = servers.noop(NoopConfig(itl_s=0.05))
    options = ReplayOptions(workers=2, executor="ray", scrape_s=None)
    trace = make_trace(n=150, rate=50.0, output_tokens=2)
    trace = trace.set_column(trace.schema.get_field_index("output_tokens"), "output_tokens",
                             pa.array([10**6] + [2] * 149, pa.int32()))
    collected: set[int] = set()   # the dead actor's rows the parent took before killing it
    killed: list[int] = []
    collect = ray_workers._collect

    def collect_then_kill(ray, call, k, live, t0_wall, streamed):  # type: ignore[no-untyped-def]
        collect(ray, call, k, live, t0_wall, streamed)
        if k == 0 and not killed:
            taken = {i for t in streamed[0] for i in t.column("request_id").to_pylist()}
            if len(taken) >= 5:
                collected.update(taken)
                killed.append(int((tmp_path / "worker0").read_text()))
                os.kill(killed[0], signal.SIGKILL)

    monkeypatch.setattr(ray_workers, "_collect", collect_then_kill)
    with pytest.raises(KeyboardInterrupt):
        with RunStore(tmp_path, config={}, backend="replay", run_id="dead") as run:
            replay_on_ray(trace, preflight([url], options), NotesPid(str(tmp_path)), run, options)
    assert killed
    meta = json.loads((run.dir / "run.json").read_text())
    assert meta["status"] == "partial"
    workers = meta["summary"]["client"]["ray_workers"]
    assert "error" in workers[0] and "error" not in workers[1]
    rows = sorted(pq.read_table(run.dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert [r["request_id"] for r in rows] == list(range(150))
    assert {r["status"] for r in rows if r["request_id"] % 2} == {"ok"}
    mine = [r for r in rows if r["request_id"] % 2 == 0]
    kept = [r for r in mine if r["status"] == "ok"]
    lost = [r for r in mine if r["status"] != "ok"]
    # kept: exactly what the parent had collected, as the actor finished it
    assert {r["request_id"] for r in kept} == collected and all(r["output_tokens"] == 2 for r in kept)
    maybe_sent = [r for r in lost if r["status"] == "error"]
    assert {r["status"] for r in lost} <= {"error", "not_sent"} and rows[0] in maybe_sent   # streaming when lost
    assert all(r["error"] == "interrupted" for r in maybe_sent)
    # due before the parent saw the actor gone: maybe sent; after: certainly not
    assert max(r["scheduled_s"] for r in maybe_sent) < min((r["scheduled_s"] for r in lost
                                                            if r["status"] == "not_sent"), default=np.inf)


# -- the command line -----------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["--executor", "ray"], "Ray actors share the load of --workers 2 or more"),
    (["--workers", "2", "--address", "auto"], "--address needs --executor ray"),
])
def test_cli_refuses_ray_options_that_do_not_fit(tmp_path, capsys, args, fragment):
    with pytest.raises(SystemExit) as info:
        main(["replay", str(tmp_path / "t.parquet"), "-e", "http://127.0.0.1:9", "--results", str(tmp_path / "res"),
              *args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "res").exists()


@pytest.mark.slow
def test_cli_ray_run_interrupted_then_resumed_has_one_row_per_request(servers, tmp_path):  # noqa: F811
    """The whole path a user takes: a private Ray instance per command, Ctrl-C, --resume (about 30 s).

    Ctrl-C lands at a point of the run's progress (:func:`interrupt_then_resume`), not once 5
    requests had arrived from a 4 s schedule: pinned to one core beside a busy loop, the actors got
    their start after the schedule had passed and sent their whole share at once, so nothing was
    left unsent when Ctrl-C landed (statuses {'ok', 'error'}: rightly, every request was in flight)."""
    f = Faults()
    partial, complete = interrupt_then_resume(f, servers.aiohttp(f.app()), tmp_path, signal.SIGINT,
                                              "--workers", "2", "--executor", "ray")
    for meta in (partial, complete):
        assert meta["config"]["options"]["executor"] == "ray"
        assert [w.get("error") for w in meta["summary"]["client"]["ray_workers"]] == [None, None]


def test_actors_with_a_free_cpu_each_are_waited_for_however_slow_they_start(
        ray_instance, servers, tmp_path, monkeypatch):  # noqa: F811
    """A bound of 0 s stands for a machine slower than any bound: with a free CPU for each actor, the
    run waits for them and completes. A fixed 120 s bound failed a private instance's two actors
    pinned to one busy core ("only 0 of 2 Ray actors were ready within 120 s"), and two on a cluster
    joined across network namespaces."""
    import llmlb_bench.replay.ray_workers as ray_workers

    ray = ray_instance
    deadline = time.monotonic() + 300      # a hang's bound: earlier tests' actors give their CPUs back
    while ray.available_resources().get("CPU", 0.0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    monkeypatch.setattr(ray_workers, "READY_TIMEOUT_S", 0.0)
    url, _ = servers.noop()
    summary, rows, _ = run_replay(make_trace(n=6, rate=100.0), [url], tmp_path,
                                  options=ReplayOptions(workers=2, executor="ray", scrape_s=None))
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 6


class HoldsACpu:
    """An actor that keeps one of the instance's CPUs while it lives."""

    def ping(self) -> bool:
        return True


def test_ctrl_c_while_the_actors_start_ends_the_run_then(ray_instance, servers, tmp_path, monkeypatch):  # noqa: F811
    """Ctrl-C while the actors start (a loaded machine starts Ray's worker processes slowly, a busy
    cluster places them late) stops the replay then, with every row ``not_sent``. It was heard only once
    every actor was ready or READY_TIMEOUT_S (120 s) had passed, and then reported as the error
    "only 1 of 2 Ray actors were ready". Here one of the instance's two CPUs is held, so the second
    actor cannot start during the run, and Ctrl-C comes as the first wait for the actors returns."""
    ray = ray_instance
    holder = ray.remote(num_cpus=1)(HoldsACpu).remote()
    assert ray.get(holder.ping.remote())
    real_wait = ray.wait
    calls: list[int] = []

    def wait(refs, **kwargs):  # type: ignore[no-untyped-def]
        ready, rest = real_wait(refs, **kwargs)
        calls.append(len(ready))
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)   # caught by the replay's handler, which forwards it
        return ready, rest

    monkeypatch.setattr(ray, "wait", wait)
    url, cfg = servers.noop()
    options = ReplayOptions(workers=2, executor="ray", scrape_s=None)
    try:
        with pytest.raises(KeyboardInterrupt):
            with RunStore(tmp_path, config={}, backend="replay", run_id="c") as run:
                replay_on_ray(make_trace(n=6, rate=100.0), preflight([url], options), make_policy("round_robin"),
                              run, options)
    finally:
        monkeypatch.undo()
        ray.kill(holder)
    assert calls[0] < 2                               # Ctrl-C came while an actor was not ready
    rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    assert sorted(r["request_id"] for r in rows) == list(range(6)) and {r["status"] for r in rows} == {"not_sent"}
    assert json.loads((run.dir / "run.json").read_text())["status"] == "partial" and cfg.received == 0


def test_actors_the_cluster_cannot_place_are_a_one_line_error(ray_instance, servers, tmp_path, monkeypatch):  # noqa: F811
    """Last in the module: the unplaceable actor's request may linger in the shared instance."""
    import llmlb_bench.replay.ray_workers as ray_workers

    monkeypatch.setattr(ray_workers, "READY_TIMEOUT_S", 2.0)
    url, _ = servers.noop()
    options = ReplayOptions(workers=3, executor="ray", scrape_s=None)  # one CPU each; the instance has 2
    with pytest.raises(UserError, match=r"only [0-2] of 3 Ray actors were ready within 2 s") as info:
        with RunStore(tmp_path, config={}, backend="replay", run_id="big") as run:
            replay_on_ray(make_trace(n=6, rate=100.0), preflight([url], options), make_policy("round_robin"),
                          run, options)
    assert info.value.where == "--workers"
