"""GuideLLM ``benchmarks.json`` (``guidellm benchmark --output-path ...json``).

A report holds ``benchmarks``: one per strategy run (a sweep holds several
rates), each imported as its own run, named ``b<index>``, with the
strategy's rate as offered rate. Requests sit under ``requests`` by status:
``successful`` (ok), ``errored`` (error) and ``incomplete`` (cut off when the
benchmark ended: timeout). Two layouts exist:

* GuideLLM 0.4 and later (``GenerativeRequestStats``): times under
  ``info.timings`` (``request_start``, ``first_token_iteration``,
  ``last_token_iteration``, ``request_end``, ``targeted_start``), token
  counts as ``prompt_tokens`` / ``output_tokens`` (or ``input_metrics`` /
  ``output_metrics``.``total_tokens``), strategy under ``config.strategy``;
* GuideLLM 0.2-0.3: ``start_time``, ``first_token_time``,
  ``last_token_time``, ``end_time``, ``prompt_tokens``, ``output_tokens``,
  strategy under ``args.strategy``.

Times are seconds since the epoch; a run's timeline starts at its first
request. GuideLLM keeps only the first and last token times, so a request's
tokens become one segment evenly spaced between them: pooled ITL is then
GuideLLM's per-request ITL weighted by gaps, the distribution it reports
itself (``--definitions guidellm`` reproduces its figures). Files in YAML
are not read (convert with ``guidellm`` or save as JSON).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, TypedDict

from llmlb_bench.errors import UserError
from llmlb_bench.peer_results.common import ImportedRun, field_of

STATUS = {"successful": "ok", "errored": "error", "incomplete": "timeout"}


class Times(TypedDict):
    """One request's times and token counts, whichever layout it came in (the times other than ``start``
    as the file has them: a number, or anything else where the request has none)."""

    start: float
    first: object
    last: object
    end: object
    target: object
    prompt: int
    output: int
    error: str | None


def _times(req: Mapping[str, Any], where: str) -> Times:
    """start, first, last, end, target and token counts of one request, whichever layout it uses."""
    t = (req.get("info") or {}).get("timings")
    if isinstance(t, Mapping):
        start, first, last = t.get("request_start") or t.get("resolve_start"), t.get("first_token_iteration"), \
            t.get("last_token_iteration")
        end, target = t.get("request_end") or t.get("resolve_end"), t.get("targeted_start")
    elif "start_time" in req:
        start, first, last = req.get("start_time"), req.get("first_token_time"), req.get("last_token_time")
        end, target = req.get("end_time"), None
    else:
        raise UserError("request has neither 'info.timings' (GuideLLM >= 0.4) nor 'start_time' (0.2-0.3)", where)
    if not isinstance(start, (int, float)):
        raise UserError("request has no start time", where)
    prompt, output = req.get("prompt_tokens"), req.get("output_tokens")
    if prompt is None:
        prompt = (req.get("input_metrics") or {}).get("total_tokens")
    if output is None:
        output = (req.get("output_metrics") or {}).get("total_tokens")
    err = req.get("error") or (req.get("info") or {}).get("error")
    return {"start": start, "first": first, "last": last, "end": end, "target": target,
            "prompt": int(prompt or 0), "output": int(output or 0), "error": str(err) if err else None}


def _strategy(bench: Mapping[str, Any]) -> dict[str, object]:
    for path in (("config", "strategy"), ("args", "strategy")):
        node: object = bench
        for k in path:
            node = node.get(k) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            return dict(node)
    return {}


def _benchmark(bench: Mapping[str, Any], index: int, where: str) -> ImportedRun:
    groups = field_of(bench, "requests", where, dict)
    reqs = []
    for key, status in STATUS.items():
        items = groups.get(key) or []
        if not isinstance(items, list):
            raise UserError(f"field 'requests.{key}' is not a list", where)
        for j, r in enumerate(items):
            reqs.append((status, r, _times(r, f"{where}: requests.{key}[{j}]")))
    reqs.sort(key=lambda x: x[2]["start"])
    t0 = reqs[0][2]["start"] if reqs else 0.0
    rows: dict[str, list[object]] = {k: [] for k in ("request_id", "scheduled_s", "sent_s", "first_token_s",
                                                     "last_token_s", "token_times", "input_tokens", "output_tokens",
                                                     "status", "error")}
    for i, (status, _r, t) in enumerate(reqs):
        sent = t["start"] - t0
        first = t["first"] - t0 if isinstance(t["first"], (int, float)) else None
        last = t["last"] - t0 if isinstance(t["last"], (int, float)) else first
        n = t["output"]
        segs = None
        if first is not None and last is not None and n > 0:   # last is None only when first is
            segs = [{"start_s": first, "gap_s": (last - first) / (n - 1) if n > 1 else 0.0, "count": n}]
        rows["request_id"].append(i)
        rows["scheduled_s"].append(t["target"] - t0 if isinstance(t["target"], (int, float)) else sent)
        rows["sent_s"].append(sent)
        rows["first_token_s"].append(first)
        rows["last_token_s"].append(last)
        rows["token_times"].append(segs)
        rows["input_tokens"].append(t["prompt"])
        rows["output_tokens"].append(n)
        rows["status"].append(status)
        rows["error"].append(t["error"])
    strategy = _strategy(bench)
    rate = strategy.get("rate")
    reported = {k: bench[k] for k in ("start_time", "end_time", "duration") if isinstance(bench.get(k), (int, float))}
    totals = bench.get("request_totals")
    notes = []
    if isinstance(totals, Mapping):
        reported["request_totals"] = dict(totals)
        if isinstance(totals.get("total"), int) and totals["total"] > len(reqs):
            notes.append(f"GuideLLM kept a sample: {len(reqs)} of {totals['total']} requests")
    return ImportedRun(name=f"b{index}", rows=rows, settings={"strategy": strategy},
                       reported=reported, notes=notes,
                       offered_rate=float(rate) if isinstance(rate, (int, float)) and rate > 0 else None)


def parse(path: Path) -> list[ImportedRun]:
    if path.suffix.lower() in (".yaml", ".yml"):
        raise UserError("GuideLLM YAML reports are not read; save the report as JSON", path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"not JSON ({exc.msg} at line {exc.lineno})", path) from None
    benches = field_of(doc, "benchmarks", str(path), list)
    if not benches:
        raise UserError("the report holds no benchmarks", path)
    return [_benchmark(b, i, f"{path}: benchmarks[{i}]") for i, b in enumerate(benches)]
