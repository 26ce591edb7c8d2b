"""The report's tables as plain models (header + rows of text), rendered by terminal, Markdown and HTML.

Defining each table once keeps the three formats in step: a figure added
here appears everywhere, formatted the same way.

* ``comparison``: one row per run, the figures a policy comparison needs;
* ``failures``: the requests that are not ok, by run, status and reason;
* ``details``: one row per figure, one column per run, in sections;
* ``groups``: per SLO class or per tenant (only when a run has several);
* ``curves``: the points of each load curve, its knee and maximum goodput.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Literal

from llmlb_bench.metrics.definitions import ANSWER_FIGURES, LATENCY_FIGURES
from llmlb_bench.metrics.distribution import PERCENTILES, pkey
from llmlb_bench.metrics.run_figures import (ConversationFigures, LatencyName, PercentileKey, PointFigure, RunFigures,
                                              Signal, SignalResponse)
from llmlb_bench.run_summary import ClientSummary
from llmlb_bench.report.shape import ReportDoc

#: one cell of a run's column: a figure read from its summary
Getter = Callable[[RunFigures], object]


@dataclass
class Table:
    """A titled table; ``sections`` marks rows that are section headings (one cell, spanning).

    A header may hold a line break (name, then unit) for narrow terminals;
    one-line formats print it as a space.
    """

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    sections: set[int] = field(default_factory=set)
    note: str | None = None

    def section(self, name: str) -> None:
        self.sections.add(len(self.rows))
        self.rows.append([name] + [""] * (len(self.header) - 1))


def transpose(t: Table) -> Table:
    """Rows become columns: a one-row-per-run table turned into one column per run (for narrow screens)."""
    return Table(t.title, ["figure"] + [r[0] for r in t.rows],
                 [[h.replace("\n", " ")] + [r[i] for r in t.rows] for i, h in enumerate(t.header) if i > 0],
                 note=t.note)


def fmt(value: object, spec: str) -> str:
    """A number in ``spec`` format, '-' when missing."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, spec)


def _get(d: object, *path: str) -> object:
    """The figure at ``path`` in a run's figures (``("ttft", "p99")``), None where a step is absent or null:
    the detail rows name their figures by path, as docs/metrics.md does, so what it finds is read as
    ``object`` and narrowed by its reader (:func:`scaled`)."""
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def scaled(path: tuple[str, ...], scale: float) -> Getter:
    """The number at ``path`` times ``scale`` (None where there is none)."""
    def get(s: RunFigures) -> float | None:
        v = _get(s, *path)
        return v * scale if isinstance(v, (int, float)) else None
    return get


def interval(fig: LatencyName, p: PercentileKey, scale: float, spec: str) -> Getter:
    """'lo-hi' of a percentile's bootstrap interval of a run's figure."""
    return lambda s: _interval(s[fig], p, scale, spec)


def _interval(d: PointFigure, p: PercentileKey, scale: float, spec: str) -> str | None:
    """'lo-hi' of a percentile's bootstrap interval (of a run's figure, or of a load curve's point)."""
    ci = (d.get("ci") or {}).get(p)
    return None if not ci else f"{fmt(ci[0] * scale, spec)}–{fmt(ci[1] * scale, spec)}"


def run_name(s: RunFigures) -> str:
    """The run's name in this report: the facets that set it apart (metrics.identity), else its label."""
    name: str = s.get("name") or s["label"] or s["run_id"]
    return name


#: name, unit label, display scale, format of each latency figure
UNITS = {"ttft": ("TTFT", "ms", 1e3, ",.1f"), "tpot": ("TPOT", "ms", 1e3, ",.2f"), "itl": ("ITL", "ms", 1e3, ",.2f"),
         "e2e": ("E2E", "s", 1.0, ",.2f"), "norm_latency": ("normalized latency", "ms/token", 1e3, ",.2f"),
         "ttfa": ("TTFA", "s", 1.0, ",.2f"), "answer_tpot": ("answer TPOT", "ms", 1e3, ",.2f")}


def _pct(path: tuple[str, ...]) -> Getter:
    return scaled(path, 100.0)


#: what ``sent_s - scheduled_s`` is, by :func:`llmlb_bench.metrics.origin.wait_kind`
WAIT_KINDS = {"router": "router wait", "client": "client lag", "router+client": "router wait + client lag"}


