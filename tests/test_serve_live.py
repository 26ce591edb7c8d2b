"""The live engine behind ``llmlb serve``: same token times as the batch simulator, streamed on time,
aborts free what they held, router-side holds and rejections.

The fleet runs on an event loop whose clock moves only when the loop would wait (:class:`VirtualTimeLoop`):
what is checked is the engine's decisions (which tokens a report carries, when a wake-up is due), so
the checks are exact and the same on any machine. How late a real loop's timers fire is the machine's;
the HTTP path on a real clock is checked in tests/test_serve_replay.py."""

from __future__ import annotations

import asyncio
import selectors
from pathlib import Path
from typing import Any, Coroutine

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmlb_bench.policies import make_policy
from llmlb_bench.serve.live import LiveFleet, LiveRequest, Submission
from llmlb_bench.serve.metrics import render
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.sim.replica import Request
from llmlb_bench.store import RunStore
from tests.sim_helpers import TINY_GPU, trace

SPEED = 20.0


class _AdvancingSelector(selectors.DefaultSelector):
    """Polls without blocking; when nothing is ready, moves the loop's clock on by the time the loop
    would have waited (to its next timer) instead of waiting."""

    def __init__(self, loop: "VirtualTimeLoop") -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if not ready:
            if timeout is None:
                return super().select(None)   # no timer: only I/O can wake the loop
            self.loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated time: every timer fires exactly when it is due, however slow the machine."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_AdvancingSelector(self))

    def time(self) -> float:
        return self.now


def run_virtual(coro: Coroutine[Any, Any, Any]) -> Any:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def live_fleet(cfg: ClusterConfig, **kwargs: Any) -> LiveFleet:
    """A live fleet on the running loop's clock (the virtual one)."""
    return LiveFleet(cfg, clock=asyncio.get_running_loop().time, **kwargs)


class Recorder:
    """A client that records what the engine tells it, with the clock of each report."""

    def __init__(self, fleet: LiveFleet) -> None:
        self.fleet = fleet
        self.reports: dict[int, list[tuple[int, float]]] = {}   # seq -> [(cumulative tokens, clock)]
        self.finished: dict[int, int] = {}
        self.rejected: dict[int, str] = {}
        self.started: dict[int, float] = {}
        self.done = asyncio.Event()
        self.expected = 0

    def on_start(self, live: LiveRequest) -> None:
        self.started[live.seq] = self.fleet.clock()

    def on_tokens(self, live: LiveRequest, count: int) -> None:
        seen = self.reports.setdefault(live.seq, [])
        seen.append(((seen[-1][0] if seen else 0) + count, self.fleet.clock()))

    def on_finish(self, live: LiveRequest, count: int) -> None:
        self.on_tokens(live, count)
        self.finished[live.seq] = live.emitted + count
        self._check()

    def on_reject(self, live: LiveRequest, message: str) -> None:
        self.rejected[live.seq] = message
        self._check()

    def _check(self) -> None:
        if len(self.finished) + len(self.rejected) >= self.expected:
            self.done.set()


