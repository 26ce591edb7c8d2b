"""The observation features shared by the learning environment and the learned policies.

A policy trained in the environment (``llmlb_bench.learn``) and the same policy
deployed behind ``llmlb route`` must see the *same numbers in the same order*,
or the trained weights mean nothing. This module is that one definition: a
fixed, named layout of

* **per-target** fields, one row per target of the :class:`View` (what a
  router can know about each replica or endpoint at the decision), and
* **per-request** fields (what it knows about the request at arrival),

each with a fixed scaling, and :meth:`Features.layout` to store the layout in
a policy file and :meth:`Features.from_layout` to rebuild (and check) it when
the file is loaded. Only numpy; nothing from training libraries.

Per-target fields (``PER_TARGET``), in this order:

================================  ===========  ==========  ========================================
name                              transform    scale       meaning (source)
================================  ===========  ==========  ========================================
``waiting``                       log1p        1           engine queue length (scraped)
``running``                       log1p        1           engine running batch (scraped)
``outstanding_requests``          log1p        1           router's own in-flight requests (own)
``outstanding_tokens``            log1p        1000        own in-flight prompt + max output tokens
``kv_usage``                      linear       1           KV-cache blocks in use, 0..1 (scraped)
``prefix_match``                  linear       1           fraction of this request's prefix blocks
                                                           the target holds (KV events, else the
                                                           router's approximate index)
``adapter_resident``              linear       1           1: the request's LoRA adapter is in the
                                                           running batch, 0.5: only queued, 0: not
                                                           there or a base-model request (adapters)
``adapter_slots_free``            linear       1           free adapter slots / max_loras (adapters)
``signal_age_s``                  linear       1           seconds since the scraped signals were
                                                           read (scraped)
``healthy``                       linear       1           1 healthy, 0 not (own)
``capacity``                      linear       1           relative serving capacity (static)
================================  ===========  ==========  ========================================

Per-request fields (``PER_REQUEST``): ``input_tokens`` (log1p, 1000), ``max_output_tokens``
(log1p, 1000), ``prefix_blocks`` (log1p, 1: the prompt's prefix-hash blocks), ``priority``
(linear), ``in_session`` (1 when it belongs to a conversation), ``has_adapter`` (1 when it names
a LoRA adapter), ``predicted_output`` (log1p, 1000: a length predictor's output tokens; only with
a predictor), ``turn`` (log1p: the conversation turn, 0 outside conversations), and one
``slo_class=NAME`` indicator per class given in ``slo_classes``, then one ``kind=NAME`` indicator
per workload kind given in ``kinds``.

A field's value is ``raw / scale`` (linear) or ``log1p(raw / scale)`` (log1p): counts and
token totals span orders of magnitude, and a log keeps one weight meaningful across them.

*Sources*: each field says where its raw value comes from (``FIELD_SOURCES``): ``own`` (the
router's own accounting, every backend), ``static`` (target facts), ``scraped`` (engine metrics:
zero where a backend scrapes nothing), ``prefix`` (KV events or the router's own index:
always available), ``adapters`` (published adapter state), ``predictor`` (a length predictor).
:func:`unavailable` lists the fields a backend without some sources cannot fill, so a policy
file that needs them is refused with one line before work.
"""

from __future__ import annotations

from math import log1p
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence, TypeAlias, TypedDict

from llmlb_bench.errors import UserError
from llmlb_bench.policies.base import RouteRequest, View
from llmlb_bench.policies.prefix_index import PrefixIndex
from llmlb_bench.lazy_import import lazy_module

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    np = lazy_module("numpy")   # loaded at first use: listing policies needs no numpy (start-up)

#: format name and version of :meth:`Features.layout` (bumped when a field's meaning changes)
FORMAT = "llmlb.features"
VERSION = 1

Array: TypeAlias = "npt.NDArray[np.float32]"
#: a per-target field's values for a request on a View of ``n`` targets
TargetGetter = Callable[[RouteRequest, View, int], Sequence[float]]


class FieldDoc(TypedDict):
    """A field as a layout stores it (:meth:`Field.to_dict`)."""

    name: str
    transform: str
    scale: float
    source: str


class Layout(TypedDict):
    """:meth:`Features.layout`: every field, its order and scaling, stored with a trained policy."""

    format: str
    version: int
    per_target: list[FieldDoc]
    per_request: list[FieldDoc]
    prefix_source: str


@dataclass(frozen=True, slots=True)
class Field:
    """One feature: its name, how its raw value is scaled, and where the raw value comes from."""

    name: str
    transform: str      # "linear" (raw / scale) or "log1p" (log1p(raw / scale))
    scale: float
    source: str         # own, static, scraped, prefix, adapters, predictor, request

    def to_dict(self) -> FieldDoc:
        return {"name": self.name, "transform": self.transform, "scale": self.scale, "source": self.source}


