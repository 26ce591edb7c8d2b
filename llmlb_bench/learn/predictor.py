"""Fit an output-length predictor on a trace: ``llmlb learn predictor``.

What a router knows when a request arrives (its prompt length, tenant, SLO class, LoRA
adapter, conversation turn, workload kind, priority: :func:`~llmlb_bench.policies.predictor.raw_features`)
is fitted against the output length the trace says it generated, with LightGBM, in one of
two ways:

* ``regression``: squared error on log(1 + tokens), so the long tail does not dominate and a
  prediction is a typical length for those features;
* ``rank``: LambdaRank within windows of requests that arrived together (Fu et al., "Efficient
  LLM Scheduling by Learning to Rank", NeurIPS 2024: a scheduler only needs the order of
  the requests it holds at once, so the loss asks for that order and nothing else); the
  label of a request is its output's decile in the training rows, shortest highest. Its
  scores become tokens through the training rows' quantiles (the score's quantile maps to
  the same quantile of output lengths), which keeps the order.

Rows are split into training and held-out rows by a hash of their conversation (or, outside
conversations, their request id), so no turn of a held-out conversation is seen in fitting;
Kendall's tau and the mean absolute error are measured on the held-out rows only, with the
numpy evaluator the policies use (:class:`~llmlb_bench.policies.predictor.Predictor`), so the
figures describe exactly what runs. LightGBM is imported here only (the ``learn`` extra).
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.policies.base import RouteRequest
from llmlb_bench.policies.predictor import (CATEGORICAL, FORMAT, NUMERIC, OBJECTIVES, VERSION, FeatureDoc,
                                            HeldoutScale, Predictor, PredictorDoc, TreeDoc, raw_features)
from llmlb_bench.schema import trace_spec
from llmlb_bench.trace_columns import TraceColumns

#: rank objective: relevance labels are output-length quantile bins (LightGBM's default gains reach 31)
RANK_BINS = 10


def requests_of(table: pa.Table) -> tuple[list[RouteRequest], np.ndarray, np.ndarray, np.ndarray]:
    """The RouteRequest of every row as a router sees it at its arrival (the same object the
    backends build), the true output lengths, the arrival times and each row's split key."""
    cols = TraceColumns(table)
    reqs = [cols.route_request(i, cols.arrival[i]) for i in range(cols.n)]
    key = np.asarray([(-1 - r.request_id) if r.session_id is None else r.session_id for r in reqs], dtype=np.int64)
    return reqs, np.asarray(cols.out, dtype=np.float64), cols.arrival_np, key


