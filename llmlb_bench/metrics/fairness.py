"""Fairness across tenants: VTC service over time windows, Jain's index, slowdown ratio.

Service follows the Virtual Token Counter paper (Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024): a request's service is its
input tokens with weight 1 plus its output tokens with weight 2. Service is
counted when it is delivered: the input tokens at the first token (prefill
done), the output tokens at their times, taken as evenly spaced between the
first and the last token (split exactly across window boundaries). Reading
only those two times, not every token's, keeps the windows cheap on ten
million requests; a stall inside a request shifts at most its own tokens
by less than the stall.

VTC's guarantee is about *backlogged* tenants: a tenant that asks for little
is not wronged by receiving little. A tenant is backlogged in a window when
one of its requests was waiting in it, i.e. the window overlaps
[origin, first token) of the request (queueing and prefill; the origin is
arrival or send, as latency counts: :mod:`llmlb_bench.metrics.origin`). Over windows of
``window_s`` seconds from the run's first scheduled time, counting only
windows with at least two backlogged tenants:

* service gap (VTC's fairness measure) = max - min service received in the
  window among backlogged tenants; reported as its maximum and mean;
* Jain's index over per-tenant normalised service = (sum S)^2 / (k sum S^2)
  over the k backlogged tenants' service rates S (service / window length,
  weight 1 each), averaged over windows; 1 is perfectly even;
* Jain's index over per-tenant SLO attainment (whole run, every tenant);
* slowdown ratio = max / min over tenants of the mean normalized latency
  (E2E / output tokens) of their ok requests. It compares tenants against
  each other, so the unknown unloaded latency cancels when tenants share a
  per-token cost; with very different prompt lengths, read it with care.

Everything is computed only for runs with at least two tenants.
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypedDict

import numpy as np

from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.columns import Scratch, read
from llmlb_bench.metrics.run_columns import RunColumns, duckdb_double
from llmlb_bench.metrics.run_figures import FairnessFigures, GroupFigures
from llmlb_bench.metrics.sql import quote
from llmlb_bench.store.views import Catalog

INPUT_WEIGHT = 1
OUTPUT_WEIGHT = 2


#: the scratch arrays :func:`_windows_of` works in, by default
BUFFERS = ("fair_x", "fair_y", "fair_jf", "fair_jl", "fair_key")


class Windows(TypedDict):
    """The windowed figures of one run (:func:`_windows`): None where no window has two backlogged tenants."""

    windows: int
    gap_max: float | None
    gap_mean: float | None
    jain_service: float | None


def _windows(cat: Catalog, run_id: str, t0: float, rows: int, tenants: list[str], window_s: float,
             scratch: Scratch) -> Windows:
    """The windowed figures of one run, from one query of its requests' times.

    Windows are counted in NumPy, not SQL: a request touches one or two
    windows but an SQL plan expands and de-duplicates (tenant, window) sets
    over every request, several times slower on ten million rows. The SQL
    equivalent is in docs/metrics.md.
    """
    names = " ".join(f"WHEN {quote(t)} THEN {i}" for i, t in enumerate(tenants))
    # no nulls (NaN instead): each batch of a column is copied as it is (metrics/columns.py), into the
    # scratch memory of the run before; the columns are only read here
    c = read(cat, f"""
        SELECT (CASE coalesce(tenant, 'default') {names} END)::BIGINT AS tn, coalesce(origin_s - {t0!r}, 'NaN') AS s,
               coalesce(first_token_s - {t0!r}, 'NaN') AS f, coalesce(last_token_s - {t0!r}, 'NaN') AS l,
               coalesce(input_tokens, 0)::DOUBLE AS n_in, coalesce(output_tokens, 0)::DOUBLE AS n_out
        FROM request_metrics WHERE run_id = {quote(run_id)}""", rows,
             {"tn": np.int64, "s": np.float64, "f": np.float64, "l": np.float64, "n_in": np.float64,
              "n_out": np.float64}, scratch)
    return _windows_of(c["tn"], c["s"], c["f"], c["l"], c["n_in"], c["n_out"], len(tenants), window_s, scratch)


def windows_of_columns(cat: Catalog, cols: RunColumns, t0: float, tenant: np.ndarray, tenants: int,
                       window_s: float, scratch: Scratch, buffers: Sequence[str] = ()) -> Windows:
    """The windowed figures of one run from its columns read once (:mod:`llmlb_bench.metrics.run_columns`),
    the same to the bit as :func:`_windows`' query gives them: its times less ``t0`` as DuckDB subtracts
    the literal, its token counts the same doubles. ``tenant``: each row's tenant, numbered 0 to
    ``tenants`` - 1 in sorted order. The columns' times are overwritten (the run's last reader). ``buffers``:
    names of five arrays of ``scratch`` (of any dtype) to work in, where a stage before lends its own: over
    ten million rows every fresh array is 40 MB for the kernel to fault in, at several microseconds a page
    on the development machine."""
    t0d = duckdb_double(cat, t0)
    s, f, l = (np.subtract(x, t0d, out=x) for x in (cols.origin, cols.first, cols.last))
    buffers = [*buffers, cols.spare_time]       # the time column that is not the origin, read by none here
    return _windows_of(tenant, s, f, l, cols.input_tokens, cols.output_tokens, tenants, window_s, scratch,
                       buffers[:len(BUFFERS)] if len(buffers) >= len(BUFFERS) else BUFFERS)


def _windows_of(tn: np.ndarray, s: np.ndarray, f: np.ndarray, l: np.ndarray, n_in: np.ndarray, n_out: np.ndarray,
                tenants: int, window_s: float, scratch: Scratch, buffers: Sequence[str] = BUFFERS) -> Windows:
    """The windowed figures of one run's rows: each one's tenant (0 to ``tenants`` - 1), origin, first and
    last token time from the run's first scheduled time (NaN where null), and its input and output tokens.
    ``buffers``: the names of five arrays of ``scratch`` to work in."""
    w = float(window_s)
    n = len(tn)
    nwin = int(max(np.fmax.reduce(x) if len(x) else 0.0 for x in (s, f, l)) // w) + 1
    cells = tenants * nwin
    # a few whole-column arrays (x, y, jf, jl, key and the masks), each filled again in place, and from
    # the scratch memory of the run before: over ten million rows every fresh array is 40 MB the kernel
    # faults in and zeroes, most of the kernel time the report spent here
    x, y = scratch.array(buffers[0], n, np.float64), scratch.array(buffers[1], n, np.float64)
    jf, jl, key = (scratch.array(name, n, np.int64) for name in buffers[2:5])
    started, out, many = (scratch.array(name, n, np.bool_) for name in ("fair_started", "fair_out", "fair_one"))
    # in one pass of C each where the report's kernels are built (the same operations in the same order:
    # every figure to the last bit; over a 5M-row run, 0.2 CPU-s of NumPy's passes), else in NumPy
    native = kernels.native if _contiguous((tn, np.int64), *((c, np.float64) for c in (s, f, l, n_in, n_out))) \
        else None
    svc: np.ndarray = np.zeros(cells)
    # a kernel declines where a cell falls outside the array: the NumPy path then computes them all again
    if native is None or not (native.fair_service(tn, f, l, n_in, n_out, nwin, w, float(INPUT_WEIGHT),
                                                  float(OUTPUT_WEIGHT), svc, jf, jl, many)
                              and native.fair_walk(tn, f, l, n_out, jf, jl, many, nwin, w, float(OUTPUT_WEIGHT), svc)):
        svc = _service(tn, f, l, n_in, n_out, nwin, w, cells, x, y, jf, jl, key, started, out, many)
        # streams over several windows: walked window by window (:func:`_walk`)
        _walk(svc, many, f, l, n_out, jf, jl, tn, nwin, w, scratch)
    backlog: np.ndarray = np.zeros(cells + 1, dtype=bool)
    if native is None or not native.fair_backlog(tn, s, f, l, nwin, w, backlog):
        backlog = _backlog(tn, s, f, l, nwin, w, cells, x, jf, jl, key, started, out, many)
    backlog = backlog[:cells]
    svc, backlog = svc.reshape(tenants, nwin), backlog.reshape(tenants, nwin)
    k = backlog.sum(axis=0)
    counted = np.flatnonzero(k > 1)
    if not len(counted):
        return {"windows": 0, "gap_max": None, "gap_mean": None, "jain_service": None}
    x = np.where(backlog[:, counted], svc[:, counted], np.nan)
    gaps = np.nanmax(x, axis=0) - np.nanmin(x, axis=0)
    s1, s2 = np.nansum(x, axis=0), np.nansum(x * x, axis=0)
    jain_w = np.where(s2 > 0, s1 * s1 / (k[counted] * np.where(s2 > 0, s2, 1)), 1.0)
    return {"windows": len(counted), "gap_max": float(gaps.max()), "gap_mean": float(gaps.mean()),
            "jain_service": float(jain_w.mean())}


def _contiguous(*arrays: tuple[np.ndarray, type[np.generic]]) -> bool:
    """Whether every array is C-contiguous and of its dtype, as the kernels take them."""
    return all(a.dtype == dtype and a.flags.c_contiguous for a, dtype in arrays)


def _service(tn: np.ndarray, f: np.ndarray, l: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, nwin: int, w: float,
             cells: int, x: np.ndarray, y: np.ndarray, jf: np.ndarray, jl: np.ndarray, key: np.ndarray,
             started: np.ndarray, out: np.ndarray, many: np.ndarray) -> np.ndarray:
    """Each row's first window (of its first token; 0 where it has none) in ``jf`` and its last token's in
    ``jl`` (0 where it has no output), the rows whose output spans windows in ``many``, and the service per
    cell (tenant x window) of the input at the first token and of the streams within one window: the
    NumPy path of the kernel ``fair_service``, in the arrays given."""
    np.isnan(f, out=started)
    np.logical_not(started, out=started)
    # each request's first window (0 where it never started: it adds nothing)
    x[...] = 0.0
    np.divide(f, w, out=x, where=started)
    np.copyto(jf, np.floor(x, out=x), casting="unsafe")
    np.multiply(tn, nwin, out=key)
    key += jf
    np.greater(n_out, 0, out=out)
    out &= started
    # its last token's window (0 where it has no output)
    x[...] = 0.0
    np.divide(l, w, out=x, where=out)
    np.copyto(jl, np.floor(x, out=x), casting="unsafe")
    np.equal(jf, jl, out=many)                         # a stream within one window
    many &= out
    # the input tokens at the first token and a one-window stream's output, to the first window's cell, in
    # one count: rows that add nothing to a cell add 0 to it (all service is whole tokens: the sums are
    # exact in any order and grouping)
    x[...] = 0.0
    np.multiply(INPUT_WEIGHT, n_in, out=x, where=started)
    y[...] = 0.0
    np.multiply(OUTPUT_WEIGHT, n_out, out=y, where=many)
    x += y
    svc: np.ndarray = np.bincount(key, weights=x, minlength=cells)
    np.logical_not(many, out=many)                     # the streams over several windows
    many &= out
    return svc


def _backlog(tn: np.ndarray, s: np.ndarray, f: np.ndarray, l: np.ndarray, nwin: int, w: float, cells: int,
             x: np.ndarray, jf: np.ndarray, jl: np.ndarray, key: np.ndarray, started: np.ndarray, waits: np.ndarray,
             one: np.ndarray) -> np.ndarray:
    """The cells (tenant x window, and a spare one past the last) in which some row waited, from its origin
    to its first token, or where it has none, to the later of its last token and its origin: the NumPy
    path of the kernel ``fair_backlog``, in the arrays given."""
    # when each request's wait ends (first token, or its end: last token or send), and whether it waited;
    # then the first and last window of each wait (0 and -1 where none) over every row, in jf and jl
    np.isnan(f, out=started)
    np.logical_not(started, out=started)
    np.fmax(l, s, out=x)
    np.copyto(x, f, where=started)
    np.greater(x, s, out=waits)                         # false where s is NaN (never sent)
    np.logical_not(waits, out=one)
    np.copyto(x, 0.0, where=one)
    x /= w
    np.copyto(jl, np.ceil(x, out=x), casting="unsafe")
    jl -= 1
    x[...] = 0.0
    np.divide(s, w, out=x, where=waits)
    np.copyto(jf, np.floor(x, out=x), casting="unsafe")
    np.multiply(tn, nwin, out=key)
    key += jf
    np.copyto(key, cells, where=one)                     # a spare cell past the last for the rows with no wait
    backlog: np.ndarray = np.zeros(cells + 1, dtype=bool)
    backlog[key] = True
    later = np.flatnonzero(jf < jl)                      # the waits that reach a later window
    j, jend, tt = jf[later] + 1, jl[later], tn[later]
    while len(j):
        backlog[tt * nwin + j] = True
        more = j < jend
        j, jend, tt = j[more] + 1, jend[more], tt[more]
    return backlog


#: rows of a run :func:`_walk` takes at a time
WALK_ROWS = 1 << 18


def _walk(svc: np.ndarray, many: np.ndarray, f: np.ndarray, l: np.ndarray, n_out: np.ndarray, jf: np.ndarray,
          jl: np.ndarray, tn: np.ndarray, nwin: int, w: float, scratch: Scratch) -> None:
    """Adds to ``svc`` (a cell per tenant and window) the output service of the rows ``many`` marks: streams
    whose tokens span windows ``jf`` to ``jl``, walked window by window, each row dropped once past its
    last (every one spans a second window, so the first step drops none); the token index where window
    j + 1 starts is both window j's last (less one) and window j + 1's first, computed once for the two.

    :data:`WALK_ROWS` rows at a time, in a few small arrays of ``scratch`` (each row's state in one of
    two, dropped rows copied from one to the other), where the whole run's streams at once made some
    twenty arrays of all of them each time: fresh memory for the kernel to fault in. Every service is
    whole tokens (or not finite), so the sums are the same in any order and grouping."""
    cells = len(svc)
    size = WALK_ROWS

    def pair(name: str, dtype: type[np.floating] | type[np.signedinteger]) -> list[np.ndarray]:
        return [scratch.array(f"walk_{name}{i}", size, dtype) for i in (0, 1)]

    state = {"ff": pair("ff", np.float64), "nn1": pair("nn1", np.float64), "g": pair("g", np.float64),
             "j": pair("j", np.int64), "jend": pair("jend", np.int64), "base": pair("base", np.int64),
             "starts": pair("starts", np.float64)}
    e_buf, k_buf = scratch.array("walk_e", size, np.float64), scratch.array("walk_k", size, np.float64)
    i_buf = scratch.array("walk_i", size, np.int64)
    for a in range(0, len(many), size):
        rows = np.flatnonzero(many[a:a + size])
        m = len(rows)
        if not m:
            continue
        rows += a
        at = 0                                  # which of each pair holds the rows' state
        ff = np.take(f, rows, out=state["ff"][0][:m], mode="clip")
        nn1 = np.take(n_out, rows, out=state["nn1"][0][:m], mode="clip")
        j = np.take(jf, rows, out=state["j"][0][:m], mode="clip")
        jend = np.take(jl, rows, out=state["jend"][0][:m], mode="clip")
        base = np.take(tn, rows, out=state["base"][0][:m], mode="clip")
        base *= nwin                            # the row's tenant's first cell
        # g = (l - ff) / (nn - 1): the spacing of the stream's tokens
        g = np.take(l, rows, out=state["g"][0][:m], mode="clip")
        g -= ff
        nn1 -= 1
        g /= nn1
        # starts = ceil((j * w - ff) / g)
        starts = np.multiply(j, w, out=state["starts"][0][:m])
        starts -= ff
        starts /= g
        np.ceil(starts, out=starts)
        while m:
            # ends = ceil(((j + 1) * w - ff) / g)
            np.add(j, 1, out=i_buf[:m])
            ends = np.multiply(i_buf[:m], w, out=e_buf[:m])
            ends -= ff
            ends /= g
            np.ceil(ends, out=ends)
            # k_hi = min(nn - 1, ends - 1) - max(0, starts) + 1, weighted max(0, k_hi) x OUTPUT_WEIGHT
            k_hi = np.subtract(ends, 1, out=k_buf[:m])
            np.minimum(nn1, k_hi, out=k_hi)
            k_hi -= np.maximum(0, starts, out=starts)
            k_hi += 1
            np.maximum(0, k_hi, out=k_hi)
            k_hi *= OUTPUT_WEIGHT
            svc += np.bincount(np.add(base, j, out=i_buf[:m]), weights=k_hi, minlength=cells)
            more = j < jend
            np.copyto(starts, ends)
            if not more.all():
                kept = np.flatnonzero(more)
                m = len(kept)
                at = 1 - at
                ff, nn1, g, j, jend, base, starts = (
                    np.take(x, kept, out=state[name][at][:m], mode="clip")
                    for name, x in (("ff", ff), ("nn1", nn1), ("g", g), ("j", j), ("jend", jend), ("base", base),
                                    ("starts", starts)))
            j += 1


def jain(values: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2); None when undefined (no values, or all zero)."""
    sq = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * sq) if values and sq > 0 else None