_TARGET_FIELDS = (
    Field("waiting", "log1p", 1.0, "scraped"),
    Field("running", "log1p", 1.0, "scraped"),
    Field("outstanding_requests", "log1p", 1.0, "own"),
    Field("outstanding_tokens", "log1p", 1000.0, "own"),
    Field("kv_usage", "linear", 1.0, "scraped"),
    Field("prefix_match", "linear", 1.0, "prefix"),
    Field("adapter_resident", "linear", 1.0, "adapters"),
    Field("adapter_slots_free", "linear", 1.0, "adapters"),
    Field("signal_age_s", "linear", 1.0, "scraped"),
    Field("healthy", "linear", 1.0, "own"),
    Field("capacity", "linear", 1.0, "static"),
)
_REQUEST_FIELDS = (
    Field("input_tokens", "log1p", 1000.0, "request"),
    Field("max_output_tokens", "log1p", 1000.0, "request"),
    Field("prefix_blocks", "log1p", 1.0, "request"),
    Field("priority", "linear", 1.0, "request"),
    Field("in_session", "linear", 1.0, "request"),
    Field("turn", "log1p", 1.0, "request"),
    Field("has_adapter", "linear", 1.0, "request"),
    Field("predicted_output", "log1p", 1000.0, "predictor"),
)
#: every per-target field, in layout order
PER_TARGET: tuple[str, ...] = tuple(f.name for f in _TARGET_FIELDS)
#: every fixed per-request field, in layout order (``slo_class=NAME`` indicators follow them)
PER_REQUEST: tuple[str, ...] = tuple(f.name for f in _REQUEST_FIELDS)
#: field name -> the source of its raw value (see the module docstring)
FIELD_SOURCES: dict[str, str] = {f.name: f.source for f in _TARGET_FIELDS + _REQUEST_FIELDS}
_BY_NAME: dict[str, Field] = {f.name: f for f in _TARGET_FIELDS + _REQUEST_FIELDS}
_CLASS_PREFIX = "slo_class="
_KIND_PREFIX = "kind="
#: how ``prefix_match`` is measured: KV events when the view has them, else the own index ("auto");
#: always the router's own index ("index"); KV events only ("events": refused where there are none)
PREFIX_SOURCES = ("auto", "index", "events")


class LengthPredictor(Protocol):
    """What ``predicted_output`` needs: predicted output tokens of a request from what is known at arrival."""

    def predict(self, req: RouteRequest) -> float: ...


def unavailable(fields: Sequence[str], have: set[str]) -> list[str]:
    """The fields among ``fields`` whose source is not in ``have`` (``own``, ``static``, ``request``
    and ``prefix`` are always available; pass e.g. ``{"scraped", "adapters"}`` for the rest)."""
    always = {"own", "static", "request", "prefix"}
    return [f for f in fields if FIELD_SOURCES.get(f, "request") not in always | have]


