"""The control policies on real HTTP: the replayer's client-side router, ``llmlb serve``'s router and
``llmlb route`` feed them measured TTFTs (``RouteRequest.outcome``), and their limits hold there."""

from __future__ import annotations

from llmlb_bench.policies.control import ConcurrencyLimit, PiAdmission
from tests.conftest import make_trace
from tests.replay_helpers import run_replay, servers  # noqa: F401  (fixture)
from tests.serve_helpers import route_over_serve


def _never_more_than(rows: list[dict], limit: int) -> None:
    """At no instant more than ``limit`` requests between their send and their last token."""
    events = sorted([(r["sent_s"], 1) for r in rows] + [(r["last_token_s"], -1) for r in rows],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= limit, peak


def test_replayer_holds_pi_admissions_limit(servers, tmp_path):  # noqa: F811
    """A limit clamped to 2 through the replayer: never more than two requests in flight, the rest held
    and released as answers come back, and the controller measured TTFTs from the outcomes."""
    urls = [servers.noop()[0], servers.noop()[0]]
    pol = PiAdmission(target_ttft_s=0.5, period_s=0.05, window_s=0.05, initial_limit=2.0, max_limit=2.0)
    _, rows, _ = run_replay(make_trace(n=40, rate=400.0, output_tokens=5), urls, tmp_path, pol)
    assert {r["status"] for r in rows} == {"ok"}
    _never_more_than(rows, 2)
    assert any(sent > sched for sent, sched in ((r["sent_s"], r["scheduled_s"]) for r in rows))  # some waited
    assert pol.held == 0 and any(y is not None for _, y, _ in pol.history)


def test_serve_and_route_run_the_controllers(tmp_path):
    """``llmlb serve`` routing by concurrency_limit (per-replica limit 1) and ``llmlb route`` in front of
    it by pi_admission: every request answered; the proxy's controller measured each one's TTFT."""
    inner = ConcurrencyLimit(initial_limit=1.0, max_limit=1.0, period_s=0.05)
    outer = PiAdmission(target_ttft_s=1.0, period_s=0.05, window_s=100.0)   # keeps every sample
    route_over_serve(tmp_path, inner, outer)
    assert len(outer._window) == 6 and all(v >= 0 for _, v in outer._window)
    assert inner.limits == [1.0, 1.0] and inner.held == 0       # it routed every request, none left held
