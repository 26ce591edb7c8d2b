"""The SQL in docs/metrics.md runs through ``llmlb query`` and gives back the report's figures."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import seg, store_run

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def statements() -> list[str]:
    """Every SQL statement of the doc's ``sql`` blocks, comments removed."""
    out = []
    for block in re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S):
        for stmt in re.split(r";\s*\n", block):
            sql = "\n".join(ln for ln in stmt.splitlines() if not ln.strip().startswith("--")).strip().rstrip(";")
            if sql:
                out.append(sql)
    return out


def find(fragment: str) -> str:
    [sql] = [s for s in statements() if fragment in s]
    return sql


@pytest.fixture
def run(tmp_path):
    """Two tenants, six requests, a power series: enough for every documented query to mean something."""
    rows = {
        "request_id": list(range(6)), "tenant": ["a", "b", "a", "b", "a", "b"],
        "sent_s": [0.0, 0.3, 1.0, 1.2, 2.0, 2.5], "scheduled_s": [0.0, 0.3, 1.0, 1.2, 2.0, 2.5],
        "first_token_s": [0.2, 1.1, 1.3, 1.9, 2.1, None], "last_token_s": [1.0, 1.5, 1.9, 2.9, 2.1, None],
        "token_times": [[seg(0.2, 0.1, 9)], [seg(1.1, 0.0, 2), seg(1.5, 0.0, 1)], [seg(1.3, 0.2, 4)],
                        [seg(1.9, 0.25, 5)], [seg(2.1, 0.0, 1)], None],
        "output_tokens": [9, 3, 4, 5, 1, 0], "input_tokens": [100, 200, 300, 400, 50, 60],
        "cached_tokens": [0, 100, 150, 0, 25, 0], "status": ["ok"] * 5 + ["error"]}
    store_run(tmp_path, "doc", rows, series={"t_s": [0.0, 1.0, 3.0] * 2, "target": ["r0"] * 3 + ["r1"] * 3,
                                             "power_w": [60.0, 200.0, 150.0, 50.0, 80.0, 90.0],
                                             "kv_blocks_used": [0, 5, 3, 0, 8, 1], "kv_blocks_total": [10] * 6,
                                             "waiting": [0, 2, 1, 0, 1, 0]})
    cat = Catalog([tmp_path])
    [s] = summarize(cat, Slo.parse("ttft=500ms,tpot=50ms"))
    [ttft_only] = summarize(cat, Slo.parse("ttft=500ms"))
    return cat, s, ttft_only


def test_documented_queries_reproduce_the_report(run):
    cat, s, ttft_only = run
    user = Catalog(cat.run_dirs, confined=True)  # as `llmlb query` opens it
    q = lambda sql: user.query_read_only(sql).to_pylist()  # noqa: E731
    assert len(statements()) >= 10
    for sql in statements():       # every statement is valid, read-only SQL over the views
        q(sql)
    [r] = q(find("ttft_p99"))
    assert r["ttft_p99"] == pytest.approx(s["ttft"]["p99"])
    [r] = q(find("itl_mean"))
    assert r["itl_mean"] == pytest.approx(s["itl"]["mean"]) and r["gaps"] == s["itl"]["n"]
    [r] = q(find("as attainment"))
    assert r["attainment"] == pytest.approx(s["slo"]["attainment"]) and r["goodput"] == pytest.approx(s["slo"]["goodput"])
    [r] = q(find("ceil(0.1 * sum(w)"))
    assert list(r.values())[1] == pytest.approx(s["pacing"]["slowest10_gap_mean_s"])
    [r] = q(find("as jain from"))
    # ttft <= 500 ms: a 3/3, b 0/3 (0.8 and 0.7 s late, one failed)
    assert r["jain"] == pytest.approx(ttft_only["fairness"]["jain_attainment"]) == pytest.approx(0.5)
    assert s["slo"]["attainment"] == pytest.approx(1 / 6)   # with tpot <= 50 ms only the 1-token request is good
    [r] = q(find("max(nl) / min(nl)"))
    assert list(r.values())[1] == pytest.approx(s["fairness"]["slowdown_ratio"])
    energy = {r["target"]: r["avg_w"] for r in q(find("as energy_j"))}
    assert energy == pytest.approx(s["energy"]["avg_power_w"])
    [r] = q(find("sum(cached_tokens)"))
    assert list(r.values())[1] == pytest.approx(s["state"]["prefix_cache_hit_rate"])


