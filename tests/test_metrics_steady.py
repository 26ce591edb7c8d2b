"""Runs not in steady state are flagged: a growing queue, a dominant drain tail, attainment collapsing at the end."""

from __future__ import annotations

import pytest

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.report.document import ReportOptions, build
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run
from sim_helpers import poisson_trace, run_sim


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    """Four replicas serve about 45 req/s of this workload: 10 req/s is steady, 60 req/s is not."""
    root = tmp_path_factory.mktemp("steady")
    for rate in (10.0, 60.0):
        run_sim(root, poisson_trace(3000, rate=rate, seed=2), ClusterConfig.build(replicas=4), run_id=f"r{rate:g}")
    return root


def test_an_overloaded_run_says_so_and_a_light_one_does_not(loads):
    by = {s["run_id"]: s for s in summarize(Catalog([loads]), Slo.parse("ttft=500ms,tpot=50ms"))}
    assert by["r10"]["steady"]["steady"] and by["r10"]["steady"]["flags"] == []
    over = by["r60"]["steady"]
    assert not over["steady"] and any("queue grows" in f for f in over["flags"])
    parts = [p["ttft_mean"] for p in over["parts"]]
    assert len(parts) == 10 and parts[-1] > 3 * parts[1]
    doc = build(Catalog([loads]), ReportOptions(slo=Slo.parse("ttft=500ms,tpot=50ms")))
    assert any(n.startswith("r60") or "not in steady state" in n for n in doc["notes"])


def test_a_long_drain_tail_and_a_late_collapse_are_flagged(tmp_path):
    n = 100
    sched = [i * 0.1 for i in range(n)]               # arrivals over 10 s
    late = [i >= 90 for i in range(n)]                # the last tenth misses its TTFT limit by far
    first = [t + (5.0 if x else 0.1) for t, x in zip(sched, late)]
    store_run(tmp_path, "tail", {"request_id": list(range(n)), "scheduled_s": sched, "sent_s": sched,
                                 "first_token_s": first, "last_token_s": [f + 20.0 for f in first],
                                 "output_tokens": [50] * n, "status": ["ok"] * n})
    [s] = summarize(Catalog([tmp_path]), Slo.parse("ttft=1s"))
    flags = s["steady"]["flags"]
    assert any("drain tail" in f for f in flags) and any("attainment collapses" in f for f in flags)
    assert any("queue grows" in f for f in flags)      # 5.0 s against 0.1 s
