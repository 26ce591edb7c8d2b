"""Per-run summary figures: every metric of docs/metrics.md for each run of a catalog.

Counts, throughput and attainment are SQL aggregates over the ``requests``
view (:mod:`llmlb_bench.metrics.counts`: one scan for runs, SLO classes and
tenants); latency percentiles come from :mod:`llmlb_bench.metrics.latency`;
pacing, fairness, energy and state from their modules. Any number in a
report can be reproduced with ``llmlb query`` (docs/metrics.md gives the SQL).

* duration = latest request end (last token, or send time for requests
  that never produced a token) - earliest scheduled time (for imported
  runs without a common clock: the duration the tool measured);
* arrival window = (last - first scheduled time) x n / (n - 1): the span over
  which the n requests arrived, so that n / window is the offered rate
  (:func:`arrival_window`);
* realised rate = requests / arrival window (beside ``offered_rate``, which is
  the rate a sweep or run.json declares when one does: the nominal rate);
* throughput = ok requests (output tokens) / arrival window;
* attainment = good requests / all requests (failed ones count as not good);
* failures = the requests that are not ok, by status and normalised reason
  (:mod:`llmlb_bench.metrics.failures`);
* goodput = good requests (their output tokens) / arrival window;
* the same rates over the whole duration, vLLM ``bench serve``'s (the drain
  tail after the last arrival included), under ``over_duration``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa

from llmlb_bench.hugepages import small_pages
from llmlb_bench.metrics.columns import Scratch
from llmlb_bench.metrics.control import control
from llmlb_bench.metrics.conversations import conversations
from llmlb_bench.metrics.adapters import adapter_loads
from llmlb_bench.metrics.counts import GROUPS, Counts, cells, rollup
from llmlb_bench.metrics.definitions import ANSWER_FIGURES, WAIT, WAIT_FIGURE, Definitions, Figure, figures
from llmlb_bench.metrics.distribution import Sample, describe
from llmlb_bench.metrics.energy import energy_and_cost
from llmlb_bench.metrics.fairness import Windows, fairness, windows_of_columns
from llmlb_bench.metrics.failures import failure_sql, failures
from llmlb_bench.metrics.goodput import offered_rate
from llmlb_bench.metrics.identity import facets, names
from llmlb_bench.metrics.latency import Latency, cell_column, group_index, run_latency, spare_buffers
from llmlb_bench.metrics.meta import table
from llmlb_bench.metrics.origin import arrival_runs, lag_threshold_ms, latency_from, wait_kind
from llmlb_bench.metrics.pacing import Segments, pacing
from llmlb_bench.metrics import run_columns
from llmlb_bench.metrics.run_columns import read_run, serves
from llmlb_bench.metrics.run_figures import (AnswerName, Distribution, GroupFigures, GroupLatency, ReasoningFigures,
                                              RunFigures, SloFigures, WaitFigures)
from llmlb_bench.metrics.sample import DEFAULT_SAMPLE, is_sampled, token_rows
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.speculative import speculative
from llmlb_bench.metrics.sql import request_metrics_sql
from llmlb_bench.metrics.cache_accounting import accounting_summary
from llmlb_bench.metrics.state import serving_state
from llmlb_bench.metrics.steady import part_sql, steady_state
from llmlb_bench.store.token_sample import kept_ref
from llmlb_bench.store.views import Catalog


@dataclass(frozen=True)
class Options:
    """How to compute a summary (everything but the SLO, which callers pass on its own)."""

    definitions: Definitions = Definitions.vllm
    seed: int = 0                       # bootstrap replicates
    ci: bool = True                     # bootstrap confidence intervals on percentiles
    confidence: float = 0.95
    window_s: float = 10.0              # fairness windows
    price_per_hour: float | None = None  # whole fleet, overrides the GPU catalog
    token_sample: int = DEFAULT_SAMPLE  # ok requests per run that token-level figures read (block sample above)
    cdf: bool = False                   # also each latency figure's CDF (for plots)


def _group(m: Counts, percentiles: GroupLatency) -> GroupFigures:
    return {"requests": m["requests"], "ok": m["ok"], "good": m["good"], "good_tokens": m["good_tokens"],
            "attainment": None if m["good"] is None else m["good"] / m["requests"], **percentiles,
            "service": m["service"], "norm_latency_mean": m["norm_latency_mean"]}


def summarize(cat: Catalog, slo: Slo | None = None, options: Options | None = None) -> list[RunFigures]:
    """One run's figures (metrics/run_figures.py) per run that has request rows, in the catalog's order
    (run folders as given; folders found inside a results directory sorted by path).

    NumPy's arrays are allocated without huge pages meanwhile (:mod:`llmlb_bench.hugepages`: over ten
    million rows, a second or more of the kernel's compaction saved where memory is fragmented)."""
    with small_pages():
        return _summarize(cat, slo, options or Options())


