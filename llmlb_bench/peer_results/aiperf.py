"""AIPerf ``profile_export.jsonl``: one record per request (``MetricRecordInfo``).

Each line holds ``metadata`` (``request_start_ns`` and ``request_end_ns``,
wall-clock nanoseconds; ``session_num``, ``x_request_id``, ``turn_index``,
``was_cancelled``), ``metrics`` (name -> ``{"value", "unit"}``, in display
units: ``time_to_first_token`` and ``request_latency`` in ms,
``inter_chunk_latency`` a list of ms, ``input_sequence_length`` and
``output_sequence_length`` in tokens) and ``error`` (``{code, type,
message}`` or null; then ``metrics`` holds only ``error_isl``).

Rows, in start order: sent = start - first start; first token = sent +
TTFT; one token-time segment per chunk (first token + cumulative
inter-chunk latencies); last token = sent + request latency. A request with
an error is ``timeout`` when its error type names a timeout, else ``error``
(cancellations included), with the error code as HTTP status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.peer_results.common import ImportedRun, chunk_segments, field_of

_TO_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}


def _seconds(metrics: Mapping[str, Any], name: str, where: str) -> Any:
    m = metrics.get(name)
    if m is None:
        return None
    value, unit = field_of(m, "value", f"{where}: metrics.{name}"), m.get("unit")
    if unit not in _TO_S:
        raise UserError(f"metrics.{name} has unit {unit!r}, expected one of {', '.join(_TO_S)}", where)
    scale = _TO_S[unit]
    if isinstance(value, list):
        return [float(v) * scale for v in value]
    if not isinstance(value, (int, float)):
        raise UserError(f"metrics.{name}.value is not a number", where)
    return float(value) * scale


def _tokens(metrics: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        v = (metrics.get(name) or {}).get("value")
        if isinstance(v, (int, float)):
            return int(v)
    return None


def parse(path: Path) -> list[ImportedRun]:
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"not JSON ({exc.msg})", where) from None
        meta = field_of(rec, "metadata", where, dict)
        start = field_of(meta, "request_start_ns", f"{where}: metadata", int)
        records.append((start, lineno, rec, meta, where))
    if not records:
        raise UserError("no records", path)
    records.sort(key=lambda r: (r[0], r[1]))
    t0 = records[0][0]
    rows: dict[str, list[object]] = {k: [] for k in ("request_id", "scheduled_s", "sent_s", "first_token_s",
                                                     "last_token_s", "token_times", "input_tokens", "output_tokens",
                                                     "status", "error", "http_status")}
    for i, (start, _lineno, rec, meta, where) in enumerate(records):
        metrics = rec.get("metrics") or {}
        err = rec.get("error")
        sent = (start - t0) * 1e-9
        ttft = _seconds(metrics, "time_to_first_token", where)
        latency = _seconds(metrics, "request_latency", where)
        end_ns = meta.get("request_end_ns")
        if err is None:
            if ttft is None or latency is None:
                raise UserError("record has no error but lacks time_to_first_token or request_latency", where)
            chunks = _seconds(metrics, "inter_chunk_latency", where) or []
            first, last = sent + ttft, sent + latency
            status, text, code = "ok", None, None
            segments = chunk_segments(first, chunks)
        else:
            kind = str((err or {}).get("type") or "")
            status = "timeout" if "timeout" in kind.lower() else "error"
            text = f"{kind}: {(err or {}).get('message', '')}".strip(": ")
            code = (err or {}).get("code")
            first = sent + ttft if ttft is not None else None
            last = (end_ns - t0) * 1e-9 if isinstance(end_ns, int) and first is not None else None
            segments = None
        rows["request_id"].append(i)
        rows["scheduled_s"].append(sent)
        rows["sent_s"].append(sent)
        rows["first_token_s"].append(first)
        rows["last_token_s"].append(last)
        rows["token_times"].append(segments)
        rows["input_tokens"].append(_tokens(metrics, "input_sequence_length", "error_isl"))
        rows["output_tokens"].append(_tokens(metrics, "output_sequence_length", "output_token_count") or 0)
        rows["status"].append(status)
        rows["error"].append(text)
        rows["http_status"].append(code if isinstance(code, int) and 0 < code < 1000 else None)
    return [ImportedRun(name="", rows=rows)]
