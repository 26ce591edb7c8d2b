"""The KV block pool of one replica: GPU blocks in use, the prefix cache's shared units, and the
CPU swap space, kept apart from the scheduler as vLLM keeps its KV cache manager.

The scheduler (sim/replica.py) decides *who* runs, is preempted or swapped; this module keeps
*what that costs in blocks*: it counts the GPU blocks in use and frees them (shared prefix units
go back to the cache, not to the pool), swaps a preempted request's blocks out to CPU memory when they fit
there and back in later, and prices each copy at ``blocks x swap_block_s`` seconds of host-link
time, which the step that runs it pays (sim/step_plan.py). Counts are in blocks of
``block_size`` tokens; a request holding ``t`` tokens of KV holds ``ceil(t / block_size)``.

Capacity: referenced prefix units count as used blocks; unreferenced ones as free (an allocation
may evict them), so the scheduler's ``total - used`` arithmetic needs no change, only a
:meth:`trim_cache` after allocations (see :mod:`llmlb_bench.sim.prefix_cache`).

Not modelled: vLLM v0's admission watermark (1% of the blocks kept free); vLLM v1, whose
scheduler the simulator follows, has none.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from llmlb_bench.sim.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from llmlb_bench.sim.replica import Request


class KVBlocks:
    """GPU KV blocks (with the prefix cache) and CPU swap blocks of one replica."""

    __slots__ = ("block_size", "total", "used", "cache", "swap_total", "swap_used", "swapped", "swap_block_s",
                 "swap_outs", "swap_ins", "swap_fallbacks")

    def __init__(self, total: int, block_size: int, prefix_unit_blocks: int = 0, swap_blocks: int = 0,
                 swap_block_s: float = 0.0) -> None:
        self.block_size = block_size
        #: GPU blocks for KV (what the cost model leaves, less LoRA slots)
        self.total = total
        #: blocks referenced as of the replica's last step boundary (decodes' growth inside a run apart);
        #: the scheduler, which checks ``total - used`` before it takes blocks, adds what it takes here
        #: (a plain add, not a call: it happens for every chunk and every run of decode steps)
        self.used = 0
        self.cache = PrefixCache(prefix_unit_blocks) if prefix_unit_blocks else None
        #: CPU blocks for swapped-out KV (0: preemption by recompute only), those in use, and the
        #: swapped-out requests as (request, blocks, was decoding), the next to swap in first
        self.swap_total = swap_blocks
        self.swap_used = 0
        self.swapped: deque[tuple[Request, int, bool]] = deque()
        #: host-link seconds to copy one block either way
        self.swap_block_s = swap_block_s
        self.swap_outs = self.swap_ins = self.swap_fallbacks = 0

    def blocks(self, tokens: int) -> int:
        """Blocks that ``tokens`` KV slots take."""
        return -(-tokens // self.block_size)

    def acquire_prefix(self, req: Request, hit: int) -> None:
        """``req`` reuses the first ``hit`` cached units of its prompt: they become referenced
        (those that were unreferenced move from free to used)."""
        cache = self.cache
        assert cache is not None and req.hashes is not None   # a hit needs both
        self.used += cache.acquire(req.hashes, hit)
        req.shared = hit
        req.blocks = hit * cache.unit_blocks

    def release(self, req: Request, blocks: int) -> None:
        """Give back the ``blocks`` KV blocks of ``req``: shared units to the cache, the rest to the pool."""
        if req.shared:
            cache = self.cache
            assert cache is not None and req.hashes is not None   # shared units come from a prefix cache
            shared_blocks = req.shared * cache.unit_blocks
            self.used -= blocks - shared_blocks + cache.release(req.hashes, req.shared)
            req.shared = 0
        else:
            self.used -= blocks
        req.blocks = 0

    def trim_cache(self, need: int) -> None:
        """Evict unreferenced prefix units until the free blocks, less the ``need`` the next step
        takes, hold them (no-op without a prefix cache)."""
        if self.cache is not None:
            self.cache.evict_to(self.total - self.used - need)

    def swap_out(self, req: Request, blocks: int, decoding: bool) -> float | None:
        """Copy the ``blocks`` KV blocks of the preempted ``req`` (already released on the GPU) to
        CPU memory if they fit there. Returns the copy's host-link seconds, or None when they do
        not fit (the request is then recomputed)."""
        if self.swap_used + blocks > self.swap_total:
            self.swap_fallbacks += 1
            return None
        self.swap_used += blocks
        self.swap_outs += 1
        self.swapped.appendleft((req, blocks, decoding))
        return blocks * self.swap_block_s

    def swap_in(self) -> float:
        """Bring the next swapped-out request's blocks back to the GPU (the scheduler checked they
        fit, and reads the request off ``swapped[0]`` first). Returns the copy's host-link seconds."""
        _, blocks, _ = self.swapped.popleft()
        self.swap_used -= blocks
        self.used += blocks
        self.swap_ins += 1
        return blocks * self.swap_block_s

    def drop_swapped(self, req: Request) -> bool:
        """Forget ``req`` if it is swapped out (its client went away), freeing its swap space."""
        for k, (r, blocks, _) in enumerate(self.swapped):
            if r is req:
                del self.swapped[k]
                self.swap_used -= blocks
                return True
        return False

    def lose_all(self) -> None:
        """The replica failed: every block, swapped-out KV and cached prefix is gone."""
        self.used = 0
        self.swapped.clear()
        self.swap_used = 0
        if self.cache is not None:
            self.cache = PrefixCache(self.cache.unit_blocks)
