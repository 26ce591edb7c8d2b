"""vLLM ``bench serve --save-detailed`` JSON imported as runs reproduce vLLM's own figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.peer_results import detect, import_results
from llmlb_bench.store.views import Catalog

DATA = Path(__file__).resolve().parent / "data"
DETAILED = DATA / "vllm_bench_serve_detailed.json"
OLD = DATA / "vllm_bench_serve_appended_old.json"


def test_imported_run_reports_the_figures_vllm_printed(tmp_path):
    [run_dir] = import_results(DETAILED, tmp_path)
    assert run_dir.name == "vllm-vllm_bench_serve_detailed"
    [s] = summarize(Catalog([tmp_path]))
    vllm = json.loads(DETAILED.read_text())
    assert s["backend"] == "vllm" and (s["requests"], s["ok"], s["error"]) == (6, vllm["completed"], vllm["failed"])
    assert s["output_tokens"] == vllm["total_output_tokens"] and s["input_tokens"] == vllm["total_input_tokens"]
    for fig in ("ttft", "tpot", "itl"):
        assert s[fig]["mean"] * 1e3 == pytest.approx(vllm[f"mean_{fig}_ms"], rel=1e-9), fig
        assert s[fig]["p50"] * 1e3 == pytest.approx(vllm[f"median_{fig}_ms"], rel=1e-9), fig
        assert s[fig]["p99"] * 1e3 == pytest.approx(vllm[f"p99_{fig}_ms"], rel=1e-9), fig
    # E2E is vLLM's latency per request; the run spans first send to last stream end
    ok = [lat for lat, err in zip(vllm["latencies"], vllm["errors"]) if not err]
    assert s["e2e"]["mean"] == pytest.approx(np.mean(ok))
    assert s["offered_rate"] == 4.0
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["config"]["vllm"]["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert meta["summary"]["import"]["clock"] == "shared"
    assert meta["summary"]["import"]["reported"]["p99_itl_ms"] == vllm["p99_itl_ms"]


def test_two_token_chunks_keep_vllm_itl_and_tpot(tmp_path):
    """Request 1 streams 9 tokens in 8 chunks: ITL counts chunk gaps, TPOT divides by 8 tokens' gaps."""
    import_results(DETAILED, tmp_path)
    cat = Catalog([tmp_path])
    row = cat.query("SELECT output_tokens, len(token_times) AS chunks, last_token_s - first_token_s AS decode "
                    "FROM requests WHERE request_id = 1").to_pylist()[0]
    assert (row["output_tokens"], row["chunks"]) == (9, 8)
    [s] = summarize(cat)
    assert s["itl"]["n"] == sum(len(x) for x in json.loads(DETAILED.read_text())["itls"])


def test_appended_results_without_start_times(tmp_path):
    dirs = import_results(OLD, tmp_path, label="old")
    assert [d.name for d in dirs] == ["vllm-vllm_bench_serve_appended_old-0", "vllm-vllm_bench_serve_appended_old-1"]
    by_id = {s["run_id"]: s for s in summarize(Catalog([tmp_path]))}
    docs = [json.loads(line) for line in OLD.read_text().splitlines()]
    for d, doc in zip(dirs, docs):
        s = by_id[d.name]
        assert s["label"].startswith("old-")
        # each request on its own clock: throughput uses vLLM's measured duration
        assert s["duration_s"] == doc["duration"]
        assert s["request_throughput"] == pytest.approx(doc["request_throughput"])
        assert s["ttft"]["mean"] * 1e3 == pytest.approx(doc["mean_ttft_ms"])
        assert s["tpot"]["p99"] * 1e3 == pytest.approx(doc["p99_tpot_ms"])
        assert s["offered_rate"] == doc["request_rate"]


def test_detection_and_bad_files(tmp_path):
    assert detect(DETAILED) == "vllm" and detect(OLD) == "vllm"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ttfts": [0.1, 0.2], "itls": [[]], "input_lens": [1, 2], "output_lens": [1, 1]}))
    with pytest.raises(UserError, match="field 'itls' has 1 entries, 'ttfts' has 2"):
        import_results(bad, tmp_path / "r")
    bad.write_text(json.dumps({"ttfts": "x"}))
    with pytest.raises(UserError, match="field 'ttfts' has type str, expected a list"):
        import_results(bad, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    import_results(DETAILED, tmp_path / "r")
    with pytest.raises(UserError, match="already exists"):
        import_results(DETAILED, tmp_path / "r")