def _summarize(cat: Catalog, slo: Slo | None, opt: Options) -> list[RunFigures]:
    metas = metas_of(cat.runs_table)
    cat.con.execute(request_metrics_sql(arrival_runs(metas)))  # the views have every schema column (store.views)
    figs = figures(opt.definitions)
    units = rollup(cells(cat, slo, part_sql(cat)), slo)   # the steady state's tenths from the same scan
    counts = {u[1]: m for u, m in units.items() if u[0] == "run"}
    runs = [r for r in cat.runs_table.to_pylist() if r["run_id"] in counts]
    token_runs = {k: (c["ok"], c["id_min"], c["id_max"]) for k, c in counts.items()}
    # token-level figures (ITL, pacing) read each run's token rows once, flattened once
    dirs = {run["run_id"]: run["dir"] for run in runs}
    tokens = {k: Segments.of(token_rows(cat, k, *v, opt.token_sample, kept_ref(metas[k]),
                                        dirs.get(k))) for k, v in token_runs.items()}
    groups: dict[str, dict[str, list[str]]] = {}
    for u in units:
        if u[0] != "run":
            groups.setdefault(u[1], {}).setdefault(u[0], []).append(u[2])
    # the answer's figures are shown only for runs with reasoning: other runs skip their columns and sorts
    shown = {**figs, WAIT: WAIT_FIGURE}
    plain = {n: f for n, f in shown.items() if n not in ANSWER_FIGURES}
    # runs of two or more tenants, from their first scheduled time (a run without one has no windows to cut)
    multi = {k: t0 for k, by in groups.items() if len(by.get("tenant", ())) > 1
             and (t0 := counts[k]["t0"]) is not None}
    # the latency and fairness stages read their runs' columns into memory reused from run to run: each
    # run's once for both, where its figures are computed from them (metrics/run_columns.py)
    scratch = Scratch()
    lat = Latency()
    fair_windows: dict[str, Windows] = {}
    arrival = set(arrival_runs(metas))
    described: dict[str, dict[str, Distribution]] = {}
    waits: dict[str, WaitFigures] = {}
    for k, c in counts.items():
        run_figs = shown if c["reasoning_tokens"] else plain
        run_groups = groups.get(k, {})
        cols = None
        if serves(run_figs):
            cell_sql, cell_dtype = cell_column(run_groups) or (None, np.int64)
            cols = read_run(cat, k, c["requests"], k in arrival, cell_sql, cell_dtype, scratch)
        # the run's figures from its samples as they come: from the columns read once, each figure's sample
        # lies in scratch memory the next one's values fill (run_latency's hand); the others (ITL's, or
        # all of a run read by the stage's own query) once the stage is done, then dropped
        done: dict[str, Distribution] = {}

        def hand(name: str, sample: Sample, k: str = k, done: dict[str, Distribution] = done) -> None:
            if name == WAIT:
                waits[k] = _wait(sample, metas[k])
            else:
                done[name] = _describe(sample, figs, opt, k, name)

        run_latency(cat, k, c["ok"], run_figs, run_groups, tokens.get(k), scratch, lat, cols, hand)
        described[k] = {name: done[name] if name in done else _describe(lat.samples.get((k, name)), figs, opt, k, name)
                        for name in figs}
        if k not in waits:
            waits[k] = _wait(lat.samples.get((k, WAIT)), metas[k])
        for key in [key for key in lat.samples if key[0] == k]:
            del lat.samples[key]
        if cols is not None and k in multi:
            assert cols.cell is not None
            tenants = sorted(run_groups["tenant"])     # as the fairness stage numbers them
            # in memory the latency stage is done with: its temporary values and its samples, described
            tenant = group_index(run_groups, "tenant", cols.cell, tenants,
                                 scratch.array(run_columns.VALUE, len(cols.cell), np.int64))
            fair_windows[k] = windows_of_columns(cat, cols, multi[k], tenant, len(tenants), opt.window_s, scratch,
                                                 spare_buffers())
    tables: dict[str, dict[str, dict[str, GroupFigures]]] = {col: {} for col in GROUPS}
    for u, m in units.items():
        if u[0] != "run":
            tables[u[0]].setdefault(u[1], {})[u[2]] = _group(m, lat.groups.get(u, {}))
    durations = {k: _duration(c, metas[k]) for k, c in counts.items()}
    energy = energy_and_cost(cat, {k: {"meta": metas[k], "duration_s": durations[k], "energy_j": counts[k]["energy_j"],
                                       "output_tokens": counts[k]["output_tokens"],
                                       "good_tokens": counts[k]["good_tokens"]} for k in counts},
                             opt.price_per_hour)
    fair = fairness(cat, {k: (t0, counts[k]["requests"]) for k, t0 in multi.items()}, tables["tenant"], opt.window_s,
                    scratch, fair_windows)
    state = serving_state(cat, counts, metas)
    cache = accounting_summary(cat)
    pace = pacing(tokens, {k: is_sampled(*v, opt.token_sample) for k, v in token_runs.items()}, slo)
    talks = conversations(cat, slo)
    loads = adapter_loads(cat)
    spec = speculative(cat, counts)
    # not-ok requests by status and reason: none to look for where every request of every run was ok
    failed = failures(cat.query(failure_sql())) if any(c["ok"] < c["requests"] for c in counts.values()) else {}
    ids = [run["run_id"] for run in runs]
    windows = {k: arrival_window(counts[k]["requests"], counts[k]["t0"], counts[k]["last_scheduled"], metas[k])
               or durations[k] for k in ids}
    steady = steady_state(cat, {k: {
        "window_s": windows[k], "attainment": _attainment(counts[k]) if slo is not None else None,
        "tail_s": _tail(counts[k])} for k in ids}, slo)
    loops = control(cat, {k: {"spec": table(metas[k], "trace").get("spec"),
                              "t1": counts[k]["last_scheduled"]} for k in ids}, slo)
    run_facets = {k: facets(metas[k]) for k in ids}
    named = names(run_facets, {run["run_id"]: run["label"] for run in runs})
    out: list[RunFigures] = []
    for run in runs:
        run_id = run["run_id"]
        c = counts[run_id]
        duration = durations[run_id]
        window = windows[run_id]
        per_s = (lambda x, w=window: x / w) if window > 0 else (lambda x: None)
        per_d = (lambda x, d=duration: x / d) if duration > 0 else (lambda x: None)
        offered = offered_rate(metas[run_id], c["requests"], c["t0"], c["last_scheduled"])
        fig = described[run_id].__getitem__
        out.append({
            "run_id": run_id, "label": run["label"], "policy": run["policy"],
            "backend": run["backend"], "status": run["status"], "created_utc": run["created_utc"],
            "requests": c["requests"],
            "ok": c["ok"], "error": c["error"], "timeout": c["timeout"], "rejected": c["rejected"],
            "not_sent": c["not_sent"],
            "failures": failed.get(run_id, []),   # not-ok requests by status and reason (metrics.failures)
            "duration_s": duration,
            "window_s": window,
            "offered_rate": offered,
            # what the trace run actually offered: goodput and throughput are per second of the same window,
            # so neither can exceed it (a nominal offered_rate can sit below a realised goodput)
            "realised_rate": per_s(c["requests"]),
            "request_throughput": per_s(c["ok"]),
            "output_throughput": per_s(c["output_tokens"]),
            "input_throughput": per_s(c["input_tokens"]),
            "over_duration": {"request_throughput": per_d(c["ok"]), "output_throughput": per_d(c["output_tokens"]),
                              "goodput": per_d(c["good"]) if slo is not None else None,
                              "good_token_throughput": per_d(c["good_tokens"]) if slo is not None else None},
            "input_tokens": c["input_tokens"], "output_tokens": c["output_tokens"],
            "cached_tokens": c["cached_tokens"], "preemptions": c["preemptions"],
            "definitions": opt.definitions.value,
            "facets": run_facets[run_id],
            "latency_from": latency_from(metas[run_id]),
            "wait": waits[run_id],
            "ttft": fig("ttft"), "tpot": fig("tpot"), "itl": fig("itl"), "e2e": fig("e2e"),
            "norm_latency": fig("norm_latency"),
            "reasoning": _reasoning(c, fig),
            "slo": None if slo is None else _judged(slo, c, per_s),
            "per_class": tables["slo_class"].get(run_id),    # None for a run of one class and one tenant
            "per_tenant": tables["tenant"].get(run_id),
            "per_adapter": tables["adapter"].get(run_id),    # null adapter = the base model ("base")
            "adapter_loads": loads.get(run_id),              # None where no target loads adapters
            "pacing": pace.get(run_id),
            "speculative": spec.get(run_id),
            "fairness": fair.get(run_id),
            "energy": energy.get(run_id),
            "state": state.get(run_id),
            "conversations": talks.get(run_id),  # None for a run without sessions
            "prefix_cache": cache.get(run_id),
            "steady": steady[run_id],
            "control": loops.get(run_id),     # None for a run without a load step in its workload
            "name": named[run_id],
        })
    return out


