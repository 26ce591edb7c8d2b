"""A trained routing policy, loaded from a plain-data policy file and run with a numpy forward pass.

The file (JSON, never pickle, never executed) is what ``llmlb learn train`` writes::

    {"format": "llmlb.policy", "version": 1,
     "features": {...},              # Features.layout(): field names, order, scaling
     "model": {"kind": "linear" | "mlp", "activation": "tanh",
               "layers": [{"weight": [[...], ...], "bias": [...]}, ...]},
     "objective": {...}, "training": {"trace": {"sha256", "rows", "spec"}, "seed", ...}}

The model scores every target from ``[its per-target features, the request's features]`` with
the *same* weights (one row per target), so one file routes any number of targets; the policy
sends the request to the healthy target with the highest score. Layers are ``weight`` of shape
``[out, in]`` and ``bias`` of ``[out]``; hidden layers use ``tanh``; the last layer has one output.

Every check happens when the file is loaded (``make_policy``), before any request: format and
version, the feature layout (:meth:`Features.from_layout` refuses another field order or
scaling), every layer's shape against the layout's width, finite numbers. Each failure is one
line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from itertools import chain
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TextIO, TypeAlias, TypedDict

from llmlb_bench.errors import UserError
from llmlb_bench.policies.base import Policy, RouteRequest, View
from llmlb_bench.policies.features import Features, Layout, LengthPredictor, unavailable
from llmlb_bench.policies.predictor import load_predictor
from llmlb_bench.lazy_import import lazy_module

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    np = lazy_module("numpy")   # loaded at first use: listing policies needs no numpy (start-up)

#: format name and version of a policy file (bumped when the meaning of a field changes)
FORMAT = "llmlb.policy"
VERSION = 1
#: model kinds: one layer (linear), or hidden tanh layers then one output (mlp)
KINDS = ("linear", "mlp")

Matrix: TypeAlias = "npt.NDArray[np.float64]"
Layers: TypeAlias = "list[tuple[Matrix, Matrix]]"


class LayerDoc(TypedDict):
    weight: list[list[float]]
    bias: list[float]


class ModelDoc(TypedDict):
    kind: str
    activation: str
    layers: list[LayerDoc]


class PolicyDoc(TypedDict):
    """A policy file as :func:`policy_document` writes it (see the module docstring); ``objective`` and
    ``training`` say what it was trained for and on, and are not read back."""

    format: str
    version: int
    features: Layout
    model: ModelDoc
    objective: dict[str, object]
    training: dict[str, object]


def n_params(n_in: int, hidden: Sequence[int]) -> int:
    """Number of weights of a scorer with ``n_in`` inputs and ``hidden`` tanh layers (empty: linear)."""
    sizes = [n_in, *hidden, 1]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def unflatten(vector: npt.NDArray[np.float64], n_in: int, hidden: Sequence[int]) -> Layers:
    """Cut a flat parameter vector (what a trainer searches over) into ``(weight, bias)`` layers."""
    sizes = [n_in, *hidden, 1]
    if vector.shape != (n_params(n_in, hidden),):
        raise ValueError(f"expected {n_params(n_in, hidden)} parameters, got shape {vector.shape}")
    layers: Layers = []
    k = 0
    for a, b in zip(sizes[:-1], sizes[1:]):
        w = vector[k:k + a * b].reshape(b, a)
        k += a * b
        layers.append((w, vector[k:k + b]))
        k += b
    return layers


def forward(layers: Layers, x: Matrix) -> Matrix:
    """Scores ``[n]`` for inputs ``x`` ``[n, in]``: tanh between layers, none after the last."""
    h = x
    last = len(layers) - 1
    for j, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if j < last:
            h = np.tanh(h)
    return h[:, 0]


def policy_document(layout: Layout, layers: Layers, *, objective: Mapping[str, object],
                    training: Mapping[str, object]) -> PolicyDoc:
    """The plain-data policy file for trained ``layers`` (see the module docstring)."""
    return {
        "format": FORMAT, "version": VERSION,
        "features": layout.copy(),
        "model": {"kind": "linear" if len(layers) == 1 else "mlp", "activation": "tanh",
                  "layers": [{"weight": w.tolist(), "bias": b.tolist()} for w, b in layers]},
        "objective": dict(objective),
        "training": dict(training),
    }


def _matrix(value: object, shape: tuple[int, ...], what: str, where: str) -> Matrix:
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise UserError(f"{what} is not an array of numbers", where) from None
    if a.shape != shape:
        raise UserError(f"{what} has shape {list(a.shape)}; the feature layout needs {list(shape)}", where)
    if not np.isfinite(a).all():
        raise UserError(f"{what} holds a value that is not finite", where)
    return a


def read_layers(model: object, n_in: int, where: str) -> Layers:
    """The model's layers, every shape checked against ``n_in`` inputs and one output."""
    if not isinstance(model, Mapping):
        raise UserError("'model' is not an object", where)
    kind, activation, raw = model.get("kind"), model.get("activation", "tanh"), model.get("layers")
    if kind not in KINDS:
        raise UserError(f"model kind {kind!r} is not one of {', '.join(KINDS)}", where)
    if activation != "tanh":
        raise UserError(f"activation {activation!r} is not supported (tanh)", where)
    if not isinstance(raw, list) or not raw or (kind == "linear") != (len(raw) == 1):
        raise UserError(f"a {kind} model needs {'one layer' if kind == 'linear' else 'two or more layers'}", where)
    layers: Layers = []
    width = n_in
    for j, layer in enumerate(raw):
        if not isinstance(layer, Mapping) or "weight" not in layer or "bias" not in layer:
            raise UserError(f"layer {j} lacks 'weight' or 'bias'", where)
        out = 1 if j == len(raw) - 1 else len(layer["bias"]) if isinstance(layer["bias"], list) else -1
        if out < 1:
            raise UserError(f"layer {j}: 'bias' is not a non-empty list", where)
        w = _matrix(layer["weight"], (out, width), f"layer {j} weight", where)
        b = _matrix(layer["bias"], (out,), f"layer {j} bias", where)
        layers.append((w, b))
        width = out
    return layers


