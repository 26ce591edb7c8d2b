"""Fit the cost model's efficiency factors to measured operator timings.

The roofline needs two numbers per GPU that no datasheet gives: the fraction
of peak FLOP/s that the model's matrix multiplications reach
(``compute_efficiency``, what prefill runs at) and the fraction of peak
memory bandwidth that streaming the weights reaches (``memory_efficiency``,
what decode runs at). Both are read off a profile of one transformer layer's
non-attention operators (QKV and output projections, the gated MLP, norms,
activation, residual adds) against the number of tokens in the batch: at few
tokens the layer is memory-bound (time ~ weight bytes / bandwidth), at many
it is compute-bound (time ~ FLOPs / peak).

The profiles are Vidur's (microsoft/vidur, ``data/profiling/compute/<gpu>/<model>/mlp.csv``):
per-operator times in milliseconds for one layer, by ``num_tokens`` and
``num_tensor_parallel_workers``. The fit minimises the mean absolute log
error of the predicted layer time over every row.

Tensor parallelism adds two all-reduces per layer; their latency and
effective bandwidth (``link_latency_us``, ``link_gb_s``) are fitted the same
way to Vidur's ``network/<node>/all_reduce.csv`` (time by message size and
number of GPUs within one node).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from llmlb_bench.errors import UserError
from llmlb_bench.sim.catalog import GPU, Model, load_catalog
from llmlb_bench.sim.cost import all_reduce_bytes_factor

#: Vidur's folder names -> catalog names
VIDUR_GPUS = {"a100": "a100-80g", "h100": "h100-sxm"}
VIDUR_NODES = {"a100_dgx": "a100-80g", "h100_dgx": "h100-sxm"}
VIDUR_MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Meta-Llama-3-8B": "llama-3-8b", "Meta-Llama-3-70B": "llama-3-70b"}
#: the operators of one layer outside attention (the embedding lookup is once per model, not per layer)
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


@dataclass(frozen=True)
class Profile:
    """Measured non-attention time of one layer (seconds) by token count and TP degree."""

    gpu: str
    model: str
    tokens: np.ndarray
    tp: np.ndarray
    seconds: np.ndarray


def _read_csv(path: Path) -> list[dict[str, str]]:
    """A profile's rows by header name; an unreadable file is a one-line error."""
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise UserError(f"cannot read profile ({exc.strerror})", path) from None


def read_vidur_mlp(path: str | Path, gpu: str, model: str) -> Profile:
    """Read one Vidur ``mlp.csv`` (median of each operator, summed over the layer)."""
    path = Path(path)
    rows = _read_csv(path)
    need = [f"time_stats.{op}.median" for op in LAYER_OPS] + ["num_tokens", "num_tensor_parallel_workers"]
    if not rows or any(c not in rows[0] for c in need):
        missing = next((c for c in need if not rows or c not in rows[0]), need[0])
        raise UserError(f"not a Vidur mlp.csv profile: missing column {missing!r}", path)
    try:
        tokens = np.array([int(r["num_tokens"]) for r in rows])
        tp = np.array([int(r["num_tensor_parallel_workers"]) for r in rows])
        ms = np.array([sum(float(r[f"time_stats.{op}.median"]) for op in LAYER_OPS) for r in rows])
    except ValueError as exc:
        raise UserError(f"bad number in profile ({exc})", path) from None
    return Profile(gpu=gpu, model=model, tokens=tokens, tp=tp, seconds=ms / 1000.0)


def find_vidur_profiles(root: str | Path) -> list[Profile]:
    """Every ``compute/<gpu>/*/<model>/mlp.csv`` under ``root`` whose GPU and model the catalog knows."""
    out = []
    for path in sorted(Path(root).glob("compute/*/*/*/mlp.csv")):
        gpu, model = VIDUR_GPUS.get(path.parts[-4]), VIDUR_MODELS.get(path.parts[-2])
        if gpu and model:
            out.append(read_vidur_mlp(path, gpu, model))
    return out