def _failed(s: RunFigures) -> int:
    failed: int = s["error"] + s["timeout"] + s["rejected"] + s["not_sent"]
    return failed


def comparison(doc: ReportDoc) -> Table:
    """One row per run: the headline figures, SLO figures when an SLO was given."""
    with_slo = doc["options"]["slo"] is not None
    cols: list[tuple[str, Getter, str]] = [
        ("requests", lambda s: s["requests"], ",d"),
        ("failed", _failed, ",d"),
        ("req/s", lambda s: s["request_throughput"], ",.2f"),
        ("out tok/s", lambda s: s["output_throughput"], ",.0f"),
        ("TTFT\np50 ms", scaled(("ttft", "p50"), 1e3), ",.1f"),
        ("TTFT\np99 ms", scaled(("ttft", "p99"), 1e3), ",.1f"),
        ("TPOT\np99 ms", scaled(("tpot", "p99"), 1e3), ",.2f"),
        ("E2E\np99 s", scaled(("e2e", "p99"), 1.0), ",.2f"),
    ]
    if any(s.get("reasoning") for s in doc["runs"]):
        cols.append(("TTFA\np99 s", scaled(("reasoning", "ttfa", "p99"), 1.0), ",.2f"))
    if any((s["wait"]["p99"] or 0) > 1e-6 for s in doc["runs"]):
        cols.append(("wait\np99 ms", scaled(("wait", "p99"), 1e3), ",.1f"))
    if with_slo:
        cols += [("attain\n%", _pct(("slo", "attainment")), ".1f"),
                 ("goodput\nreq/s", scaled(("slo", "goodput"), 1.0), ",.2f")]
    cols += [("J/tok", scaled(("energy", "j_per_good_token" if with_slo else "j_per_output_token"), 1.0), ",.3f"),
             ("$/M\ngood tok" if with_slo else "$/M\ntok",
              scaled(("energy", "usd_per_m_good_tokens" if with_slo else "usd_per_m_output_tokens"), 1.0), ",.2f")]
    t = Table("Comparison", ["run"] + [c[0] for c in cols])
    unsteady = False
    for s in doc["runs"]:
        mark = "" if (s.get("steady") or {}).get("steady", True) else " (!)"
        unsteady |= bool(mark)
        t.rows.append([run_name(s) + mark] + [fmt(g(s), spec) for _, g, spec in cols])
    notes = [f"all runs: {doc['common']}"] if doc.get("common") else []
    if unsteady:
        notes.append("(!) not in steady state: its means depend on how long it ran (see the notes)")
    if with_slo:
        notes.append(f"SLO {doc['options']['slo_text']}; J/tok and $/M per SLO-compliant output token")
    t.note = "; ".join(notes) or None
    return t


def failures(doc: ReportDoc) -> Table | None:
    """Every request that is not ok, by run, status and normalised reason (metrics.failures); None when all
    are ok."""
    runs = [s for s in doc["runs"] if s.get("failures")]
    if not runs:
        return None
    t = Table("Failures: why requests are not ok", ["run", "requests", "status", "reason"])
    for s in runs:
        for i, f in enumerate(s["failures"]):
            t.rows.append([run_name(s) if i == 0 else "", fmt(f["requests"], ",d"), f["status"].replace("_", " "),
                           f["reason"]])
    return t


