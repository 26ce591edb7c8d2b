"""Engine-level scheduling: the order in which one replica admits its waiting requests,
and which running request it preempts when KV blocks run out.

This is the second, smaller policy interface (the first is routing,
:mod:`llmlb_bench.policies.base`). Routing picks a replica; an engine
scheduler lives inside each simulated replica (:mod:`llmlb_bench.sim.replica`)
and orders that replica's own queue. Built in:

* ``fcfs`` (default, vLLM's): admit in arrival order; preempt the most
  recently admitted running request, which rejoins the head of the queue.
* ``priority`` (vLLM's ``--scheduling-policy priority``): admit the smallest
  ``(priority, arrival)`` first (lower value = more urgent); preempt the
  running request with the largest.
* ``sjf``: shortest predicted output first, from a noisy oracle of chosen
  Kendall tau or a trained predictor file, with linear aging against starvation.
* ``vtc``: the Virtual Token Counter of Sheng et al. (OSDI 2024) — serve the
  tenant that has received the least weighted service.
* ``deadline``: earliest deadline first, the deadline being arrival + the
  TTFT target of the request's SLO class.

How a replica uses a scheduler. The replica asks ``make_queue(replica)``
once for its waiting queue (as vLLM v1's scheduler holds a request queue of
its policy's kind: ``FcfsQueue``, a deque, for ``fcfs``), an object with

* ``append(req)``: a request arrives; ``requeue(req)``: a preempted one returns
  (FCFS: to the front);
* ``head(now)``: the request to try next (the replica stops admitting when it
  does not fit: no skipping, as in vLLM); ``pop_head()``: it was admitted;
* ``newcomer_may_lead()``: whether the request just appended could be the next
  one admitted (FCFS: only into an empty queue), which decides whether a
  decode run in flight is cut at the next step for it;
* ``drop(req)``: a client went away; True if the request left the queue at
  once (FCFS), False if it stays queued until admitted and is dropped then;
* ``len()``, iteration and ``clear()``.

and calls ``victim(running, now)`` (the running requests in admission order: a
dict used as an ordered set; iterate it or ``reversed()`` it) when it must
preempt, ``on_tokens(req, prompt_tokens, output_tokens, now)`` when
tokens are computed (a prefill chunk, its sampled first token, or a request's
decode tokens when it leaves the batch, while ``req.step0`` is still set) and
``on_decode(req)`` when a request starts decoding (``req.step0`` = its first
decode step). ``req.route`` is the :class:`~llmlb_bench.policies.RouteRequest`;
``req.sched`` is a slot a scheduler may use per request.

There is no FCFS branch in the replica: FCFS is this interface too.
A user's scheduler subclasses :class:`EngineScheduler`, sets ``fcfs = False``
and overrides ``pick(waiting, now)`` (index into the waiting list, oldest
first) — simple, and O(waiting) per admission — or ``make_queue`` for a
faster structure, as the built-ins do (a heap for static keys: O(log n)).
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import ClassVar, Collection, Generic, Iterator, Optional, Protocol, Sequence, TypeVar, cast

from llmlb_bench.policies.base import RouteRequest
from llmlb_bench.policies.predictor import OutputLengths, load_predictor
from llmlb_bench.policies.queueing import parse_deadlines


#: a keyed scheduler's per-request sort key, kept in ``QueuedRequest.sched``: (key, arrival, request id)
SchedKey = tuple[float, float, int]


class QueuedRequest(Protocol):
    """What an engine scheduler reads of a request in a replica (the simulator's ``sim.replica.Request``)."""

    #: what the router knew of it: tenant, priority, SLO class, arrival, id
    route: RouteRequest
    #: prompt tokens, and the output tokens it will generate
    prompt: int
    out: int
    #: prompt tokens computed so far; times preempted
    computed: int
    preemptions: int
    #: the step at which it started decoding (-1: not decoding)
    step0: int
    #: a slot the scheduler may use per request (a keyed scheduler's key); None until it does
    sched: Optional[SchedKey]


#: the replica's own request type, whatever it is (the queue hands back what it was given)
R = TypeVar("R", bound=QueuedRequest)
R_co = TypeVar("R_co", bound=QueuedRequest, covariant=True)


class SchedReplica(Protocol[R_co]):
    """What an engine scheduler reads of the replica whose queue it orders (``sim.replica.Replica``)."""

    @property
    def index(self) -> int: ...
    #: steps the replica has run
    @property
    def step(self) -> int: ...
    #: its running requests (they bind the queue's request type)
    @property
    def running(self) -> Collection[R_co]: ...


class WaitingQueue(Protocol[R]):
    """A replica's waiting queue (see the module docstring)."""

    def append(self, req: R) -> None: ...
    def requeue(self, req: R) -> None: ...
    def head(self, now: float) -> R: ...
    def pop_head(self) -> object: ...
    def newcomer_may_lead(self) -> bool: ...
    def drop(self, req: R) -> bool: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[R]: ...


class EngineScheduler:
    """FCFS: the base class, and vLLM's default order."""

    name: ClassVar[str] = "fcfs"
    summary: ClassVar[str] = "First come, first served; preempt the most recently admitted (vLLM's default)."
    #: parameter name -> (default, one-line meaning); used by ``llmlb policies``
    params: ClassVar[dict[str, tuple[object, str]]] = {}
    #: arrival order: the deque :class:`FcfsQueue`; a subclass that sets False gets a
    #: :class:`PickQueue` ordered by its ``pick``
    fcfs: ClassVar[bool] = True

    def make_queue(self, replica: SchedReplica[R]) -> WaitingQueue[R]:
        """The waiting queue of ``replica`` (called once per replica; each has its own scheduler)."""
        return FcfsQueue() if self.fcfs else PickQueue(self)

    def pick(self, waiting: Sequence[QueuedRequest], now: float) -> int:
        return 0

    def victim(self, running: dict[R, None], now: float) -> R:
        """The request to preempt: the most recently admitted."""
        return next(reversed(running))

    # queue defaults for the schedulers that are their own queue (``make_queue`` returns self)
    def newcomer_may_lead(self) -> bool:
        return True

    def drop(self, req: QueuedRequest) -> bool:
        return False

    def on_tokens(self, req: QueuedRequest, prompt_tokens: int, output_tokens: int, now: float) -> None:
        return None

    def on_decode(self, req: QueuedRequest) -> None:
        return None


class FcfsQueue(deque[R]):
    """vLLM v1's FCFS request queue: arrivals at the back, a preempted request back at the front."""

    __slots__ = ()
    requeue = deque.appendleft
    pop_head = deque.popleft

    def head(self, now: float) -> R:
        return self[0]

    def newcomer_may_lead(self) -> bool:
        return len(self) == 1

    def drop(self, req: R) -> bool:
        self.remove(req)
        return True


class PickQueue(Generic[R]):
    """A waiting list in arrival order, ordered by the scheduler's ``pick``; a preempted
    request rejoins at the back."""

    __slots__ = ("_scheduler", "_items", "_pos")

    def __init__(self, scheduler: EngineScheduler) -> None:
        self._scheduler = scheduler
        self._items: list[R] = []
        self._pos = 0

    def append(self, req: R) -> None:
        self._items.append(req)

    def requeue(self, req: R) -> None:
        self._items.append(req)

    def head(self, now: float) -> R:
        self._pos = self._scheduler.pick(self._items, now)
        return self._items[self._pos]

    def pop_head(self) -> None:
        del self._items[self._pos]

    def newcomer_may_lead(self) -> bool:
        return True

    def drop(self, req: QueuedRequest) -> bool:
        return False

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[R]:
        return iter(self._items)


class KeyedScheduler(EngineScheduler):
    """Admit the smallest static key first, preempt the largest: a heap, O(log n) per request.

    The key is computed once per request (``req.sched = (key, arrival, request_id)``)
    and kept across preemptions, so a preempted request rejoins by its key.
    """

    fcfs = False

    def key(self, req: QueuedRequest) -> float:
        raise NotImplementedError

    def make_queue(self, replica: SchedReplica[R]) -> WaitingQueue[R]:
        self._heap: list[tuple[SchedKey, QueuedRequest]] = []
        return cast("WaitingQueue[R]", self)   # the scheduler is the queue; it hands back what it is given

    def append(self, req: QueuedRequest) -> None:
        if req.sched is None:
            r = req.route
            req.sched = (self.key(req), r.arrival_s, r.request_id)
        heappush(self._heap, (req.sched, req))

    requeue = append

    def head(self, now: float) -> QueuedRequest:
        return self._heap[0][1]

    def pop_head(self) -> None:
        heappop(self._heap)

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[QueuedRequest]:
        return (req for _, req in self._heap)

    def victim(self, running: dict[R, None], now: float) -> R:
        return max(running, key=_sched_key)


def _sched_key(req: QueuedRequest) -> SchedKey:
    return cast(SchedKey, req.sched)   # set when the request first queued here


class PriorityScheduler(KeyedScheduler):
    """vLLM's priority scheduling: lower ``priority`` values first, then earlier arrivals."""

    name = "priority"
    summary = "vLLM priority scheduling: lowest trace priority value first, then arrival; preempt the least urgent."

    def key(self, req: QueuedRequest) -> float:
        return float(req.route.priority)


class PredictedShortestJobFirst(KeyedScheduler):
    """Shortest predicted output first, with linear aging.

    Each replica predicts a request's output length once, when it first queues
    there, with a :class:`KendallOracle` of quality ``tau`` (its own stream, seeded
    by ``seed`` and the replica's index). The key is the prediction minus
    ``aging`` tokens per second the request has waited; since every waiting
    request ages at the same rate, that order equals the static key
    ``prediction + aging x arrival``, so a heap keeps it. A request that
    arrived ``d`` seconds before another is served first unless its prediction
    exceeds the other's by more than ``aging x d``: aging bounds starvation.
    The preemption victim is the running request with the largest key.
    With ``predictor=FILE`` a trained predictor (``llmlb learn predictor``) replaces
    the oracle: it reads what the request's RouteRequest says at arrival, never its length.
    """

    name = "sjf"
    summary = "Shortest predicted output first (Kendall-tau oracle or trained predictor) with aging against starvation."
    params = {
        "tau": (0.5, "Kendall tau of the length predictor against the true output length"),
        "aging": (10.0, "predicted tokens forgiven per second of waiting (0 = pure SJF, may starve)"),
        "seed": (0, "seed of the predictor's noise (the run's seed unless given)"),
        "predictor": ("", "trained predictor file (llmlb learn predictor); replaces the tau oracle"),
    }

    def __init__(self, tau: float = 0.5, aging: float = 10.0, seed: int = 0, predictor: str = "") -> None:
        if not -1.0 <= tau <= 1.0:
            raise ValueError(f"tau must be in [-1, 1] (got {tau})")
        if aging < 0:
            raise ValueError(f"aging must be >= 0 (got {aging})")
        self.tau, self.aging, self.seed, self.predictor = tau, aging, seed, predictor
        if predictor:
            load_predictor(predictor)               # a bad predictor file fails here, before the run

    def make_queue(self, replica: SchedReplica[R]) -> WaitingQueue[R]:
        self._lengths = OutputLengths(self.tau, self.seed * 1_000_003 + replica.index, self.predictor)
        return super().make_queue(replica)

    def key(self, req: QueuedRequest) -> float:
        prediction: float = self._lengths.predict(req.route, req.out)
        return prediction + self.aging * float(req.route.arrival_s)


class DeadlineScheduler(KeyedScheduler):
    """Earliest deadline first; deadline = arrival + the TTFT target of the request's SLO class.

    EDF meets every deadline that any order can meet on one server when the
    load is feasible (Liu & Layland 1973); under overload it lets every request
    run late. The preemption victim is the running request with the latest deadline.
    """

    name = "deadline"
    summary = "Earliest deadline first: arrival + the TTFT target of the request's slo_class; preempt the latest."
    params = {
        "deadlines": ("", "TTFT target per class, e.g. 'interactive=0.5,batch=60' (slo_class=seconds)"),
        "deadline_s": (2.0, "TTFT target of classes not listed in deadlines"),
    }

    def __init__(self, deadlines: str = "", deadline_s: float = 2.0) -> None:
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 (got {deadline_s})")
        self.deadlines, self.deadline_s = deadlines, deadline_s
        self._by_class = parse_deadlines(deadlines)

    def key(self, req: QueuedRequest) -> float:
        r: RouteRequest = req.route
        return r.arrival_s + self._by_class.get(r.slo_class, self.deadline_s)


class VirtualTokenCounter(EngineScheduler):
    """VTC: serve the backlogged tenant that has received the least weighted service.

    Source: Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024
    (Algorithm 2) and its artifact's ``VTCReqQueue``. Each tenant ``u`` has a counter
    ``c_u`` of service received on this replica: ``input_weight`` x prompt tokens,
    added when a request is admitted (once: not again after a preemption), plus
    ``output_weight`` x each generated token. Admission takes the earliest waiting
    request of the tenant with the smallest counter among tenants with waiting
    requests. When a tenant's waiting queue goes from empty to non-empty, its
    counter is lifted to at least the smallest counter of the other tenants with
    waiting requests, so an idle tenant cannot bank service and then monopolise
    the engine. Preemption keeps vLLM's victim (the most recently admitted); a
    preempted request rejoins the head of its tenant's queue without a lift.

    Decode tokens are counted exactly even though the simulator jumps over runs of
    decode steps: a tenant's counter is ``base + output_weight x (n x (step + 1) -
    sum of step0)`` over its ``n`` decoding requests, settled into ``base`` when a
    request leaves the batch.
    """

    name = "vtc"
    summary = "Virtual Token Counter fairness (Sheng et al. OSDI'24): least-served backlogged tenant first."
    params = {
        "input_weight": (1.0, "service per prompt token"),
        "output_weight": (2.0, "service per generated token"),
    }
    fcfs = False

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        if input_weight < 0 or output_weight < 0:
            raise ValueError("input_weight and output_weight must be >= 0")
        self.input_weight, self.output_weight = input_weight, output_weight

    def make_queue(self, replica: SchedReplica[R]) -> WaitingQueue[R]:
        self._replica: SchedReplica[QueuedRequest] = replica
        self._queues: dict[str, deque[QueuedRequest]] = {}
        self._base: dict[str, float] = {}
        self._decoding: dict[str, int] = {}
        self._step0_sum: dict[str, int] = {}
        self._n = 0
        self._head_tenant = ""
        return cast("WaitingQueue[R]", self)   # the scheduler is the queue; it hands back what it is given

    def counter(self, tenant: str) -> float:
        """Service ``tenant`` has received on this replica so far."""
        n = self._decoding.get(tenant, 0)
        live = n * (self._replica.step + 1) - self._step0_sum.get(tenant, 0) if n else 0
        return self._base.get(tenant, 0.0) + self.output_weight * live

    def append(self, req: QueuedRequest) -> None:
        u = req.route.tenant
        q = self._queues.get(u)
        if q is None:
            q = self._queues[u] = deque()
            self._base[u] = 0.0
        if not q:
            others = [self.counter(v) for v, qv in self._queues.items() if qv and v != u]
            if others:
                lift = min(others) - self.counter(u)
                if lift > 0:
                    self._base[u] += lift
        q.append(req)
        self._n += 1

    def requeue(self, req: QueuedRequest) -> None:
        self._queues[req.route.tenant].appendleft(req)
        self._n += 1

    def head(self, now: float) -> QueuedRequest:
        best: tuple[float, float, int] | None = None
        for u, q in self._queues.items():
            if q:
                r = q[0].route
                k = (self.counter(u), r.arrival_s, r.request_id)
                if best is None or k < best:
                    best, self._head_tenant = k, u
        return self._queues[self._head_tenant][0]

    def pop_head(self) -> None:
        u = self._head_tenant
        req = self._queues[u].popleft()
        self._n -= 1
        if req.preemptions == 0 and req.computed == 0:     # first admission (not a KV hand-over either)
            self._base[u] += self.input_weight * req.prompt

    def clear(self) -> None:
        for q in self._queues.values():
            q.clear()
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[QueuedRequest]:
        return (req for q in self._queues.values() for req in q)

    def on_decode(self, req: QueuedRequest) -> None:
        u = req.route.tenant
        self._decoding[u] = self._decoding.get(u, 0) + 1
        self._step0_sum[u] = self._step0_sum.get(u, 0) + req.step0

    def on_tokens(self, req: QueuedRequest, prompt_tokens: int, output_tokens: int, now: float) -> None:
        u = req.route.tenant
        if req.step0 >= 0:          # leaving the batch: its live decode count moves into the base
            self._decoding[u] -= 1
            self._step0_sum[u] -= req.step0
        if output_tokens:
            self._base[u] = self._base.get(u, 0.0) + self.output_weight * output_tokens


#: Built-in engine schedulers by name (the order ``llmlb policies`` lists them in).
ENGINE_SCHEDULERS: dict[str, type[EngineScheduler]] = {
    c.name: c for c in (EngineScheduler, PriorityScheduler, PredictedShortestJobFirst, VirtualTokenCounter,
                        DeadlineScheduler)}
