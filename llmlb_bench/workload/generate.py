"""Turn a :class:`WorkloadSpec` into a trace table.

Each tenant is generated on its own random streams, derived from the seed and
the tenant's *name* (not its position), so adding a tenant to a spec leaves
the others' requests unchanged. Per tenant: arrivals (of requests, or of
sessions that expand into turns), lengths, multimodal content, system
prompts, accumulated context, then agentic children generation by
generation. Tenants are then superposed (merged by arrival time), numbered,
and their prompts hashed into chained prefix blocks. Everything is columnar
NumPy: a few vectorised passes per column, never a Python loop per request.

Within a tenant, rows are built so that a parent always precedes its
children and a child never arrives before its parent; a stable sort by
arrival therefore keeps every parent ahead of its children, and cutting the
sorted trace at N requests never orphans one.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Sequence

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.schema import TRACE
from llmlb_bench.tomlfile import construct
from llmlb_bench.workload.prefixes import JOIN, OWN, SESSION, SYSTEM, chained_hashes, stream_keys
from llmlb_bench.workload.sessions import segment_exclusive_cumsum
from llmlb_bench.workload.spec import TenantSpec, WorkloadSpec


class Stream(IntEnum):
    """Independent random streams of one tenant (changing one never shifts another)."""

    ARRIVALS = 0
    LENGTHS = 1
    SESSIONS = 2
    SYSTEM_LENGTHS = 3
    SYSTEM_GROUPS = 4
    MULTIMODAL = 5
    FANOUT = 6
    TOOLS = 7
    JOINS = 8
    ADAPTERS = 9
    REASONING = 10


def stream(seed: int, scope: str, which: Stream) -> np.random.Generator:
    key = (zlib.crc32(scope.encode()), int(which))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


@dataclass
class TenantRequests:
    """The requests of one tenant, column by column (parents before children).

    ``parent`` is a row index within this tenant (-1: none); ``session`` a
    tenant-local id (-1: none); ``turn`` -1 when not a conversation turn.
    A join waits for rows ``wait_lo`` to ``wait_hi`` - 1 too (-1: not a join).
    ``bounds``/``keys`` describe each prompt's prefix streams (see
    :mod:`llmlb_bench.workload.prefixes`); ``None`` when hashes are not wanted.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    session: np.ndarray
    turn: np.ndarray
    parent: np.ndarray
    after_parent_s: np.ndarray
    images: np.ndarray
    image_tokens: np.ndarray
    audio_s: np.ndarray
    #: how many of ``output_tokens`` are reasoning (0: none; :mod:`llmlb_bench.workload.reasoning`)
    reasoning: np.ndarray
    wait_lo: np.ndarray
    wait_hi: np.ndarray
    bounds: np.ndarray | None
    keys: np.ndarray | None

    def take(self, mask: np.ndarray) -> TenantRequests:
        """The rows in ``mask``, parent indices unchanged."""
        cols: dict[str, np.ndarray | None] = {
            f.name: (getattr(self, f.name)[mask] if getattr(self, f.name) is not None else None) for f in fields(self)}
        return construct(TenantRequests, cols)

    def select(self, mask: np.ndarray) -> TenantRequests:
        """Keep the rows in ``mask`` (a kept row's parent must be kept) and renumber parents and
        the rows joins wait for (a dropped one is waited for no more)."""
        new_index = np.cumsum(mask) - 1
        before = np.concatenate([[0], np.cumsum(mask)])  # kept rows before each index
        out = self.take(mask)
        out.parent = np.where(out.parent >= 0, new_index[np.maximum(out.parent, 0)], -1)
        joins = out.wait_lo >= 0
        out.wait_lo = np.where(joins, before[np.maximum(out.wait_lo, 0)], -1)
        out.wait_hi = np.where(joins, before[np.maximum(out.wait_hi, 0)], -1)
        return out

    def __len__(self) -> int:
        return len(self.arrival_s)


