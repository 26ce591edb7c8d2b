"""One serving engine (vLLM v1's scheduler) advanced from event to event.

The scheduler, per step: every running request in decode gets one token;
running requests still in prefill get the rest of the step's token budget
(``max_num_batched_tokens``) in admission order; then, if nothing was
preempted, waiting requests are admitted first-come-first-served while a
seat (``max_num_seqs``), budget and KV blocks remain, with chunked prefill.
KV memory is paged: a request holds ceil(tokens / block_size) blocks and
takes a new block whenever its next token starts one. When a step cannot get
the blocks it needs, the most recently admitted running request is preempted
(recompute: its blocks are freed and it goes back to the head of the waiting
queue, keeping the tokens it already streamed), as vLLM does.

Why this is fast: between two events that change the batch (an arrival that
can be admitted, a prefill chunk, a finish, a preemption, running out of
free blocks) every step is a decode step of the same requests, so a whole
run of them is planned at once. Nothing per request or per token is touched
inside a run: each decoding request's state is a linear function of the
step index (``ctx0``, ``step0``), blocks are counted per phase of the step
index modulo the block size, and finishes sit in a heap keyed by the step at
which they happen. Each run is recorded once in the replica's timeline, from
which token times are cut later, in bulk (:mod:`llmlb_bench.sim.timeline`).

Step time within a run is held constant at the roofline value for the run's
mean context length. The roofline is piecewise linear in context length, so
the run's total duration is exact while it stays in one regime (compute- or
memory-bound); runs are cut so that the step time drifts by at most
``STEP_TIME_TOLERANCE`` within one.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Any

from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.timeline import Timeline

#: largest relative growth of the decode step time within one run
STEP_TIME_TOLERANCE = 0.02
#: longest run planned at once (bounds float error of start + k x gap)
MAX_RUN_STEPS = 1 << 20


class Request:
    """A request inside the simulator (one trace row)."""

    __slots__ = ("row", "route", "prompt", "out", "generated", "computed", "blocks", "ctx0", "step0",
                 "gen", "span_start", "spans", "preemptions", "cached")

    def __init__(self, row: int, route: Any, prompt: int, out: int) -> None:
        self.row = row
        self.route = route
        self.prompt = prompt
        self.out = out
        self.generated = 0
        self.computed = 0
        self.blocks = 0          # blocks held while waiting/prefilling (decoding requests: derived)
        self.ctx0 = 0            # decoding: tokens in KV when decode started ...
        self.step0 = -1          # ... at this step index (-1 = not decoding)
        self.gen = 0             # invalidates stale finish-heap entries
        self.span_start = -1     # step of the first token of the current token run
        self.spans: list[tuple[int, int]] | None = None   # earlier token runs (only after a preemption)
        self.preemptions = 0
        self.cached = 0


class Replica:
    """The scheduler and KV cache of one replica."""

    def __init__(self, index: int, name: str, cost: CostModel, *, max_num_seqs: int,
                 max_num_batched_tokens: int, block_size: int, chunked_prefill: bool) -> None:
        self.index = index
        self.name = name
        self.cost = cost
        self.max_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.bs = block_size
        self.chunked = chunked_prefill
        self.total_blocks = cost.kv_blocks
        self.used = 0                                # blocks allocated as of the last boundary
        self.step = 0                                # steps completed
        self.t = 0.0                                 # time of the last boundary
        self.running: dict[Request, None] = {}       # admission order (the preemption victim is the last)
        self.prefilling: list[Request] = []          # running requests still in prefill, admission order
        self.waiting: deque[Request] = deque()
        self.decoding = 0                            # running requests in decode
        self.context = 0                             # their total context for the next step
        self.phase = [0] * block_size                # decoders needing a new block at steps = p (mod bs)
        self.finish_heap: list[tuple[int, int, Request, int]] = []
        self._seq = 0
        self.timeline = Timeline()
        self.version = 0                             # bumps whenever the pending boundary moves
        # the run in flight
        self.run_start = 0.0
        self.run_gap = 0.0
        self.run_n = 0                               # 0 = idle
        self.run_chunks: list[tuple[Request, int]] = []
        self.run_decode_only = False
        self.preemptions = 0

    # ---- queries -------------------------------------------------------------------------------

    def fits(self, tokens: int) -> bool:
        """Whether a request whose KV needs ``tokens`` slots can ever run here."""
        return -(-tokens // self.bs) <= self.total_blocks

    def blocks_used_at(self, t: float) -> int:
        """Blocks in use at time ``t`` inside the run in flight (for series samples)."""
        if not self.run_n or not self.decoding:
            return self.used
        done = min(self.run_n, int((t - self.run_start) / self.run_gap)) if t > self.run_start else 0
        return self.used + self._blocks_needed(done)

    def oldest_needed_step(self) -> int:
        """The first step whose end time an unfinished request still needs for its token times."""
        oldest = self.step + 1
        for group in (self.running, self.waiting):
            for req in group:
                first = req.spans[0][0] if req.spans else req.span_start
                if 0 <= first < oldest:
                    oldest = first
        return oldest

    @property
    def run_end(self) -> float:
        return self.run_start + self.run_n * self.run_gap

    # ---- events --------------------------------------------------------------------------------

    def enqueue(self, req: Request, t: float) -> float | None:
        """A request arrives at time ``t``. Returns the new boundary time if it moved, else None."""
        self.waiting.append(req)
        if not self.run_n:
            self.t = t
            return self._schedule()
        # A decode run ends early at the next step boundary when the newcomer could be admitted there.
        if (self.run_decode_only and self.run_n > 1 and len(self.waiting) == 1
                and len(self.running) < self.max_seqs):
            j = int((t - self.run_start) / self.run_gap) + 1
            if j < self.run_n:
                self.run_n = j
                self.timeline.truncate_last(j)
                self.version += 1
                return self.run_end
        return None

    def boundary(self, done: list[Request]) -> float | None:
        """The run in flight has ended: apply it, append finished requests to ``done``,
        schedule the next step. Returns the next boundary time, or None when idle."""
        n = self.run_n
        if self.decoding:
            self.used += self._blocks_needed(n)
            self.context += self.decoding * n
        self.t = self.run_end
        self.step += n
        step = self.step
        for req, chunk in self.run_chunks:
            req.computed += chunk
            if req.computed == req.prompt + req.generated:
                # Prefill (or recompute after preemption) complete: this step sampled a token.
                self.prefilling.remove(req)
                req.generated += 1
                req.span_start = step
                if req.generated >= req.out:
                    self._release(req, req.blocks)
                    done.append(req)
                else:
                    self._start_decode(req)
        self.run_chunks = []
        heap = self.finish_heap
        while heap and heap[0][0] <= step:
            _, _, req, gen = heappop(heap)
            if gen == req.gen:
                computed = self._stop_decode(req)
                self._release(req, -(-computed // self.bs))
                done.append(req)
        return self._schedule()

    # ---- decode bookkeeping -----------------------------------------------------------------------

    def _start_decode(self, req: Request) -> None:
        """``req`` decodes from the next step on: its next token's KV goes to slot ``computed``."""
        c = req.computed
        s0 = self.step + 1
        req.ctx0, req.step0 = c, s0
        # Requested blocks so far become implicit: ceil(computed / bs), as allocated by the prefill.
        self.phase[(s0 - c) % self.bs] += 1
        self.decoding += 1
        self.context += c + 1
        self._seq += 1
        heappush(self.finish_heap, (s0 + req.out - req.generated - 1, self._seq, req, req.gen))

    def _stop_decode(self, req: Request) -> int:
        """Take ``req`` out of decode at the current boundary; returns the tokens in its KV."""
        advanced = self.step - req.step0 + 1
        computed = req.ctx0 + advanced
        req.generated += advanced
        req.computed = computed
        self.phase[(req.step0 - req.ctx0) % self.bs] -= 1
        self.decoding -= 1
        self.context -= computed + 1
        req.step0 = -1
        req.gen += 1
        return computed

    def _blocks_needed(self, n: int) -> int:
        """New blocks the decoding requests take over the next ``n`` steps."""
        q, r = divmod(n, self.bs)
        need = q * self.decoding
        if r:
            phase, bs, s = self.phase, self.bs, self.step + 1
            for j in range(r):
                need += phase[(s + j) % bs]
        return need

    def _release(self, req: Request, blocks: int) -> None:
        """``req`` leaves the batch for good (finished)."""
        del self.running[req]
        self.used -= blocks
        req.blocks = 0
        spans = req.spans
        if spans is None:
            req.spans = [(req.span_start, self.step)]
        else:
            spans.append((req.span_start, self.step))

    def _preempt_last(self) -> tuple[Request, bool]:
        """Preempt the most recently admitted running request (recompute). Returns it and
        whether it was decoding (then it needed a block at the next step iff its phase matches)."""
        req = next(reversed(self.running))
        del self.running[req]
        decoding = req.step0 >= 0
        if decoding:
            phase_hit = (self.step + 1 - (req.step0 - req.ctx0)) % self.bs == 0
            computed = self._stop_decode(req)
            self.used -= -(-computed // self.bs)
            if req.spans is None:
                req.spans = []
            req.spans.append((req.span_start, self.step))
        else:
            phase_hit = False
            self.prefilling.remove(req)
            self.used -= req.blocks
        req.blocks = 0
        req.computed = 0
        req.span_start = -1
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)
        return req, decoding and phase_hit

    # ---- the scheduler -------------------------------------------------------------------------------

    def _schedule(self) -> float | None:
        bs = self.bs
        budget = self.budget - self.decoding
        need = self.phase[(self.step + 1) % bs] if self.decoding else 0
        preempted = False
        # 1. decodes: one slot each; preempt from the tail until their new blocks fit
        while need > self.total_blocks - self.used:
            _, hit = self._preempt_last()
            preempted = True
            budget = self.budget - self.decoding
            need -= hit
        free = self.total_blocks - self.used - need
        chunks: list[tuple[Request, int]] = []
        # 2. running prefills, in admission order
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req not in self.running:
                continue
            chunk = min(req.prompt + req.generated - req.computed, budget)
            nb = -(-(req.computed + chunk) // bs) - req.blocks
            while nb > free:
                victim, hit = self._preempt_last()
                preempted = True
                free = self.total_blocks - self.used - need + hit
                need -= hit
                if victim is req:
                    break
            if req not in self.running:
                continue
            req.blocks += nb
            self.used += nb
            free -= nb
            budget -= chunk
            chunks.append((req, chunk))
        # 3. waiting requests, first come first served, only if nothing was preempted this step
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(self.running) < self.max_seqs:
                req = waiting[0]
                todo = req.prompt + req.generated - req.computed
                chunk = min(todo, budget)
                if chunk < todo and not self.chunked:
                    break
                nb = -(-(req.computed + chunk) // bs) - req.blocks
                if nb > free:
                    break
                waiting.popleft()
                self.running[req] = None
                self.prefilling.append(req)
                req.blocks += nb
                self.used += nb
                free -= nb
                budget -= chunk
                chunks.append((req, chunk))
        return self._plan(chunks, preempted)

    def _plan(self, chunks: list[tuple[Request, int]], preempted: bool) -> float | None:
        """Start the next run at ``self.t``: one mixed step, or a run of identical decode steps."""
        self.run_start = self.t
        self.version += 1
        cost = self.cost
        if chunks:
            tokens = attn = kv = 0.0
            completing = 0
            for req, chunk in chunks:
                tokens += chunk
                attn += chunk * (req.computed + (chunk + 1) / 2)
                kv += req.computed + chunk
                completing += req.computed + chunk == req.prompt + req.generated
            gap = cost.step(int(tokens), attn, kv, self.decoding, self.context,
                            self.decoding + completing).total
            n = 1
        elif self.decoding:
            heap = self.finish_heap
            while heap[0][3] != heap[0][2].gen:
                heappop(heap)
            n = heap[0][0] - self.step
            if preempted or self.prefilling:
                n = 1
            else:
                n = min(n, self._block_limit(n), MAX_RUN_STEPS)
                base = cost.decode_time(self.decoding, self.context)
                n = min(n, max(1, int(STEP_TIME_TOLERANCE * base / (cost.context_slope * self.decoding))))
            gap = cost.decode_time(self.decoding, self.context + self.decoding * (n - 1) / 2)
        else:
            self.run_n = 0
            self.run_decode_only = False
            return None
        self.run_chunks = chunks
        self.run_n = n
        self.run_gap = gap
        self.run_decode_only = not chunks
        self.timeline.append(self.step + 1, self.run_start, gap, n)
        return self.run_end

    def _block_limit(self, n: int) -> int:
        """Largest m <= n such that the next m decode steps find their new blocks free."""
        free = self.total_blocks - self.used
        d = self.decoding
        if d * (n // self.bs + 1) <= free:
            return n
        q = free // d
        m, acc = q * self.bs, q * d
        phase, bs, s = self.phase, self.bs, self.step + 1 + m
        for j in range(bs):
            acc += phase[(s + j) % bs]
            if acc > free:
                break
            m += 1
        return min(n, m)