def test_documented_window_sql_matches_the_numpy_windows(tmp_path):
    """Random requests of three tenants, 1-second windows: the doc's SQL and the report agree."""
    rng = np.random.default_rng(9)
    n = 300
    sent = np.sort(rng.uniform(0, 30, n))
    first = sent + rng.exponential(0.8, n)
    out = rng.integers(1, 60, n)
    last = first + rng.uniform(0.01, 0.05, n) * (out - 1)
    failed = rng.random(n) < 0.05
    store_run(tmp_path, "win", {
        "request_id": list(range(n)), "tenant": rng.choice(["a", "b", "c"], n).tolist(),
        "sent_s": sent, "scheduled_s": sent, "first_token_s": [None if x else v for x, v in zip(failed, first)],
        "last_token_s": [None if x else v for x, v in zip(failed, last)], "input_tokens": rng.integers(10, 900, n),
        "output_tokens": np.where(failed, 0, out), "status": np.where(failed, "error", "ok").tolist()})
    cat = Catalog([tmp_path])
    [s] = summarize(cat, None, Options(window_s=1.0))
    sql = find("jain_service").replace("/ 10", "/ 1").replace("* 10", "* 1").replace("+ 1) * 10", "+ 1) * 1")
    [r] = Catalog([tmp_path], confined=True).query_read_only(sql).to_pylist()
    f = s["fairness"]
    assert r["windows"] == f["windows"] > 10
    assert r["gap_max"] == pytest.approx(f["service_gap_max"]) and r["gap_mean"] == pytest.approx(f["service_gap_mean"])
    assert r["jain_service"] == pytest.approx(f["jain_service"])


def test_documented_origin_sql_counts_a_simulated_run_from_arrival(tmp_path):
    """A simulated run whose router held requests: the doc's TTFT and wait queries give the report's figures."""
    n = 50
    rng = np.random.default_rng(3)
    sched = np.sort(rng.uniform(0, 10, n))
    sent = sched + rng.exponential(0.5, n) * (rng.random(n) < 0.6)
    first = sent + 0.05
    store_run(tmp_path, "held", {"request_id": list(range(n)), "scheduled_s": sched, "sent_s": sent,
                                 "first_token_s": first, "last_token_s": first + 0.2, "output_tokens": [5] * n,
                                 "status": ["ok"] * n}, backend="sim")
    cat = Catalog([tmp_path])
    [s] = summarize(cat, None)
    [r] = cat.query(find("ttft_p99")).to_pylist()
    assert r["ttft_p99"] == pytest.approx(s["ttft"]["p99"]) == pytest.approx(np.percentile(first - sched, 99))
    [r] = cat.query(find("share_waited")).to_pylist()
    assert list(r.values())[1] == pytest.approx(s["wait"]["mean"])
    assert r["share_waited"] == pytest.approx(s["wait"]["share"])


def test_documented_speculative_sql_gives_the_report_figures(tmp_path):
    """A replay whose server counted drafts (series) and a simulated run (per-request counts)."""
    bundled = [[seg(0.1, 0.0, 1), seg(0.2, 0.0, 3), seg(0.3, 0.0, 2)], [seg(0.5, 0.0, 1), seg(0.6, 0.1, 3)]]
    base = {"request_id": [0, 1], "sent_s": [0.0, 0.4], "scheduled_s": [0.0, 0.4], "first_token_s": [0.1, 0.5],
            "last_token_s": [0.3, 0.8], "token_times": bundled, "output_tokens": [6, 4], "input_tokens": [10, 10],
            "status": ["ok", "ok"]}
    store_run(tmp_path, "replay", base, series={"t_s": [0.0, 1.0], "target": ["r0", "r0"], "spec_drafts": [None, 4],
                                                "spec_draft_tokens": [None, 16], "spec_accepted_tokens": [None, 6]})
    store_run(tmp_path, "sim", {**base, "spec_drafts": [2, 1], "spec_draft_tokens": [8, 4],
                                "spec_accepted_tokens": [3, 0]})
    cat = Catalog([tmp_path])
    got = {s["run_id"]: s["speculative"] for s in summarize(cat)}
    user = Catalog(cat.run_dirs, confined=True)
    q = lambda sql: {r["run_id"]: r for r in user.query_read_only(sql).to_pylist()}  # noqa: E731
    [from_series, from_requests] = [s for s in statements() if "as mean_acceptance_length" in s]
    for run_id, r in [*q(from_series).items(), *q(from_requests).items()]:
        assert r["acceptance_rate"] == pytest.approx(got[run_id]["acceptance_rate"])
        assert r["mean_acceptance_length"] == pytest.approx(got[run_id]["mean_acceptance_length"])
    assert got["replay"]["source"] == "server" and got["replay"]["acceptance_rate"] == 6 / 16
    assert got["sim"]["source"] == "simulator" and got["sim"]["mean_acceptance_length"] == 1 + 3 / 3
    # deliveries: 3 bundles, then 1 + 3 spaced tokens: 10 tokens in 7 deliveries; from the lists and from
    # the per-row column
    from_lists, from_column = [s for s in statements() if "as tokens_per_delivery" in s]
    for sql in (from_lists, from_column):
        for run_id, r in q(sql).items():
            assert r["tokens_per_delivery"] == pytest.approx(10 / 7) == got[run_id]["tokens_per_delivery"]
