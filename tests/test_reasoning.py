"""Reasoning through the flow: spec and imports -> trace -> simulator -> metrics, SLOs and report.

Replay and ``llmlb serve`` are in tests/test_reasoning_replay.py, real vLLM in
tests/test_reasoning_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.run_figures import ReasoningFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.report.document import ReportOptions, build
from llmlb_bench.report.tables import all_tables
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.timeline import nth_token_times
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.store.views import Catalog
from llmlb_bench.workload.generate import generate
from llmlb_bench.workload.importers import import_trace
from llmlb_bench.workload.importers.jsonl import read_bailian
from llmlb_bench.workload.spec import WorkloadSpec
from metrics_helpers import seg, store_run
from shape_check import mismatches
from test_metrics_docs import find
from sim_helpers import by_request_id, run_sim, trace

SERVEGEN_R1 = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "servegen" / "deepseek-r1"


def spec(reasoning: dict | None, **tenant: object) -> WorkloadSpec:
    t = {"arrival": {"process": "poisson", "rate": 5.0}, "input": {"dist": "fixed", "value": 100},
         "output": {"dist": "uniform", "low": 100, "high": 300}, **tenant}
    if reasoning is not None:
        t["reasoning"] = reasoning
    return WorkloadSpec.from_dict({"seed": 3, "requests": 2000, "tenants": {"r": t}})


def test_ratio_splits_the_output_and_tokens_add_to_the_answer():
    plain = generate(spec(None))
    ratio = generate(spec({"ratio": {"dist": "uniform", "low": 0.2, "high": 0.6}}))
    tokens = generate(spec({"tokens": {"dist": "fixed", "value": 500}, "probability": 0.25}))
    out = plain.column("output_tokens").to_numpy()
    assert plain.column("reasoning_tokens").null_count == plain.num_rows   # no reasoning: the column stays null
    # the reasoning stream is the tenant's own: arrivals and drawn lengths do not move
    for t in (ratio, tokens):
        assert t.column("arrival_s").equals(plain.column("arrival_s"))
    assert np.array_equal(ratio.column("output_tokens").to_numpy(), out)
    r = ratio.column("reasoning_tokens").to_numpy()
    assert np.all((r >= np.floor(0.2 * out)) & (r <= np.ceil(0.6 * out)))
    assert r.sum() / out.sum() == pytest.approx(0.4, abs=0.01)          # mean of the uniform share
    r = tokens.column("reasoning_tokens").to_numpy()
    assert set(np.unique(r)) == {0, 500}
    assert (r > 0).mean() == pytest.approx(0.25, abs=0.03)               # probability of thinking at all
    assert np.array_equal(tokens.column("output_tokens").to_numpy(), out + r)   # output = reasoning + answer
    assert generate(spec({"tokens": {"dist": "fixed", "value": 500}, "probability": 0.25})).equals(tokens)


def test_session_history_keeps_answers_not_reasoning():
    s = spec({"tokens": {"dist": "fixed", "value": 1000}}, sessions={"turns": {"dist": "fixed", "value": 3},
                                                                        "think_s": {"dist": "fixed", "value": 1.0}})
    t = generate(s).to_pylist()
    by = {r["request_id"]: r for r in t}
    children = [r for r in t if r["parent_id"] is not None]
    assert children
    for c in children:
        p = by[c["parent_id"]]
        # next prompt = previous prompt + previous answer (reasoning dropped) + the new message (100)
        assert c["input_tokens"] == p["input_tokens"] + p["output_tokens"] - p["reasoning_tokens"] + 100


@pytest.mark.parametrize("reasoning, problem", [
    ({}, "give exactly one of ratio"),
    ({"ratio": {"dist": "fixed", "value": 0.5}, "tokens": {"dist": "fixed", "value": 9}}, "give exactly one"),
    ({"ratio": {"dist": "fixed", "value": 0.5}, "probabilty": 0.5}, "probabilty"),
    ({"tokens": {"dist": "fixed", "value": 9}, "probability": 2}, "must be <= 1"),
    ({"ratio": {"dist": "fixed", "value": 1.5}}, r"must lie in \[0, 1\].*100% of its mass above 1"),
    ({"ratio": {"dist": "uniform", "low": 0.5, "high": 1.5}}, "50% of its mass above 1"),
])
def test_bad_reasoning_tables_name_the_field(reasoning, problem):
    with pytest.raises(UserError, match=problem) as e:
        spec(reasoning)
    assert "tenants.r.reasoning" in str(e.value)


def test_servegen_deepseek_r1_brings_its_reason_ratio():
    if not SERVEGEN_R1.exists():
        pytest.skip("ServeGen data absent (../shared/data)")
    imported = import_trace("servegen", SERVEGEN_R1)
    t = imported.table
    r, out = t.column("reasoning_tokens").to_numpy(), t.column("output_tokens").to_numpy()
    assert np.all(r <= out) and set(t.column("kind").to_pylist()) == {"reasoning"}
    # the spec carries the measured PDFs: each tenant's mean share is its reason_ratio's mean
    tenants = imported.spec["tenants"]
    ratio = next(iter(tenants.values()))["reasoning"]["ratio"]
    assert ratio["dist"] == "empirical" and max(ratio["values"]) <= 1.0
    means = [np.dot(v["reasoning"]["ratio"]["values"], v["reasoning"]["ratio"]["probs"]) for v in tenants.values()]
    assert min(means) - 0.02 < (r / out).mean() < max(means) + 0.02


def test_bailian_jsonl_reasoning_column(tmp_path):
    f = tmp_path / "b.jsonl"
    rows = [{"chat_id": 1, "timestamp": 0.0, "input_length": 10, "output_length": 50, "hash_ids": [1],
             "reasoning_tokens": 30},
            {"chat_id": 2, "timestamp": 1.0, "input_length": 10, "output_length": 20, "hash_ids": [2],
             "reasoning_tokens": None}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_bailian(f).column("reasoning_tokens").to_pylist() == [30, 0]
    rows[1]["reasoning_tokens"] = 21
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(UserError, match="line 2: reasoning_tokens 21 exceeds output_length 20"):
        read_bailian(f)


def test_nth_token_time_reads_segments():
    tt = pa.array([[seg(1.0, 0.1, 3), seg(2.0, 0.5, 4)], [seg(0.0, 1.0, 2)], None], pa.list_(TOKEN_SEGMENT))
    got = nth_token_times(tt, np.array([5, 3, 1]))
    assert got[0] == pytest.approx(2.5) and np.isnan(got[1]) and np.isnan(got[2])
    assert nth_token_times(tt, np.array([3, 2, 0]))[:2] == pytest.approx([1.2, 1.0])


def test_simulator_reasoning_is_decode_work_and_the_answer_starts_after_it(tmp_path):
    """One request at a time: decode steps are identical, so token k comes at first + (k - 1) x TPOT."""
    cfg = ClusterConfig.build(replicas=1)
    arrival = np.arange(6) * 50.0
    out = np.array([400, 400, 300, 300, 1, 2])
    reasoning = pa.array([300, 0, 299, 300, 1, 1], pa.int32())
    plain, _, _ = run_sim(tmp_path, trace(arrival, 200, out), cfg, run_id="plain")
    think, _, _ = run_sim(tmp_path, trace(arrival, 200, out, reasoning_tokens=reasoning), cfg, run_id="think")
    plain, think = by_request_id(plain), by_request_id(think)
    for col in ("first_token_s", "last_token_s", "output_tokens", "token_times"):  # the same decode work
        assert think.column(col).equals(plain.column(col))
    assert plain.column("reasoning_tokens").null_count == plain.num_rows == plain.column("first_answer_s").null_count
    rows = think.to_pylist()
    assert [r["reasoning_tokens"] for r in rows] == [300, None, 299, 300, 1, 1]
    for r in rows:
        k = r["reasoning_tokens"]
        if k and k < r["output_tokens"]:
            tpot = (r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
            assert r["first_answer_s"] == pytest.approx(r["first_token_s"] + k * tpot, rel=1e-9)
        else:
            assert r["first_answer_s"] is None   # no reasoning, or all reasoning and no answer

    [s_think] = summarize(Catalog([tmp_path / "think"]), Slo.parse("ttfa=3s"))
    [s_plain] = summarize(Catalog([tmp_path / "plain"]), Slo.parse("ttfa=3s"))
    assert s_plain["reasoning"] is None
    assert s_think["reasoning"]["tokens"] == 901 and s_think["reasoning"]["requests"] == 5
    assert s_think["reasoning"]["share"] == pytest.approx(901 / out.sum())
    assert mismatches(s_think["reasoning"], ReasoningFigures, "reasoning") == []   # as run_figures.py declares


def test_answer_metrics_and_slos_against_hand_computed_values(tmp_path):
    """TTFT stays the first token of any kind; TTFA and answer TPOT follow the answer; SLOs on them."""
    rows = {
        "request_id": [0, 1, 2, 3], "sent_s": [0.0, 1.0, 2.0, 3.0], "scheduled_s": [0.0, 1.0, 2.0, 3.0],
        "first_token_s": [0.1, 1.1, 2.2, 3.1], "last_token_s": [2.1, 1.5, 3.2, 4.1],
        "token_times": [[seg(0.1, 0.1, 21)], [seg(1.1, 0.1, 5)], [seg(2.2, 0.1, 11)], [seg(3.1, 0.1, 11)]],
        "output_tokens": [21, 5, 11, 11], "reasoning_tokens": [10, None, 10, 11],
        "first_answer_s": [1.1, None, 3.2, None], "status": ["ok"] * 4}
    store_run(tmp_path, "r", rows)
    cat = Catalog([tmp_path])
    [s] = summarize(cat, Slo.parse("ttfa=1.05s,answer_tpot=150ms"))
    r = s["reasoning"]
    # ttfa: 1.1 (reasoned), 0.1 (no reasoning: its first token), 1.2 (answer = one token); none for request 3
    assert r["ttfa"]["n"] == 3 and r["ttfa"]["mean"] == pytest.approx((1.1 + 0.1 + 1.2) / 3)
    # answer tpot: (2.1 - 1.1) / 10 and (1.5 - 1.1) / 4; request 2's answer is one token, request 3 has none
    assert r["answer_tpot"]["n"] == 2 and r["answer_tpot"]["mean"] == pytest.approx(0.1)
    assert s["ttft"]["mean"] == pytest.approx(0.125)
    assert r["share"] == pytest.approx(31 / 48) and r["requests"] == 3
    # good: request 1 only (0 has ttfa 1.1 > 1.05, 2 has 1.2, 3 never answered)
    assert s["slo"]["good"] == 1
    [s] = summarize(cat, Slo.parse("ttfa=1.15s"))
    assert s["slo"]["good"] == 2
    with pytest.raises(UserError, match="unknown SLO metric 'ttfb'.*ttfa, answer_tpot"):
        Slo.parse("ttfb=1s")


def test_report_shows_reasoning_only_for_runs_with_it(tmp_path):
    base = {"request_id": [0, 1], "sent_s": [0.0, 1.0], "scheduled_s": [0.0, 1.0], "first_token_s": [0.1, 1.1],
            "last_token_s": [0.5, 1.5], "token_times": [[seg(0.1, 0.1, 5)], [seg(1.1, 0.1, 5)]],
            "output_tokens": [5, 5], "status": ["ok", "ok"]}
    store_run(tmp_path / "plain", "plain", base)

    def titles(path: Path) -> str:
        doc = build(Catalog([path]), ReportOptions())
        return "\n".join(str(cell) for t in all_tables(doc) for row in [t.header] + t.rows for cell in row)

    assert "TTFA" not in titles(tmp_path / "plain") and "Reasoning" not in titles(tmp_path / "plain")
    store_run(tmp_path / "think", "think", {**base, "reasoning_tokens": [2, 2], "first_answer_s": [0.3, 1.3]})
    text = titles(tmp_path / "think")
    assert "TTFA p99 (s)" in text and "reasoning share of output tokens (%)" in text


def test_documented_reasoning_sql_gives_the_report_figures(tmp_path):
    rng = np.random.default_rng(5)
    n = 60
    sent = np.sort(rng.uniform(0, 20, n))
    out = rng.integers(2, 80, n)
    reasoning = np.where(rng.random(n) < 0.7, rng.integers(0, 40, n), 0) * (out > 40)
    first = sent + rng.uniform(0.05, 0.3, n)
    gap = rng.uniform(0.01, 0.03, n)
    store_run(tmp_path, "doc", {
        "request_id": list(range(n)), "sent_s": sent, "scheduled_s": sent, "first_token_s": first,
        "last_token_s": first + gap * (out - 1), "token_times": [[seg(f, g, int(o))] for f, g, o in zip(first, gap, out)],
        "output_tokens": out, "reasoning_tokens": [int(r) or None for r in reasoning],
        "first_answer_s": [f + g * r if r else None for f, g, r in zip(first, gap, reasoning)], "status": ["ok"] * n})
    [s] = summarize(Catalog([tmp_path]), None)
    [r] = Catalog([tmp_path], confined=True).query_read_only(find("ttfa_p99")).to_pylist()
    assert r["ttfa_p99"] == pytest.approx(s["reasoning"]["ttfa"]["p99"])
    assert r["answer_tpot_p50"] == pytest.approx(s["reasoning"]["answer_tpot"]["p50"])
    assert r["reasoning_share"] == pytest.approx(s["reasoning"]["share"]) == pytest.approx(reasoning.sum() / out.sum())
    # theory: evenly paced tokens, so the answer's TPOT is each request's gap
    assert s["reasoning"]["answer_tpot"]["p50"] == pytest.approx(np.percentile(gap[out - reasoning > 1], 50))


def test_reasoning_preset_has_servegens_share_and_every_request_answers():
    from llmlb_bench.workload.spec import load_spec

    t = generate(load_spec(Path(__file__).resolve().parents[1] / "workloads" / "reasoning.toml"))
    r, out = t.column("reasoning_tokens").to_numpy(), t.column("output_tokens").to_numpy()
    assert r.sum() / out.sum() == pytest.approx(0.62, abs=0.02)   # ServeGen deepseek-r1: 62% of output tokens
    assert np.all(r < out)                                           # a share below 1 leaves an answer token


def test_a_gate_on_the_answer_catches_longer_reasoning_that_ttft_does_not(tmp_path, capsys):
    """Same outputs, more of them reasoning: TTFT and E2E stay, TTFA grows, and p99_ttfa fails."""
    from conftest import cli
    from llmlb_bench.experiment import simulate_run
    from llmlb_bench.schema import read_trace, write_trace

    for side, share in (("base", 0.2), ("worse", 0.8)):
        s = spec({"ratio": {"dist": "fixed", "value": share}}).replace(requests=300)
        for seed in (1, 2, 3):
            path = tmp_path / side / f"s{seed}.parquet"
            write_trace(generate(s, seed=seed), path, spec=s.to_dict())
            simulate_run(read_trace(path), path, ClusterConfig.build(replicas=2), "least_outstanding", {}, seed,
                         tmp_path / side / "runs", run_id=f"s{seed}")
    code, out, _ = cli(["gate", str(tmp_path / "base" / "runs"), str(tmp_path / "worse" / "runs"),
                        "--rule", "p99_ttft <= +10%", "--rule", "ttfa.p99 <= +10%", "--json", str(tmp_path / "g.json"),
                        "--allow-different-workloads"],   # the traces stand for a model that reasons longer
                       capsys)
    assert code == 1, out
    status = {v["rule"]: v["status"] for v in json.loads((tmp_path / "g.json").read_text())["verdicts"]}
    assert status == {"p99_ttft <= +10%": "pass", "ttfa.p99 <= +10%": "fail"}


def test_trace_stats_report_the_reasoning_share():
    from llmlb_bench.workload.stats import trace_stats

    t = generate(spec({"tokens": {"dist": "fixed", "value": 500}, "probability": 0.25}))
    r, out = t.column("reasoning_tokens").to_numpy(), t.column("output_tokens").to_numpy()
    got = trace_stats(t)["reasoning"]
    assert got == pytest.approx({"requests_reasoning": (r > 0).mean(), "token_share": r.sum() / out.sum(),
                                 "p50_tokens": 500.0})
    assert "reasoning" not in trace_stats(generate(spec(None)))


def test_trace_fit_recovers_the_reasoning_share():
    from llmlb_bench.workload.fit import fit_trace

    original = generate(spec({"ratio": {"dist": "uniform", "low": 0.3, "high": 0.9}, "probability": 0.6}))
    fitted = fit_trace(original).spec
    table = next(iter(fitted["tenants"].values()))["reasoning"]
    assert table["probability"] == pytest.approx(0.6, abs=0.03)
    again = generate(WorkloadSpec.from_dict(fitted))
    share = lambda t: t.column("reasoning_tokens").to_numpy().sum() / t.column("output_tokens").to_numpy().sum()  # noqa: E731
    assert share(again) == pytest.approx(share(original), abs=0.02)