def _detail_rows(doc: ReportDoc) -> list[tuple[str, list[tuple[str, Getter, str]]]]:
    defs = doc["options"]["definitions"]
    latency: list[tuple[str, Getter, str]] = []
    for fig in LATENCY_FIGURES:
        name, unit, scale, spec = UNITS[fig]
        latency.append((f"{name} mean ({unit})", scaled((fig, "mean"), scale), spec))
        latency += [(f"{name} {pkey(p)} ({unit})", scaled((fig, pkey(p)), scale), spec) for p in PERCENTILES]
        latency.append((f"{name} p99 95% CI", interval(fig, "p99", scale, spec), "s"))
    sections: list[tuple[str, list[tuple[str, Getter, str]]]] = [
        ("Requests", [
            ("total", lambda s: s["requests"], ",d"), ("ok", lambda s: s["ok"], ",d"),
            ("failed (error/timeout/rejected/not sent)", _failed, ",d"),
            ("offered rate (req/s)", lambda s: s["offered_rate"], ",.2f"),
            ("realised rate (requests / arrival window)", lambda s: s.get("realised_rate"), ",.2f"),
        ]),
        ("Throughput", [
            ("arrival window (s)", lambda s: s.get("window_s"), ",.1f"),
            ("duration, to the last token (s)", lambda s: s["duration_s"], ",.1f"),
            ("requests/s (arrival window)", lambda s: s["request_throughput"], ",.2f"),
            ("output tokens/s (arrival window)", lambda s: s["output_throughput"], ",.0f"),
            ("requests/s over duration (vLLM)", scaled(("over_duration", "request_throughput"), 1.0), ",.2f"),
        ]),
        ("Before the first byte (metrics.origin)", [
            ("latency counted from", lambda s: s.get("latency_from"), "s"),
            ("sent - scheduled is", lambda s: WAIT_KINDS.get(s["wait"]["kind"]), "s"),
            ("  mean (ms)", scaled(("wait", "mean"), 1e3), ",.2f"),
            ("  p99 (ms)", scaled(("wait", "p99"), 1e3), ",.2f"),
            ("  max (ms)", scaled(("wait", "max"), 1e3), ",.2f"),
            ("  requests that waited (%)", _pct(("wait", "share")), ".1f"),
            ("  included in latency", lambda s: _yes(s["wait"]["included"]), "s"),
        ]),
        ("Steady state (metrics.steady)", [
            ("in steady state", lambda s: _yes(s["steady"]["steady"]), "s"),
            ("TTFT mean, 2nd tenth of arrivals (s)", lambda s: _part(s, 1), ",.2f"),
            ("TTFT mean, last tenth of arrivals (s)", lambda s: _part(s, -1), ",.2f"),
            ("drain tail after the last arrival (s)", scaled(("steady", "tail_s"), 1.0), ",.1f"),
        ]),
        (f"Latency ({defs} definitions)", latency),
    ]
    if any(s.get("reasoning") for s in doc["runs"]):
        answer: list[tuple[str, Getter, str]] = [
            ("requests that reasoned", scaled(("reasoning", "requests"), 1), ",d"),
            ("reasoning share of output tokens (%)", _pct(("reasoning", "share")), ".1f"),
        ]
        for answer_fig in ANSWER_FIGURES:
            name, unit, scale, spec = UNITS[answer_fig]
            answer += [(f"{name} {p} ({unit})", scaled(("reasoning", answer_fig, p), scale), spec) for p in ("mean", "p50", "p99")]
        sections.append(("Reasoning: the answer after the thinking", answer))
    if doc["options"]["slo"] is not None:
        sections.append(("SLO", [
            ("attainment (%)", _pct(("slo", "attainment")), ".1f"),
            ("goodput (requests/s, arrival window)", scaled(("slo", "goodput"), 1.0), ",.2f"),
            ("goodput over duration (vLLM)", scaled(("over_duration", "goodput"), 1.0), ",.2f"),
            ("good output tokens/s", scaled(("slo", "good_token_throughput"), 1.0), ",.0f"),
        ]))
    if any(s.get("control") for s in doc["runs"]):
        sections.append(("Control: response to the load steps (metrics.control)", _control_rows(doc["runs"])))
    sections.append(("Token pacing", [
        ("fluidity index mean", scaled(("pacing", "fluidity", "mean"), 1.0), ".3f"),
        ("fluidity index p1", scaled(("pacing", "fluidity", "p1"), 1.0), ".3f"),
        ("requests with fluidity >= 0.9 (%)", _pct(("pacing", "fluidity", "share_ge_0.9")), ".1f"),
        ("fluid token rate (tokens/s/stream)", scaled(("pacing", "fluid_token_rate"), 1.0), ",.1f"),
        ("slowest-10% gap mean (ms)", scaled(("pacing", "slowest10_gap_mean_s"), 1e3), ",.1f"),
        ("ITL and pacing from a block sample", lambda s: "yes" if (p := s["pacing"]) and p["sampled"] else "no", "s"),
    ]))
    if any((sp := s["speculative"]) and sp.get("acceptance_rate") is not None for s in doc["runs"]):
        sections.append(("Speculative decoding", [
            ("acceptance rate (%)", _pct(("speculative", "acceptance_rate")), ".1f"),
            ("mean acceptance length (tokens/step)", scaled(("speculative", "mean_acceptance_length"), 1.0), ".2f"),
            ("tokens per delivery", scaled(("speculative", "tokens_per_delivery"), 1.0), ".2f"),
            ("counted by", lambda s: (sp.get("source") if (sp := s["speculative"]) else None) or "-", "s"),
        ]))
    if any(s.get("fairness") for s in doc["runs"]):
        sections.append(("Fairness across tenants", [
            ("tenants", scaled(("fairness", "tenants"), 1), ",d"),
            ("Jain index, service (window mean)", scaled(("fairness", "jain_service"), 1.0), ".3f"),
            ("Jain index, attainment", scaled(("fairness", "jain_attainment"), 1.0), ".3f"),
            ("VTC service gap max (tokens)", scaled(("fairness", "service_gap_max"), 1.0), ",.0f"),
            ("VTC service gap mean (tokens)", scaled(("fairness", "service_gap_mean"), 1.0), ",.0f"),
            ("slowdown ratio max/min", scaled(("fairness", "slowdown_ratio"), 1.0), ".2f"),
        ]))
    talks = [c for s in doc["runs"] if (c := s["conversations"])]
    if talks:
        sections.append(("Conversations", _conversation_rows(talks)))
    sections.append(("Energy and cost", [
        ("energy (kJ)", scaled(("energy", "energy_j"), 1e-3), ",.2f"),
        ("J per output token", scaled(("energy", "j_per_output_token"), 1.0), ",.3f"),
        ("J per SLO-compliant token", scaled(("energy", "j_per_good_token"), 1.0), ",.3f"),
        ("average power per replica (W)", scaled(("energy", "avg_power_per_replica_w"), 1.0), ",.0f"),
        ("cost ($)", scaled(("energy", "cost_usd"), 1.0), ",.4f"),
        ("$ per million good tokens", scaled(("energy", "usd_per_m_good_tokens"), 1.0), ",.2f"),
    ]))
    sections.append(("Serving state", [
        ("prefix-cache hit rate (%)", _pct(("state", "prefix_cache_hit_rate")), ".1f"),
        ("preempted requests", scaled(("state", "preempted_requests"), 1), ",d"),
        ("preemptions", scaled(("state", "preemptions"), 1), ",d"),
        ("KV use mean (%)", _pct(("state", "kv_util_mean")), ".1f"),
        ("KV use peak (%)", _pct(("state", "kv_util_max")), ".1f"),
        ("time at >= 95% KV (%)", _pct(("state", "kv_high_share")), ".1f"),
        ("waiting mean / peak", lambda s: _pair(st["waiting_mean"], st["waiting_max"]) if (st := s["state"]) else None,
         "s"),
        ("running mean / peak", lambda s: _pair(st["running_mean"], st["running_max"]) if (st := s["state"]) else None,
         "s"),
    ]))
    if any(s.get("prefix_cache") for s in doc["runs"]):
        sections.append(("Prefix cache (% of prompt tokens)", [
            ("offered (one unbounded cache)", _pct(("prefix_cache", "offered")), ".1f"),
            ("reachable (unbounded cache per target)", _pct(("prefix_cache", "reachable")), ".1f"),
            ("achieved (cached tokens)", _pct(("prefix_cache", "achieved")), ".1f"),
            ("  lost to routing", _pct(("prefix_cache", "routing")), ".1f"),
            ("  lost to eviction", _pct(("prefix_cache", "eviction")), ".1f"),
            ("  lost to a stale router index", _pct(("prefix_cache", "stale")), ".1f"),
            ("  lost in flight (prefix still computing)", _pct(("prefix_cache", "in_flight")), ".1f"),
            ("  lost to block granularity", _pct(("prefix_cache", "granularity")), ".1f"),
            ("  lost with failed requests", _pct(("prefix_cache", "failed")), ".1f"),
            ("  not measured (no cached_tokens)", _pct(("prefix_cache", "unmeasured")), ".1f"),
            ("hits beyond the trace's prompts", _pct(("prefix_cache", "beyond")), ".1f"),
            ("router's predicted hit rate", _pct(("prefix_cache", "predicted", "hit_rate_predicted")), ".1f"),
            ("  delivered, same requests", _pct(("prefix_cache", "predicted", "hit_rate_delivered")), ".1f"),
            ("  predicted, not delivered", _pct(("prefix_cache", "predicted", "over")), ".1f"),
            ("  delivered, not predicted", _pct(("prefix_cache", "predicted", "under")), ".1f"),
        ]))
    if any(_client(s) for s in doc["runs"]):
        sections.append(("Client self-check", [
            ("event loop", lambda s: (c.get("event_loop") if (c := _client(s)) else None) or "-", "s"),
            ("dispatch lag p99 (ms)", scaled(("state", "client", "dispatch_lag_ms", "p99"), 1.0), ",.2f"),
            ("dispatch lag max (ms)", scaled(("state", "client", "dispatch_lag_ms", "max"), 1.0), ",.2f"),
            ("client CPU per request (ms)", scaled(("state", "client", "cpu_ms_per_request"), 1.0), ",.3f"),
            ("flagged too slow", lambda s: _flag(c.get("flagged") if (c := _client(s)) else None), "s"),
            ("server behind the sends (s; YES > 1 s)",
             lambda s: _server_lag(c.get("server_check") if (c := _client(s)) else None), "s"),
        ]))
    return sections