class Features:
    """A fixed selection of fields, computed for one decision at a time (see the module docstring).

    ``fields``: the names to use (per-target and per-request mixed; layout order is kept, not the
    order given); default: every per-target and per-request field, less ``predicted_output`` when
    there is no predictor. ``slo_classes`` / ``kinds``: one ``slo_class=NAME`` / ``kind=NAME``
    request indicator per name.
    Call :meth:`record` after each decision so the own prefix index knows where prefixes went.
    """

    __slots__ = ("target_fields", "request_fields", "slo_classes", "kinds", "predictor", "prefix_source", "_index",
                 "_match", "_tcols", "_rcols", "_tplan", "_rget")

    def __init__(self, view: View | None = None, *, fields: Sequence[str] | None = None,
                 predictor: LengthPredictor | None = None, slo_classes: Sequence[str] = (), kinds: Sequence[str] = (),
                 prefix_source: str = "auto", where: str = "features") -> None:
        if prefix_source not in PREFIX_SOURCES:
            raise UserError(f"unknown prefix source {prefix_source!r} (known: {', '.join(PREFIX_SOURCES)})", where)
        if fields is None:
            fields = PER_TARGET + tuple(f for f in PER_REQUEST if f != "predicted_output" or predictor is not None)
        unknown = [f for f in fields if f not in _BY_NAME]
        if unknown:
            raise UserError(f"unknown feature {unknown[0]!r} (known: {', '.join(_BY_NAME)})", where)
        if "predicted_output" in fields and predictor is None:
            raise UserError("feature 'predicted_output' needs a length predictor; none is configured", where)
        for what, names in (("slo_classes", slo_classes), ("kinds", kinds)):
            if len(set(names)) != len(names):
                raise UserError(f"{what} names a value twice", where)
        if prefix_source == "events" and view is not None and view.cached_prefix is None:
            raise UserError("prefix_match from KV events, but this backend publishes none", where)
        wanted = set(fields)
        self.target_fields = tuple(f for f in _TARGET_FIELDS if f.name in wanted)
        self.request_fields = tuple(f for f in _REQUEST_FIELDS if f.name in wanted)
        self.slo_classes = tuple(slo_classes)
        self.kinds = tuple(kinds)
        self.predictor = predictor
        self.prefix_source = prefix_source
        self._index = PrefixIndex()
        self._match: list[int] = []
        self._tcols = tuple(f.name for f in self.target_fields)
        self._rcols = tuple(f.name for f in self.request_fields)
        # per field: the raw getter; targets scale as one [fields, n] array, requests as scalars
        self._tplan = [_scaled(self._target_getter(f.name), f) for f in self.target_fields]
        self._rget = [(self._request_getter(f.name), log1p if f.transform == "log1p" else None, f.scale)
                      for f in self.request_fields]

    # ---- names and layout ---------------------------------------------------------------------------

    @property
    def target_names(self) -> tuple[str, ...]:
        """The columns of :meth:`targets`."""
        return self._tcols

    @property
    def request_names(self) -> tuple[str, ...]:
        """The entries of :meth:`request`."""
        return (self._rcols + tuple(_CLASS_PREFIX + c for c in self.slo_classes)
                + tuple(_KIND_PREFIX + k for k in self.kinds))

    def layout(self) -> Layout:
        """Plain data naming every field, its order and scaling: stored with a trained policy and
        checked by :meth:`from_layout` when it is loaded."""
        return {
            "format": FORMAT, "version": VERSION,
            "per_target": [f.to_dict() for f in self.target_fields],
            "per_request": [f.to_dict() for f in self.request_fields]
            + [{"name": name, "transform": "linear", "scale": 1.0, "source": "request"}
               for name in self.request_names[len(self._rcols):]],
            "prefix_source": self.prefix_source,
        }

    @classmethod
    def from_layout(cls, layout: Mapping[str, object], view: View | None = None, *,
                    predictor: LengthPredictor | None = None, where: str = "features") -> "Features":
        """The features a stored :meth:`layout` describes; a layout of another format, version,
        order or scaling than this code computes is refused with one line naming ``where``."""
        if not isinstance(layout, Mapping) or layout.get("format") != FORMAT:
            raise UserError(f"not a feature layout (format {FORMAT!r} expected)", where)
        if layout.get("version") != VERSION:
            raise UserError(f"feature layout version {layout.get('version')!r}; this llmlb computes "
                            f"version {VERSION}", where)
        per_target, per_request = layout.get("per_target"), layout.get("per_request")
        try:
            if not isinstance(per_target, list) or not isinstance(per_request, list):
                raise TypeError
            targets = [str(f["name"]) for f in per_target]
            requests = [str(f["name"]) for f in per_request]
            prefix_source = str(layout.get("prefix_source", "auto"))
        except (KeyError, TypeError):
            raise UserError("feature layout lacks per_target / per_request field lists", where) from None
        classes = [r[len(_CLASS_PREFIX):] for r in requests if r.startswith(_CLASS_PREFIX)]
        kinds = [r[len(_KIND_PREFIX):] for r in requests if r.startswith(_KIND_PREFIX)]
        plain = [r for r in requests if not r.startswith((_CLASS_PREFIX, _KIND_PREFIX))]
        feats = cls(view, fields=targets + plain, predictor=predictor, slo_classes=classes, kinds=kinds,
                    prefix_source=prefix_source, where=where)
        if feats.layout() != dict(layout):
            raise UserError("feature layout differs from what this llmlb computes (field order or scaling)", where)
        return feats

    # ---- values ---------------------------------------------------------------------------------------

    def targets(self, req: RouteRequest, view: View) -> Array:
        """float32 ``[len(view), n_target_fields]``: the scaled per-target fields for ``req`` now."""
        cols = self.target_columns(req, view)
        k, n = len(cols), len(view.targets)
        out: Array = np.fromiter(chain.from_iterable(cols), np.float32, k * n).reshape(k, n).T
        return out

    def target_columns(self, req: RouteRequest, view: View) -> list[Sequence[float]]:
        """The scaled per-target fields as one sequence of ``len(view)`` numbers per field, in layout
        order: what :meth:`targets` stacks, for callers that pack several arrays into one buffer.

        Plain Python over a few short lists: for the handful of targets of a fleet this is cheaper
        than numpy's per-call overhead (it runs once per decision)."""
        n = len(view.targets)
        return [get(req, view, n) for get in self._tplan]

    def request(self, req: RouteRequest) -> Array:
        """float32 ``[n_request_fields]``: the scaled per-request fields of ``req``."""
        return np.array(self.request_values(req), dtype=np.float32)

    def request_values(self, req: RouteRequest) -> list[float]:
        """:meth:`request` as a list."""
        vals = [f(get(req) / s) if f is not None else get(req) / s for get, f, s in self._rget]
        if self.slo_classes:
            vals.extend(1.0 if req.slo_class == c else 0.0 for c in self.slo_classes)
        if self.kinds:
            vals.extend(1.0 if req.kind == k else 0.0 for k in self.kinds)
        return vals

    def record(self, req: RouteRequest, target: int, now: float) -> None:
        """``req`` was sent to ``target``: the own prefix index remembers its prefix there."""
        if req.prefix_hashes and self.prefix_source != "events":
            self._index.ensure(target + 1)
            self._index.insert(req.prefix_hashes, target, now)

    def _target_getter(self, name: str) -> TargetGetter:
        """The raw value of a per-target field as a sequence of ``n`` numbers."""
        if name in _VIEW_LISTS:
            return _VIEW_LISTS[name]
        return {"capacity": _capacity, "signal_age_s": _signal_age, "prefix_match": self._prefix_match,
                "adapter_resident": _adapter_resident, "adapter_slots_free": _adapter_slots_free}[name]

    def _prefix_match(self, req: RouteRequest, view: View, n: int) -> Sequence[float]:
        hashes = req.prefix_hashes
        if not hashes:
            return [0.0] * n
        events = view.cached_prefix
        k = len(hashes)
        if events is not None and self.prefix_source != "index":
            return [events(i, hashes) / k for i in range(n)]
        if self.prefix_source == "events":
            raise UserError("prefix_match from KV events, but this backend publishes none", "features")
        if len(self._match) != n:
            self._match = [0] * n
        self._index.ensure(n)
        self._index.match(hashes, self._match)
        return [m / k for m in self._match]

    def _request_getter(self, name: str) -> Callable[[RouteRequest], float]:
        """The raw value of a per-request field."""
        if name == "predicted_output":
            predictor = self.predictor
            assert predictor is not None        # checked in __init__
            return lambda req: max(float(predictor.predict(req)), 0.0)
        return _REQUEST_GETTERS[name]


