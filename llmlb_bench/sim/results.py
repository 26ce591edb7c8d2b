"""Collect ended requests and write them to the run's requests sink in batches.

A finished request is remembered as a few numbers (its trace row, its token
step ranges on its last replica, its prefill energy); its times, energy and
``token_times`` segments are computed in bulk from that replica's timeline
when a batch is written, and the timelines are then trimmed to what
unfinished requests still need.
"""

from __future__ import annotations

from typing import Any, Final, Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa
from librt.vecs import append, vec
from mypy_extensions import i64

from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.sim.replica import Replica, Request
from llmlb_bench.sim.speculative import bundled_steps
from llmlb_bench.sim.timeline import (Columns, decode_energy, joined, list_array, nth_token_times, runs_of,
                                      step_end_times, summary_segments, token_segments)


class RowSink(Protocol):
    """Where rows go: a run store's Parquet sink, or any object that takes column batches."""

    def write(self, columns: Mapping[str, Any]) -> None: ...


class RunSinks(Protocol):
    """What a simulation streams into: a :class:`~llmlb_bench.store.RunStore`, or any object with
    these two sinks (the learning environment keeps its rows in memory)."""

    @property
    def requests(self) -> RowSink: ...

    @property
    def series(self) -> RowSink: ...


#: a missing time in a float column (written as null)
_NAN: Final = float("nan")


class Finished:
    """One replica's requests finished since the last batch, as the few numbers their rows need, taken
    when each finishes (:meth:`add`), so that the :class:`Request` objects are freed then, not held
    to the batch's end: the collector does not scan 20,000 of them at each pass, and the batch reads
    typed columns instead of walking the requests' attributes. The columns are mypyc's ``vec`` (as
    the timeline's, sim/timeline.py): compiled, a value is appended unboxed, and the batch copies a
    column into NumPy as flat memory (as Python lists, boxing each value and NumPy's conversion of
    the lists back were a tenth of the compiled run). A speculative replica also keeps the requests
    themselves (their decode stints)."""

    __slots__ = ("rows", "span_a", "span_b", "nspans", "lead", "energy", "cached", "preemptions", "prefill_target",
                 "decode_target", "predicted", "moved", "guessed", "requests")

    def __init__(self) -> None:
        self.rows = vec[i64]()
        #: the token step ranges ``[span_a, span_b]`` of all requests, flat; ``nspans`` per request
        self.span_a = vec[i64]()
        self.span_b = vec[i64]()
        self.nspans = vec[i64]()
        #: the first token's time where another replica made it (P/D), else NaN
        self.lead = vec[float]()
        #: joules of prefill shares
        self.energy = vec[float]()
        self.cached = vec[i64]()
        self.preemptions = vec[i64]()
        #: replica indices (-1: none)
        self.prefill_target = vec[i64]()
        self.decode_target = vec[i64]()
        self.predicted: list[int | None] = []
        #: whether any request has a prefill / decode target, any a cache prediction
        self.moved = self.guessed = False
        self.requests: list[Request] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, r: Request, keep: bool) -> None:
        """``r`` finished here; ``keep``: hold the request itself too (a speculative replica)."""
        self.rows = append(self.rows, r.row)
        spans = r.spans
        assert spans is not None   # a finished request ran at least one step
        for a, b in spans:
            self.span_a = append(self.span_a, a)
            self.span_b = append(self.span_b, b)
        self.nspans = append(self.nspans, len(spans))
        self.lead = append(self.lead, r.first_token_s if r.first_token_s >= 0 else _NAN)
        self.energy = append(self.energy, r.energy)
        self.cached = append(self.cached, max(r.cached, 0))
        self.preemptions = append(self.preemptions, r.preemptions)
        if r.prefill_target >= 0 or r.decode_target >= 0:
            self.moved = True
        self.prefill_target = append(self.prefill_target, r.prefill_target)
        self.decode_target = append(self.decode_target, r.decode_target)
        p = r.route.predicted_cached_tokens
        if p is not None:
            self.guessed = True
        self.predicted.append(p)
        if keep:
            self.requests.append(r)