def _lengths(t: TenantSpec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    if t.io_correlation:
        z_in = rng.standard_normal(n)
        z_out = t.io_correlation * z_in + math.sqrt(1 - t.io_correlation**2) * rng.standard_normal(n)
        return t.input.from_normal(z_in), t.output.from_normal(z_out)
    return t.input.sample(rng, n), t.output.sample(rng, n)


def tenant_requests(t: TenantSpec, seed: int, horizon: float, rate_scale: float, hashes: bool) -> TenantRequests:
    starts = t.arrival.times(stream(seed, t.name, Stream.ARRIVALS), horizon, rate_scale)
    if t.sessions is not None:
        session, turn, think = t.sessions.expand(stream(seed, t.name, Stream.SESSIONS), starts)
        if t.sessions.tools is not None:  # tool turns: a tool's time instead of a human's think time
            tool, tool_s, tool_tokens = t.sessions.tools.draw(stream(seed, t.name, Stream.TOOLS), turn)
            think = np.where(tool, tool_s, think)
        arrival = starts[session] + segment_exclusive_cumsum(think, session) + think
        idx = np.arange(len(session))
        parent = np.where(turn > 0, idx - 1, -1)
        after = np.where(turn > 0, think, np.nan)
    else:
        n0 = len(starts)
        arrival, turn, parent, after = starts, np.full(n0, -1), np.full(n0, -1), np.full(n0, np.nan)
        session = np.arange(n0) if t.fanout is not None else np.full(n0, -1)
    n = len(arrival)
    new_in, out = _lengths(t, stream(seed, t.name, Stream.LENGTHS), n)
    think_rng = stream(seed, t.name, Stream.REASONING) if t.reasoning is not None else None
    out, reasoning = _reason(t, think_rng, out)
    if t.sessions is not None and t.sessions.tools is not None:
        new_in = np.where(tool, tool_tokens, new_in)  # the tool's result is the turn's new input
    images = image_tokens = np.zeros(n, np.int64)
    audio = np.zeros(n)
    if t.multimodal is not None:
        images, image_tokens, audio, audio_tokens = t.multimodal.draw(stream(seed, t.name, Stream.MULTIMODAL), n)
        new_in = new_in + image_tokens + audio_tokens
    system = np.zeros(n, np.int64)
    sys_keys = np.zeros(n, np.uint64)
    if t.system_prompt is not None:
        sp = t.system_prompt
        pool = sp.pool or t.name
        per_group = sp.lengths(stream(seed, pool, Stream.SYSTEM_LENGTHS))
        owners = session if t.sessions is not None else np.arange(n)
        n_owners = int(owners.max()) + 1 if n else 0
        group = sp.assign(stream(seed, t.name, Stream.SYSTEM_GROUPS), n_owners)[owners]
        system = per_group[group]
        if hashes:
            sys_keys = stream_keys(SYSTEM, pool, group)
    # the next turn's context holds earlier answers, not their reasoning (as DeepSeek's and Qwen's APIs drop it)
    history = segment_exclusive_cumsum(new_in + out - reasoning, session) if t.sessions is not None else 0
    prompt = system + history + new_in
    reqs = TenantRequests(
        arrival_s=arrival, input_tokens=prompt, output_tokens=out, session=session, turn=turn, parent=parent,
        after_parent_s=after, images=images, image_tokens=image_tokens, audio_s=audio, reasoning=reasoning,
        wait_lo=np.full(n, -1), wait_hi=np.full(n, -1), bounds=np.stack([system, prompt], axis=1) if hashes else None,
        keys=np.stack([sys_keys, stream_keys(SESSION, t.name, session) if t.sessions is not None
                       else stream_keys(OWN, t.name, np.arange(n))], axis=1) if hashes else None,
    )
    if t.max_context is not None and t.sessions is not None:
        # Context only grows within a session, so this drops a suffix of each session.
        reqs = reqs.select((turn <= 0) | (prompt + out <= t.max_context))
    if t.fanout is not None:
        reqs = _fan_out(t, reqs, stream(seed, t.name, Stream.FANOUT), hashes,
                        stream(seed, t.name, Stream.JOINS) if t.fanout.join else None, think_rng)
    late = reqs.arrival_s >= horizon
    return reqs.select(~late) if late.any() else reqs


def _reason(t: TenantSpec, rng: np.random.Generator | None, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(output_tokens, reasoning_tokens)`` of requests whose drawn output is ``out``."""
    if t.reasoning is None or rng is None:
        return out, np.zeros(len(out), np.int64)
    return t.reasoning.draw(rng, out)


def _answered(reqs: TenantRequests, rows: np.ndarray) -> np.ndarray:
    """Prompt + answer of ``rows``: the context a child or a join extends (reasoning is not kept)."""
    result: np.ndarray = reqs.input_tokens[rows] + reqs.output_tokens[rows] - reqs.reasoning[rows]
    return result


def _fan_out(t: TenantSpec, reqs: TenantRequests, rng: np.random.Generator, hashes: bool,
             join_rng: np.random.Generator | None, think_rng: np.random.Generator | None) -> TenantRequests:
    """Append ``depth`` generations of children; each child's prompt extends its parent's context.
    With ``join_rng``, each generation's parents with children also get a join request."""
    f = t.fanout
    assert f is not None
    parts = [reqs]
    gen = np.arange(len(reqs))
    cur, base, end = reqs, 0, len(reqs)   # `cur` starts at row `base`; `end` rows so far
    for _ in range(f.depth):
        k = f.children.sample(rng, len(gen)).astype(np.int64)
        src = np.repeat(gen, k)  # row in `cur` of each child's parent
        m = len(src)
        if m == 0:
            break
        tool = np.maximum(f.tool_s.sample(rng, m), 0.0)
        context = _answered(cur, src)
        prompt = context + f.tool_tokens.sample(rng, m).astype(np.int64)
        out, reasoning = _reason(t, think_rng, (f.output or t.output).sample(rng, m).astype(np.int64))
        first = end
        child = TenantRequests(
            arrival_s=cur.arrival_s[src] + tool, input_tokens=prompt, output_tokens=out,
            session=cur.session[src], turn=np.full(m, -1), parent=base + src, after_parent_s=tool,
            images=np.zeros(m, np.int64), image_tokens=np.zeros(m, np.int64), audio_s=np.zeros(m),
            reasoning=reasoning, wait_lo=np.full(m, -1), wait_hi=np.full(m, -1),
            # with hashes, every part carries bounds and keys
            bounds=np.column_stack([cur.bounds[src, :-1], context, prompt]) if hashes else None,  # type: ignore[index]
            keys=np.column_stack([cur.keys[src], stream_keys(OWN, t.name, first + np.arange(m))]) if hashes else None,  # type: ignore[index]
        )
        if t.max_context is not None:
            child = child.take(prompt + out <= t.max_context)  # parents live in earlier parts
        parts.append(child)
        end = first + len(child)
        if join_rng is not None:
            parts.append(_joins(t, cur, base, child, first, join_rng, hashes, think_rng))
            end += len(parts[-1])
        base, cur, gen = first, child, np.arange(len(child))
    return _concat(parts)


def _joins(t: TenantSpec, cur: TenantRequests, base: int, child: TenantRequests, first: int,
           rng: np.random.Generator, hashes: bool, think_rng: np.random.Generator | None) -> TenantRequests:
    """One join per row of ``cur`` (rows ``base``...) with children in ``child`` (rows ``first``...,
    contiguous per parent): parent context + the children's answers + its own tokens, sent when
    the last child ends."""
    f = t.fanout
    assert f is not None
    parent = child.parent - base
    owners, lo = np.unique(parent, return_index=True)
    hi = np.r_[lo[1:], len(parent)]
    m = len(owners)
    answers = np.add.reduceat(child.output_tokens - child.reasoning, lo) if m else np.zeros(0, np.int64)
    context = _answered(cur, owners)
    prompt = context + answers + (f.join_tokens or f.tool_tokens).sample(rng, m).astype(np.int64)
    out, reasoning = _reason(t, think_rng, (f.output or t.output).sample(rng, m).astype(np.int64))
    last = np.maximum.reduceat(child.arrival_s, lo) if m else np.zeros(0)
    own = first + len(child)
    joins = TenantRequests(
        arrival_s=last, input_tokens=prompt, output_tokens=out, session=cur.session[owners],
        turn=np.full(m, -1), parent=base + owners, after_parent_s=np.zeros(m),
        images=np.zeros(m, np.int64), image_tokens=np.zeros(m, np.int64), audio_s=np.zeros(m),
        reasoning=reasoning, wait_lo=first + lo, wait_hi=first + hi,
        bounds=np.column_stack([cur.bounds[owners, :-1], context, prompt]) if hashes else None,  # type: ignore[index]
        keys=np.column_stack([cur.keys[owners], stream_keys(JOIN, t.name, own + np.arange(m))]) if hashes else None,  # type: ignore[index]
    )
    return joins.take(prompt + out <= t.max_context) if t.max_context is not None else joins


def _pad(a: np.ndarray, width: int) -> np.ndarray:
    """Pad prefix levels on the left with unused (bound 0) levels."""
    return np.pad(a, ((0, 0), (width - a.shape[1], 0))) if a.shape[1] < width else a


def _concat(parts: list[TenantRequests]) -> TenantRequests:
    cols: dict[str, np.ndarray | None] = {}
    for f in fields(TenantRequests):
        values = [getattr(p, f.name) for p in parts]
        if values[0] is None:
            cols[f.name] = None
        elif values[0].ndim == 2:
            width = max(v.shape[1] for v in values)
            cols[f.name] = np.concatenate([_pad(v, width) for v in values])
        else:
            cols[f.name] = np.concatenate(values)
    return construct(TenantRequests, cols)


def horizon_limit(spec: WorkloadSpec, rate_scale: float) -> float:
    """Past this time no tenant has arrivals left (finite tables, replays)."""
    return max(t.arrival.horizon_limit(rate_scale) for t in spec.tenants)


def _horizon_for(spec: WorkloadSpec, n: int, rate_scale: float) -> float:
    """Shortest generation horizon whose expected request count covers ``n`` with margin."""
    def expected(h: float) -> float:
        return sum(t.arrival.expected_count(h, rate_scale) * t.requests_per_arrival() for t in spec.tenants)

    limit = horizon_limit(spec, rate_scale)
    target = n * 1.02 + 6 * math.sqrt(n) + 8
    h = 1.0
    while expected(h) < target and h < limit:
        h *= 2.0
    lo = h / 2
    for _ in range(40):  # bisect down to a tight horizon
        mid = (lo + h) / 2
        if expected(mid) >= target:
            h = mid
        else:
            lo = mid
    return min(h, limit)


def generate(spec: WorkloadSpec, seed: int | None = None, rate_scale: float = 1.0) -> pa.Table:
    """Generate the trace of ``spec`` as a table conforming to :data:`schema.TRACE`.

    ``seed`` None uses the spec's own seed; ``rate_scale`` multiplies the
    spec's own ``rate_scale`` (arrival rates up, time structure unchanged).
    """
    seed = spec.seed if seed is None else seed
    scale = spec.rate_scale * rate_scale
    hashes = spec.emit_prefix_hashes
    if spec.duration_s is not None:
        horizon = spec.duration_s / spec.time_scale
        parts = [tenant_requests(t, seed, horizon, scale, hashes) for t in spec.tenants]
        return _assemble(spec, parts, None, seed)
    n = spec.requests
    assert n is not None
    horizon = _horizon_for(spec, n, scale)
    limit = horizon_limit(spec, scale)
    while True:
        parts = [tenant_requests(t, seed, horizon, scale, hashes) for t in spec.tenants]
        if sum(len(p) for p in parts) >= n or horizon >= limit:
            break
        horizon = min(horizon * 1.5, limit)
    return _assemble(spec, parts, n, seed)


def _assemble(spec: WorkloadSpec, parts: list[TenantRequests], limit: int | None, seed: int) -> pa.Table:
    sizes = [len(p) for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    all_rows = parts[0] if len(parts) == 1 else _concat(parts)
    tenant_idx = np.repeat(np.arange(len(parts), dtype=np.int32), sizes)
    arrival = all_rows.arrival_s
    order: slice | np.ndarray
    if len(arrival) > 1 and not np.all(arrival[1:] >= arrival[:-1]):
        order = np.argsort(arrival, kind="stable")[:limit]
        n = len(order)
    else:  # already in order (one plain tenant): slicing is free
        n = min(len(arrival), limit if limit is not None else len(arrival))
        order = slice(0, n)
    if n == 0:
        raise UserError("the spec generates no requests (check rates and duration_s)", spec.source)
    tenant_idx = tenant_idx[order]
    tenants = spec.tenants

    def per_tenant(values: Sequence[object], dtype: type) -> np.ndarray:
        if len(set(values)) == 1:
            return np.full(n, values[0], dtype=dtype)
        return np.asarray(values, dtype=dtype)[tenant_idx]

    def dictionary(values: list[str]) -> pa.DictionaryArray:
        uniq = list(dict.fromkeys(values))
        codes = per_tenant([uniq.index(v) for v in values], np.int32)
        return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(uniq, pa.string()))

    def nullable(values: np.ndarray, null: np.ndarray, type_: pa.DataType) -> pa.Array:
        data = values.astype(type_.to_pandas_dtype(), copy=False)
        return pa.array(data, type_, mask=null) if null.any() else pa.array(data, type_)

    def scaled(a: np.ndarray) -> np.ndarray:
        return a * spec.time_scale if spec.time_scale != 1.0 else a

    columns = {
        "request_id": pa.array(np.arange(n, dtype=np.int64)),
        "arrival_s": pa.array(scaled(arrival[order])),
        "tenant": dictionary([t.tenant for t in tenants]),
        "input_tokens": pa.array(_int32(all_rows.input_tokens[order], "input_tokens", spec)),
        "output_tokens": pa.array(_int32(all_rows.output_tokens[order], "output_tokens", spec)),
        "priority": pa.array(per_tenant([t.priority for t in tenants], np.int8)),
        "slo_class": dictionary([t.slo_class for t in tenants]),
        "kind": dictionary([t.kind for t in tenants]),
    }
    if any(t.multimodal is not None for t in tenants):
        columns["images"] = pa.array(all_rows.images[order].astype(np.int16))
        columns["image_tokens"] = pa.array(all_rows.image_tokens[order].astype(np.int32))
        columns["audio_s"] = pa.array(all_rows.audio_s[order].astype(np.float32))
    else:
        columns["images"] = pa.array(np.zeros(n, np.int16))
        columns["image_tokens"] = pa.array(np.zeros(n, np.int32))
        columns["audio_s"] = pa.array(np.zeros(n, np.float32))
    if any(t.sessions is not None or t.fanout is not None for t in tenants):
        # Parent and session ids become global (per-tenant offsets), then follow the new order.
        row_offset = offsets[:-1][tenant_idx]
        parent = all_rows.parent[order]
        new_id = np.full(len(arrival), -1, dtype=np.int64)
        new_id[order] = np.arange(n)
        parent = np.where(parent >= 0, new_id[np.maximum(parent + row_offset, 0)], -1)
        session_base = np.cumsum([0] + [int(p.session.max()) + 1 if len(p) else 0 for p in parts])
        session = all_rows.session[order]
        session = np.where(session >= 0, session + session_base[:-1][tenant_idx], -1)
        turn = all_rows.turn[order]
        columns["session_id"] = nullable(session, session < 0, pa.int64())
        columns["turn"] = nullable(turn + 1, turn < 0, pa.int32())
        columns["parent_id"] = nullable(parent, parent < 0, pa.int64())
        columns["after_parent_s"] = nullable(scaled(all_rows.after_parent_s[order]), parent < 0, pa.float64())
        if any(t.fanout is not None and t.fanout.join for t in tenants):
            columns["wait_ids"] = _wait_ids(all_rows.wait_lo[order] + row_offset, all_rows.wait_hi[order] + row_offset,
                                            all_rows.wait_lo[order] >= 0, new_id)
    if any(t.reasoning is not None for t in tenants):
        columns["reasoning_tokens"] = pa.array(all_rows.reasoning[order].astype(np.int32))
    if any(t.adapters is not None for t in tenants):
        columns["adapter"] = _adapter_column(spec, parts, order, seed)
    if all_rows.bounds is not None and all_rows.keys is not None:
        columns["prefix_hashes"] = chained_hashes(all_rows.bounds[order], all_rows.keys[order], spec.block_size)
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in TRACE.schema]
    return pa.Table.from_arrays(arrays, schema=TRACE.schema)


def _wait_ids(lo: np.ndarray, hi: np.ndarray, join: np.ndarray, new_id: np.ndarray) -> pa.ListArray:
    """``wait_ids`` of the assembled rows: a join's waited-for rows (``lo`` to ``hi`` - 1, over all
    tenants' rows) as request ids, without those the cut at N requests dropped; null elsewhere."""
    counts = np.where(join, hi - lo, 0)
    rows = np.repeat(lo, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    ids = new_id[rows] if len(rows) else np.zeros(0, np.int64)
    keep = ids >= 0
    kept = np.bincount(np.repeat(np.arange(len(lo)), counts)[keep], minlength=len(lo))
    offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[keep], pa.int64()),
                                    mask=pa.array(~join))