def _describe(sample: Sample | None, figs: Mapping[str, Figure], opt: Options, run_id: str, name: str) -> Distribution:
    """One latency figure of one run: its count, mean, percentiles and their intervals (and CDF)."""
    return describe(sample, figs[name].method, seed=opt.seed, key=(run_id, name), ci=opt.ci, level=opt.confidence,
                    cdf=opt.cdf)


def _attainment(c: Counts) -> float | None:
    """Good requests / all requests (failed ones count as not good); None without an SLO."""
    good, requests = c["good"], c["requests"]
    return good / requests if requests and good is not None else None


def _judged(slo: Slo, c: Counts, per_s: Callable[[float], float | None]) -> SloFigures:
    """The run judged against ``slo``: its counts were rolled up with it, so good requests are counted."""
    good, good_tokens = c["good"] or 0, c["good_tokens"] or 0
    return {"spec": slo.to_dict(), "good": good, "good_tokens": good_tokens, "attainment": _attainment(c),
            "goodput": per_s(good), "good_token_throughput": per_s(good_tokens)}


def _tail(c: Counts) -> float | None:
    """The drain tail: last end - last scheduled time (None where either is unknown)."""
    return None if c["t1"] is None or c["last_scheduled"] is None else c["t1"] - c["last_scheduled"]