def layer_params(m: Model) -> float:
    """Weights of one layer's projections and MLP (what the profiled GEMMs multiply by)."""
    q = m.hidden * m.heads * m.head_dim
    kv = 2 * m.hidden * m.kv_heads * m.head_dim
    o = m.heads * m.head_dim * m.hidden
    mlp = 3 * m.hidden * m.intermediate
    return float(q + kv + o + mlp)


def predict_layer(m: Model, g: GPU, tokens: np.ndarray, tp: np.ndarray, compute_efficiency: float,
                  memory_efficiency: float, layer_latency_us: float) -> np.ndarray:
    """The cost model's time for one layer's non-attention work on one GPU: the smooth roofline
    ``hypot(compute, memory)`` of :mod:`llmlb_bench.sim.cost` plus the fixed layer latency."""
    params = layer_params(m) / tp
    compute = 2.0 * params * tokens / (g.bf16_tflops * 1e12 * compute_efficiency)
    memory = params * m.weight_bytes / (g.hbm_gb_s * 1e9 * memory_efficiency)
    out: np.ndarray = np.hypot(compute, memory) + layer_latency_us * 1e-6
    return out


@dataclass(frozen=True)
class Fit:
    """Fitted factors of one GPU and the mean absolute log error they leave."""

    gpu: str
    compute_efficiency: float
    memory_efficiency: float
    layer_latency_us: float
    rows: int

    @property
    def factors(self) -> tuple[float, float, float]:
        return self.compute_efficiency, self.memory_efficiency, self.layer_latency_us


