"""Characterisation of a trace: the figures that say how heavy-tailed, bursty and stateful it is.

Definitions (also in docs/workloads.md):

* rate: (n - 1) / (last arrival - first arrival), requests per second;
* inter-arrival CV: standard deviation over mean of the gaps (1 for Poisson);
* index of dispersion of counts, IDC(w): variance over mean of the request
  counts in consecutive windows of w seconds (1 for Poisson, CV^2 for a
  renewal process at long windows, growing with w for bursty processes);
* Hurst exponent: aggregated-variance estimate, H = 1 + slope / 2 of
  log Var(mean count per block of m bins) against log m (0.5 for short-range
  dependence, towards 1 for long-range dependent, self-similar traffic);
* Hill tail index: alpha = 1 / mean(log(X_(i) / X_(k+1))), i = 1..k, over
  the k = max(10, 2% of n) largest values (smaller alpha = heavier tail;
  below 2 the variance is infinite in the limit);
* input/output correlation: Spearman's rho and Pearson's r of log lengths;
* prefix reuse: the fraction of prompt blocks whose chained hash was already
  seen earlier in the trace (hits of an infinite prefix cache).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.schema import trace_block_size
from llmlb_bench.tomlfile import Value
from llmlb_bench.workload.prefixes import reuse_ratio

IDC_WINDOWS = (1.0, 10.0, 60.0, 600.0)
QUANTILES = (0.1, 0.5, 0.9, 0.99)


def one_line(table: pa.Table) -> str:
    """A one-line summary: count, span, mean rate, tenants and median lengths."""
    n = table.num_rows
    if n == 0:
        return "0 requests"
    arrival = table.column("arrival_s").to_numpy()
    span = float(arrival.max() - arrival.min())
    rate = f"{(n - 1) / span:.2f} req/s" if span > 0 else "all at t=0"
    tenants = pc.count_distinct(table.column("tenant").cast(pa.string())).as_py() if "tenant" in table.column_names else 0
    med_in = float(np.median(table.column("input_tokens").to_numpy()))
    med_out = float(np.median(table.column("output_tokens").to_numpy()))
    return (f"{n:,} requests over {span:,.1f} s ({rate}), {tenants} tenant(s), "
            f"median input {med_in:,.0f} / output {med_out:,.0f} tokens")


def index_of_dispersion(arrival_s: np.ndarray, window_s: float, start: float | None = None,
                        end: float | None = None) -> float:
    """Variance over mean of the counts in consecutive windows of ``window_s`` (1 for Poisson).

    Values growing with the window are the signature of burstiness at long
    time scales (MMPP, Hawkes, diurnal load); a renewal process stays flat.
    """
    t = np.asarray(arrival_s, dtype=float)
    lo = t.min() if start is None else start
    hi = t.max() if end is None else end
    n_win = int((hi - lo) // window_s)
    if n_win < 2:
        return float("nan")
    counts = np.bincount(((t - lo) // window_s).astype(np.int64), minlength=n_win)[:n_win]
    mean = counts.mean()
    return float(counts.var(ddof=1) / mean) if mean > 0 else float("nan")


def hurst(arrival_s: np.ndarray, bins: int = 4096) -> float:
    """Aggregated-variance Hurst estimate from counts in ``bins`` equal bins over the trace."""
    t = np.asarray(arrival_s, dtype=float)
    if len(t) < 100 or t.max() <= t.min():
        return float("nan")
    counts = np.histogram(t, bins=bins)[0].astype(float)
    ms, vs = [], []
    m = 1
    while bins // m >= 8:
        k = bins // m
        blocks = counts[: k * m].reshape(k, m).mean(axis=1)
        v = blocks.var(ddof=1)
        if v > 0:
            ms.append(m)
            vs.append(v)
        m *= 2
    if len(ms) < 3:
        return float("nan")
    slope = np.polyfit(np.log(ms), np.log(vs), 1)[0]
    return float(1 + slope / 2)


def hill_alpha(values: np.ndarray, fraction: float = 0.02, minimum: int = 10) -> float:
    """Hill estimator of the tail index over the largest ``max(minimum, fraction * n)`` values."""
    x = np.sort(np.asarray(values, dtype=float)[np.asarray(values) > 0])[::-1]
    k = max(minimum, int(fraction * len(x)))
    if len(x) <= k or x[k] <= 0:
        return float("nan")
    logs = np.log(x[:k] / x[k])
    return float(1.0 / logs.mean()) if logs.mean() > 0 else float("inf")


def length_stats(values: np.ndarray) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    q = np.quantile(v, QUANTILES)
    out = {"mean": float(v.mean()), **{f"p{int(p * 100)}": float(x) for p, x in zip(QUANTILES, q)},
           "max": float(v.max()), "hill_alpha": hill_alpha(v)}
    return out


def arrival_stats(arrival_s: np.ndarray) -> dict[str, Value]:
    t = np.sort(np.asarray(arrival_s, dtype=float))
    n = len(t)
    span = float(t[-1] - t[0]) if n else 0.0
    gaps = np.diff(t)
    out: dict[str, Value] = {"requests": n, "span_s": span,
                             "rate_rps": (n - 1) / span if span > 0 else float("nan"),
                             "interarrival_cv": float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0
                             else float("nan")}
    out["idc"] = {f"{w:g}s": index_of_dispersion(t, w) for w in IDC_WINDOWS if span / w >= 10}
    out["hurst"] = hurst(t)
    return out


def trace_stats(table: pa.Table) -> dict[str, Value]:
    """Every figure of the characterisation, as a JSON-able dict."""
    arrival = table.column("arrival_s").to_numpy()
    inp = table.column("input_tokens").to_numpy()
    out = table.column("output_tokens").to_numpy()
    result: dict[str, Value] = {**arrival_stats(arrival), "input_tokens": length_stats(inp),
                                "output_tokens": length_stats(out)}
    if len(inp) > 2 and np.ptp(inp) > 0 and np.ptp(out) > 0:
        from scipy import stats as sps  # imported where used: scipy costs every CLI command ~0.5 s otherwise

        result["io_spearman"] = float(sps.spearmanr(inp, out).statistic)
        result["io_pearson_log"] = float(np.corrcoef(np.log1p(inp), np.log1p(out))[0, 1])
    hashes = table.column("prefix_hashes")
    if hashes.null_count < table.num_rows:
        result["prefix"] = {"block_size": trace_block_size(table),
                            "blocks": int(pc.sum(pc.list_value_length(hashes)).as_py() or 0),
                            "reuse_ratio": reuse_ratio(hashes)}
    session = table.column("session_id")
    if session.null_count < table.num_rows:
        counts = pc.value_counts(session.drop_null()).field("counts").to_numpy()
        result["sessions"] = {"sessions": int(len(counts)), "mean_requests": float(counts.mean()),
                              "max_requests": int(counts.max())}
    parents = table.num_rows - table.column("parent_id").null_count
    if parents:
        result["dependent_requests"] = int(parents)
    waits = table.column("wait_ids") if "wait_ids" in table.column_names else None
    if waits is not None and waits.null_count < table.num_rows:
        lengths = pc.list_value_length(waits.drop_null()).to_numpy(zero_copy_only=False)
        result["joins"] = {"joins": int((lengths > 0).sum()), "mean_inputs": float(lengths[lengths > 0].mean())
                           if (lengths > 0).any() else 0.0}
    images = table.column("images").to_numpy(zero_copy_only=False)
    if images.any():
        result["images"] = {"requests_with_images": float((images > 0).mean()), "mean_images": float(images.mean()),
                            "image_token_share": float(table.column("image_tokens").to_numpy().sum() / max(inp.sum(), 1))}
    reasoning = table.column("reasoning_tokens") if "reasoning_tokens" in table.column_names else None
    if reasoning is not None and (r := reasoning.fill_null(0).to_numpy()).any():
        # output_tokens = reasoning + answer: the share of the decode work that is reasoning
        result["reasoning"] = {"requests_reasoning": float((r > 0).mean()),
                               "token_share": float(r.sum() / max(out.sum(), 1)),
                               "p50_tokens": float(np.median(r[r > 0]))}
    adapter = table.column("adapter") if "adapter" in table.column_names else None
    if adapter is not None and adapter.null_count < table.num_rows:
        # LoRA adapters: how many, and how skewed (the share of the most requested ones)
        counts = np.sort(pc.value_counts(adapter.drop_null().cast(pa.string())).field("counts").to_numpy())[::-1]
        result["adapters"] = {"adapters": int(len(counts)), "base_share": adapter.null_count / table.num_rows,
                              "top1_share": float(counts[0] / table.num_rows),
                              "top10_share": float(counts[:10].sum() / table.num_rows)}
    tenants = pc.value_counts(table.column("tenant").cast(pa.string()))
    result["tenants"] = {v["values"]: int(v["counts"]) for v in tenants.to_pylist()}
    kinds = pc.value_counts(table.column("kind").cast(pa.string()))
    result["kinds"] = {v["values"]: int(v["counts"]) for v in kinds.to_pylist()}
    return _clean(result)


def _clean(table: Mapping[str, Value]) -> dict[str, Value]:
    """NaN/inf -> None so the dict is valid JSON (in the nested tables too)."""
    return {k: _clean(v) if isinstance(v, dict) else None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in table.items()}
