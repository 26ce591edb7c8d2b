"""A trained output-length predictor, evaluated in numpy from a plain JSON file.

The predictive policies (``least_predicted_work``, ``predicted_sjf``) and the engine's
``sjf`` scheduler order or weigh requests by their predicted output length. Besides the
Kendall-tau oracle (:mod:`llmlb_bench.policies.oracle`), which reads the true length and
adds calibrated noise, they accept a predictor trained by ``llmlb learn predictor``
(:mod:`llmlb_bench.learn.predictor`): a LightGBM tree ensemble over what is known when a
request arrives. Its file is our own JSON (never pickle, never executed): the feature
names and encodings, the trees as flat arrays, and how a tree score becomes tokens. This
module reads it, checks every array before any work, and walks the trees in numpy, so
inference needs neither LightGBM nor anything else of the training stack.

Features (:data:`NUMERIC`, :data:`CATEGORICAL`) come from the
:class:`~llmlb_bench.policies.base.RouteRequest` alone, the same object in the simulator,
``llmlb serve``, the replayer and ``llmlb route``, so training and inference cannot read a
request differently. The requested ``max_output_tokens`` is deliberately not a feature:
in a trace replay it *is* the true output length.

Tree walk (LightGBM's own decision rules, so the numpy sum equals LightGBM's raw score):
numeric split ``x <= threshold`` goes left; a missing value (NaN, or also zero where the
split's missing type is "zero") goes the split's default way; with missing type "none" a
NaN is read as 0. A categorical split goes left when the category's code is in the split's
set; a negative code (a category unseen in training) or NaN goes right.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence, TypedDict

from llmlb_bench.errors import UserError
from llmlb_bench.policies.base import RouteRequest
from llmlb_bench.policies.oracle import KendallOracle
from llmlb_bench.lazy_import import lazy_module

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")   # loaded at first use: listing policies needs no numpy (start-up)

FORMAT = "llmlb-predictor"
VERSION = 1
OBJECTIVES = ("regression", "rank")
#: numeric features of a request, in this order (turn: NaN outside conversations)
NUMERIC: tuple[str, ...] = ("input_tokens", "priority", "turn", "in_session")
#: categorical features, encoded by the file's category lists (unseen categories: -1)
CATEGORICAL: tuple[str, ...] = ("tenant", "slo_class", "adapter", "kind")
ALL_FEATURES: tuple[str, ...] = NUMERIC + CATEGORICAL
#: the adapter value of a request that names none (the base model)
BASE_MODEL = ""
_MISSING = {"none": 0, "zero": 1, "nan": 2}
_ZERO = 1e-35          # LightGBM's kZeroThreshold: |x| below it counts as zero
_CHUNK = 256           # rows evaluated together (a chunk holds rows x nodes decisions)


class _Categories(TypedDict, total=False):
    categories: list[str]


class FeatureDoc(_Categories):
    """A feature of the file: its name, and a categorical one's categories (their order is the code)."""

    name: str


class TreeDoc(TypedDict):
    """One tree as flat preorder arrays, one entry per node (a leaf has feature -1 and its value)."""

    feature: list[int]
    threshold: list[float]
    left: list[int]
    right: list[int]
    default_left: list[bool]
    missing: list[str]
    categories: list[list[int] | None]
    value: list[float]


class _RankCalibration(TypedDict, total=False):
    score: list[float]
    tokens: list[float]


class OutputDoc(_RankCalibration):
    """How a score becomes tokens: clipped to the range, and (rank models) mapped through score -> tokens."""

    min_tokens: float
    max_tokens: float


class HeldoutFigures(TypedDict):
    """How well the predictor ranks and sizes rows it did not see (``learn.predictor.evaluate``)."""

    rows: int
    kendall_tau: float | None
    window_tau: float | None
    window: int
    mae_tokens: float | None


class HeldoutScale(HeldoutFigures, total=False):
    median_mae_tokens: float | None


class _Trained(TypedDict, total=False):
    training: dict[str, object]
    heldout: HeldoutScale


class PredictorDoc(_Trained):
    """A predictor file as ``llmlb learn predictor`` writes it (see the module docstring); ``training`` and
    ``heldout`` say what it was fitted on and how well it did, and are not read back."""

    format: str
    version: int
    objective: str
    features: list[FeatureDoc]
    trees: list[TreeDoc]
    output: OutputDoc