def heldout_mask(key: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rows held out: a splitmix64 hash of each row's key (conversation or request id) and the
    seed below ``fraction``: deterministic, and every turn of a conversation on one side."""
    with np.errstate(over="ignore"):
        z = key.astype(np.uint64) + np.uint64((0x9E3779B97F4A7C15 * (seed + 1)) % (1 << 64))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    held: np.ndarray = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction
    return held


def _columns(reqs: list[RouteRequest], train: np.ndarray) -> tuple[list[FeatureDoc], np.ndarray]:
    """The features that vary among the training rows, with categorical codes, and the
    encoded matrix of every row (a feature constant in training carries nothing)."""
    raw = [raw_features(r) for r in reqs]
    specs: list[FeatureDoc] = []
    columns: list[np.ndarray] = []
    idx = np.flatnonzero(train)
    for name in NUMERIC:
        v = np.asarray([row[name] for row in raw], dtype=np.float64)
        t = v[idx]
        seen = t[~np.isnan(t)]
        if len(seen) and (np.unique(seen).size > 1 or np.isnan(t).any()):
            specs.append({"name": name})
            columns.append(v)
    for name in CATEGORICAL:
        vals = [str(row[name]) for row in raw]
        cats = sorted({vals[i] for i in idx.tolist()})
        if len(cats) > 1:
            code = {c: k for k, c in enumerate(cats)}
            specs.append({"name": name, "categories": cats})
            columns.append(np.asarray([code.get(v, -1) for v in vals], dtype=np.float64))
    x = np.column_stack(columns) if columns else np.zeros((len(reqs), 0))
    return specs, x


def _windows(n: int, window: int) -> list[int]:
    """Group sizes of consecutive ``window``-request windows (the last one shorter)."""
    return [min(window, n - s) for s in range(0, n, window)]


def _lightgbm() -> ModuleType:
    try:
        import lightgbm
    except ImportError:
        raise UserError("fitting a predictor needs LightGBM: pip install 'llmlb-bench[learn]'",
                        "llmlb learn predictor") from None
    return lightgbm


def _tree_arrays(node: Mapping[str, Any]) -> TreeDoc:
    """One tree of LightGBM's ``dump_model`` (its JSON, read as it comes) as flat preorder arrays
    (children after their parent)."""
    out: TreeDoc = {"feature": [], "threshold": [], "left": [], "right": [], "default_left": [], "missing": [],
                    "categories": [], "value": []}

    def add(feature: int, threshold: float, default_left: bool, missing: str, categories: list[int] | None,
            value: float) -> int:
        """Append a node (children -1 until they are walked); its index."""
        out["feature"].append(feature)
        out["threshold"].append(threshold)
        out["left"].append(-1)
        out["right"].append(-1)
        out["default_left"].append(default_left)
        out["missing"].append(missing)
        out["categories"].append(categories)
        out["value"].append(value)
        return len(out["feature"]) - 1

    def walk(nd: Mapping[str, Any]) -> int:
        if "split_feature" not in nd:
            return add(-1, 0.0, False, "none", None, float(nd["leaf_value"]))
        feature = int(nd["split_feature"])
        default_left = bool(nd.get("default_left", True))
        missing = str(nd.get("missing_type", "None")).lower()
        if nd["decision_type"] == "==":
            i = add(feature, 0.0, default_left, missing, sorted(int(c) for c in str(nd["threshold"]).split("||")), 0.0)
        elif nd["decision_type"] == "<=":
            i = add(feature, float(nd["threshold"]), default_left, missing, None, 0.0)
        else:
            raise ValueError(f"unexpected LightGBM decision type {nd['decision_type']!r}")
        out["left"][i] = walk(nd["left_child"])
        out["right"][i] = walk(nd["right_child"])
        return i

    walk(node)
    return out


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of two samples (nan when either is constant)."""
    if len(a) < 2 or np.unique(a).size < 2 or np.unique(b).size < 2:
        return math.nan
    from scipy.stats import kendalltau
    return float(kendalltau(a, b).statistic)


def window_tau(pred: np.ndarray, true: np.ndarray, window: int) -> float:
    """Mean Kendall tau within consecutive windows of ``window`` requests (in arrival order):
    how well the predictor orders the requests a scheduler holds at once."""
    taus = [kendall_tau(pred[s:s + window], true[s:s + window]) for s in range(0, len(pred) - 1, window)]
    taus = [t for t in taus if not math.isnan(t)]
    return float(np.mean(taus)) if taus else math.nan


def fit(table: pa.Table, *, objective: str = "regression", seed: int = 0, trees: int = 100, leaves: int = 15,
        window: int = 32, heldout: float = 0.2, trace: str | Path = "trace", sha256: str | None = None,
        lgb_params: Mapping[str, object] | None = None) -> PredictorDoc:
    """Fit a predictor on ``table`` and return its file's content (a JSON-able dict, held-out
    figures included). Inputs are checked before any fitting."""
    where = "llmlb learn predictor"
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r} (objectives: {', '.join(OBJECTIVES)})", "--objective")
    if not 0 < heldout < 1:
        raise UserError(f"must be in (0, 1) (got {heldout})", "--heldout")
    for name, v in (("--trees", trees), ("--leaves", leaves), ("--window", window)):
        if v < 2:
            raise UserError(f"must be >= 2 (got {v})", name)
    reqs, y, arrival, key = requests_of(table)
    test = heldout_mask(key, heldout, seed)
    train = ~test
    if train.sum() < 20 or test.sum() < 2:
        raise UserError(f"{len(reqs)} rows leave {int(train.sum())} to fit and {int(test.sum())} to hold out "
                        "(at least 20 and 2 needed)", trace)
    specs, x = _columns(reqs, train)
    if not specs:
        raise UserError("nothing known at arrival varies across the trace's rows (prompt length, tenant, class, "
                        "adapter, turn, kind, priority): there is nothing to predict from", trace)
    lgb = _lightgbm()
    cat_idx = [i for i, s in enumerate(specs) if "categories" in s]
    params: dict[str, object] = {
        "num_leaves": leaves, "learning_rate": 0.1, "min_data_in_leaf": 20, "seed": seed,
        "deterministic": True, "force_row_wise": True, "num_threads": 1, "verbose": -1,
        "max_cat_to_onehot": 8, "min_data_per_group": 20, "cat_smooth": 10.0,
    }
    rows = np.flatnonzero(train)
    if objective == "regression":
        params["objective"] = "regression"
        label = np.log1p(y[rows])
        group = None
    else:
        rows = rows[np.argsort(arrival[rows], kind="stable")]
        edges = np.quantile(y[rows], np.linspace(0, 1, RANK_BINS + 1)[1:-1])
        label = (RANK_BINS - 1 - np.searchsorted(edges, y[rows], side="left")).astype(np.float64)
        group = _windows(len(rows), window)
        params.update(objective="lambdarank", lambdarank_truncation_level=window, eval_at=[window])
    params.update(lgb_params or {})
    data = lgb.Dataset(x[rows], label=label, group=group, categorical_feature=cat_idx or "auto",
                       feature_name=[s["name"] for s in specs], free_raw_data=False)
    booster = lgb.train(params, data, num_boost_round=trees)
    dump = booster.dump_model()
    doc: PredictorDoc = {
        "format": FORMAT, "version": VERSION, "objective": objective,
        "features": specs,
        "trees": [_tree_arrays(t["tree_structure"]) for t in dump["tree_info"]],
        "output": {"min_tokens": float(max(1.0, y[rows].min())), "max_tokens": float(y[rows].max())},
    }
    if objective == "rank":
        score, tokens = _calibration(Predictor({**doc, "objective": "regression"}, where).scores(x[rows]), y[rows])
        doc["output"]["score"], doc["output"]["tokens"] = score, tokens
    doc["training"] = {
        "trace": Path(trace).name, "sha256": sha256, "rows": len(reqs), "train_rows": int(train.sum()),
        "heldout_rows": int(test.sum()), "heldout_fraction": heldout, "seed": seed, "trees": trees,
        "leaves": leaves, "window": window, "spec": trace_spec(table),
        "lightgbm": getattr(lgb, "__version__", ""),
    }
    predictor = Predictor(doc, where)
    idx = np.flatnonzero(test)
    idx = idx[np.argsort(arrival[idx], kind="stable")]
    doc["heldout"] = evaluate(predictor, x[idx], y[idx], window, y[rows])
    return doc


