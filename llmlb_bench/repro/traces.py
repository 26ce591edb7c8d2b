"""Synthetic traces built for one claim each, where a preset workload would blur the effect
(e.g. a fixed share of very long prompts for Sarathi-Serve). Arrivals and lengths come from
one seeded generator, so the same seed gives the same trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from llmlb_bench.schema import trace_table
from llmlb_bench.workload import generate, load_spec

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


def table(arrival: np.ndarray, input_tokens: np.ndarray | int, output_tokens: np.ndarray | int,
          **extra: np.ndarray | pa.Array) -> pa.Table:
    """A TRACE table from columns; scalar lengths are broadcast."""
    return trace_table(arrival, input_tokens, output_tokens, "repro", **extra)


def poisson(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate, n))


def lognormal(rng: np.random.Generator, median: float, sigma: float, n: int, high: int) -> np.ndarray:
    return np.clip(rng.lognormal(np.log(median), sigma, n), 1, high).astype(np.int32)


def chat(n: int, rate: float, seed: int, input_median: float = 600, output_median: float = 150,
         sigma: float = 0.8) -> pa.Table:
    """Poisson arrivals with lognormal prompt and output lengths."""
    rng = np.random.default_rng(seed)
    return table(poisson(rng, rate, n), lognormal(rng, input_median, sigma, n, 6000),
                 lognormal(rng, output_median, sigma, n, 2000))


def preset(name: str, seed: int, rate_scale: float = 1.0, requests: int | None = None) -> pa.Table:
    """A workload preset of workloads/ (optionally with fewer requests)."""
    spec = load_spec(WORKLOADS / f"{name}.toml").replace(requests=requests)
    return generate(spec, seed=seed, rate_scale=rate_scale)