def _requests(n: int, seed: int) -> list[tuple[float, int, int, list[int]]]:
    """(gap before sending, prompt, output, prefix hashes): three shared prefixes and unique tails."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = int(rng.integers(40, 900))
        group = int(rng.integers(0, 3))
        shared = [1000 * (group + 1) + k for k in range(min(prompt // 16, 20))]
        hashes = shared + [10**6 + 1000 * i + k for k in range(prompt // 16 - len(shared))]
        out.append((float(rng.exponential(0.03)), prompt, int(rng.integers(1, 120)), hashes))
    return out


def _live_run(cfg: ClusterConfig, reqs, stream: bool = True, policy=None, speed: float = SPEED):
    async def go():
        fleet = live_fleet(cfg, speed=speed, policy=policy)
        rec = Recorder(fleet)
        rec.expected = len(reqs)
        lives = []
        for gap, prompt, out, hashes in reqs:
            await asyncio.sleep(gap / speed)
            lives.append(fleet.submit(Submission(prompt, out, hashes, stream, target=None if policy else 0), rec))
        await asyncio.wait_for(rec.done.wait(), 600)
        fleet.close()
        return fleet, rec, lives
    return run_virtual(go())


@pytest.mark.parametrize("case", ["prefix_cache", "preemption", "speculative"])
def test_token_times_equal_a_batch_simulation_of_the_same_arrivals(tmp_path: Path, case: str):
    if case == "prefix_cache":
        cfg = ClusterConfig.build(replicas=1, max_num_seqs=8, max_num_batched_tokens=512)
        reqs = _requests(40, seed=1)
    elif case == "speculative":    # bundled tokens: one delivery per verify step, streamed as drawn
        cfg = ClusterConfig.build(replicas=1, max_num_seqs=8, speculative={"acceptance": 0.7})
        reqs = _requests(20, seed=3)
    else:
        (tmp_path / "tiny.toml").write_text(TINY_GPU)
        cfg = ClusterConfig.build(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0, max_num_batched_tokens=2048,
                                  max_num_seqs=64, catalogs=(str(tmp_path / "tiny.toml"),))
        reqs = [(gap, prompt, 10 * out, []) for gap, prompt, out, _ in _requests(30, seed=2)]
    fleet, rec, lives = _live_run(cfg, reqs)
    assert len(rec.finished) == len(reqs)
    if case == "prefix_cache":
        assert sum(live.cached_tokens for live in lives) > 0   # shared prefixes hit the cache
    elif case == "preemption":
        assert sum(live.preemptions for live in lives) > 0     # KV ran out: recompute preemptions
    else:
        assert any(c > 1 for live in lives for _, _, c in live.segments)   # bundles arrived
    # request ids as the live fleet numbers them (speculative draws are seeded by the request id)
    table = trace(np.array([live.arrival_s for live in lives]), [r[1] for r in reqs], [r[2] for r in reqs],
                  prefix_hashes=pa.array([r[3] for r in reqs], pa.list_(pa.uint64())),
                  request_id=np.array([live.seq for live in lives], dtype=np.int64))
    with RunStore(tmp_path, config={}, backend="sim", run_id="batch") as run:
        simulate(table, cfg, make_policy("round_robin"), run)
    rows = {r["request_id"]: r for r in pq.read_table(run.dir / "requests.parquet").to_pylist()}
    for k, live in enumerate(lives):
        row = rows[live.seq]
        assert row["status"] == "ok"
        assert rec.finished[live.seq] == row["output_tokens"] == reqs[k][2]
        assert live.cached_tokens == row["cached_tokens"] and live.preemptions == row["preemptions"]
        assert rec.reports[live.seq][-1][0] == reqs[k][2]       # every token streamed, once
        got = [(s, g, c) for s, g, c in live.segments]
        want = [(s["start_s"], s["gap_s"], s["count"]) for s in row["token_times"]]
        assert len(got) == len(want)
        assert np.allclose(np.array(got), np.array(want), rtol=0, atol=1e-9)


def _token_times(live: LiveRequest) -> list[float]:
    return [s + k * g for s, g, c in live.segments for k in range(c)]


def test_streamed_tokens_are_reported_when_they_become_final(tmp_path: Path):
    """Each report carries exactly the tokens of one engine step, at the moment that step ends: the
    fleet wakes at every step end of a streaming request, not only at run boundaries (where a batch
    changes: a server that wrote its tokens then would be hundreds of milliseconds late). On a loop
    whose timers fire when due this is exact; a real loop's lateness is the machine's, not the
    engine's (it used to be bounded here, median under 20 ms, which a loaded machine can exceed)."""
    cfg = ClusterConfig.build(replicas=1)
    reqs = [(0.02, 300, 60, []) for _ in range(6)]
    fleet, rec, lives = _live_run(cfg, reqs, speed=1.0)
    for live in lives:
        times = _token_times(live)
        reports = rec.reports[live.seq]
        assert [cum for cum, _ in reports] == list(range(1, 61)) and len(times) == 60   # one token a report
        for cum, clock in reports:
            assert clock == pytest.approx(fleet.wall(times[cum - 1]), abs=1e-9)   # when its step ended
            if cum < len(times):
                assert fleet.wall(times[cum]) > clock + 1e-4                    # the next one was not due
    # several requests shared steps: one wake-up reported to each of them
    clocks = [clock for live in lives for _, clock in rec.reports[live.seq]]
    assert len(set(clocks)) < len(clocks)


