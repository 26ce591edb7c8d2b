"""Queue/SLO-aware policies: predicted TTFT with early rejection, admission
control, and the router-side queues (FCFS, EDF, predicted SJF) with their
HOLD / release protocol."""

from __future__ import annotations

import pytest

from llmlb_bench.policies import HOLD, REJECT, RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.base import on_dispatch, on_finish, set_now


def view(n: int = 2, capacity: tuple[float, ...] | None = None, **signals) -> View:
    caps = capacity or (1.0,) * n
    return View([TargetInfo(f"r{i}", capacity=caps[i]) for i in range(n)], **signals)


def req(i: int = 0, input_tokens: int = 1000, out: int = 50, arrival: float = 0.0, hashes=(), **kw) -> RouteRequest:
    return RouteRequest(request_id=i, arrival_s=arrival, input_tokens=input_tokens, max_output_tokens=out,
                        prefix_hashes=list(hashes), **kw)


# --- predicted TTFT (Mooncake) ---------------------------------------------------------------

def test_predicted_ttft_is_queue_plus_uncached_prefill_and_the_queue_drains():
    pol = make_policy("predicted_ttft", {"prefill_tokens_per_s": 1000.0})
    v = view(2)
    a = pol.choose(req(0, 2000), v)  # 2 s of prefill queued on a
    b = 1 - a
    on_dispatch(v, a, req(0, 2000))
    assert pol.predicted(req(1, 500), v)[a] == pytest.approx(2.5)
    assert pol.predicted(req(1, 500), v)[b] == pytest.approx(0.5)
    assert pol.choose(req(1, 500), v) == b
    set_now(v, 1.5)
    ttft = pol.predicted(req(2, 1000), v)
    assert (ttft[a], ttft[b]) == pytest.approx((0.5 + 1.0, 0.0 + 1.0))


def test_predicted_ttft_counts_cache_hits_and_capacity():
    pol = make_policy("predicted_ttft", {"prefill_tokens_per_s": 1000.0})
    hashes = list(range(50))  # 800 tokens of shared prefix
    v = view(2, capacity=(1.0, 2.0))
    pol.index.insert(hashes, 0, 0.0)
    # target 0: (1000 - 800) / 1000 = 0.2 s; target 1 (twice as fast): 1000 / 2000 = 0.5 s
    assert pol.predicted(req(0, 1000, hashes=hashes), v) == pytest.approx([0.2, 0.5])
    events = view(2, cached_prefix=lambda i, h: 50 if i == 1 else 0)
    assert make_policy("predicted_ttft", {"prefill_tokens_per_s": 1000.0}).choose(req(0, 1000, hashes=hashes),
                                                                                  events) == 1


def test_predicted_ttft_rejects_early_when_the_best_estimate_misses_the_slo():
    pol = make_policy("predicted_ttft", {"prefill_tokens_per_s": 1000.0, "ttft_slo_s": 1.5})
    v = view(1)
    assert pol.choose(req(0, 1000), v) == 0
    assert pol.choose(req(1, 1000), v) == REJECT  # would wait 1 s + 1 s prefill = 2 s > 1.5 s
    assert pol.choose(req(2, 400), v) == 0  # 1 s + 0.4 s fits; the rejected request left no trace


# --- admission control -----------------------------------------------------------------------

def test_admission_control_sheds_load_only_when_every_target_is_full():
    pol = make_policy("admission_control", {"max_outstanding": 3})
    assert pol.choose(req(), view(2, outstanding_requests=[3, 2])) == 1
    assert pol.choose(req(), view(2, outstanding_requests=[3, 3])) == REJECT
    assert pol.choose(req(), view(2, outstanding_requests=[0, 0], healthy=[False, False])) == REJECT


def test_admission_control_token_limit_admits_an_oversized_request_on_an_idle_target():
    pol = make_policy("admission_control", {"max_outstanding_tokens": 1000})
    assert pol.choose(req(0, 600, 100), view(2, outstanding_tokens=[500, 600], outstanding_requests=[1, 1])) == REJECT
    assert pol.choose(req(0, 600, 100), view(2, outstanding_tokens=[300, 600], outstanding_requests=[1, 1])) == 0
    assert pol.choose(req(0, 5000, 100), view(2, outstanding_tokens=[300, 0])) == 1


