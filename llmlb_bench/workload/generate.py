"""Turn a :class:`WorkloadSpec` into a trace table.

Each tenant is generated on its own random streams, derived from the seed and
the tenant's *name* (not its position), so adding a tenant to a spec leaves
the others' requests unchanged. Tenants are then superposed (merged by
arrival time) and numbered. Everything is columnar NumPy: the cost is a few
vectorised passes per column, not a Python loop per request.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.schema import TRACE
from llmlb_bench.workload.spec import TenantSpec, WorkloadSpec


class Stream(IntEnum):
    """Independent random streams of one tenant (changing one never shifts another)."""

    ARRIVALS = 0
    LENGTHS = 1


def stream(seed: int, tenant: str, which: Stream) -> np.random.Generator:
    key = (zlib.crc32(tenant.encode()), int(which))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


@dataclass
class TenantRequests:
    """The requests of one tenant, column by column, in arrival order."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray


def tenant_requests(t: TenantSpec, seed: int, horizon: float, rate_scale: float) -> TenantRequests:
    arrivals = t.arrival.times(stream(seed, t.name, Stream.ARRIVALS), horizon, rate_scale)
    n = len(arrivals)
    rng = stream(seed, t.name, Stream.LENGTHS)
    if t.io_correlation:
        z_in = rng.standard_normal(n)
        z_out = t.io_correlation * z_in + math.sqrt(1 - t.io_correlation**2) * rng.standard_normal(n)
        inp, out = t.input.from_normal(z_in), t.output.from_normal(z_out)
    else:
        inp, out = t.input.sample(rng, n), t.output.sample(rng, n)
    return TenantRequests(arrival_s=arrivals, input_tokens=inp, output_tokens=out)


def horizon_limit(spec: WorkloadSpec, rate_scale: float) -> float:
    """Past this time no tenant has arrivals left (finite tables, replays)."""
    return max(t.arrival.horizon_limit(rate_scale) for t in spec.tenants)


def _horizon_for(spec: WorkloadSpec, n: int, rate_scale: float) -> float:
    """Shortest generation horizon whose expected request count covers ``n`` with margin."""
    def expected(h: float) -> float:
        return sum(t.arrival.expected_count(h, rate_scale) for t in spec.tenants)

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
    return min(h, limit) if math.isfinite(limit) else h


def generate(spec: WorkloadSpec, seed: int | None = None, rate_scale: float = 1.0) -> pa.Table:
    """Generate the trace of ``spec`` as a table conforming to :data:`schema.TRACE`.

    ``seed`` None uses the spec's own seed; ``rate_scale`` multiplies the
    spec's own ``rate_scale`` (arrival rates up, time structure unchanged).
    """
    seed = spec.seed if seed is None else seed
    scale = spec.rate_scale * rate_scale
    if spec.duration_s is not None:
        horizon = spec.duration_s / spec.time_scale
        parts = [tenant_requests(t, seed, horizon, scale) for t in spec.tenants]
        return _assemble(spec, parts, None)
    n = spec.requests
    assert n is not None
    horizon = _horizon_for(spec, n, scale)
    limit = horizon_limit(spec, scale)
    while True:
        parts = [tenant_requests(t, seed, horizon, scale) for t in spec.tenants]
        if sum(len(p.arrival_s) for p in parts) >= n or horizon >= limit:
            break
        horizon = min(horizon * 1.5, limit)
    return _assemble(spec, parts, n)


def _assemble(spec: WorkloadSpec, parts: list[TenantRequests], limit: int | None) -> pa.Table:
    arrival = np.concatenate([p.arrival_s for p in parts])
    tenant_idx = np.concatenate([np.full(len(p.arrival_s), i, dtype=np.int32) for i, p in enumerate(parts)])
    if len(parts) > 1:
        order = np.argsort(arrival, kind="stable")
        if limit is not None:
            order = order[:limit]
    else:
        order = slice(0, limit)
    arrival = arrival[order] * spec.time_scale
    tenant_idx = tenant_idx[order]
    n = len(arrival)
    if n == 0:
        raise UserError("the spec generates no requests (check rates and duration_s)", spec.source)

    def per_tenant(values: list, dtype: type) -> np.ndarray:
        return np.asarray(values, dtype=dtype)[tenant_idx]

    def dictionary(values: list[str]) -> pa.DictionaryArray:
        uniq = list(dict.fromkeys(values))
        codes = np.asarray([uniq.index(v) for v in values], dtype=np.int32)[tenant_idx]
        return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(uniq, pa.string()))

    tenants = spec.tenants
    columns = {
        "request_id": pa.array(np.arange(n, dtype=np.int64)),
        "arrival_s": pa.array(arrival),
        "tenant": dictionary([t.name for t in tenants]),
        "input_tokens": pa.array(np.concatenate([p.input_tokens for p in parts])[order]),
        "output_tokens": pa.array(np.concatenate([p.output_tokens for p in parts])[order]),
        "images": pa.array(np.zeros(n, dtype=np.int16)),
        "image_tokens": pa.array(np.zeros(n, dtype=np.int32)),
        "audio_s": pa.array(np.zeros(n, dtype=np.float32)),
        "priority": pa.array(per_tenant([t.priority for t in tenants], np.int8)),
        "slo_class": dictionary([t.slo_class for t in tenants]),
        "kind": dictionary([t.kind for t in tenants]),
    }
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in TRACE.schema]
    return pa.Table.from_arrays(arrays, schema=TRACE.schema)