def _adapter_column(spec: WorkloadSpec, parts: list[TenantRequests], order: slice | np.ndarray,
                    seed: int) -> pa.DictionaryArray:
    """The ``adapter`` column: each tenant's draws (one per session, else per request), coded into
    one dictionary of every tenant's names; null for the base model."""
    names: list[str] = []
    code: list[np.ndarray] = []
    for t, p in zip(spec.tenants, parts):
        if t.adapters is None or not len(p):
            code.append(np.full(len(p), -1, np.int32))
            continue
        sessions = int(p.session.max()) + 1 if (p.session >= 0).any() else 0
        owners = np.where(p.session >= 0, p.session, sessions + np.arange(len(p)))
        local = t.adapters.draw(stream(seed, t.name, Stream.ADAPTERS), owners)
        known = {n: i for i, n in enumerate(names)}
        glob = np.asarray([known.setdefault(n, len(known)) for n in t.adapters.names], np.int32)
        names = list(known)
        code.append(np.where(local >= 0, glob[np.maximum(local, 0)], -1).astype(np.int32))
    codes = np.concatenate(code)[order]
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), pa.array(names, pa.string()))


def _int32(values: np.ndarray, name: str, spec: WorkloadSpec) -> np.ndarray:
    if values.size and values.max() > np.iinfo(np.int32).max:
        raise UserError(f"{name} exceeds 2^31 tokens; set max_context or caps", spec.source)
    return values.astype(np.int32)