def _client(s: RunFigures) -> ClientSummary | None:
    return st["client"] if (st := s["state"]) else None


def _flag(flagged: bool | None) -> str | None:
    return None if flagged is None else "YES" if flagged else "no"


def _signal(s: RunFigures, sig: Signal) -> SignalResponse | None:
    return c.get(sig) if (c := s["control"]) else None


def _control_rows(runs: list[RunFigures]) -> list[tuple[str, Getter, str]]:
    """Per controlled signal: settling time, overshoot, steady-state error, oscillation (docs/control.md)."""
    def settling(sig: Signal) -> Getter:
        def get(s: RunFigures) -> str | None:
            r = _signal(s, sig)
            if r is None:
                return None
            v = r["settling_s"]
            return f"{v:,.0f}" if r["settled"] else f"> {v:,.0f} (not settled)"
        return get

    def peak(s: RunFigures, sig: Signal) -> str | None:
        r = _signal(s, sig)
        hz, share = (r["spectral_peak_hz"], r["spectral_peak_share"]) if r else (None, None)
        return None if hz is None or share is None else f"{hz:.3g} Hz / {100 * share:.0f}%"

    rows: list[tuple[str, Getter, str]] = [
        ("load steps (edges)", lambda s: (len(c["steps"]) if (c := s["control"]) else 0) or None, ",d")]
    names = {"ttft": "TTFT p{q:g} per {b:g} s", "queue": "engine queue", "replicas": "replicas"}
    signals: tuple[Signal, ...] = ("ttft", "queue", "replicas")
    for sig in signals:
        first = next((c for s in runs if (c := s["control"]) and c.get(sig)), None)
        if first is None:
            continue
        label = names[sig].format(q=100 * first["quantile"], b=first["bin_s"])
        rows += [(f"{label}: settling time (s)", settling(sig), "s"),
                 ("  overshoot (% of the change)", _pct(("control", sig, "overshoot")), ",.0f")]
        if sig == "ttft":
            rows.append(("  steady-state error (% of the SLO)", _pct(("control", sig, "steady_state_error")), ",.0f"))
        rows += [("  sign changes of the error", scaled(("control", sig, "sign_changes"), 1), ",d"),
                 ("  spectral peak / its energy share", partial(peak, sig=sig), "s")]
    return rows