def test_a_request_arriving_before_a_late_wake_up_does_not_hold_back_the_tokens_due():
    """A step of a streaming request ends, its wake-up is late (a loaded machine), and a request
    arrives before it fires: the tokens of that step go out as soon as the loop runs the wake-up.
    Re-arming the timer for the new arrival moved it to the next step end, and the due tokens waited
    a whole step more (then went out with the next step's)."""
    cfg = ClusterConfig.build(replicas=1)

    async def go():
        loop = asyncio.get_running_loop()
        fleet = live_fleet(cfg)
        rec = Recorder(fleet)
        rec.expected = 2
        a = fleet.submit(Submission(300, 20, [], True, target=0), rec)
        while len(rec.reports.get(a.seq, [])) < 5:
            await asyncio.sleep(1e-4)
        last = rec.reports[a.seq][-1][1]
        due = fleet.wall(fleet.states[0].timer_at)      # the end of the step in progress: its token is next
        late = (due - last) / 4
        loop.now = due + late                            # the machine stalled past it, the timer not yet run
        fleet.submit(Submission(100, 5, [], False, target=0), rec)
        await asyncio.wait_for(rec.done.wait(), 600)
        fleet.close()
        return rec.reports[a.seq], due + late

    reports, stalled = run_virtual(go())
    assert reports[5] == (6, pytest.approx(stalled, abs=1e-9))   # one token, as soon as the loop ran again


def test_an_aborted_request_leaves_the_batch_and_frees_its_blocks():
    cfg = ClusterConfig.build(replicas=1)

    async def go():
        fleet = live_fleet(cfg, speed=SPEED)
        rec = Recorder(fleet)
        rec.expected = 2
        lives = [fleet.submit(Submission(500, 400, [], True, target=0), rec) for _ in range(3)]
        while not rec.reports.get(lives[1].seq) or rec.reports[lives[1].seq][-1][0] < 20:
            await asyncio.sleep(0.01)
        fleet.cancel(lives[1])
        rep = fleet.replicas[0]
        await asyncio.sleep(0.2)
        mid = (len(rep.running), lives[1].done)
        await asyncio.wait_for(rec.done.wait(), 600)
        fleet.close()
        return fleet, rec, lives, mid

    fleet, rec, lives, mid = run_virtual(go())
    rep = fleet.replicas[0]
    assert mid == (2, True)
    assert lives[1].seq not in rec.finished
    made = rec.reports[lives[1].seq][-1][0]
    assert 20 <= made < 400 and lives[1].req.generated >= made
    assert [rec.finished[lives[k].seq] for k in (0, 2)] == [400, 400]
    assert rep.kv.used == 0 and not rep.running and not rep.waiting
    assert fleet.states[0].metrics.aborted == 1
    assert fleet.view.outstanding_requests == (0,)


def test_an_aborted_queued_request_never_starts():
    cfg = ClusterConfig.build(replicas=1, max_num_seqs=1, max_num_batched_tokens=2048)

    async def go():
        fleet = live_fleet(cfg, speed=SPEED)
        rec = Recorder(fleet)
        rec.expected = 2
        lives = [fleet.submit(Submission(100, 50, [], False, target=0), rec) for _ in range(3)]
        fleet.cancel(lives[1])
        assert lives[1].done and len(fleet.replicas[0].waiting) == 1
        await asyncio.wait_for(rec.done.wait(), 600)
        fleet.close()
        return fleet, rec, lives

    fleet, rec, lives = run_virtual(go())
    assert lives[1].req.generated == 0 and lives[1].seq not in rec.reports
    assert sorted(rec.finished.values()) == [50, 50]


