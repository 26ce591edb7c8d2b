"""A fixed pair of runs gives the same report, byte for byte, as the code that wrote tests/data/report_golden.json.

Work on the report's speed (fused scans, other sorts, walks in another order) must not move a
single figure; the other report tests check definitions against tolerances or small hand cases,
this one checks every figure of a report over two seeded runs (two tenants and SLO classes,
sessions, failures, stalls in the token streams, a block sample of the token rows, a power series,
verdicts) against the bytes the code before wrote. Regenerate the file only when a figure moves on
purpose (a definition changes): ``LLMLB_WRITE_GOLDEN=1 pytest tests/test_report_golden.py``, and say
in the commit which figures moved and why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options
from llmlb_bench.report.document import ReportOptions, build, to_json
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog

GOLDEN = Path(__file__).parent / "data" / "report_golden.json"
ROWS, PART = 6000, 1500


def _token_times(first: np.ndarray, gap: np.ndarray, out: np.ndarray, rng: np.random.Generator) -> pa.Array:
    """The first token, a decode run, and for a third of the requests a stall and a second run."""
    n = len(first)
    stall = rng.random(n) < 0.3
    k = np.maximum(out - 1, 1)
    split = np.where(stall, np.maximum(k // 2, 1), k)
    nseg = 2 + stall.astype(np.int64)
    offsets = np.r_[0, np.cumsum(nseg)].astype(np.int32)
    idx = offsets[:-1]
    start, gaps, count = np.empty(offsets[-1]), np.empty(offsets[-1]), np.empty(offsets[-1], dtype=np.int32)
    start[idx], gaps[idx], count[idx] = first, 0.0, 1
    start[idx + 1], gaps[idx + 1], count[idx + 1] = first + gap, gap, split
    s3 = idx[stall] + 2
    start[s3] = first[stall] + gap[stall] * (split[stall] + 1) + rng.exponential(0.3, stall.sum())
    gaps[s3], count[s3] = gap[stall], (k - split)[stall]
    seg = pa.StructArray.from_arrays([pa.array(start), pa.array(gaps), pa.array(count)], fields=list(TOKEN_SEGMENT))
    return pa.ListArray.from_arrays(pa.array(offsets), seg)


def _write_run(root: Path, run_id: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    config = {"offered_rate": 50.0, "policy": {"name": run_id},
              "cluster": {"pools": [{"name": "default", "replicas": 4, "tp": 1, "gpu": "h100-sxm"}]}}
    with RunStore(root, config=config, backend="sim", label=run_id, run_id=run_id, rows_per_group=PART) as run:
        t = 0.0
        for a in range(0, ROWS, PART):
            sent = t + np.cumsum(rng.exponential(1 / 50.0, PART))
            t = float(sent[-1])
            ttft, gap = rng.lognormal(np.log(0.15), 0.8, PART), rng.lognormal(np.log(0.025), 0.4, PART)
            out = rng.integers(1, 400, PART)
            first = sent + ttft
            tt = _token_times(first, gap, out, rng)
            last = np.array([s[-1]["start_s"] + s[-1]["gap_s"] * (s[-1]["count"] - 1) for s in tt.to_pylist()])
            ids = np.arange(a, a + PART)
            run.requests.write({
                "request_id": ids, "tenant": np.where(rng.random(PART) < 0.6, "chat", "batch").tolist(),
                "slo_class": np.where(rng.random(PART) < 0.7, "interactive", "batch").tolist(),
                "target": [f"r{i % 4}" for i in ids], "scheduled_s": sent, "sent_s": sent + rng.exponential(0.002, PART),
                "first_token_s": first, "last_token_s": last, "token_times": tt,
                "input_tokens": rng.integers(10, 3000, PART).astype(np.int32), "output_tokens": out.astype(np.int32),
                "cached_tokens": rng.integers(0, 10, PART).astype(np.int32),
                "status": np.where(rng.random(PART) < 0.02, "error", "ok").tolist(),
                "error": np.where(rng.random(PART) < 0.5, "input + 12 tokens exceeds 4096", "timeout").tolist(),
                "preemptions": rng.poisson(0.05, PART).astype(np.int32), "energy_j": rng.uniform(0.1, 300, PART),
                "session_id": rng.integers(0, ROWS // 4, PART), "turn": rng.integers(1, 12, PART).astype(np.int32)})
        ticks = np.arange(0.0, t, 1.0)
        m = 4 * len(ticks)
        run.series.write({"t_s": np.repeat(ticks, 4), "target": [f"r{i % 4}" for i in range(m)],
                          "waiting": rng.poisson(2, m), "running": rng.poisson(60, m),
                          "kv_blocks_used": rng.integers(0, 3000, m), "kv_blocks_total": np.full(m, 3000),
                          "power_w": rng.uniform(300, 700, m)})


def _report(root: Path) -> dict[str, object]:
    """The report's document, less what depends on when and where it was written."""
    doc = json.loads(to_json(build(Catalog([root]), ReportOptions(
        slo=Slo.parse("ttft=300ms,tpot=40ms;batch:e2e=20s"), summary=Options(token_sample=2000)))))
    for run in doc["runs"]:
        del run["created_utc"]
    return doc


@pytest.mark.parametrize("path", ["as built", "numpy"])
def test_report_is_the_golden_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Both paths of the report's figures give the golden bytes: the compiled kernels where they are
    built (metrics/kernels.py), and the NumPy code they stand for, the reference."""
    if path == "numpy":
        monkeypatch.setattr(kernels, "native", None)
    for i, run_id in enumerate(("a", "b")):
        _write_run(tmp_path, run_id, seed=i)
    text = json.dumps(_report(tmp_path), indent=1, sort_keys=True) + "\n"
    if os.environ.get("LLMLB_WRITE_GOLDEN") and path == "numpy":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "a report figure moved: see this module's docstring"
