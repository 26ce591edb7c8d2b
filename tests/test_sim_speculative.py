"""Speculative decoding in the simulator (sim/speculative.py), checked against theory:
tokens per verify step (Leviathan et al. 2023), the batch-1 speed-up with the proposer's
cost, bundled token times, determinism, acceptance per request class and config errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.catalog import load_catalog
from llmlb_bench.sim.speculative import Speculation, SpeculativeSpec, expected_tokens
from sim_helpers import TINY_GPU, by_request_id, poisson_trace, run_sim, trace


def _cfg(spec: dict[str, Any] | None, **kw: Any) -> ClusterConfig:
    return ClusterConfig.build(**{"replicas": 1, "gpu": "h100-sxm", "model": "llama-3-8b", "speculative": spec,
                                  "enable_prefix_caching": False, **kw})


def _steps(row: dict[str, Any]) -> int:
    """Verify steps of a request: its token_times segments after the prefill's first token."""
    return len(row["token_times"]) - 1


@pytest.mark.parametrize("a,k", [(0.5, 4), (0.8, 4), (0.9, 2), (0.0, 3), (1.0, 5)])
def test_tokens_per_step_match_the_iid_acceptance_model(a: float, k: int) -> None:
    spec = SpeculativeSpec.parse({"acceptance": a, "num_speculative_tokens": k}, "speculative")
    prop = Speculation(spec, CostModel(load_catalog().model("llama-3-8b"), load_catalog().gpu("h100-sxm")),
                       None, 32, None, seed=3)
    accepted, emitted = prop.draw(0, 0, 0, 200_000)
    assert emitted.sum() == 200_000 and np.array_equal(emitted[:-1], accepted[:-1] + 1)
    mean = accepted[:-1].mean() + 1
    e = expected_tokens(a, k)
    sd = np.std(accepted[:-1] + 1)
    assert abs(mean - e) <= 4 * sd / np.sqrt(len(emitted)) + 1e-12, (mean, e)
    # the accepted count's distribution: P(j) = a^j (1 - a) below k, a^k at k
    p = [a ** j * (1 - a) for j in range(k)] + [a ** k]
    freq = np.bincount(accepted[:-1], minlength=k + 1) / (len(accepted) - 1)
    assert np.allclose(freq, p, atol=0.01)


def test_a_long_request_emits_the_expected_tokens_per_step(tmp_path: Path) -> None:
    req, _, _ = run_sim(tmp_path, trace(np.array([0.0]), 200, 4000), _cfg({"acceptance": 0.8}))
    row = req.to_pylist()[0]
    assert row["output_tokens"] == 4000
    steps = _steps(row)
    assert sum(s["count"] for s in row["token_times"]) == 4000
    assert all(s["gap_s"] == 0.0 for s in row["token_times"])      # each step's tokens arrive bundled
    assert row["spec_draft_tokens"] == 4 * steps
    assert row["spec_accepted_tokens"] >= 3999 - steps   # the last step may be cut at max_tokens
    assert abs(3999 / steps - expected_tokens(0.8, 4)) < 0.1


def _decode_time(tmp_path: Path, spec: dict[str, Any] | None, run_id: str, out: int = 3000) -> float:
    req, _, _ = run_sim(tmp_path, trace(np.array([0.0]), 64, out), _cfg(spec), run_id=run_id)
    row = req.to_pylist()[0]
    return float(row["last_token_s"] - row["first_token_s"])


@pytest.mark.parametrize("a", [0.0, 1.0])
def test_batch1_speedup_matches_leviathan_with_the_draft_cost(tmp_path: Path, a: float) -> None:
    """At a = 0 or 1 the step count is exact, so the speed-up is the formula's to within the
    run's step-time tolerance: E T / (T_verify + k c T), T the plain decode step."""
    k, c = 4, 0.1
    plain = _decode_time(tmp_path, None, "plain")
    spec = _decode_time(tmp_path, {"method": "draft_model", "cost_ratio": c, "num_speculative_tokens": k,
                                   "acceptance": a}, f"spec{a}")
    cost = CostModel(load_catalog().model("llama-3-8b"), load_catalog().gpu("h100-sxm"))
    ctx = 64 + 1500
    t = cost.run_step(1, ctx, ctx, 1)[0]
    t_verify = cost.run_step(k + 1, (k + 1) * ctx + k * (k + 1) / 2, ctx + k, k + 1)[0]
    predicted = expected_tokens(a, k) * t / (t_verify + k * c * t)
    assert spec and plain / spec == pytest.approx(predicted, rel=0.02)
    # Leviathan et al.'s form takes the verify step as one target step; on an H100 at batch 1 the
    # step is memory-bound, so 5 query tokens cost about what 1 does
    leviathan = (1 - a ** (k + 1)) / (1 - a) / (k * c + 1) if a < 1 else (k + 1) / (k * c + 1)
    assert plain / spec == pytest.approx(leviathan, rel=0.05)