def _terms(profiles: Sequence[Profile]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: compute time at peak, memory time at peak, measured time."""
    cat = load_catalog()
    comp, mem, meas = [], [], []
    for p in profiles:
        m, g = cat.models[p.model], cat.gpus[p.gpu]
        params = layer_params(m) / p.tp
        comp.append(2.0 * params * p.tokens / (g.bf16_tflops * 1e12))
        mem.append(params * m.weight_bytes / (g.hbm_gb_s * 1e9))
        meas.append(p.seconds)
    return np.concatenate(comp), np.concatenate(mem), np.concatenate(meas)


def relative_errors(profiles: Sequence[Profile], factors: tuple[float, float, float]) -> np.ndarray:
    """predicted / measured - 1 for every row of ``profiles``."""
    c, mm, y = _terms(profiles)
    ce, me, lat = factors
    out: np.ndarray = (np.hypot(c / ce, mm / me) + lat * 1e-6) / y - 1.0
    return out


FACTORS = ("compute_efficiency", "memory_efficiency", "layer_latency_us")


def fit_efficiency(profiles: Sequence[Profile], fixed: Mapping[str, float] | None = None) -> Fit:
    """Factors minimising the mean absolute log error over ``profiles`` (all of one GPU).

    With one model only, a constant layer time cannot be split between streaming the
    weights and fixed latency: hold one of the three factors at a given value
    (``fixed``, e.g. another GPU's fitted memory efficiency). Nelder-Mead from a
    mid-range start, efficiencies kept in (0, 1] and the latency >= 0; rounded as the
    catalog stores them."""
    from scipy.optimize import minimize

    fixed = dict(fixed or {})
    unknown = set(fixed) - set(FACTORS)
    if unknown:
        raise ValueError(f"unknown factor {sorted(unknown)[0]!r} (factors: {', '.join(FACTORS)})")
    gpus = {p.gpu for p in profiles}
    if len(gpus) != 1:
        raise ValueError(f"fit one GPU at a time, got {sorted(gpus)}")
    if not fixed and len({p.model for p in profiles}) < 2:
        raise ValueError("one model cannot separate memory time from layer latency: fix one factor")
    c, mm, y = _terms(profiles)
    start = np.array([0.6, 0.8, 20.0])

    def clip(x: np.ndarray) -> tuple[float, float, float]:
        v = [fixed.get(name, float(x[i])) for i, name in enumerate(FACTORS)]
        return min(max(v[0], 0.05), 1.0), min(max(v[1], 0.05), 1.0), max(v[2], 0.0)

    def loss(x: np.ndarray) -> float:
        ce, me, lat = clip(x)
        return float(np.abs(np.log((np.hypot(c / ce, mm / me) + lat * 1e-6) / y)).mean())

    res = minimize(loss, start, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-7, "maxiter": 4000})
    ce, me, lat = clip(res.x)
    return Fit(gpu=gpus.pop(), compute_efficiency=round(ce, 2), memory_efficiency=round(me, 2),
               layer_latency_us=float(round(lat)), rows=len(y))


def error_table(profiles: Sequence[Profile], settings: dict[str, tuple[float, float, float]]) -> list[dict[str, object]]:
    """Per profile and setting (ce, me, layer latency): mean and 90th percentile of
    |predicted / measured - 1| in %, overall and split at 256 tokens (decode-like vs prefill-like)."""
    rows = []
    for p in profiles:
        for label, factors in settings.items():
            rel = np.abs(relative_errors([p], factors))
            small = p.tokens <= 256
            rows.append({"gpu": p.gpu, "model": p.model, "setting": label, "factors": factors,
                         "mean_pct": 100 * float(rel.mean()), "p90_pct": 100 * float(np.percentile(rel, 90)),
                         "small_batch_pct": 100 * float(rel[small].mean()),
                         "large_batch_pct": 100 * float(rel[~small].mean())})
    return rows


# ---- tensor-parallel all-reduce --------------------------------------------------------------------------

@dataclass(frozen=True)
class AllReduceProfile:
    """Measured all-reduce times (seconds) within one node, by message bytes and GPU count."""

    gpu: str
    gpus: np.ndarray
    nbytes: np.ndarray
    seconds: np.ndarray


def read_vidur_all_reduce(path: str | Path, gpu: str) -> AllReduceProfile:
    """Read Vidur's ``all_reduce.csv`` (``size`` in fp16 elements, median time in ms), keeping
    the rows where all GPUs sit in one node (tensor parallelism does not cross nodes)."""
    path = Path(path)
    rows = _read_csv(path)
    need = ("time_stats.all_reduce.median", "num_workers", "size", "devices_per_node")
    missing = next((c for c in need if not rows or c not in rows[0]), None)
    if missing:
        raise UserError(f"not a Vidur all_reduce.csv profile: missing column {missing!r}", path)
    try:
        rows = [r for r in rows if r["num_workers"] == r["devices_per_node"]]
        return AllReduceProfile(gpu=gpu, gpus=np.array([int(r["num_workers"]) for r in rows]),
                                nbytes=np.array([2.0 * int(r["size"]) for r in rows]),
                                seconds=np.array([float(r["time_stats.all_reduce.median"]) / 1e3 for r in rows]))
    except ValueError as exc:
        raise UserError(f"bad number in profile ({exc})", path) from None


def find_vidur_all_reduce(root: str | Path) -> list[AllReduceProfile]:
    """Every ``network/<node>/all_reduce.csv`` under ``root`` whose node type the catalog maps."""
    return [read_vidur_all_reduce(p, VIDUR_NODES[p.parts[-2]])
            for p in sorted(Path(root).glob("network/*/all_reduce.csv")) if p.parts[-2] in VIDUR_NODES]


def predict_all_reduce(p: AllReduceProfile, latency_us: float, gb_s: float) -> np.ndarray:
    """The cost model's all-reduce: a fixed latency plus 2 (n-1)/n of the message over the link."""
    out: np.ndarray = latency_us * 1e-6 + all_reduce_bytes_factor(p.gpus) * p.nbytes / (gb_s * 1e9)
    return out


def fit_all_reduce(p: AllReduceProfile) -> tuple[float, float]:
    """(link_latency_us, link_gb_s) minimising the mean absolute log error; whole us and GB/s."""
    from scipy.optimize import minimize

    def loss(x: np.ndarray) -> float:
        lat, bw = max(float(x[0]), 0.0), max(float(x[1]), 1.0)
        return float(np.abs(np.log(predict_all_reduce(p, lat, bw) / p.seconds)).mean())

    res = minimize(loss, np.array([10.0, 200.0]), method="Nelder-Mead",
                   options={"xatol": 1e-3, "fatol": 1e-8, "maxiter": 4000})
    return float(round(max(res.x[0], 0.0))), float(round(max(res.x[1], 1.0)))
