"""Warnings a reader must see before trusting a report's figures, one sentence each.

Collected once into the report document (``doc["notes"]``) so the terminal,
Markdown, HTML and JSON all carry the same ones: runs that did not complete,
runs that could not be read, a replay client that lagged behind its
schedule, latency that includes the client's lag, runs not in steady state.
"""

from __future__ import annotations

from llmlb_bench.metrics.run_figures import RunFigures


def _name(s: RunFigures) -> str:
    return s.get("name") or s["label"] or s["run_id"]


def run_notes(runs: list[RunFigures]) -> list[str]:
    """The notes about the summarised runs (the caller adds those about runs that could not be read)."""
    out = []
    for s in runs:
        if s["status"] != "complete":
            out.append(f"run {s['run_id']} is {s['status']}; its figures cover the rows it stored")
        wait = s.get("wait") or {}
        lag_ms = 1e3 * (wait.get("p99") or 0.0)     # a flagged wait has a p99
        if wait.get("flagged") and wait.get("included"):
            out.append(f"{_name(s)}: latency counts from arrival (its policy holds requests) and includes the "
                       f"client's lag; sent - scheduled p99 {lag_ms:,.1f} ms")
        elif wait.get("flagged"):
            out.append(f"{_name(s)}: the client lagged behind its schedule (sent - scheduled p99 "
                       f"{lag_ms:,.1f} ms); latency counts from the send and leaves the lag out, "
                       f"but the offered load was not the trace's")
        for flag in (s.get("steady") or {}).get("flags") or ():
            out.append(f"{_name(s)}: not in steady state — {flag}")
    return out
