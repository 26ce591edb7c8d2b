"""Characterisation of a trace: the figures that say how heavy-tailed, bursty and stateful it is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def one_line(table: pa.Table) -> str:
    """A one-line summary: count, span, mean rate, tenants and median lengths."""
    n = table.num_rows
    if n == 0:
        return "0 requests"
    arrival = table.column("arrival_s").to_numpy()
    span = float(arrival.max() - arrival.min())
    rate = f"{(n - 1) / span:.2f} req/s" if span > 0 else "all at t=0"
    tenants = table.column("tenant").unique().to_pylist() if "tenant" in table.column_names else []
    med_in = float(np.median(table.column("input_tokens").to_numpy()))
    med_out = float(np.median(table.column("output_tokens").to_numpy()))
    return (f"{n:,} requests over {span:,.1f} s ({rate}), {len(tenants)} tenant(s), "
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