def test_speedup_shrinks_as_the_batch_grows(tmp_path: Path) -> None:
    """Verify steps cost k + 1 tokens per sequence: cheap while decode is memory-bound (small
    batches), dear once it is compute-bound, so the gain falls with load (SmartSpec's claim)."""
    spec = {"method": "draft_model", "cost_ratio": 0.05, "acceptance": 0.7}

    def throughput(n: int, s: dict[str, Any] | None, run_id: str) -> float:
        req, _, _ = run_sim(tmp_path, trace(np.zeros(n), 128, 400), _cfg(s, max_num_seqs=1024), run_id=run_id)
        return float(pa.compute.sum(req["output_tokens"]).as_py()) / float(pa.compute.max(req["last_token_s"]).as_py())

    gains = [throughput(n, spec, f"s{n}") / throughput(n, None, f"p{n}") for n in (1, 64, 512)]
    assert gains[0] > 2.0 and gains[0] > gains[1] > gains[2], gains
    assert gains[2] < 1.0          # at batch 512 speculation costs more than it gains


def test_acceptance_per_request_class_and_determinism(tmp_path: Path) -> None:
    n = 40
    kinds = ["code" if i % 2 else "chat" for i in range(n)]
    t = trace(np.arange(n) * 0.05, 300, 300, kind=pa.array(kinds).dictionary_encode())
    spec = {"acceptance": 0.3, "classes": {"code": 0.9}}
    a, _, _ = run_sim(tmp_path, t, _cfg(spec), seed=1, run_id="a")
    b, _, _ = run_sim(tmp_path, t, _cfg(spec), seed=1, run_id="b")
    c, _, _ = run_sim(tmp_path, t, _cfg(spec), seed=2, run_id="c")
    cols = ["token_times", "last_token_s", "spec_accepted_tokens"]
    assert by_request_id(a).select(cols).equals(by_request_id(b).select(cols))
    assert not by_request_id(a).select(cols).equals(by_request_id(c).select(cols))
    rows = by_request_id(a).to_pylist()
    for kind, rate in (("code", 0.9), ("chat", 0.3)):
        got = [r for r, k in zip(rows, kinds) if k == kind]
        drafted = sum(r["spec_draft_tokens"] for r in got)
        accepted = sum(r["spec_accepted_tokens"] for r in got)
        # accepted / drafted = E[min(G, k)] / k
        want = (expected_tokens(rate, 4) - 1) / 4
        assert accepted / drafted == pytest.approx(want, abs=0.04), kind


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_keeps_every_token(tmp_path: Path, preemption: str) -> None:
    """Under KV pressure requests are preempted mid-stint; each still gets all its tokens."""
    cat = tmp_path / "tiny.toml"
    cat.write_text(TINY_GPU)
    t = poisson_trace(150, 30.0, seed=7, input_mean=800, output_mean=600)
    req, _, _ = run_sim(tmp_path, t, _cfg({"acceptance": 0.6}, gpu="tiny-gpu", catalogs=[str(cat)],
                                          gpu_memory_utilization=1.0, max_num_seqs=256,
                                          max_num_batched_tokens=8192, preemption=preemption), run_id="tiny")
    rows = req.to_pylist()
    assert sum(r["preemptions"] for r in rows) > 0
    for r in rows:
        assert r["status"] == "ok"
        assert r["output_tokens"] == r["requested_output_tokens"] == sum(s["count"] for s in r["token_times"])


def test_off_means_no_columns_and_one_token_per_step(tmp_path: Path) -> None:
    req, _, _ = run_sim(tmp_path, trace(np.array([0.0]), 100, 50), _cfg(None))
    row = req.to_pylist()[0]
    assert row["spec_draft_tokens"] is None and row["spec_accepted_tokens"] is None
    assert row["token_times"][-1]["count"] == 49 and row["token_times"][-1]["gap_s"] > 0


