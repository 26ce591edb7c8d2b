"""AIPerf ``profile_export.jsonl`` imported as a run; the CLI command; one report over three tools."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.cli import main
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.peer_results import detect, import_results
from llmlb_bench.store.views import Catalog

DATA = Path(__file__).resolve().parent / "data"
EXPORT = DATA / "aiperf_profile_export.jsonl"


def records():
    return [json.loads(line) for line in EXPORT.read_text().splitlines()]


def test_records_become_rows_with_aiperf_figures(tmp_path):
    import_results(EXPORT, tmp_path)
    [s] = summarize(Catalog([tmp_path]))
    ok = [r for r in records() if r["error"] is None]
    assert s["backend"] == "aiperf" and (s["requests"], s["ok"], s["error"]) == (5, 4, 1)
    m = lambda r, k: r["metrics"][k]["value"]  # noqa: E731
    assert s["ttft"]["mean"] * 1e3 == pytest.approx(np.mean([m(r, "time_to_first_token") for r in ok]))
    assert s["e2e"]["p50"] * 1e3 == pytest.approx(np.median([m(r, "request_latency") for r in ok]))
    # vLLM TPOT = AIPerf's inter_token_latency: (latency - TTFT) / (OSL - 1)
    assert s["tpot"]["mean"] * 1e3 == pytest.approx(np.mean([m(r, "inter_token_latency") for r in ok]))
    chunks = [g for r in ok for g in m(r, "inter_chunk_latency")]
    assert s["itl"]["n"] == len(chunks) and s["itl"]["mean"] * 1e3 == pytest.approx(np.mean(chunks))
    assert s["output_tokens"] == sum(m(r, "output_sequence_length") for r in ok)


def test_cancelled_request_and_start_order(tmp_path):
    import_results(EXPORT, tmp_path)
    rows = Catalog([tmp_path]).query(
        "SELECT request_id, sent_s, status, error, http_status, input_tokens FROM requests ORDER BY request_id"
    ).to_pylist()
    assert [r["sent_s"] for r in rows] == sorted(r["sent_s"] for r in rows) and rows[0]["sent_s"] == 0.0
    [bad] = [r for r in rows if r["status"] != "ok"]
    assert bad["status"] == "error" and bad["http_status"] == 499 and bad["input_tokens"] == 550
    assert bad["error"].startswith("RequestCancellationError: Request was cancelled")


def test_bad_records(tmp_path):
    assert detect(EXPORT) == "aiperf"
    bad = tmp_path / "profile_export.jsonl"
    bad.write_text('{"metadata": {"request_start_ns": 1}, "metrics": {"time_to_first_token": {"value": 1, "unit": "ms"}, '
                   '"request_latency": {"value": 2, "unit": "minutes"}}, "error": null}\n')
    with pytest.raises(UserError, match=r"profile_export.jsonl:1: metrics.request_latency has unit 'minutes'"):
        import_results(bad, tmp_path / "r")
    bad.write_text('{"metadata": {}, "metrics": {}}\n')
    with pytest.raises(UserError, match="missing field 'request_start_ns'"):
        import_results(bad, tmp_path / "r")


def test_cli_imports_three_tools_and_reports_them_together(tmp_path, capsys):
    results = tmp_path / "results"
    main_args = ["import-results", str(EXPORT), str(DATA / "vllm_bench_serve_detailed.json"),
                 str(DATA / "guidellm_benchmarks.json"), "--results", str(results)]
    try:
        main(main_args)
    except SystemExit as e:
        assert e.code in (0, None)
    assert capsys.readouterr().out.count("imported") == 4
    try:
        main(["report", str(results), "--format", "json", "--slo", "ttft=300ms"])
    except SystemExit as e:
        assert e.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["backend"] for r in doc["runs"]) == ["aiperf", "guidellm", "guidellm", "vllm"]
    with pytest.raises(SystemExit) as info:
        main(["import-results", str(tmp_path / "none.json"), "--results", str(results)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "no such file" in err and len(err.strip().splitlines()) == 1
