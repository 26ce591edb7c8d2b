"""Which LoRA adapter each request names: a tenant's adapters with Zipf popularity.

Multi-LoRA serving puts many fine-tuned adapters on one base model, and their
popularity is skewed: a few adapters take most requests (S-LoRA's and dLoRA's
workloads draw adapter ranks from a power law). A tenant's ``[adapters]``
table names ``count`` adapters ``<prefix>0 .. <prefix>{count-1}`` (or lists
``names``) and gives adapter ``k`` (rank k + 1) probability proportional to
``(k + 1)^-zipf_s``; ``zipf_s = 0`` is uniform. ``base_fraction`` of the
draws name no adapter (the base model: a null in the trace's ``adapter``).

One draw per conversation: every turn of a session, and every request an
agent fans out from it, names the same adapter (an application is one
fine-tune), so the adapter column follows the trace's prefix structure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmlb_bench.workload.distributions import Zipf
from llmlb_bench.workload.fields import Section


@dataclass(frozen=True)
class Adapters:
    """A tenant's adapters (names in popularity order) and the share of base-model requests."""

    names: tuple[str, ...]
    zipf_s: float
    base_fraction: float

    def draw(self, rng: np.random.Generator, owners: np.ndarray) -> np.ndarray:
        """Per request, the index of its adapter in ``names`` (-1: the base model); requests with
        the same ``owner`` (a session, or the request itself: non-negative ids) share one draw."""
        n_owners = int(owners.max()) + 1 if owners.size else 0
        u = rng.random(n_owners)
        base = rng.random(n_owners) < self.base_fraction
        rank = Zipf(self.zipf_s, len(self.names)).ppf(u).astype(np.int64) - 1 if self.zipf_s > 0 else \
            np.minimum((u * len(self.names)).astype(np.int64), len(self.names) - 1)
        result: np.ndarray = np.where(base, -1, rank)[owners]
        return result


def parse_adapters(s: Section) -> Adapters:
    if s.has("names"):
        names = s.raw("names")
        if not isinstance(names, list) or not names or not all(isinstance(x, str) and x for x in names):
            raise s.error("names", "expected a non-empty list of adapter names")
        if len(set(names)) != len(names):
            raise s.error("names", "adapter names must be distinct")
        if s.has("count") or s.has("prefix"):
            raise s.error("names", "give either names or count (and prefix), not both")
        out = tuple(names)
    else:
        count = s.integer("count", ge=1, le=1_000_000)
        prefix = s.string("prefix", "lora-")
        if not prefix:
            raise s.error("prefix", "must not be empty")
        out = tuple(f"{prefix}{k}" for k in range(count))
    adapters = Adapters(names=out, zipf_s=s.number("zipf_s", 1.0, ge=0),
                        base_fraction=s.number("base_fraction", 0.0, ge=0, le=1))
    s.finish()
    return adapters