# --- router queues ---------------------------------------------------------------------------

class Backend:
    """The HOLD/release protocol as a backend must drive it (what base.py documents)."""

    def __init__(self, policy, n: int = 1) -> None:
        self.policy = policy
        self.view = View([TargetInfo(f"r{i}") for i in range(n)])
        self.sent: list[tuple[int, int]] = []
        self.rejected: list[int] = []
        self.inflight: dict[int, tuple[RouteRequest, int]] = {}

    def _dispatch(self, r: RouteRequest, target: int) -> None:
        if target == REJECT:
            self.rejected.append(r.request_id)
            return
        on_dispatch(self.view, target, r)
        self.inflight[r.request_id] = (r, target)
        self.sent.append((r.request_id, target))

    def _drain(self) -> None:
        while (item := self.policy.release(self.view)) is not None:
            self._dispatch(*item)

    def arrive(self, r: RouteRequest) -> None:
        set_now(self.view, max(self.view.now, r.arrival_s))
        t = self.policy.choose(r, self.view)
        if t == HOLD:
            self._drain()
        else:
            self._dispatch(r, t)

    def finish(self, rid: int, now: float) -> None:
        set_now(self.view, now)
        r, t = self.inflight.pop(rid)
        on_finish(self.view, t, r)
        self.policy.on_complete(r, t, self.view)
        self._drain()


def test_fcfs_queue_holds_at_the_limit_and_releases_in_arrival_order():
    b = Backend(make_policy("fcfs_queue", {"max_outstanding": 2}))
    for i in range(5):
        b.arrive(req(i, arrival=0.1 * i))
    assert [rid for rid, _ in b.sent] == [0, 1] and b.policy.held == 3
    b.finish(0, 1.0)
    b.finish(1, 1.1)
    assert [rid for rid, _ in b.sent] == [0, 1, 2, 3]
    b.finish(2, 1.2)
    assert [rid for rid, _ in b.sent][-1] == 4 and b.policy.held == 0


def test_fcfs_queue_does_not_let_a_newcomer_jump_the_queue():
    b = Backend(make_policy("fcfs_queue", {"max_outstanding": 1}), n=2)
    for i in range(3):
        b.arrive(req(i))
    assert [rid for rid, _ in b.sent] == [0, 1] and b.policy.held == 1
    b.finish(0, 1.0)  # room again: the held request 2 goes, not a later arrival
    assert b.sent[-1][0] == 2


def test_edf_releases_the_earliest_deadline_and_can_drop_late_requests():
    pol = make_policy("edf", {"max_outstanding": 1, "deadlines": "interactive=0.5,batch=60", "drop_late": True})
    b = Backend(pol)
    b.arrive(req(0, arrival=0.0, slo_class="batch"))           # sent at once
    b.arrive(req(1, arrival=0.1, slo_class="batch"))           # deadline 60.1
    b.arrive(req(2, arrival=0.2, slo_class="interactive"))     # deadline 0.7
    b.arrive(req(3, arrival=0.3))                              # default 2.0 -> deadline 2.3
    b.finish(0, 0.4)
    assert b.sent[-1][0] == 2  # interactive first
    b.finish(2, 3.0)  # now 3.0: request 3 (deadline 2.3) is late and dropped, batch request 1 goes
    assert b.rejected == [3] and b.sent[-1][0] == 1


def test_predicted_sjf_with_a_perfect_oracle_releases_shortest_first():
    b = Backend(make_policy("predicted_sjf", {"max_outstanding": 1, "tau": 1.0}))
    lengths = [100, 900, 30, 500, 10]
    for i, out in enumerate(lengths):
        b.arrive(req(i, out=out, arrival=0.01 * i))
    for t, rid in enumerate([0, 4, 2, 3]):
        b.finish(rid, 1.0 + t)
    assert [rid for rid, _ in b.sent] == [0, 4, 2, 3, 1]


def test_edf_rejects_a_malformed_deadline_list():
    from llmlb_bench.errors import UserError

    with pytest.raises(UserError, match="slo_class=seconds"):
        make_policy("edf", {"deadlines": "interactive:0.5"})