def _scaled(get: TargetGetter, f: Field) -> TargetGetter:
    """``get`` with ``f``'s scaling applied (the raw getter itself for a plain linear field): one call
    per field and decision, no per-field branching."""
    inv = 1.0 / f.scale
    if f.transform == "log1p":
        if inv == 1.0:
            return lambda req, view, n: list(map(log1p, get(req, view, n)))
        return lambda req, view, n: [log1p(v * inv) for v in get(req, view, n)]
    if inv != 1.0:
        return lambda req, view, n: [v * inv for v in get(req, view, n)]
    return get


#: fields that are one of the View's own lists, as they are
_VIEW_LISTS: dict[str, TargetGetter] = {
    "waiting": lambda req, view, n: view.waiting,
    "running": lambda req, view, n: view.running,
    "outstanding_requests": lambda req, view, n: view.outstanding_requests,
    "outstanding_tokens": lambda req, view, n: view.outstanding_tokens,
    "kv_usage": lambda req, view, n: view.kv_usage,
    "healthy": lambda req, view, n: view.healthy,
}


def _capacity(req: RouteRequest, view: View, n: int) -> Sequence[float]:
    return [t.capacity for t in view.targets]


def _signal_age(req: RouteRequest, view: View, n: int) -> Sequence[float]:
    now = view.now
    return [now - t if now > t else 0.0 for t in view.signal_time]


def _adapter_resident(req: RouteRequest, view: View, n: int) -> Sequence[float]:
    a = req.adapter
    if a is None or not any(view.adapters):
        return [0.0] * n
    return [0.0 if s is None else 1.0 if a in s.running else 0.5 if a in s.waiting else 0.0
            for s in view.adapters]


def _adapter_slots_free(req: RouteRequest, view: View, n: int) -> Sequence[float]:
    if not any(view.adapters):
        return [0.0] * n
    return [0.0 if s is None or s.max_loras <= 0
            else max(s.max_loras - len(set(s.running) | set(s.waiting)), 0) / s.max_loras
            for s in view.adapters]


_REQUEST_GETTERS: dict[str, Callable[[RouteRequest], float]] = {
    "input_tokens": lambda req: float(req.input_tokens),
    "max_output_tokens": lambda req: float(req.max_output_tokens),
    "prefix_blocks": lambda req: float(len(req.prefix_hashes)),
    "priority": lambda req: float(req.priority),
    "in_session": lambda req: 0.0 if req.session_id is None else 1.0,
    "turn": lambda req: float(req.turn or 0),
    "has_adapter": lambda req: 0.0 if req.adapter is None else 1.0,
}