def _conversation_rows(talks: list[ConversationFigures]) -> list[tuple[str, Getter, str]]:
    """Session figures, then TTFT p50 / p99 per turn index (metrics/conversations.py)."""
    rows: list[tuple[str, Getter, str]] = [
        ("sessions", scaled(("conversations", "sessions"), 1), ",d"),
        ("completed sessions (all requests ok)", scaled(("conversations", "completed"), 1), ",d"),
        ("requests per session mean", scaled(("conversations", "requests_mean"), 1.0), ",.1f"),
        ("session attainment (%)", _pct(("conversations", "attainment")), ".1f"),
        ("session completion p50 (s)", scaled(("conversations", "completion_s", "p50"), 1.0), ",.2f"),
        ("session completion p99 (s)", scaled(("conversations", "completion_s", "p99"), 1.0), ",.2f"),
        ("prompt tokens per session mean", scaled(("conversations", "tokens", "input_mean"), 1.0), ",.0f"),
        ("cached prompt tokens per session mean", scaled(("conversations", "tokens", "cached_mean"), 1.0), ",.0f"),
        ("output tokens per session mean", scaled(("conversations", "tokens", "output_mean"), 1.0), ",.0f"),
    ]
    turns = sorted({(t["turn"], t["pooled"]) for c in talks for t in c["ttft_by_turn"]})
    for turn, pooled in turns:
        def get(s: RunFigures, turn: int = turn) -> str | None:
            c = s["conversations"]
            t = next((t for t in c["ttft_by_turn"] if t["turn"] == turn), None) if c else None
            return None if t is None else f"{fmt(_ms(t['p50']), ',.0f')} / {fmt(_ms(t['p99']), ',.0f')}"
        rows.append((f"TTFT p50 / p99 turn {turn}{'+' if pooled else ''} (ms)", get, "s"))
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def _server_lag(check: object) -> str | None:
    """The server-side cross-check of a replay (replay.witness.server_check), as one cell."""
    if not isinstance(check, dict) or not check.get("available"):
        return None
    return f"{check['lag_s']:.2f}" + (" YES" if check.get("flagged") else "")