class RequestRecorder:
    """Turns ended requests into REQUESTS rows."""

    def __init__(self, trace: pa.Table, sink: RowSink, replicas: Sequence[Replica], scheduled_s: list[float],
                 sent_s: list[float | None], token_times: str = "segments", batch_rows: int = 20_000) -> None:
        """``scheduled_s``, ``sent_s``: per trace row, the simulation's own lists (lists, not sequences:
        compiled, a batch then reads them natively, where a generic ``__getitem__`` per row cost 2.5%)."""
        self.sink = sink
        self.summary_tokens = token_times == "summary"
        self.replicas = replicas
        self.scheduled_s = scheduled_s
        self.sent_s = sent_s
        self.batch_rows = batch_rows
        # the trace's columns each batch copies, as the requests table types them, cast and combined
        # once here rather than once per batch
        src = trace.select(["request_id", "session_id", "turn", "input_tokens", "output_tokens"])
        for name in ("tenant", "slo_class", "adapter"):
            src = src.append_column(name, trace.column(name).cast(pa.string()))
        self._trace = src.combine_chunks()
        # reasoning tokens are decode steps like any other (output_tokens = reasoning + answer); the
        # recorder only says how many came first, and when the first answer token came
        col = trace.column("reasoning_tokens") if "reasoning_tokens" in trace.column_names else None
        reasoning = col.fill_null(0).to_numpy().astype(np.int64) if col is not None else np.zeros(0, np.int64)
        self._reasoning: np.ndarray | None = reasoning if (reasoning > 0).any() else None
        self._finished: list[Finished] = [Finished() for _ in replicas]
        self._other: dict[str, list[Any]] = {"rows": [], "target": [], "status": [], "error": []}
        self.pending = 0
        self.counts: dict[str, int] = {}   # statuses other than ok
        self.ok = 0
        self.attributed_energy_j = 0.0

    def track(self, rep: Replica) -> None:
        """A replica joined the fleet (autoscaling)."""
        self._finished.append(Finished())

    def finished(self, req: Request) -> None:
        self._finished[req.target].add(req, self.replicas[req.target].spec is not None)
        self.ok += 1
        self.pending += 1
        if self.pending >= self.batch_rows:
            self.flush()

    def ended(self, row: int, target: str | None, status: str, error: str | None) -> None:
        """A request that produced no tokens: rejected, failed, or never sent."""
        o = self._other
        o["rows"].append(row)
        o["target"].append(target)
        o["status"].append(status)
        o["error"].append(error)
        self._count(status)

    def status_counts(self) -> dict[str, int]:
        counts = dict(self.counts, ok=self.ok) if self.ok else dict(self.counts)
        return dict(sorted(counts.items()))

    def _count(self, status: str) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        self.pending += 1
        if self.pending >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write the batch: the finished requests of consecutive replicas without speculation as one
        part (their timelines joined, :func:`~llmlb_bench.sim.timeline.joined`: one pass of NumPy and
        Arrow calls and one sink write per batch, not per replica), a speculative replica's as its
        own, then the requests that ended without tokens; rows in replica order, as before."""
        parts: list[dict[str, Any]] = []
        group: list[tuple[Replica, Finished]] = []
        for rep, batch in zip(self.replicas, self._finished):
            if not len(batch):
                continue
            if rep.spec is not None:
                if group:
                    parts.append(self._finished_columns(group))
                    group = []
                parts.append(self._finished_columns([(rep, batch)]))
            else:
                group.append((rep, batch))
            self._finished[rep.index] = Finished()
        if group:
            parts.append(self._finished_columns(group))
        for rep in self.replicas:
            rep.timeline.drop_before(rep.oldest_needed_step())
        o = self._other
        if o["rows"]:
            n = len(o["rows"])
            parts.append({
                "rows": np.array(o["rows"], dtype=np.int64),
                "target": pa.array(o["target"], pa.string()),
                "first_token_s": pa.nulls(n, pa.float64()),
                "last_token_s": pa.nulls(n, pa.float64()),
                "token_times": pa.nulls(n, pa.list_(TOKEN_SEGMENT)),
                "output_tokens": np.zeros(n, dtype=np.int32),
                "cached_tokens": np.zeros(n, dtype=np.int32),
                "status": pa.array(o["status"], pa.string()),
                "error": pa.array(o["error"], pa.string()),
                "preemptions": np.zeros(n, dtype=np.int32),
                "prefill_target": pa.nulls(n, pa.string()),
                "decode_target": pa.nulls(n, pa.string()),
                "energy_j": np.zeros(n),
                "predicted_cached_tokens": pa.nulls(n, pa.int32()),
            })
            self._other = {k: [] for k in o}
        if parts:
            self._write(parts)
        self.pending = 0

    def _finished_columns(self, group: list[tuple[Replica, Finished]]) -> dict[str, Any]:
        """The rows of the requests finished on ``group``'s replicas (several without speculation, or
        one speculative replica), replica by replica."""
        batches = [batch for _, batch in group]
        tl, shifts, before = joined([rep.timeline for rep, _ in group])
        shift = np.repeat(shifts, [len(batch.span_a) for batch in batches])
        a = _joined([batch.span_a for batch in batches], np.int64) + shift
        b = _joined([batch.span_b for batch in batches], np.int64) + shift
        per = _joined([batch.nspans for batch in batches], np.int64)
        ends = np.cumsum(per)
        sizes = [len(batch) for batch in batches]
        n = sum(sizes)
        lead = _joined([batch.lead for batch in batches], np.float64)
        has_lead = ~np.isnan(lead)
        ra, rb = runs_of(tl, a), runs_of(tl, b)
        head, tail = ends - per, ends - 1
        here_first = step_end_times(tl, a[head], ra[head])
        last = step_end_times(tl, b[tail], rb[tail])
        here = np.add.reduceat(b - a + 1, head)
        segments: pa.ListArray | None = None
        spec: dict[str, np.ndarray] = {}
        spec_rep = group[0][0].spec
        if spec_rep is not None:
            here, segments, spec = _speculative_columns(tl, batches[0].requests, spec_rep.k, lead)
        energy = _joined([batch.energy for batch in batches], np.float64) + decode_energy(tl, before, a, b, per, ra, rb)
        lo = 0
        for size in sizes:      # summed replica by replica, as the rows were before they were joined
            self.attributed_energy_j += float(energy[lo:lo + size].sum())
            lo += size
        output = (here + has_lead).astype(np.int32)
        token_times = (summary_segments(here_first, last, here, lead) if self.summary_tokens
                       else segments if segments is not None else token_segments(tl, a, b, per, lead, ra, rb))
        row_ids = _joined([batch.rows for batch in batches], np.int64)
        names = [r.name for r in self.replicas]
        moved = any(batch.moved for batch in batches)
        targets = pa.array([rep.name for rep, _ in group], pa.string())
        return {
            **self._answer_columns(row_ids, output, token_times),
            "rows": row_ids,
            "target": targets.take(pa.array(np.repeat(np.arange(len(group)), sizes))),
            "first_token_s": np.where(has_lead, lead, here_first),
            "last_token_s": last,
            "token_times": token_times,
            "output_tokens": output,
            "cached_tokens": _joined([batch.cached for batch in batches], np.int32),
            "status": pa.repeat(pa.scalar("ok", pa.string()), n),
            "error": pa.nulls(n, pa.string()),
            "preemptions": _joined([batch.preemptions for batch in batches], np.int32),
            "prefill_target": (pa.array([names[i] if i >= 0 else None for batch in batches
                                         for i in batch.prefill_target], pa.string())
                               if moved else pa.nulls(n, pa.string())),
            "decode_target": (pa.array([names[i] if i >= 0 else None for batch in batches
                                        for i in batch.decode_target], pa.string())
                              if moved else pa.nulls(n, pa.string())),
            "energy_j": energy,
            **spec,
            "predicted_cached_tokens": (pa.array([p for batch in batches for p in batch.predicted], pa.int32())
                                        if any(batch.guessed for batch in batches) else pa.nulls(n, pa.int32())),
        }

    def _answer_columns(self, rows: np.ndarray, output: np.ndarray, token_times: pa.ListArray) -> dict[str, Any]:
        """``reasoning_tokens`` and ``first_answer_s`` (token reasoning + 1) of finished requests;
        none when the trace has no reasoning, so such runs write exactly what they wrote before."""
        if self._reasoning is None:
            return {}
        reasoning = np.minimum(self._reasoning[rows], output)
        thinks = reasoning > 0
        first_answer = nth_token_times(token_times, np.where(thinks, reasoning + 1, 0))
        return {"reasoning_tokens": pa.array(reasoning.astype(np.int32), mask=~thinks),
                "first_answer_s": pa.array(first_answer, mask=np.isnan(first_answer))}

    def _write(self, parts: list[dict[str, Any]]) -> None:
        """Each part (finished requests of consecutive replicas, or the ended ones) as its own batch
        of rows: concatenating them first would copy every token segment once more."""
        for cols in parts:
            rows = cols.pop("rows")
            src = self._trace.take(pa.array(rows))
            order: list[int] = rows.tolist()
            scheduled_s, sent_s = vec[float](), vec[float]()
            for r in order:
                scheduled_s = append(scheduled_s, self.scheduled_s[r])
                t = self.sent_s[r]
                sent_s = append(sent_s, _NAN if t is None else t)
            sent = np.array(sent_s, dtype=np.float64)
            self.sink.write({
                "request_id": src.column("request_id").combine_chunks(),
                "tenant": src.column("tenant").combine_chunks(),
                "slo_class": src.column("slo_class").combine_chunks(),
                "session_id": src.column("session_id").combine_chunks(),
                "turn": src.column("turn").combine_chunks(),
                "scheduled_s": np.array(scheduled_s, dtype=np.float64),
                "sent_s": pa.array(sent, mask=np.isnan(sent)),
                "input_tokens": src.column("input_tokens").combine_chunks(),
                "requested_output_tokens": src.column("output_tokens").combine_chunks(),
                "adapter": src.column("adapter").combine_chunks(),
                **cols,
            })


def _joined(columns: list[vec[i64]] | list[vec[float]], dtype: type) -> np.ndarray:
    """The columns one after the other, as one NumPy array of ``dtype``."""
    if len(columns) == 1:
        return np.array(columns[0], dtype=dtype)
    return np.concatenate([np.asarray(c) for c in columns]).astype(dtype, copy=False)


def _speculative_columns(tl: Columns, reqs: Sequence[Request], k: int,
                         lead: np.ndarray) -> tuple[np.ndarray, pa.ListArray, dict[str, np.ndarray]]:
    """A speculative replica's requests: tokens made here, ``token_times`` with one segment per
    step (the step's tokens bundled at its end: gap 0), and the columns of verify steps that
    drafted, tokens drafted (``k`` per step) and drafts accepted.

    Python per request, not per run of steps: each verify step's token count is its own draw."""
    n = len(reqs)
    here, per_req = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    steps, accepted = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    starts: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    for i, req in enumerate(reqs):
        stints = req.stints or []
        if not np.isnan(lead[i]):
            starts.append(lead[i:i + 1])
            counts.append(np.ones(1, dtype=np.int64))
        times, made = bundled_steps(tl, stints, req.spans or [])
        starts.append(times)
        counts.append(made)
        per_req[i] = len(made) + (not np.isnan(lead[i]))
        here[i] = int(made.sum())
        steps[i] = sum(st.steps for st in stints)
        accepted[i] = sum(int(st.accepted.sum()) for st in stints)
    start = np.concatenate(starts)
    segments = list_array(per_req, start, np.zeros(len(start)), np.concatenate(counts))
    return here, segments, {"spec_drafts": steps.astype(np.int32), "spec_draft_tokens": (k * steps).astype(np.int32),
                            "spec_accepted_tokens": accepted.astype(np.int32)}