def _calibration(scores: np.ndarray, y: np.ndarray, points: int = 256) -> tuple[list[float], list[float]]:
    """Score -> tokens for a rank model: each distinct training score goes to the output
    length at its mid-rank quantile, counted from the highest score (the shortest); a model
    with few distinct scores (a few task types) thus predicts each group's middle length, not
    the end of its range. At most ``points`` knots, evenly spaced in rank, ends kept."""
    values, counts = np.unique(scores, return_counts=True)
    mid = (np.cumsum(counts) - counts / 2) / len(scores)     # share of rows with a lower score, mid-tie
    tokens = np.quantile(y, 1 - mid)
    if len(values) < 2:
        values, tokens = np.array([values[0], values[0] + 1.0]), np.repeat(tokens, 2)
    if len(values) > points:
        keep = np.unique(np.linspace(0, len(values) - 1, points).round().astype(np.int64))
        values, tokens = values[keep], tokens[keep]
    return values.tolist(), tokens.tolist()


def evaluate(predictor: Predictor, x: np.ndarray, y: np.ndarray, window: int,
             train_y: np.ndarray | None = None) -> HeldoutScale:
    """Kendall tau (overall and within windows), MAE and, for scale, the MAE of always
    predicting the training rows' median, on rows ``x`` (in arrival order) with true lengths ``y``."""
    pred = predictor.tokens(predictor.scores(x))
    out: HeldoutScale = {
        "rows": int(len(y)),
        "kendall_tau": _round(kendall_tau(pred, y)),
        "window_tau": _round(window_tau(pred, y, window)),
        "window": window,
        "mae_tokens": _round(float(np.mean(np.abs(pred - y)))) if len(y) else None,
    }
    if train_y is not None and len(y):
        out["median_mae_tokens"] = _round(float(np.mean(np.abs(np.median(train_y) - y))))
    return out


def evaluate_trace(predictor: Predictor, table: pa.Table, window: int = 32) -> HeldoutScale:
    """A predictor's figures on every row of another trace (in arrival order); its Kendall tau is
    None for a constant prediction."""
    reqs, y, arrival, _ = requests_of(table)
    order = np.argsort(arrival, kind="stable")
    return evaluate(predictor, predictor.encode_many([reqs[i] for i in order]), y[order], window)


def _round(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)