def _part(s: RunFigures, i: int) -> float | None:
    parts = s["steady"]["parts"]
    return parts[i]["ttft_mean"] if len(parts) > max(i, -i - 1) else None


def _yes(flag: bool | None) -> str | None:
    return None if flag is None else "yes" if flag else "no"


def _pair(a: float | None, b: float | None) -> str | None:
    return None if a is None else f"{a:,.1f} / {b:,}"


def details(doc: ReportDoc, runs: list[RunFigures] | None = None) -> Table:
    """Every figure (rows, in sections) of ``runs`` (columns; all runs by default)."""
    runs = doc["runs"] if runs is None else runs
    t = Table("Details", ["figure"] + [run_name(s) for s in runs])
    for name, rows in _detail_rows(doc):
        t.section(name)
        for label, get, spec in rows:
            t.rows.append([label] + [fmt(get(s), spec) for s in runs])
    return t


#: a grouped section of a run's figures
GroupKey = Literal["per_class", "per_tenant", "per_adapter"]
#: the grouped tables: summary key -> (title, first column)
GROUP_TABLES: dict[GroupKey, tuple[str, str]] = {"per_class": ("Per SLO class", "class"),
                                                 "per_tenant": ("Per tenant", "tenant"),
                                                 "per_adapter": ("Per LoRA adapter", "adapter")}


def groups(doc: ReportDoc, key: GroupKey) -> Table | None:
    """Per SLO class (``per_class``), tenant (``per_tenant``) or LoRA adapter (``per_adapter``,
    with each run's adapter loads): attainment and p99 TTFT/E2E per run."""
    runs = [(s, by) for s in doc["runs"] if (by := s[key])]
    if not any(len(by) > 1 for _, by in runs):
        return None
    names = sorted({g for _, by in runs for g in by})
    if key == "per_adapter":   # most requested first: adapter names carry no order (lora-10 < lora-2)
        names.sort(key=lambda g: -sum(by[g]["requests"] for _, by in runs if g in by))
    with_slo = doc["options"]["slo"] is not None
    title, first = GROUP_TABLES[key]
    t = Table(title, [first] + [run_name(s) for s, _ in runs])
    if key == "per_adapter" and any(s["adapter_loads"] for s, _ in runs):
        t.note = "adapter loads into GPU slots: " + ", ".join(
            f"{run_name(s)} {fmt(loads['total'] if (loads := s['adapter_loads']) else None, ',d')}" for s, _ in runs)
    for g in names:
        cells = []
        for _, by in runs:
            d = by.get(g)
            if d is None:
                cells.append("-")
                continue
            parts = [f"{fmt(d['requests'], ',d')} req"]
            if with_slo:
                parts.append(f"{fmt(None if d['attainment'] is None else 100 * d['attainment'], '.1f')}%")
            # a group's percentiles are there only where it has ok requests with the figure (GroupLatency)
            ttft = d.get("ttft_p99")
            parts.append(f"TTFT p99 {fmt(None if ttft is None else 1e3 * ttft, ',.0f')} ms")
            parts.append(f"E2E p99 {fmt(d.get('e2e_p99'), ',.2f')} s")
            cells.append(" · ".join(parts))
        t.rows.append([g] + cells)
    return t