def test_router_holds_and_rejects_like_the_simulator():
    cfg = ClusterConfig.build(replicas=2)
    reqs = [(0.0, 200, 40, []) for _ in range(6)]
    fleet, rec, lives = _live_run(cfg, reqs, stream=False, policy=make_policy("fcfs_queue", {"max_outstanding": 1}))
    assert len(rec.finished) == 6 and not fleet.held
    starts = sorted(rec.started[live.seq] for live in lives)
    assert starts[2] - starts[1] > 0.5 * 40 * 0.005 / SPEED    # the third waited for a completion
    assert fleet.view.outstanding_requests == (0, 0)

    fleet, rec, lives = _live_run(cfg, reqs, policy=make_policy("admission_control", {"max_outstanding": 1}))
    assert rec.rejected and len(rec.rejected) + len(rec.finished) == 6
    assert fleet.rejected == len(rec.rejected)


def test_replica_abort_mid_decode_cuts_the_run_at_the_step_in_progress():
    """The simulator hook itself: the batch continues without the aborted request."""
    from llmlb_bench.sim.fleet import Fleet
    from llmlb_bench.policies import RouteRequest

    rep = Fleet(ClusterConfig.build(replicas=1), 16).replicas[0]
    reqs = [Request(i, RouteRequest(i, 0.0, 100, 50), 100, 50) for i in range(3)]
    for r in reqs:
        rep.enqueue(r, 0.0)
    done: list[Request] = []
    while rep.run_end < 0.1:
        rep.boundary(done)
    gap = rep.run_gap
    assert rep.abort(reqs[1], 0.1) is False          # running: it leaves at the next boundary
    end = rep.run_end
    assert 0.1 < end <= 0.1 + gap + 1e-12
    rep.boundary(done)
    assert done == [reqs[1]] and reqs[1].generated < 50
    while not rep.idle:
        rep.boundary(done)
    assert [r.generated for r in done[1:]] == [50, 50] and rep.kv.used == 0


@pytest.mark.parametrize("read", [False, True])
def test_a_late_overhead_timer_does_not_move_the_request(read: bool):
    """A request's overhead (the time its API server holds it) ends at its due time in simulated
    time, however late the timer that ends it fires: on a loaded machine it entered the queue when
    the timer fired, and the machine's lateness became part of the served times. The fleet's clock
    is made to jump 50 ms past the due time before the timer fires: the first token still comes one
    prefill step after the due time, as in the batch simulation. Also when /metrics is read in
    between (``read``): a read-out is not an event the request must enter after (it was, and the
    request entered at the read's time: a replayer scraping /metrics moved the served times)."""
    cfg = ClusterConfig.build(replicas=1).with_profile({
        "llmlb_profile": 1, "request_overhead_s": 0.01,
        "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16, "num_kv_blocks": 1000,
                   "max_model_len": 2048},
        "step": {"base_s": 0.004, "per_token_s": 1e-4, "per_sample_s": 5e-4, "per_attn_s": 0.0, "per_kv_s": 0.0}})
    now = [0.0]

    async def go() -> LiveRequest:
        fleet = LiveFleet(cfg, clock=lambda: now[0])
        rec = Recorder(fleet)
        rec.expected = 1
        live = fleet.submit(Submission(100, 1, [], False, target=0), rec)
        now[0] = 0.06                 # the machine stalled: the 10 ms timer fires 50 ms late
        if read:
            assert "vllm:num_requests_waiting" in render(fleet, [0], "m")
        await asyncio.wait_for(rec.done.wait(), 600)
        fleet.close()
        return live

    live = asyncio.run(go())
    assert live.first_token_s == pytest.approx(0.01 + 0.004 + 100 * 1e-4 + 5e-4, abs=1e-12)
