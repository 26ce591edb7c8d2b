"""One serving engine (vLLM v1's scheduler) advanced from event to event.

The scheduler, per step: every running request in decode gets one token;
running requests still in prefill get the rest of the step's token budget
(``max_num_batched_tokens``) in admission order; then, if nothing was
preempted, waiting requests are admitted in the engine scheduler's order
(first come first served by default; see :mod:`llmlb_bench.policies.schedulers`)
while a seat (``max_num_seqs``), budget and KV blocks remain, with chunked prefill.
KV memory is paged: a request holds ceil(tokens / block_size) blocks and
takes a new block whenever its next token starts one. With prefix caching,
an admitted request first reuses the cached units its prompt hashes match
(skipping their prefill), and its own full prompt units join the cache once
computed. When a step cannot get the blocks it needs, the most recently
admitted running request (or the scheduler's victim) is preempted
(recompute: its blocks are freed and it goes back to the head of the
waiting queue, keeping the tokens it already streamed), as vLLM does.

With ``swap_blocks`` > 0 (vLLM v0's ``preemption_mode="swap"``) the victim's
KV blocks are copied to CPU memory instead, when they fit in what is left of
the swap space (else it is recomputed, where vLLM v0 would abort the engine).
Swapped requests wait in their own queue, which comes before the waiting
queue: at a step that preempts nobody, they are swapped back in (the most
recently swapped first; under FCFS that is the earliest admitted, as vLLM
v0's arrival order gives, and under other schedulers the most urgent, since
victims are taken least urgent first) while a seat, the token budget and
their blocks remain, and no waiting request is admitted while one is still
out. A swapped-in request resumes where it stopped (decode, or the rest of
its prefill) without recomputing anything. The copies run over the GPU's
host link before the step's forward pass, as vLLM v0's worker does, so the
step that swaps lasts ``blocks x swap_block_s`` longer, at idle power.

Who runs is decided here; the blocks it costs are kept by :class:`KVBlocks`
(sim/kv_blocks.py: blocks in use, release, the prefix cache, the swap space and
each copy's seconds), and what one step runs is a :class:`StepPlan`
(sim/step_plan.py) that planning fills, timing reads and execution applies.

Why this is fast: between two events that change the batch (an arrival that
can be admitted, a prefill chunk, a finish, a preemption, running out of
free blocks) every step is a decode step of the same requests, so a whole
run of them is planned at once. Nothing per request or per token is touched
inside a run: each decoding request's state is a linear function of the
step index (``ctx0``, ``step0``), blocks are counted per phase of the step
index modulo the block size, and finishes sit in a heap keyed by the step at
which they happen. Each run is recorded once in the replica's timeline, from
which token times and energy shares are cut later, in bulk
(:mod:`llmlb_bench.sim.timeline`).

Step time within a run is held constant at the roofline value for the run's
mean context length. The roofline is piecewise linear in context length, so
the run's total duration is exact while it stays in one regime (compute- or
memory-bound); runs are cut so that the step time drifts by at most
``STEP_TIME_TOLERANCE`` within one. With step-time jitter (a measured profile's
spread, sim/jitter.py) every decode step is a run of its own, with its own drawn
length.

Energy: each step draws the cost model's power for its mix of compute and
memory time; the step's energy is shared among the tokens it processes
(a prefill chunk of c tokens gets c shares, each decoding request one).
Idle time draws idle power and is not attributed to requests.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.indexed_heap import HeapEntry, IndexedHeap
from llmlb_bench.sim.jitter import StepJitter
from llmlb_bench.sim.kv_blocks import KVBlocks
from llmlb_bench.sim.lora import AdapterSlots, LoraCosts
from llmlb_bench.sim.profile import ProfileCost
from llmlb_bench.policies.base import RouteRequest
from llmlb_bench.policies.schedulers import WaitingQueue
from llmlb_bench.sim.scheduling import EngineScheduler
from llmlb_bench.sim.speculative import Speculation, Stint
from llmlb_bench.sim.step_plan import StepPlan
from llmlb_bench.sim.timeline import Timeline

#: largest relative growth of the decode step time within one run
STEP_TIME_TOLERANCE = 0.02


class Request(HeapEntry):
    """A request inside the simulator (one trace row, possibly one phase of it). While it decodes it
    sits in its replica's finish heap, keyed by the step of its last token there
    (sim/indexed_heap.py)."""

    __slots__ = ("row", "route", "prompt", "out", "stop", "generated", "computed", "blocks", "ctx0", "step0",
                 "span_start", "spans", "preemptions", "cached", "hashes", "shared", "energy", "first_token_s",
                 "prefill_target", "decode_target", "target", "sched", "stints", "adapter")

    def __init__(self, row: int, route: Any, prompt: int, out: int, hashes: Sequence[int] | None = None) -> None:
        super().__init__()
        self.row = row
        self.route = route
        self.prompt = prompt
        self.out = out
        self.stop = out          # tokens to have generated when this replica is done with it
        self.generated = 0
        self.computed = 0
        self.blocks = 0          # KV blocks of this request while waiting/prefilling (decoding: derived)
        self.ctx0 = 0            # decoding: tokens in KV when decode started ...
        self.step0 = -1          # ... at this step index (-1 = not decoding)
        self.span_start = -1     # step of the first token of the current token run
        self.spans: list[tuple[int, int]] | None = None   # token runs as step ranges on ``target``
        self.preemptions = 0
        self.cached = -1         # prompt tokens served from the prefix cache at first admission
        self.hashes = hashes     # prompt's prefix-cache unit hashes (None: no prefix caching)
        self.shared = 0          # leading units referenced in the prefix cache
        self.energy = 0.0        # joules of prefill shares (decode shares come from the timeline)
        self.first_token_s = -1.0    # set when the first token came from another replica (P/D)
        self.prefill_target = -1
        self.decode_target = -1
        self.target = -1
        self.sched: Any = None   # per-request state of a non-FCFS engine scheduler (e.g. its sort key)
        self.stints: list[Stint] | None = None   # decode stints under speculative decoding (sim/speculative.py)
        self.adapter: str | None = route.adapter if route is not None else None   # LoRA adapter (None: base)


class Replica:
    """The scheduler and KV cache of one replica."""

    def __init__(self, index: int, name: str, cost: CostModel | ProfileCost, *, max_num_seqs: int,
                 max_num_batched_tokens: int, block_size: int, chunked_prefill: bool,
                 prefix_unit_blocks: int = 0, pool: str = "default", role: str = "mixed",
                 scheduler: EngineScheduler | None = None, context_limit: int = 1 << 30, hash_stride: int = 1,
                 created_at: float = 0.0, swap_blocks: int = 0, speculation: Speculation | None = None,
                 lora: LoraCosts | None = None, jitter: StepJitter | None = None) -> None:
        self.index = index
        self.name = name
        self.pool = pool
        self.role = role
        #: longest prompt + output accepted (the model length)
        self.context_limit = context_limit
        #: trace prefix hashes per prefix-cache unit
        self.hash_stride = hash_stride
        # life cycle (autoscaling, failures): routable only when none of these holds
        self.created_at = created_at
        self.retired_at: float | None = None
        self.starting = self.draining = self.down = False
        #: requests dispatched here still in the API server (a profile's request overhead; see sim/simulation.py)
        self.entering = 0
        #: frontend CPU seconds of requests dispatched here, not yet booked into a step (a profile's
        #: ``frontend_cpu_s``, sim/profile.py: the API server shares the engine's core); 0 otherwise
        self.frontend_owed = 0.0
        #: requests dispatched to the busy engine that owe ``frontend_after_s`` once a first token is
        #: sampled (the part of the frontend's work that comes after the request's own wait)
        self.frontend_after = 0
        #: when the outbound KV link (disaggregation) is free again
        self.link_free_at = 0.0
        #: every step takes this many times as long as the cost model says (a scheduled slowdown)
        self.slowdown = 1.0
        self.cost = cost
        #: the pool's proposer (None: one token per step, as without speculative decoding)
        self.spec = speculation
        #: this replica's step-time jitter draws (sim/jitter.py; None: every step is the model's)
        self.jitter = jitter
        self.max_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.bs = block_size
        self.chunked = chunked_prefill
        #: LoRA adapter slots (sim/lora.py; None: the replica serves the base model only); their
        #: preallocated GPU buffers come off the KV cache
        self.lora = AdapterSlots(lora) if lora is not None else None
        #: the GPU's KV blocks, the prefix cache and the CPU swap space (sim/kv_blocks.py)
        self.kv = KVBlocks(cost.kv_blocks - (lora.reserved_blocks if lora is not None else 0), block_size,
                           prefix_unit_blocks, swap_blocks, cost.swap_block_s)
        #: longest prompt + output this replica can ever serve (model length, KV capacity, unchunked budget)
        self.max_total = min(context_limit, self.kv.total * block_size + 1,
                             context_limit if chunked_prefill else max_num_batched_tokens + 1)
        # decode steps (times the batch size) over which the step time grows by at most the tolerance:
        # relative growth per step <= decoding x context_slope / min_step_s
        self.cost_changed()
        self.scheduler = scheduler if scheduler is not None else EngineScheduler()
        # whether the scheduler counts tokens (VTC does; FCFS and the static-key ones keep the base's
        # no-op hooks, which then are not called: a few calls per request on the hot path)
        sched = type(self.scheduler)
        self._observes = (sched.on_tokens is not EngineScheduler.on_tokens
                          or sched.on_decode is not EngineScheduler.on_decode)
        self.step = 0                                # steps completed
        self.t = 0.0                                 # time of the last boundary
        self.running: dict[Request, None] = {}       # admission order (the preemption victim is the last)
        self.prefilling: list[Request] = []          # running requests still in prefill, admission order
        # the engine scheduler's queue (FCFS: a deque; see policies.schedulers)
        self.waiting: WaitingQueue[Request] = self.scheduler.make_queue(self)
        self.decoding = 0                            # running requests in decode
        self.context = 0                             # their total context for the next step
        self.phase = [0] * block_size                # decoders needing a new block at steps = p (mod bs)
        #: decoding requests by the step of their last token here, ties by the order their decodes started
        self.finish_heap = IndexedHeap()
        self._seq = 0
        #: what the next step runs (planned at a boundary, applied at the next; sim/step_plan.py)
        self.plan = StepPlan()
        self._done_here: list[Request] = []          # finished at a prefill completion, reported at the boundary
        self._aborted: list[Request] = []            # to drop at the next boundary (see ``abort``)
        self.timeline = Timeline()
        self.version = 0                             # bumps whenever the pending boundary moves
        # the run in flight
        self.run_start = 0.0
        self.run_gap = 0.0
        self.run_n = 0
        self.idle = True
        self.run_power = 0.0
        self._pre_energy = self._pre_power = self._pre_start = 0.0
        self.run_decode_only = False
        # totals
        self.preemptions = 0
        self.prefill_tokens = 0                      # prompt tokens computed, recomputed ones included
        self.swap_time_s = 0.0                       # host-link seconds steps spent copying (KV swap, adapters)
        self.failures = 0
        self.energy_j = 0.0                          # up to the last boundary (or to ``idle_since``)
        self.idle_since = created_at
        self.busy_s = 0.0

    def cost_changed(self) -> None:
        """The cost model's speed changed (a green knob, sim/green.py): re-derive the run-cutting
        tolerance from its new context slope (runs planned from now on)."""
        self._tol_steps = STEP_TIME_TOLERANCE * self.cost.min_step_s / self.cost.context_slope
        #: the step's further growth per context token and request decoding, over ``context_slope``
        #: (a profile's dense attention term, sim/profile.py; 0 for the roofline)
        self._dense_per_seq = self.cost.dense_slope / self.cost.context_slope

    # ---- queries -------------------------------------------------------------------------------

    def fits(self, tokens: int) -> bool:
        """Whether a request whose KV needs ``tokens`` slots can ever run here."""
        return self.kv.blocks(tokens) <= self.kv.total

    def blocks_used_at(self, t: float) -> int:
        """Blocks in use at time ``t`` inside the run in flight (for series samples)."""
        if not self.run_n or not self.decoding:
            return self.kv.used
        done = min(self.run_n, int((t - self.run_start) / self.run_gap)) if t > self.run_start else 0
        return self.kv.used + self._blocks_needed(done)

    @property
    def routable(self) -> bool:
        return not (self.starting or self.draining or self.down or self.retired_at is not None)

    def retire(self, t: float) -> None:
        """Leave the fleet at ``t`` (drained): no more power or cost from here on."""
        self.energy_j = self.energy_at(t)
        self.retired_at = t

    def energy_at(self, t: float) -> float:
        """Joules drawn from creation to ``t`` (``t`` not before the last event)."""
        if self.retired_at is not None:
            return self.energy_j
        if self.idle:
            return self.energy_j + self.cost.idle_power_w * (t - self.idle_since)
        if t < self.run_start:       # inside a mixed step applied ahead of its end (see _plan)
            return self._pre_energy + self._pre_power * (t - self._pre_start)
        return self.energy_j + self.run_power * (t - self.run_start)

    def oldest_needed_step(self) -> int:
        """The first step whose timeline entry an unfinished request still needs."""
        oldest = self.step + 1
        for group in (self.running, self.waiting, (r for r, _, _ in self.kv.swapped)):
            for req in group:
                first = req.spans[0][0] if req.spans else req.span_start
                if 0 <= first < oldest:
                    oldest = first
        return oldest

    @property
    def run_end(self) -> float:
        return self.run_start + self.run_n * self.run_gap

    # ---- events --------------------------------------------------------------------------------

    def admit(self, key: int, route: RouteRequest, prompt: int, out: int) -> tuple[Request, float]:
        """The engine's request for ``route``, routed here, and the seconds before the engine sees it
        (a measured profile's API-server time, sim/profile.py; 0: at once, through :meth:`enqueue`).
        The one way the simulator and ``llmlb serve`` make it: the prompt's prefix-cache hashes at this
        replica's stride (None without a prefix cache). A delayed request counts in :attr:`entering`
        (the caller takes it off when the request reaches the queue or is lost)."""
        hashes = route.prefix_hashes
        stride = self.hash_stride
        req = Request(key, route, prompt, out,
                      None if self.kv.cache is None or not hashes else
                      hashes if stride == 1 else hashes[stride - 1::stride])
        delay = self.cost.request_overhead(1, prompt)
        if self.cost.frontend_cpu_s and not self.idle:     # the frontend takes it from a running engine's steps
            self.frontend_owed += self.cost.frontend_wait_s
            if self.cost.frontend_after_s:      # the rest once a first token is sampled (sim/profile.py)
                self.frontend_after += 1
        if delay > 0:
            req.target = self.index
            self.entering += 1
        return req, delay

    def enqueue(self, req: Request, t: float) -> float | None:
        """A request arrives at time ``t``. Returns the new boundary time if it moved, else None."""
        req.target = self.index
        self.waiting.append(req)
        if self.lora is not None:
            self.lora.enqueue(req.adapter)
        if self.idle:
            self.energy_j += self.cost.idle_power_w * (t - self.idle_since)
            self.t = t
            return self._schedule()
        # A decode run ends early at the next step boundary when the newcomer could be admitted there
        # (with no decode step at all if it arrives during the mixed step that precedes the run). With
        # LoRA, requests waiting only for an adapter slot are skipped, so a newcomer whose adapter can
        # join may be admitted behind them: then the run ends too (at worst the boundary admits no one).
        if (self.run_decode_only and self.run_n and len(self.running) < self.max_seqs and not self.kv.swapped
                and (self.waiting.newcomer_may_lead() if self.lora is None else self.lora.can_join(req.adapter))):
            return self._cut_after(t)
        return None

    def slow_down(self, factor: float, t: float) -> float | None:
        """From ``t`` on every step takes ``factor`` times as long as the cost model says; a decode run
        in flight ends at its next step boundary so that the next is planned at the new speed.
        Returns the new boundary time, or None when it did not move."""
        self.slowdown = factor
        if self.run_decode_only and self.run_n and not self.idle:
            return self._cut_after(t)
        return None

    def _cut_after(self, t: float) -> float | None:
        """End the decode run in flight at the first step boundary after ``t``; returns the new
        boundary time, or None when the run ends there anyway."""
        j = int((t - self.run_start) / self.run_gap) + 1 if t >= self.run_start else 0
        if j >= self.run_n:
            return None
        self.run_n = j
        self.timeline.truncate_last(j)
        self.version += 1
        return self.run_end

    def abort(self, req: Request, t: float) -> bool:
        """The client of ``req`` (waiting or running here) went away at ``t``. Returns True when it
        left at once (from the queue or the swap space), False when it leaves at a later boundary.

        Used by the live server (:mod:`llmlb_bench.serve`); batch simulations never abort. As in
        vLLM, which drops aborted requests when it next schedules: a request waiting in the FCFS
        queue leaves at once; a running one leaves the batch at the end of the step in progress
        (the run in flight is cut there) and is reported in ``boundary``'s ``done`` list, with
        ``generated`` tokens, fewer than it asked for. Under other engine schedulers a waiting
        request stays queued until it is admitted and is dropped at the boundary after that.
        A swapped-out request leaves at once, giving back its swap space."""
        if self.kv.drop_swapped(req):
            return True
        if req not in self.running and self.waiting.drop(req):
            if self.lora is not None:
                self.lora.dequeue(req.adapter)
            return True
        self._aborted.append(req)
        if self.run_decode_only and self.run_n:
            self._cut_after(t)
        return False

    def _drop_aborted(self, done: list[Request]) -> None:
        """Take aborted requests out of the batch (those still queued wait for their admission)."""
        queued = []
        for req in self._aborted:
            if req in self.running:
                if req.step0 >= 0:
                    self._release(req, self.kv.blocks(self._stop_decode(req)))
                else:
                    self.prefilling.remove(req)
                    self._release(req, req.blocks)
                done.append(req)
            elif any(w is req for w in self.waiting):
                queued.append(req)
        self._aborted = queued

    def boundary(self, done: list[Request]) -> float | None:
        """The run in flight has ended: apply it, append requests done here to ``done``
        (finished, or handed over after prefill), schedule the next step.
        Returns the next boundary time, or None when idle."""
        self._apply(self.run_n)
        finishing = self.finish_heap.heap
        step = self.step
        while finishing and finishing[0].key <= step:
            req = cast(Request, self.finish_heap.pop())
            self._release(req, self.kv.blocks(self._stop_decode(req)))
            done.append(req)
        if self._done_here:
            done.extend(self._done_here)
            self._done_here.clear()
        if self._aborted:
            self._drop_aborted(done)
        if self.kv.cache is not None:
            self.kv.trim_cache(0)
        return self._schedule()

    def _apply(self, n: int) -> None:
        """Advance the state by the ``n`` steps of the run in flight (a mixed step has n = 1)."""
        if self.decoding:   # the decodes' new blocks
            self.kv.used += self.phase[(self.step + 1) % self.bs] if n == 1 else self._blocks_needed(n)
            self.context += self.decoding * n
        busy = n * self.run_gap
        self.t = self.run_start + busy
        self.energy_j += self.run_power * busy
        self.busy_s += busy
        self.step += n
        chunks = self.plan.chunks
        if not chunks:
            return
        step = self.step
        cache = self.kv.cache
        on_tokens = self.scheduler.on_tokens if self._observes else None
        for req, chunk in chunks:
            req.computed += chunk
            self.prefill_tokens += chunk
            if on_tokens is not None:   # a chunk that completes the prefill also samples a token
                on_tokens(req, chunk, int(req.computed == req.prompt + req.generated), self.t)
            if cache is not None and req.hashes is not None:
                full = min(req.computed, req.prompt) // (self.bs * cache.unit_blocks)
                if full > req.shared:
                    req.shared += cache.register(req.hashes, req.shared, min(full, len(req.hashes)))
            if req.computed == req.prompt + req.generated:
                # Prefill (or recompute after preemption) complete: this step sampled a token.
                self.prefilling.remove(req)
                req.generated += 1
                req.span_start = step
                if req.generated >= req.stop:
                    self._release(req, req.blocks)
                    self._done_here.append(req)
                else:
                    self._start_decode(req)
        self.plan.chunks = []

    # ---- decode bookkeeping -----------------------------------------------------------------------

    def _start_decode(self, req: Request) -> None:
        """``req`` decodes from the next step on: its next token's KV goes to slot ``computed``."""
        c = req.computed
        s0 = self.step + 1
        req.ctx0, req.step0 = c, s0
        self.phase[(s0 - c) % self.bs] += 1
        self.decoding += 1
        self.context += c + 1
        if self._observes:
            self.scheduler.on_decode(req)
        steps = req.stop - req.generated
        if self.spec is not None:
            stints = req.stints if req.stints is not None else []
            accepted, emitted = self.spec.draw(req.row, req.route.request_id, len(stints), steps)
            stints.append(Stint(s0, accepted, emitted))
            req.stints = stints
            steps = len(emitted)
        self._seq += 1
        self.finish_heap.place(req, s0 + steps - 1, self._seq)

    def _stop_decode(self, req: Request) -> int:
        """Take ``req`` out of decode at the current boundary; returns the tokens in its KV."""
        advanced = self.step - req.step0 + 1
        computed = req.ctx0 + advanced
        # speculative: ``advanced`` steps made the tokens drawn for them (KV: one slot per step)
        made = advanced if req.stints is None else req.stints[-1].cut(advanced)
        req.generated += made
        if self._observes:
            self.scheduler.on_tokens(req, 0, made, self.t)
        req.computed = computed
        self.phase[(req.step0 - req.ctx0) % self.bs] -= 1
        self.decoding -= 1
        self.context -= computed + 1
        req.step0 = -1
        self.finish_heap.remove(req)
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
        """``req`` leaves this replica for good (finished or handed over)."""
        del self.running[req]
        if self.lora is not None:
            self.lora.leave(req.adapter)
        self.kv.release(req, blocks)
        spans = req.spans
        if spans is None:
            req.spans = [(req.span_start, self.step)]
        else:
            spans.append((req.span_start, self.step))

    def _preempt(self) -> tuple[Request, bool]:
        """Preempt the engine scheduler's victim (FCFS: the most recently admitted); swap its KV
        out when swapping is on and the swap space has room, else recompute and requeue it.
        Returns it and whether it was decoding and needed a new block at the next step."""
        req = self.scheduler.victim(self.running, self.t)
        del self.running[req]
        if self.lora is not None:
            self.lora.leave(req.adapter)
            self.lora.enqueue(req.adapter)     # back to the waiting queue (LoRA excludes KV swap)
        decoding = req.step0 >= 0
        if decoding:
            phase_hit = (self.step + 1 - (req.step0 - req.ctx0)) % self.bs == 0
            blocks = self.kv.blocks(self._stop_decode(req))
            if req.spans is None:
                req.spans = []
            req.spans.append((req.span_start, self.step))
        else:
            phase_hit = False
            self.prefilling.remove(req)
            blocks = req.blocks
        kv = self.kv
        kv.release(req, blocks)
        req.span_start = -1
        req.preemptions += 1
        self.preemptions += 1
        if kv.swap_total:
            copy_s = kv.swap_out(req, blocks, decoding)
            if copy_s is not None:
                self.plan.link_s += copy_s      # the copy runs before the step being planned
                return req, decoding and phase_hit
        req.computed = 0
        self.waiting.requeue(req)
        return req, decoding and phase_hit

    def _swap_in(self, plan: StepPlan) -> None:
        """Bring swapped-out requests back (see the module docstring) while a seat, the token
        budget and their blocks remain. Decoders rejoin the batch at the step being planned;
        partial prefills get a chunk in the plan."""
        kv, bs = self.kv, self.bs
        swapped = kv.swapped
        budget, free = plan.budget, plan.free
        while swapped and budget > 0 and len(self.running) < self.max_seqs:
            req, blocks, decoding = swapped[0]
            if decoding:
                chunk = 1
                extra = int(req.computed % bs == 0)     # its next token starts a block
            else:
                todo = req.prompt + req.generated - req.computed
                chunk = min(todo, budget)
                if chunk < todo and not self.chunked:
                    break
                extra = -(-(req.computed + chunk) // bs) - blocks
            if blocks + extra > free:
                break
            plan.link_s += kv.swap_in()
            self.running[req] = None
            free -= blocks + extra
            budget -= chunk
            if decoding:
                req.span_start = self.step + 1
                self._start_decode(req)
                plan.need += extra
            else:
                req.blocks = blocks + extra
                kv.used += extra
                self.prefilling.append(req)
                plan.chunks.append((req, chunk))
        plan.budget, plan.free = budget, free

    def drain(self, t: float) -> list[Request]:
        """Remove every request at time ``t`` (replica failure): returns them; KV (swapped-out
        KV too) and cache are lost."""
        reqs = list(self.running) + list(self.waiting) + [r for r, _, _ in self.kv.swapped]
        for req in reqs:
            if req.step0 >= 0:
                self._stop_decode(req)
            req.computed = req.blocks = req.shared = 0
            req.span_start = -1
            req.spans = None
        self.running.clear()
        self.prefilling.clear()
        self.waiting.clear()
        self.kv.lose_all()
        self.plan.link_s = 0.0
        if self.lora is not None:
            self.lora.clear()
        self.decoding = self.context = 0
        self.phase = [0] * self.bs
        self.energy_j = self.energy_at(t)
        self.idle_since = self.t = t
        self.idle = True
        self.step += self.run_n      # the cut-off run keeps its step numbers; no request refers to them
        self.run_n = 0
        self.plan.chunks = []
        self.version += 1
        return reqs

    # ---- the scheduler -------------------------------------------------------------------------------

    def _schedule(self) -> float | None:
        """Plan the next step at a boundary, in vLLM's order: room for the decodes' new KV blocks
        (preempting when they do not fit), the running prefills' next chunks, then, unless this
        step preempted, newcomers: swapped-out requests back in and waiting ones in the queue's
        order while the token budget, the batch size and the free blocks allow."""
        kv, plan = self.kv, self.plan
        need = self.phase[(self.step + 1) % self.bs] if self.decoding else 0
        if not self.waiting and not self.prefilling and not kv.swapped and need <= kv.total - kv.used:
            plan.preempted = False
            return self._plan(plan)      # the common case: only decodes continue
        preempted = need > kv.total - kv.used
        if preempted:
            need = self._fit_decodes(need)
        plan.budget = self.budget - self.decoding
        plan.free = kv.total - kv.used - need
        plan.need = need
        plan.preempted = preempted
        if self.prefilling:
            self._continue_prefills(plan)
        if not plan.preempted and (self.waiting or kv.swapped or kv.cache is not None):
            self._admit(plan)
        return self._plan(plan)

    def _fit_decodes(self, need: int) -> int:
        """Each decode takes one token slot, and ``need`` of them a new block, more than are free:
        preempt victims until those blocks fit. Returns the blocks still needed."""
        kv = self.kv
        while need > kv.total - kv.used:
            _, hit = self._preempt()
            need -= hit
        return need

    def _continue_prefills(self, plan: StepPlan) -> None:
        """Next chunk of each running prefill, in admission order, within the token budget the
        decodes left; preempts (possibly the prefill itself) when its blocks do not fit."""
        bs, kv, chunks = self.bs, self.kv, plan.chunks
        budget, free, need, preempted = plan.budget, plan.free, plan.need, plan.preempted
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req not in self.running:
                continue
            chunk = min(req.prompt + req.generated - req.computed, budget)
            nb = -(-(req.computed + chunk) // bs) - req.blocks
            while nb > free:
                victim, hit = self._preempt()
                preempted = True
                free = kv.total - kv.used - need + hit
                need -= hit
                if victim is req:
                    break
            if req not in self.running:
                continue
            req.blocks += nb
            kv.used += nb
            free -= nb
            budget -= chunk
            chunks.append((req, chunk))
        plan.budget, plan.free, plan.need, plan.preempted = budget, free, need, preempted

    def _admit(self, plan: StepPlan) -> None:
        """Swapped-out requests back in first (none is admitted while one is still out, as in vLLM
        v0), then waiting ones from the head of the queue, reusing cached prefix blocks, until one
        does not fit (no skipping, except a request whose LoRA adapter finds no slot in the batch:
        it keeps its place and the next one is tried, as vLLM v1 does). Appends their first chunks
        to the plan."""
        bs, kv, chunks = self.bs, self.kv, plan.chunks
        waiting = self.waiting
        cache = kv.cache
        unit_blocks = cache.unit_blocks if cache is not None else 0
        lora = self.lora
        skipped: list[Request] = []
        if kv.swapped:
            self._swap_in(plan)
            if kv.swapped:
                plan.budget = 0      # admits no waiting request while one is still out
        budget, free = plan.budget, plan.free
        while waiting and budget > 0 and len(self.running) < self.max_seqs:
            req = waiting.head(self.t)
            if lora is not None and not lora.can_join(req.adapter):
                waiting.pop_head()
                skipped.append(req)
                continue
            hit = revive = 0
            if cache is not None and req.hashes is not None and req.computed == 0:
                unit = bs * unit_blocks
                # at least one prompt token is always computed (the step must sample)
                hit = cache.match(req.hashes, (req.prompt + req.generated - 1) // unit)
                revive = cache.revive_cost(req.hashes, hit) if hit else 0
            computed = hit * bs * unit_blocks if hit else req.computed
            todo = req.prompt + req.generated - computed
            chunk = min(todo, budget)
            if chunk < todo and not self.chunked:
                break
            held = hit * unit_blocks if hit else req.blocks
            nb = -(-(computed + chunk) // bs) - held
            if nb + revive > free:
                break
            waiting.pop_head()
            if hit:
                kv.acquire_prefix(req, hit)
                req.computed = computed
            if cache is not None and req.cached < 0:
                req.cached = computed if req.hashes is not None else 0
                cache.lookups += 1
                cache.hits += hit > 0
            self.running[req] = None
            self.prefilling.append(req)
            req.blocks += nb
            kv.used += nb
            free -= nb + revive
            budget -= chunk
            chunks.append((req, chunk))
            if lora is not None:
                plan.link_s += lora.join(req.adapter)
        plan.budget, plan.free = budget, free
        for req in reversed(skipped):
            waiting.requeue(req)
        kv.trim_cache(plan.need)

    def _plan(self, plan: StepPlan) -> float | None:
        """Start the next run at ``self.t``: one mixed step, or a run of identical decode steps."""
        self.run_start = self.t
        self.version += 1
        if plan.chunks:
            return self._plan_mixed(plan)
        if self.decoding:
            return self._plan_decode(plan.preempted)
        self.run_n = 0
        self.idle = True
        self.run_decode_only = False
        self.idle_since = self.t
        return None

    def _plan_mixed(self, plan: StepPlan) -> float:
        """One step with the plan's prefill chunks (and the running decodes).

        When the step completes every prefill, admits no one after it (nothing waits) and
        finishes no one, the step after it is certain to start a decode run; then the step
        is applied at once and that run planned behind it, which saves one event per
        admission. An arrival during the step still ends the run at the step's end."""
        decoding = self.decoding
        chunks = plan.chunks
        tokens = 0
        attn = kv_read = 0.0
        completing = 0
        ending = False        # a request gets its last token on this replica at this step
        for req, chunk in chunks:
            c = req.computed
            tokens += chunk
            attn += chunk * (c + (chunk + 1) / 2)
            kv_read += c + chunk
            if c + chunk == req.prompt + req.generated:
                completing += 1
                if req.generated + 1 >= req.stop:
                    ending = True
        if self.spec is None:
            gap, power = self.cost.run_step(tokens + decoding, attn + self.context, kv_read + self.context,
                                            decoding + completing)
        else:
            gap, power = self.spec.step(tokens, attn, kv_read, completing, decoding, self.context)
        if self.jitter is not None:
            gap *= self.jitter.factor(self.run_start)
        if self.slowdown != 1.0:
            gap *= self.slowdown
        if self.frontend_owed:
            gap += self._take_frontend()
        if self.frontend_after and completing:     # owed by requests whose first token this step samples
            k = min(completing, self.frontend_after)
            self.frontend_after -= k
            self.frontend_owed += k * self.cost.frontend_after_s
        if plan.link_s:
            gap, power = self._with_link(gap, power)
        share = power * gap / (tokens + decoding)
        for req, chunk in chunks:
            req.energy += share * chunk
        self.timeline.add(self.step + 1, self.run_start, gap, 1, share)
        self.idle = False
        if (completing == len(chunks) == len(self.prefilling) and not ending and not self.waiting
                and not (decoding and self._next_finish() <= self.step + 1)):
            self._pre_energy, self._pre_power, self._pre_start = self.energy_j, power, self.run_start
            self.run_n, self.run_gap, self.run_power = 1, gap, power
            self._apply(1)
            self.run_start = self.t
            return self._plan_decode(False)
        self.run_n = 1
        self.run_gap = gap
        self.run_power = power
        self.run_decode_only = False
        return self.run_start + gap

    def _plan_decode(self, preempted: bool) -> float:
        """A run of decode steps up to the next finish, block shortage or step-time drift."""
        decoding = self.decoding
        n = self._next_finish() - self.step
        link_s = self.plan.link_s
        if preempted or self.prefilling or link_s or self.jitter is not None or self.frontend_owed:
            n = 1       # (with jitter every step has its own length; frontend time lengthens one step)
        else:
            free = self.kv.total - self.kv.used
            if decoding * (n // self.bs + 1) > free:
                n = self._block_limit(n, free)
            # cut runs so the step time drifts by at most the tolerance (see the module docstring)
            n_tol = int(self._tol_steps / decoding if not self._dense_per_seq
                        else self._tol_steps / (decoding * (1.0 + self._dense_per_seq * decoding)))
            if n > n_tol:
                n = n_tol if n_tol > 0 else 1
        ctx = self.context + decoding * (n - 1) / 2
        gap, power = (self.cost.run_step(decoding, ctx, ctx, decoding) if self.spec is None
                      else self.spec.step(0, 0.0, 0.0, 0, decoding, ctx))
        if self.jitter is not None and n:
            gap *= self.jitter.factor(self.run_start)
        if self.slowdown != 1.0:
            gap *= self.slowdown
        if self.frontend_owed and n:
            gap += self._take_frontend()
        if link_s:
            gap, power = self._with_link(gap, power)
        self.run_n = n
        self.run_gap = gap
        self.run_power = power
        self.run_decode_only = True
        self.idle = False
        if n:   # n = 0 only behind an applied mixed step, when the next step needs a preemption
            self.timeline.add(self.step + 1, self.run_start, gap, n, power * gap / decoding)
        return self.run_start + n * gap

    def _take_frontend(self) -> float:
        """The frontend CPU seconds owed by requests dispatched since the last planned step, booked
        into the step being planned (the API server took them from the engine's core meanwhile)."""
        owed = self.frontend_owed
        self.frontend_owed = 0.0
        return owed

    def _with_link(self, gap: float, power: float) -> tuple[float, float]:
        """(step time, power) of a step that first copies the plan's host-link traffic (KV swaps,
        adapter loads): longer by the copy time, which the GPUs spend at idle power."""
        t = self.plan.link_s
        self.plan.link_s = 0.0
        self.swap_time_s += t
        total = gap + t
        return total, (power * gap + self.cost.idle_power_w * t) / total

    def _next_finish(self) -> int:
        """Step at which the next decoding request finishes."""
        return int(self.finish_heap.heap[0].key)

    def _block_limit(self, n: int, free: int) -> int:
        """Largest m <= n such that the next m decode steps find their new blocks free."""
        d = self.decoding
        q = free // d
        m, acc = q * self.bs, q * d
        phase, bs, s = self.phase, self.bs, self.step + 1 + m
        for j in range(bs):
            acc += phase[(s + j) % bs]
            if acc > free:
                break
            m += 1
        return min(n, m)