def curves(doc: ReportDoc) -> list[Table]:
    """One table per load curve: its points, the knee and the maximum goodput."""
    out = []
    for c in doc["curves"]:
        t = Table(f"Load: {c['name']}", ["offered req/s", "realised req/s", "throughput", "goodput", "attain %",
                                          "E2E p50 s", "E2E p99 s", "E2E p99 95% CI", "TTFT p99 ms"])
        for p in c["points"]:
            t.rows.append([fmt(p["rate"], ",.2f"), fmt(p.get("realised_rate"), ",.2f"), fmt(p["throughput"], ",.2f"),
                           fmt(p["goodput"], ",.2f"),
                           fmt(None if p["attainment"] is None else 100 * p["attainment"], ".1f"),
                           fmt(p["e2e"].get("p50"), ",.2f"), fmt(p["e2e"].get("p99"), ",.2f"),
                           fmt(_interval(p["e2e"], "p99", 1.0, ",.2f"), "s"),
                           fmt(None if (ttft99 := p["ttft"].get("p99")) is None else 1e3 * ttft99, ",.1f")])
        mg = c["max_goodput"]
        notes = ["offered: the rate the run was set to (or its schedule's); realised: requests / arrival window, "
                 "the window throughput and goodput are per second of",
                 f"knee ({c['knee_figure']}, Kneedle): {fmt(c['knee_rate'], ',.2f')} req/s"]
        if doc["options"]["slo"] is not None:
            target = 100 * doc["options"]["attainment_target"]
            notes.append(f"capacity (highest offered rate with attainment >= {target:g}%): "
                         + (f"{fmt(mg['rate'], ',.2f')} req/s, goodput there {fmt(mg['goodput'], ',.2f')} req/s"
                            if mg else "none"))
        t.note = "; ".join(notes)
        out.append(t)
    return out


#: gate metric -> display scale, format and unit in a verdict table
_VERDICT_UNITS = {"p99_ttft": (1e3, ",.1f", " ms"), "p99_tpot": (1e3, ",.2f", " ms"), "p99_e2e": (1.0, ",.2f", " s"),
                  "attainment": (100.0, ".1f", "%"), "throughput": (1.0, ",.2f", " req/s"),
                  "goodput": (1.0, ",.2f", " req/s")}


def verdict_tables(doc: ReportDoc) -> list[Table]:
    """One table per comparison with the baseline: each headline figure's values, change, interval, p-value."""
    v = doc["verdicts"]
    out = []
    for comp in v["comparisons"] if v else ():
        t = Table(f"Verdict: {comp['candidate']} vs {comp['baseline']}",
                  ["figure", "base", "cand", "change\n%", "95% CI\n%", "p\nHolm", "verdict"])
        for c in comp["changes"]:
            scale, spec, unit = _VERDICT_UNITS.get(c["metric"], (1.0, ",.2f", ""))

            def val(x: float | None, scale: float = scale, spec: str = spec) -> str:
                return "-" if x is None else fmt(x * scale, spec)

            low, high = c["low"], c["high"]
            ci = "-" if low is None or high is None else f"{100 * low:+.1f}..{100 * high:+.1f}"
            t.rows.append([f"{c['figure']} {unit.strip()}".strip(),
                           val(c["baseline_value"]), val(c["candidate_value"]),
                           f"{100 * c['change']:+.1f}", ci, fmt(c["p_adjusted"], ".3g"),
                           c["direction"] if c["significant"] else "noise"])
        t.note = comp["sentence"]
        out.append(t)
    return out


def all_tables(doc: ReportDoc) -> list[Table]:
    """The tables of a full report, in order (details last: it is the longest)."""
    out = [comparison(doc)]
    out += [t for t in (failures(doc),) if t is not None]
    out += verdict_tables(doc)
    out += [t for t in (groups(doc, key) for key in GROUP_TABLES) if t is not None]
    out += curves(doc)
    out.append(details(doc))
    return out