def _reasoning(c: Counts, answer: Callable[[AnswerName], Distribution]) -> ReasoningFigures | None:
    """Reasoning share of the ok requests' output, and the answer's figures; None for a run without
    reasoning (its report shows nothing of it)."""
    if not c["reasoning_tokens"]:
        return None
    return {"requests": c["reasoning_requests"], "tokens": c["reasoning_tokens"],
            "share": c["reasoning_tokens"] / c["output_tokens"] if c["output_tokens"] else None,
            "ttfa": answer("ttfa"), "answer_tpot": answer("answer_tpot")}


def _wait(sample: Sample | None, meta: Mapping[str, object]) -> WaitFigures:
    """``sent_s - scheduled_s`` of the ok requests: router wait or client lag (:mod:`~llmlb_bench.metrics.origin`).

    ``share`` is the share of requests that waited at all (more than 1 us);
    ``flagged`` marks a replay whose client lag p99 exceeds its threshold.
    """
    kind = wait_kind(meta)
    d = describe(sample, "linear", seed=0, key=(), percentiles=(50.0, 99.0), ci=False)
    p99 = d["p99"]
    return {"n": d["n"], "mean": d["mean"], "p50": d["p50"], "p99": p99,
            "max": float(sample.v[-1]) if sample is not None else None,
            "share": float(1.0 - np.searchsorted(sample.v, 1e-6, side="right") / sample.n) if sample is not None
            else None,
            "kind": kind,
            "included": latency_from(meta) == "arrival",
            "flagged": kind != "router" and p99 is not None and p99 * 1e3 > lag_threshold_ms(meta)}


def arrival_window(requests: int, first_s: float | None, last_s: float | None,
                   meta: Mapping[str, object]) -> float | None:
    """(last - first scheduled) x n / (n - 1): n requests over it is the offered rate; None when unknown
    (one request, or an import whose requests each ran on their own clock)."""
    if table(meta, "summary", "import").get("clock") == "per_request":
        return None
    if requests > 1 and first_s is not None and last_s is not None and last_s > first_s:
        return (last_s - first_s) * requests / (requests - 1)
    return None


def _duration(c: Counts, meta: Mapping[str, object]) -> float:
    """Request span; for imports whose requests each run on their own clock, the tool's measured duration."""
    imported = table(meta, "summary", "import")
    measured = imported.get("duration_s")
    if imported.get("clock") == "per_request" and isinstance(measured, (int, float)) and measured:
        return float(measured)
    return (c["t1"] - c["t0"]) if c["t1"] is not None and c["t0"] is not None else 0.0


def metas_of(runs_table: pa.Table) -> dict[str, Mapping[str, object]]:
    """run id -> run.json document, from a catalog's ``runs_table`` (values ``object``: metrics/meta.py)."""
    return {r["run_id"]: json.loads(r["meta"]) if r["meta"] else {} for r in runs_table.to_pylist()}
