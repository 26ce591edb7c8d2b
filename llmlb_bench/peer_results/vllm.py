"""vLLM ``vllm bench serve --save-result --save-detailed`` JSON.

The file is one JSON object (or, with ``--append-result``, one per line),
with the run's settings (``backend``, ``model_id``, ``request_rate``,
``burstiness``, ``max_concurrency``, ``date``, ...), its headline figures
(``duration``, ``completed``, ``mean_ttft_ms``, ``p99_itl_ms``, ...) and, per
request, parallel lists: ``input_lens``, ``output_lens``, ``ttfts`` (s),
``itls`` (list of chunk gaps, s), ``errors`` (empty string when ok) and in
recent versions ``start_times`` (``time.perf_counter`` at send) and
``latencies`` (send to last chunk, s).

Rows: sent = start time - first start time; first token = sent + TTFT;
one token-time segment per received chunk (chunk times = first token +
cumulative ITLs); last token = sent + latency (vLLM's E2E), or the last chunk
when latencies are absent. Without ``start_times`` the file has no common
timeline: every request starts at 0 and the run keeps vLLM's measured
``duration`` for throughput. A request whose ``errors`` entry is not empty
is ``error``. The result: the same TTFT, TPOT, ITL and E2E as vLLM reports.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from llmlb_bench.errors import UserError
from llmlb_bench.peer_results.common import ImportedRun, chunk_segments, field_of

SETTINGS = ("backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
            "burstiness", "max_concurrency", "date")
#: headline figures vLLM prints, kept to compare with ours
REPORTED = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
            "request_goodput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
            "median_e2el_ms", "p99_e2el_ms")


def _documents(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        docs = [doc]
    except json.JSONDecodeError:
        try:   # --append-result: one object per line
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise UserError(f"not JSON ({exc.msg} at line {exc.lineno})", path) from None
    for i, d in enumerate(docs):
        if not isinstance(d, dict):
            raise UserError(f"result {i} is not a JSON object", path)
    return docs


def _run(doc: dict[str, Any], where: str) -> ImportedRun:
    ttfts = field_of(doc, "ttfts", where, list)
    n = len(ttfts)
    cols = {k: field_of(doc, k, where, list) for k in ("itls", "input_lens", "output_lens")}
    errors = field_of(doc, "errors", where, list, required=False) or [""] * n
    starts = field_of(doc, "start_times", where, list, required=False)
    latencies = field_of(doc, "latencies", where, list, required=False)
    for k, v in {**cols, "errors": errors, "start_times": starts or [0] * n, "latencies": latencies or [0] * n}.items():
        if len(v) != n:
            raise UserError(f"field {k!r} has {len(v)} entries, 'ttfts' has {n}", where)
    t0 = min((s for s in starts if isinstance(s, (int, float))), default=0.0) if starts else 0.0
    rows: dict[str, list[object]] = {k: [] for k in ("request_id", "scheduled_s", "sent_s", "first_token_s",
                                                     "last_token_s", "token_times", "input_tokens", "output_tokens",
                                                     "status", "error")}
    for i in range(n):
        sent = float(starts[i]) - t0 if starts else 0.0
        err = errors[i] or ""
        ok = not err
        itl = cols["itls"][i] or []
        if not isinstance(itl, list) or not all(isinstance(g, (int, float)) for g in itl):
            raise UserError(f"itls[{i}] is not a list of numbers", where)
        first = sent + float(ttfts[i]) if ok else None
        if first is not None:
            last = sent + float(latencies[i]) if latencies else first + float(sum(itl))
        rows["request_id"].append(i)
        rows["scheduled_s"].append(sent)
        rows["sent_s"].append(sent)
        rows["first_token_s"].append(first)
        rows["last_token_s"].append(last if ok else None)
        rows["token_times"].append(chunk_segments(first, itl) if first is not None else None)
        rows["input_tokens"].append(int(cols["input_lens"][i] or 0))
        rows["output_tokens"].append(int(cols["output_lens"][i] or 0) if ok else 0)
        rows["status"].append("ok" if ok else "error")
        rows["error"].append(err or None)
    rate = doc.get("request_rate")
    duration = doc.get("duration")
    return ImportedRun(
        name="", rows=rows,
        settings={k: doc[k] for k in SETTINGS if k in doc},
        reported={k: doc[k] for k in REPORTED if k in doc},
        offered_rate=float(rate) if isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0 else None,
        clock="shared" if starts else "per_request",
        duration_s=float(duration) if isinstance(duration, (int, float)) else None,
        notes=[] if starts else ["no start_times in the file (vLLM before they were saved): each request on its "
                                 "own clock; throughput uses vLLM's measured duration"])


def parse(path: Path) -> list[ImportedRun]:
    docs = _documents(path)
    runs = [_run(d, f"{path}" + (f" (result {i})" if len(docs) > 1 else "")) for i, d in enumerate(docs)]
    if len(runs) > 1:
        for i, r in enumerate(runs):
            r.name = str(i)
    return runs