def load_policy_file(path: Path, predictor: LengthPredictor | None = None
                     ) -> tuple[dict[str, object], Features, Layers]:
    """Read and check a policy file; returns the document, its features and its layers. A layout
    with ``predicted_output`` needs ``predictor`` (one line naming the file otherwise)."""
    where = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError("no such policy file", where) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"not a readable JSON policy file ({type(exc).__name__})", where) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UserError(f"not an llmlb policy file (format {FORMAT!r} expected)", where)
    if doc.get("version") != VERSION:
        raise UserError(f"policy file version {doc.get('version')!r}; this llmlb reads version {VERSION}", where)
    layout = doc.get("features")
    if not isinstance(layout, dict):
        raise UserError("'features' is not a feature layout", where)
    feats = Features.from_layout(layout, predictor=predictor, where=where)
    n_in = len(feats.target_names) + len(feats.request_names)
    return doc, feats, read_layers(doc.get("model"), n_in, where)


class LearnedPolicy(Policy):
    """Scores each healthy target with a trained model; the highest score wins (see the module docstring)."""

    name = "learned"
    summary = "A trained policy file (llmlb learn train): a linear or MLP scorer over the features of each target."
    params = {"path": ("", "policy file (JSON) written by llmlb learn train"),
              "predictor": ("", "length predictor file (llmlb learn predictor) for a policy trained with "
                                "the predicted_output feature"),
              "log": ("", "append each decision's observation and choice to this file (JSON lines), to audit "
                          "a deployment offline")}

    _log: TextIO | None

    def __init__(self, path: str = "", predictor: str = "", log: str = "") -> None:
        if not path:
            raise ValueError("give path=FILE (a policy file written by llmlb learn train)")
        self.predictor = predictor
        length = load_predictor(predictor) if predictor else None
        document, features, layers = load_policy_file(Path(path), length)
        self._setup(path, document, features.layout(), layers, length)
        self.log = log
        if log:
            try:
                self._log = open(log, "a", encoding="utf-8", buffering=1)   # noqa: SIM115 (lives with the policy)
            except OSError as exc:
                raise UserError(f"cannot write the decision log ({exc.strerror})", log) from None

    @classmethod
    def from_model(cls, layers: Layers, features: Features) -> "LearnedPolicy":
        """A policy of ``layers`` over ``features`` without a file (a trainer's candidate: the same
        forward pass as the file it may become)."""
        policy = cls.__new__(cls)
        policy.predictor = ""
        policy._setup("", {}, features.layout(), layers, features.predictor)
        return policy

    def _setup(self, path: str, document: Mapping[str, object], layout: Layout, layers: Layers,
               length: LengthPredictor | None = None) -> None:
        self.path = path
        self.document = document
        self._layout = layout
        self._layers = layers
        self._length = length
        self._features: Features | None = None
        self._tie = 0
        self.log = ""
        self._log = None

    def unavailable(self, have: set[str]) -> list[str]:
        """The features of this policy's layout that a backend publishing only the sources in ``have``
        (besides own accounting, static facts, the request and prefixes) cannot fill."""
        names = [f["name"] for f in chain(self._layout["per_target"], self._layout["per_request"])]
        return unavailable(names, have)

    def features(self, view: View) -> Features:
        """The run's features, built at the first decision (they need the view: number of targets,
        whether it publishes KV events)."""
        if self._features is None:
            self._features = Features.from_layout(self._layout, view, predictor=self._length,
                                                  where=self.path or "policy")
        return self._features

    def scores(self, req: RouteRequest, view: View) -> Matrix:
        """The model's score of every target for ``req`` now (higher is better)."""
        feats = self.features(view)
        return self.score_features(feats.targets(req, view), feats.request(req))

    def score_features(self, targets: npt.NDArray[Any], request: npt.NDArray[Any]) -> Matrix:
        """Scores from the observation itself: per-target rows ``[n, k]`` and the request's features."""
        x = np.empty((targets.shape[0], targets.shape[1] + request.shape[0]), dtype=np.float64)
        x[:, :targets.shape[1]] = targets
        x[:, targets.shape[1]:] = request
        return forward(self._layers, x)

    @staticmethod
    def pick(scores: Matrix, healthy: Sequence[bool], tie: int) -> int:
        """The healthy target with the highest score; equal scores (identical targets, e.g. an idle
        fleet) go to the first at or after ``tie`` (mod n), so they rotate rather than all fill target 0."""
        s = scores.copy()
        ok = np.asarray(healthy, dtype=bool)
        if ok.any():
            s[~ok] = -np.inf
        n = len(s)
        order = (np.arange(n) + tie) % n
        return int(order[int(np.argmax(s[order]))])

    def choose(self, req: RouteRequest, view: View) -> int:
        feats = self.features(view)
        t, r = feats.targets(req, view), feats.request(req)
        self._tie += 1
        target = self.pick(self.score_features(t, r), view.healthy, self._tie)
        feats.record(req, target, view.now)
        if self._log is not None:
            self._log.write(json.dumps({"request_id": req.request_id, "now": view.now, "targets": t.tolist(),
                                        "request": r.tolist(), "healthy": list(view.healthy), "tie": self._tie,
                                        "target": target}) + "\n")
        return target


def check_sources(policy: object, have: set[str], where: str) -> None:
    """Refuse, before any work, a learned policy whose features need a source the backend will not
    publish (e.g. scraped queues and KV use when scraping is off): it was trained on values it
    would see as zeros."""
    if isinstance(policy, LearnedPolicy):
        missing = policy.unavailable(have)
        if missing:
            raise UserError(f"policy file {policy.path} needs {', '.join(missing)}, which this backend cannot fill "
                            f"without scraping the engines' metrics", where)