def fairness(cat: Catalog, runs: Mapping[str, tuple[float, int]], tenants: Mapping[str, Mapping[str, GroupFigures]],
             window_s: float = 10.0, scratch: Scratch | None = None,
             windows: Mapping[str, Windows] | None = None) -> dict[str, FairnessFigures]:
    """``{run_id: {...}}`` for ``runs`` (run id -> first scheduled time and request rows), the runs with two
    or more tenants.

    ``tenants`` maps run ids to their tenants' figures (metrics/summary.py; ``attainment`` None without an SLO);
    ``scratch``: memory to reuse; ``windows``: runs' windowed figures already computed (from their columns
    read once: :func:`windows_of_columns`), not read again.
    """
    out: dict[str, FairnessFigures] = {}
    scratch = scratch or Scratch()
    for run_id, (t0, rows) in runs.items():
        per = tenants.get(run_id) or {}
        att = [t["attainment"] for t in per.values()]
        known = [a for a in att if a is not None]
        lat = [m for t in per.values() if (m := t["norm_latency_mean"])]
        win = windows[run_id] if windows and run_id in windows else \
            _windows(cat, run_id, t0, rows, sorted(per), window_s, scratch)
        out[run_id] = {
            "tenants": len(per),
            "window_s": window_s,
            "windows": win["windows"],
            "service_gap_max": win["gap_max"],
            "service_gap_mean": win["gap_mean"],
            "jain_service": win["jain_service"],
            "jain_attainment": jain(known) if att and len(known) == len(att) else None,
            "slowdown_ratio": max(lat) / min(lat) if len(lat) > 1 else None,
            "per_tenant": {t: {"requests": d["requests"], "service": d["service"],
                               "norm_latency_mean": d["norm_latency_mean"]} for t, d in per.items()},
        }
    return out
