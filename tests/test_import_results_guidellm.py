"""GuideLLM ``benchmarks.json`` (0.4+ and 0.3 layouts) imported as one run per benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.definitions import Definitions
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.peer_results import detect, import_results
from llmlb_bench.store.views import Catalog

DATA = Path(__file__).resolve().parent / "data"
REPORT = DATA / "guidellm_benchmarks.json"
V03 = DATA / "guidellm_v03_benchmarks.json"


def guidellm_percentile(values, weights, q):
    """GuideLLM's ``Percentiles.from_pdf``: first value whose cumulative probability reaches q."""
    order = np.argsort(values)
    v, w = np.asarray(values, float)[order], np.asarray(weights, float)[order]
    return v[np.searchsorted(np.cumsum(w / w.sum()), q, side="left")]


def test_one_run_per_benchmark_with_guidellm_figures(tmp_path):
    dirs = import_results(REPORT, tmp_path)
    assert [d.name for d in dirs] == ["guidellm-guidellm_benchmarks-b0", "guidellm-guidellm_benchmarks-b1"]
    report = json.loads(REPORT.read_text())
    summaries = summarize(Catalog([tmp_path]), Slo.parse("ttft=60ms"), Options(definitions=Definitions.guidellm))
    for s, bench in zip(summaries, report["benchmarks"]):
        ok = bench["requests"]["successful"]
        assert s["backend"] == "guidellm" and s["offered_rate"] == bench["config"]["strategy"]["rate"]
        assert (s["requests"], s["ok"], s["error"], s["timeout"]) == (6, 4, 1, 1)
        # GuideLLM's own per-request figures, weighted as its distributions weight them
        itl = [r["inter_token_latency_ms"] for r in ok]
        itl_w = [r["output_tokens"] - 1 for r in ok]
        tpot = [r["time_per_output_token_ms"] for r in ok]
        tpot_w = [r["output_tokens"] for r in ok]
        ttft = [r["time_to_first_token_ms"] for r in ok]
        assert s["itl"]["mean"] * 1e3 == pytest.approx(np.average(itl, weights=itl_w))
        assert s["tpot"]["mean"] * 1e3 == pytest.approx(np.average(tpot, weights=tpot_w))
        for p in (50, 90, 99):
            assert s["itl"][f"p{p}"] * 1e3 == pytest.approx(guidellm_percentile(itl, itl_w, p / 100))
            assert s["tpot"][f"p{p}"] * 1e3 == pytest.approx(guidellm_percentile(tpot, tpot_w, p / 100))
            assert s["ttft"][f"p{p}"] * 1e3 == pytest.approx(guidellm_percentile(ttft, [1] * 4, p / 100))
        assert s["input_tokens"] == sum(r["prompt_tokens"] for r in ok)
    # the faster benchmark meets a 60 ms TTFT with every ok request, the slower with some
    assert summaries[0]["slo"]["good"] == 4 and summaries[1]["slo"]["good"] < 4


def test_scheduled_times_come_from_targeted_start(tmp_path):
    import_results(REPORT, tmp_path)
    cat = Catalog([tmp_path])
    lag = cat.query("SELECT min(sent_s - scheduled_s) AS lo, max(sent_s - scheduled_s) AS hi FROM requests")
    assert lag.to_pylist() == [{"lo": pytest.approx(0.0005, abs=1e-6), "hi": pytest.approx(0.0006, abs=1e-6)}]


def test_guidellm_03_layout(tmp_path):
    [d] = import_results(V03, tmp_path)
    [s] = summarize(Catalog([tmp_path]), None, Options(definitions=Definitions.guidellm))
    bench = json.loads(V03.read_text())["benchmarks"][0]
    ok = bench["requests"]["successful"]
    assert (s["ok"], s["error"], s["offered_rate"]) == (3, 1, 2.0)
    assert s["ttft"]["mean"] * 1e3 == pytest.approx(np.mean([r["time_to_first_token_ms"] for r in ok]))
    assert s["itl"]["mean"] * 1e3 == pytest.approx(np.mean([r["inter_token_latency_ms"] for r in ok]))
    meta = json.loads((d / "run.json").read_text())
    assert meta["config"]["guidellm"]["strategy"]["type_"] == "constant"


def test_detection_and_errors(tmp_path):
    assert detect(REPORT) == "guidellm" and detect(V03) == "guidellm"
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"benchmarks": [{"requests": {"successful": [{"info": {}}]}}]}))
    with pytest.raises(UserError, match=r"benchmarks\[0\]: requests.successful\[0\].*neither 'info.timings'"):
        import_results(bad, tmp_path / "r")
    bad.write_text(json.dumps({"benchmarks": []}))
    with pytest.raises(UserError, match="no benchmarks"):
        import_results(bad, tmp_path / "r")
    yaml = tmp_path / "benchmarks.yaml"
    yaml.write_text("benchmarks: []\n")
    with pytest.raises(UserError, match="YAML"):
        import_results(yaml, tmp_path / "r", tool="guidellm")