@pytest.mark.parametrize("spec,message", [
    ({"metod": "ngram"}, "unknown field 'metod' (did you mean 'method'?)"),
    ({"method": "medusa"}, "cluster.speculative.method: must be one of draft_model, eagle, ngram"),
    ({"acceptance": 1.5}, "cluster.speculative.acceptance: must be an acceptance rate in [0, 1]"),
    ({"classes": {"code": -0.1}}, "cluster.speculative.classes.code: must be an acceptance rate"),
    ({"num_speculative_tokens": 0}, "cluster.speculative.num_speculative_tokens: must be a positive integer"),
    ({"method": "draft_model"}, "needs exactly one of draft_model"),
    ({"method": "draft_model", "draft_model": "llama-9"}, "cluster.speculative.draft_model"),
    ({"method": "ngram", "cost_ratio": 0.1}, "an n-gram proposer has no GPU cost"),
    ({"acceptance_by": "tenant"}, "must be one of kind, slo_class"),
])
def test_bad_settings_are_one_line_errors(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as e:
        ClusterConfig.build(speculative=spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_pool_settings_and_draft_model_cost(tmp_path: Path) -> None:
    """A Llama-3-70B pool (tp 4) drafting with Llama-3-8B from the catalog: at acceptance 0 every
    verify step makes one token, so TPOT is the verify step plus k draft-model steps, each the
    8B model's own roofline step on the pool's GPUs; the plain pool beside it decodes as ever."""
    k = 3
    cfg = ClusterConfig.build(model="llama-3-70b", tp=4, gpu="h100-sxm", enable_prefix_caching=False, pools=[
        {"name": "spec", "replicas": 1, "speculative": {"method": "draft_model", "draft_model": "llama-3-8b",
                                                        "num_speculative_tokens": k, "acceptance": 0.0}},
        {"name": "plain", "replicas": 1}])
    assert cfg.pools[0].speculative_spec is not None and cfg.pools[1].speculative_spec is None
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
    req, _, _ = run_sim(tmp_path, trace(np.array([0.0, 0.0]), 64, 1000), cfg, policy="round_robin")
    tpot = {r["target"]: (r["last_token_s"] - r["first_token_s"]) / 999 for r in req.to_pylist()}
    cat = load_catalog()
    h100 = cat.gpu("h100-sxm")
    target, draft = CostModel(cat.model("llama-3-70b"), h100, 4), CostModel(cat.model("llama-3-8b"), h100, 4)
    ctx = 64 + 500
    plain = target.run_step(1, ctx, ctx, 1)[0]
    verify = target.run_step(k + 1, (k + 1) * ctx + k * (k + 1) / 2, ctx + k, k + 1)[0]
    assert tpot["r1"] == pytest.approx(plain, rel=0.02)
    assert tpot["r0"] == pytest.approx(verify + k * draft.run_step(1, ctx, ctx, 1)[0], rel=0.02)


def test_itl_counts_deliveries_and_tpot_counts_tokens(tmp_path: Path) -> None:
    """Bundled tokens: ITL is the time between verify steps, TPOT the time per token; their ratio
    is the tokens per step. The report shows the acceptance figures."""
    from llmlb_bench.metrics.summary import summarize
    from llmlb_bench.report.document import ReportOptions, build
    from llmlb_bench.report.markdown import render
    from llmlb_bench.store.views import Catalog
    req, _, _ = run_sim(tmp_path, trace(np.array([0.0]), 200, 2000), _cfg({"acceptance": 0.8}), run_id="spec")
    [s] = summarize(Catalog([tmp_path / "spec"]))
    row = req.to_pylist()[0]
    steps = _steps(row)
    gaps = np.diff([seg["start_s"] for seg in row["token_times"]])
    assert s["itl"]["n"] == steps and s["itl"]["mean"] == pytest.approx(gaps.mean())
    assert s["tpot"]["mean"] == pytest.approx(gaps.sum() / 1999)
    assert s["itl"]["mean"] / s["tpot"]["mean"] == pytest.approx(1999 / steps)
    spec = s["speculative"]
    assert spec["source"] == "simulator" and spec["tokens_per_delivery"] == pytest.approx(2000 / (steps + 1))
    assert spec["acceptance_rate"] == row["spec_accepted_tokens"] / row["spec_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(expected_tokens(0.8, 4), rel=0.05)
    text = render(build(Catalog([tmp_path / "spec"]), ReportOptions()))
    assert "Speculative decoding" in text and "acceptance rate (%)" in text


def test_cluster_file_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster TOML with a pool's [pools.speculative] table: simulated; a typo in it: exit 2, one line."""
    import pyarrow.parquet as pq
    from conftest import cli
    path = tmp_path / "t.parquet"
    pq.write_table(trace(np.arange(4) * 0.5, 100, 64), path)
    good = tmp_path / "c.toml"
    good.write_text('gpu = "h100-sxm"\n[[pools]]\nname = "spec"\nreplicas = 1\n'
                    '[pools.speculative]\nmethod = "eagle"\nnum_speculative_tokens = 3\nacceptance = 0.8\n')
    code, _, err = cli(["simulate", str(path), "--cluster", str(good), "-r", str(tmp_path / "res"),
                        "--run-id", "eagle"], capsys)
    assert code == 0, err
    rows = pq.read_table(tmp_path / "res" / "eagle" / "requests.parquet").to_pylist()
    assert all(r["spec_draft_tokens"] == 3 * r["spec_drafts"] > 0 for r in rows)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pools]]\nname = "spec"\nreplicas = 1\n[pools.speculative]\nnum_speculative_token = 3\n')
    code, _, err = cli(["simulate", str(path), "--cluster", str(bad), "-r", str(tmp_path / "res")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "pools[0].speculative: unknown field 'num_speculative_token' (did you mean 'num_speculative_tokens'?)" in err