def raw_features(req: RouteRequest) -> dict[str, float | str]:
    """Every feature of ``req`` by name, before encoding (what is known when it arrives)."""
    return {
        "input_tokens": float(req.input_tokens),
        "priority": float(req.priority),
        "turn": math.nan if req.turn is None else float(req.turn),
        "in_session": 0.0 if req.session_id is None else 1.0,
        "tenant": req.tenant,
        "slo_class": req.slo_class,
        "adapter": BASE_MODEL if req.adapter is None else req.adapter,
        "kind": req.kind,
    }


@dataclass(frozen=True)
class Feature:
    """One input column of the model: a name and, for a categorical one, its codes."""

    name: str
    categories: tuple[str, ...] | None = None     # None: numeric
    codes: Mapping[str, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.categories is not None:
            object.__setattr__(self, "codes", {c: float(k) for k, c in enumerate(self.categories)})

    def encode(self, value: float | str) -> float:
        if self.categories is None:
            return float(value)
        return self.codes.get(str(value), -1.0)


class Predictor:
    """A loaded predictor: :meth:`predict` gives a request's predicted output tokens."""

    def __init__(self, doc: Mapping[str, object], where: str | Path) -> None:
        self.where = str(where)
        self.doc = doc
        _check(isinstance(doc, Mapping), "not a JSON object", where)
        _check(doc.get("format") == FORMAT, f"not an llmlb predictor (format {doc.get('format')!r}, "
                                            f"expected {FORMAT!r})", where)
        _check(doc.get("version") == VERSION, f"predictor version {doc.get('version')!r} is not supported "
                                              f"(this llmlb reads version {VERSION})", where)
        self.objective = doc.get("objective")
        _check(self.objective in OBJECTIVES, f"unknown objective {self.objective!r} "
                                             f"(objectives: {', '.join(OBJECTIVES)})", where)
        self.features = _features(doc.get("features"), where)
        self._trees(doc.get("trees"), where)
        out = doc.get("output")
        if not isinstance(out, Mapping):
            raise UserError("missing 'output' (how a score becomes tokens)", where)
        lo, hi = _number(out.get("min_tokens"), "output.min_tokens", where), _number(out.get("max_tokens"),
                                                                                   "output.max_tokens", where)
        _check(1 <= lo <= hi, f"output token range [{lo:g}, {hi:g}] is empty or below 1", where)
        self.min_tokens, self.max_tokens = lo, hi
        self._cal_score: np.ndarray | None = None
        self._cal_tokens: np.ndarray | None = None
        if self.objective == "rank":
            self._cal_score = _array(out.get("score"), "output.score", where)
            self._cal_tokens = _array(out.get("tokens"), "output.tokens", where)
            _check(len(self._cal_score) >= 2 and len(self._cal_score) == len(self._cal_tokens),
                   "output.score and output.tokens must have the same length (at least 2)", where)
            _check(bool(np.all(np.diff(self._cal_score) > 0)), "output.score must be strictly increasing", where)

    # ---- loading ------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> "Predictor":
        """Read and check a predictor file; every problem is one :class:`UserError` line."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError("predictor file not found", p) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read predictor file: {exc}", p) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"not valid JSON: {exc}", p) from None
        return cls(doc, p)

    def _trees(self, trees: object, where: str | Path) -> None:
        """Flatten the trees into one node table; children always follow their parent
        (checked), so every walk ends within the deepest tree's depth."""
        if not (isinstance(trees, list) and len(trees) > 0):
            raise UserError("'trees' must be a non-empty list", where)
        feat: list[int] = []
        thr: list[float] = []
        left: list[int] = []
        right: list[int] = []
        dleft: list[bool] = []
        miss: list[int] = []
        catrow: list[int] = []
        leaf: list[float] = []
        cats: list[list[int]] = []
        roots: list[int] = []
        depth = 1
        n_features = len(self.features)
        for k, t in enumerate(trees):
            name = f"trees[{k}]"
            if not isinstance(t, Mapping):
                raise UserError(f"{name} is not an object", where)
            f = _ints(t.get("feature"), f"{name}.feature", where)
            n = len(f)
            _check(n >= 1, f"{name} has no nodes", where)
            cols: dict[str, list[object]] = {}
            for key in ("threshold", "left", "right", "default_left", "missing", "categories", "value"):
                col = t.get(key)
                if not (isinstance(col, list) and len(col) == n):
                    raise UserError(f"{name}.{key} must be a list of {n} values", where)
                cols[key] = col
            base = len(feat)
            roots.append(base)
            lft, rgt = _ints(cols["left"], f"{name}.left", where), _ints(cols["right"], f"{name}.right", where)
            value = _array(cols["value"], f"{name}.value", where)
            tdepth = [1] * n
            for i in range(n):
                fi = f[i]
                _check(-1 <= fi < n_features, f"{name}: node {i} splits on feature {fi}, the file has "
                                              f"{n_features} features", where)
                if fi >= 0:
                    _check(i < lft[i] < n and i < rgt[i] < n, f"{name}: node {i}'s children must follow it "
                                                              "within the tree", where)
                    tdepth[lft[i]] = tdepth[rgt[i]] = tdepth[i] + 1
                mtype = _MISSING.get(str(cols["missing"][i]), -1)
                _check(mtype >= 0, f"{name}: node {i} has missing type {cols['missing'][i]!r} "
                                   "(none, zero or nan)", where)
                c = cols["categories"][i]
                if fi >= 0 and c is not None:
                    _check(self.features[fi].categories is not None,
                           f"{name}: node {i} makes a categorical split on numeric feature "
                           f"{self.features[fi].name!r}", where)
                    catrow.append(len(cats))
                    cats.append(_ints(c, f"{name}.categories[{i}]", where))
                else:
                    catrow.append(-1)
                feat.append(fi)
                thr.append(_number(cols["threshold"][i], f"{name}.threshold", where) if fi >= 0 else 0.0)
                left.append(base + lft[i] if fi >= 0 else base + i)
                right.append(base + rgt[i] if fi >= 0 else base + i)
                dleft.append(bool(cols["default_left"][i]))
                miss.append(mtype)
                leaf.append(float(value[i]) if fi < 0 else 0.0)
            depth = max(depth, max(tdepth))
        self.n_trees = len(roots)
        self._roots = np.asarray(roots, dtype=np.int64)
        self._feat = np.asarray(feat, dtype=np.int64)
        self._col = np.maximum(self._feat, 0)
        self._thr = np.asarray(thr, dtype=np.float64)
        self._left = np.asarray(left, dtype=np.int64)
        self._right = np.asarray(right, dtype=np.int64)
        self._dleft = np.asarray(dleft, dtype=bool)
        kinds = np.asarray(miss, dtype=np.int8)
        self._miss_none, self._miss_zero, self._miss_nan = kinds == 0, kinds == 1, kinds == 2
        self._leaf = np.asarray(leaf, dtype=np.float64)
        self._catrow = np.asarray(catrow, dtype=np.int64)
        self._cat_nodes = np.flatnonzero(self._catrow >= 0)
        width = 1 + max((max(c) for c in cats if c), default=0)
        self._member = np.zeros((max(len(cats), 1), width), dtype=bool)
        for r, c in enumerate(cats):
            _check(all(v >= 0 for v in c), "category codes of a split must be >= 0", where)
            self._member[r, c] = True
        self._depth = depth

    # ---- inference ----------------------------------------------------------------------------

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    def encode(self, req: RouteRequest) -> list[float]:
        """``req``'s feature row in the file's order and encoding."""
        raw = raw_features(req)
        return [f.encode(raw[f.name]) for f in self.features]

    def encode_many(self, reqs: Sequence[RouteRequest]) -> np.ndarray:
        return np.asarray([self.encode(r) for r in reqs], dtype=np.float64).reshape(len(reqs), len(self.features))

    def scores(self, x: np.ndarray) -> np.ndarray:
        """The raw ensemble score of each row of ``x`` (the sum of the trees' leaf values,
        as LightGBM's ``predict(raw_score=True)``)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, len(self.features))
        return np.concatenate([self._chunk(x[s:s + _CHUNK]) for s in range(0, len(x), _CHUNK)] or [np.zeros(0)])

    def _chunk(self, x: np.ndarray) -> np.ndarray:
        """Every node's decision for each row at once (a successor table), then one lookup per
        level of the deepest tree: a handful of numpy calls per request, whatever the trees."""
        v = x[:, self._col]
        nan = np.isnan(v)
        missing = (self._miss_nan & nan) | (self._miss_zero & (nan | (np.abs(v) <= _ZERO)))
        go_left = np.where(missing, self._dleft, np.where(nan & self._miss_none, 0.0, v) <= self._thr)
        if len(self._cat_nodes):
            cn = self._cat_nodes
            code = np.where(nan[:, cn], -1.0, v[:, cn])
            ok = (code >= 0) & (code < self._member.shape[1])
            go_left[:, cn] = ok & self._member[self._catrow[cn], np.where(ok, code, 0).astype(np.int64)]
        nxt = np.where(go_left, self._left, self._right)
        if len(x) == 1:             # one request (a policy's call): plain 1-D lookups are cheaper
            step, node = nxt[0], self._roots
            for _ in range(self._depth - 1):
                node = step[node]
            return np.asarray([self._leaf[node].sum()])
        node = np.broadcast_to(self._roots, (len(x), self.n_trees))
        for _ in range(self._depth - 1):
            node = np.take_along_axis(nxt, node, axis=1)
        total: np.ndarray = self._leaf[node].sum(axis=1)
        return total

    def tokens(self, scores: np.ndarray) -> np.ndarray:
        """Predicted output tokens from raw scores: regression models predict log(1 + tokens);
        rank models' scores (higher = shorter) map through the training rows' score quantiles
        to the same quantile of their output lengths, which keeps the ranking."""
        if self._cal_score is None or self._cal_tokens is None:
            out = np.expm1(scores)
        else:
            out = np.interp(scores, self._cal_score, self._cal_tokens)
        clipped: np.ndarray = np.clip(out, self.min_tokens, self.max_tokens)
        return clipped

    def predict_many(self, reqs: Sequence[RouteRequest]) -> np.ndarray:
        return self.tokens(self.scores(self.encode_many(reqs)))

    def predict(self, req: RouteRequest) -> float:
        """Predicted output tokens of ``req``."""
        return float(self.tokens(self.scores(np.asarray([self.encode(req)], dtype=np.float64)))[0])


class OutputLengths:
    """Where a predictive policy's output lengths come from: the trained predictor in the file
    ``predictor`` names, else the Kendall oracle of quality ``tau`` over the length the backend
    knows (a trace's output length in the simulator and the replayer, a request's max_tokens live)."""

    __slots__ = ("trained", "oracle")

    def __init__(self, tau: float, seed: int, predictor: str = "") -> None:
        self.trained = load_predictor(predictor) if predictor else None
        self.oracle = KendallOracle(tau, seed) if self.trained is None else None

    def predict(self, req: RouteRequest, true_tokens: int) -> float:
        """Predicted output tokens of ``req``, whose true (or requested) length is ``true_tokens``."""
        if self.trained is not None:
            return self.trained.predict(req)
        assert self.oracle is not None
        return float(self.oracle.predict(true_tokens))


_CACHE: dict[tuple[str, int, int], Predictor] = {}


def load_predictor(path: str | Path) -> Predictor:
    """A predictor file, loaded once per process while it is unchanged (the engine scheduler
    is built once per replica; they share the parsed trees)."""
    p = Path(path)
    try:
        st = os.stat(p)
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        return Predictor.load(p)        # raises the one-line error
    if key not in _CACHE:
        _CACHE[key] = Predictor.load(p)
    return _CACHE[key]


def _check(ok: bool, problem: str, where: str | Path) -> None:
    if not ok:
        raise UserError(problem, where)


def _features(spec: object, where: str | Path) -> tuple[Feature, ...]:
    if not (isinstance(spec, list) and len(spec) > 0):
        raise UserError("'features' must be a non-empty list", where)
    out: list[Feature] = []
    for i, f in enumerate(spec):
        if not (isinstance(f, Mapping) and isinstance(f.get("name"), str)):
            raise UserError(f"features[{i}] has no name", where)
        name = f["name"]
        _check(name in ALL_FEATURES, f"unknown feature {name!r} (features: {', '.join(ALL_FEATURES)})", where)
        _check(name not in [o.name for o in out], f"feature {name!r} is listed twice", where)
        cats = f.get("categories")
        if name in CATEGORICAL:
            if not (isinstance(cats, list) and all(isinstance(c, str) for c in cats)):
                raise UserError(f"categorical feature {name!r} needs a list of category names", where)
            out.append(Feature(name, tuple(cats)))
        else:
            _check(cats is None, f"numeric feature {name!r} cannot have categories", where)
            out.append(Feature(name))
    return tuple(out)


def _number(v: object, what: str, where: str | Path) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
        raise UserError(f"{what} must be a finite number (got {v!r})", where)
    return float(v)


def _array(v: object, what: str, where: str | Path) -> np.ndarray:
    if not isinstance(v, list):
        raise UserError(f"{what} must be a list of numbers", where)
    return np.asarray([_number(x, what, where) for x in v], dtype=np.float64)


def _ints(v: object, what: str, where: str | Path) -> list[int]:
    if not (isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)):
        raise UserError(f"{what} must be a list of integers", where)
    return list(v)
