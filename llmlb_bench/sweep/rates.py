"""Offered request rate of a workload spec, so a sweep can be given in req/s as well as in rate scales.

A spec's arrival processes know their expected counts; the mean rate over
the spec's own horizon (its ``duration_s``, or the time its ``requests``
take to arrive) is what a trace generated from it offers. Generating at
``rate_scale = r / nominal_rate(spec)`` then offers ``r`` req/s, because every
arrival process scales linearly with ``rate_scale``.
"""

from __future__ import annotations

from llmlb_bench.workload import WorkloadSpec
from llmlb_bench.workload.generate import horizon_limit


def expected_requests(spec: WorkloadSpec, horizon: float) -> float:
    """Expected requests arriving in ``horizon`` generator seconds (sessions and fan-out included)."""
    return sum(t.arrival.expected_count(horizon, spec.rate_scale) * t.requests_per_arrival() for t in spec.tenants)


def spec_horizon(spec: WorkloadSpec) -> float:
    """Generator seconds the spec covers: its duration, or the time its request count takes to arrive."""
    if spec.duration_s is not None:
        return spec.duration_s / spec.time_scale
    assert spec.requests is not None
    limit = horizon_limit(spec, spec.rate_scale)
    hi = 1.0
    while expected_requests(spec, hi) < spec.requests and hi < limit:
        hi *= 2.0
    hi = min(hi, limit)
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_requests(spec, mid) >= spec.requests:
            hi = mid
        else:
            lo = mid
    return hi


def nominal_rate(spec: WorkloadSpec) -> float:
    """Mean request rate (req/s of trace time) of a trace generated from ``spec`` at ``rate_scale`` 1."""
    horizon = spec_horizon(spec)
    return expected_requests(spec, horizon) / (horizon * spec.time_scale)
