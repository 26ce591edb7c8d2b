"""Measured engine profiles: a step-time model fitted to a live endpoint (``llmlb calibrate``).

The roofline of :mod:`llmlb_bench.sim.cost` predicts step times from a GPU's
datasheet and a model's shape. A profile instead states what one engine,
on one machine, serving one model, was measured to take. Its step time is
linear in the quantities the replica's scheduler already computes for every
step (:meth:`CostModel.run_step`'s arguments)::

    step_s = base_s + per_token_s x tokens + per_sample_s x sampled
             + per_attn_s x attn + per_kv_s x kv + per_dense_s x tokens x kv

``tokens``: new tokens in the step (prefill chunks plus one per decoding
request); ``sampled``: requests that sample a token (decoders plus completed
prefills: LM head, sampler, detokenising and streaming the token);
``attn``: the sum over new tokens of the context each attends to (quadratic in
a prefill chunk, the context length for a decode token); ``kv``: KV tokens
read (each decoder's context, each chunk's prefix plus itself). ``per_dense_s`` (optional, 0 when
absent) is for engines whose attention is ONE dense masked product over the whole step, every new
token of the batch against every KV token the step reads, instead of one small product per request:
transformers' continuous batching without flash attention (paged SDPA or eager, the default where
flash attention is not installed) builds a mask of tokens x (kv + tokens) and multiplies through it,
so a step's attention grows with the batch's tokens TIMES its KV, quadratically in the batch.
``llmlb calibrate`` fits it only where the probes show it (calibrate/fit.py: an F-test of the term
against the model without it); engines whose kernels attend per request (vLLM, SGLang) should not
show it, and probes without it leave it out (tests/test_dense_attention.py). Why linear: below
saturation each of these costs scales with its count, and the profile
is fitted on the operating range the probes cover (prompts up to the step
budget and beyond, batches up to ``max_num_seqs``); see docs/fidelity.md for
what that range is and how far from it the fit was checked.

``request_overhead_s + request_per_prompt_token_s x prompt`` is the part of
a lone request's time to first token that no step accounts for: HTTP,
handing the request to the engine and the first token back, and work that
grows with the WHOLE prompt, cached part included (tokenising it, hashing its
blocks for the prefix-cache lookup). The simulator applies it as a delay
between a request's dispatch to a replica and its arrival in the engine's
waiting queue (sim/simulation.py, serve/live.py), not inside a step: in vLLM v1
that work is the API server process's (HTTP, tokenising, detokenising) and
the engine core's input thread's (deserialising, block hashes), which run
beside the engine core's busy loop instead of stopping it, so one request's
arrival does not lengthen the steps of the batch already running. The part
of it that is really the first token's way back (engine core -> API server
-> client) delays every token of the request alike, which for latency from
arrival is the same as arriving that much later. A lone request's time to
first token is this delay plus its prefill steps, which is how
``llmlb calibrate`` fits it.

``frontend_cpu_s`` (optional, 0 when absent) is the engine time that a
request's overhead work takes from the steps where the API server shares the
engine's core (vLLM's CPU build runs its API server, engine-core process and
worker on one core): tokenising and handing over a request then takes turns
with the model's steps instead of running beside them. A request dispatched
to a replica whose engine is busy adds it to the next step the replica plans;
its own delay before the queue stays the whole overhead (on a shared core
the frontend's work is not faster for the engine's being busy). Dispatched to
an idle engine it costs no step: the frontend has the core to itself, so a
lone request's time to first token is the overhead plus its prefill, as
before, and a batch already decoding slows by ``frontend_cpu_s`` per
arrival. ``frontend_wait_share`` (optional, 1 when absent: all of it) says
how much of it lands on the step the arriving request itself waits behind;
the rest lands on the step after the next first token sampled, the
request's own as a rule (its first token's way back and the work after
admission), so the batch pays it and the request does not wait for it.
``llmlb calibrate`` measures the share from the interference probe's arrivals'
own time to first token (calibrate/frontend.py). One figure per request,
not per prompt token: ``llmlb calibrate``'s interference probe (lone
requests of one prompt length arriving during a decode window) measures it
at one length, and the tokenising part that grows with the prompt was a
tenth of the overhead at the prompts measured (docs/fidelity.md).

A profile also records the engine settings the scheduler needs: ``max_num_seqs``,
``max_num_batched_tokens``, KV ``block_size``, the number of KV blocks, the
model length, and whether prefix caching is on. A pool with a profile takes
its KV blocks and block size from it, and its other settings where the pool
leaves them unset (so ``--max-num-seqs 32`` asks "what if" of the measured
engine; for another KV size edit ``num_kv_blocks`` in the file); prefix
caching is on only when both the pool and the profile say so. Energy and
price still come from the pool's ``gpu`` entry, with the roofline's state-based
power (sim/cost.py ``busy_activity``): the profile's batch-proportional terms
(per token, per sample) stand for the step's compute share, the rest (base,
attention, KV reads) for its memory-bound part; one pipeline stage's GPUs are
busy at a time, idle time draws idle power. (Before 2026-12-01 every step drew
the GPU's maximum power, which the ML.ENERGY measurements contradict: decoding
draws 65-70% of the limit on H100.)

Since version 2 the step model is the engine's median step, and an optional
``jitter`` table (sigma, slow_rate_hz, slow_mean_s, slow_factor; measured by
calibrate/dispersion.py) says how the engine's steps scatter around it, which
the simulator draws per step (sim/jitter.py), and, where it has
drift_sigma and drift_period_s, how the engine's speed drifts over time. Version 1 files (fitted on the
fastest probes, no jitter) still load.

Two optional tables tie the step model to the engine's LONG-RUN speed (calibrate/anchor.py). One
calibration lasts half a minute of a speed drift that runs over minutes (on vLLM CPU the base step
moved 2.2x between calibrations two minutes apart, docs/fidelity.md), so its median step is one draw
of that drift. ``reference`` (written by ``llmlb calibrate``) names the drift reference probe
(``batch`` requests of ``context`` prompt tokens, ``tokens`` output each) and its typical step over
the calibration (``step_s``, the median over ``probes`` windows). ``anchor`` (written by
``llmlb validate`` and benchmarks/fidelity.py, which send that probe between their replays) says the
step model was rescaled: ``scale`` = ``reference_step_s`` (the long-run median of ``probes`` windows
over ``span_s`` seconds) / ``calibration_step_s`` (the reference's ``step_s``) multiplies every
``step`` coefficient and ``frontend_cpu_s`` already (readers never apply it again), and the
``jitter`` table's drift is the one those probes measured over minutes, drawn around the long-run median
(``calibration_drift_sigma`` and ``calibration_drift_period_s`` keep the calibration's own). The
simulator reads neither table.

The file is JSON (written by ``llmlb calibrate``, readable and editable by
hand); its content travels in the cluster config, so run.json holds it and a
run can be reproduced without the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TypedDict

from llmlb_bench.errors import UserError
from llmlb_bench.sim.catalog import GPU, Model
from llmlb_bench.sim.cost import busy_activity
from llmlb_bench.sim.jitter import COUNTS, JitterSpec, JitterTable

#: the format's version (``llmlb_profile`` key): 2 added the optional ``jitter`` table (the step model
#: is the median step since; version 1 profiles, fitted on the fastest repeats, load without jitter)
PROFILE_VERSION = 2
#: the versions this release reads
READABLE_VERSIONS = (1, 2)
#: step-time coefficients, in the order of :meth:`ProfileCost.features`
STEP_TERMS = ("base_s", "per_token_s", "per_sample_s", "per_attn_s", "per_kv_s", "per_dense_s")
#: engine settings a profile fixes, and whether each must be a positive integer
ENGINE_INTS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks", "max_model_len")
#: smallest context slope used for the replica's run-length tolerance (a profile may have none)
_MIN_SLOPE = 1e-15


class StepCoefficients(TypedDict):
    """The step-time model's coefficients (:data:`STEP_TERMS`; see the module docstring)."""

    base_s: float
    per_token_s: float
    per_sample_s: float
    per_attn_s: float
    per_kv_s: float
    per_dense_s: float


class EngineSettings(TypedDict):
    """The engine settings a profile fixes (:data:`ENGINE_INTS`, and prefix caching: true when absent)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    enable_prefix_caching: bool


class _Model(TypedDict):
    llmlb_profile: int
    engine: EngineSettings
    step: StepCoefficients
    request_overhead_s: float
    request_per_prompt_token_s: float
    frontend_cpu_s: float
    jitter: JitterTable | None              # None: the profile measured no spread (version 1)


class Reference(TypedDict):
    """The drift reference probe a calibration sent and its typical step over it (module docstring)."""

    batch: int
    context: int
    tokens: int
    step_s: float
    probes: int


class Anchor(TypedDict):
    """How the step model was rescaled to the engine's long-run typical speed (module docstring)."""

    scale: float
    reference_step_s: float
    calibration_step_s: float
    probes: int
    span_s: float
    calibration_drift_sigma: float
    calibration_drift_period_s: float


class ProfileDoc(_Model, total=False):
    """A profile's content, parsed (:func:`parse_profile`): what a profile file, a cluster's ``profile``
    table and run.json's ``config.cluster.profile`` hold, every field the simulator reads present.

    ``source`` (where and when it was measured) and ``fit`` (the fit's residuals), which
    ``llmlb calibrate`` writes, are carried as the JSON objects they are: shown and stored
    (verdict.json names the source), never read field by field."""

    source: dict[str, object]
    fit: dict[str, object]
    reference: Reference
    anchor: Anchor
    #: the part of ``frontend_cpu_s`` the arriving request waits for (module docstring; 1 when absent)
    frontend_wait_share: float


@dataclass(frozen=True)
class EngineProfile:
    """A profile's step model and engine settings (see the module docstring), from a parsed profile."""

    step: StepCoefficients
    request_overhead_s: float
    request_per_prompt_token_s: float
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    enable_prefix_caching: bool
    #: the measured step-time dispersion (sim/jitter.py); none (all zero) when the profile has no table
    jitter: JitterSpec = JitterSpec()
    #: seconds of the engine's time each arriving request's frontend work takes (module docstring)
    frontend_cpu_s: float = 0.0
    #: the part of it charged to the step the arriving request waits behind (module docstring)
    frontend_wait_share: float = 1.0

    @classmethod
    def of(cls, doc: ProfileDoc) -> "EngineProfile":
        e = doc["engine"]
        return cls(step=doc["step"], request_overhead_s=doc["request_overhead_s"],
                   request_per_prompt_token_s=doc["request_per_prompt_token_s"], frontend_cpu_s=doc["frontend_cpu_s"],
                   max_num_seqs=e["max_num_seqs"], max_num_batched_tokens=e["max_num_batched_tokens"],
                   block_size=e["block_size"], num_kv_blocks=e["num_kv_blocks"], max_model_len=e["max_model_len"],
                   enable_prefix_caching=e["enable_prefix_caching"],
                   jitter=JitterSpec.of(doc["jitter"]) if doc["jitter"] is not None else JitterSpec(),
                   frontend_wait_share=doc.get("frontend_wait_share", 1.0))

    @classmethod
    def from_dict(cls, d: object, where: str = "profile") -> "EngineProfile":
        """The profile of a profile's content as a file or a table holds it (:func:`parse_profile`)."""
        return cls.of(parse_profile(d, where))

    def step_time(self, tokens: float, attn: float, kv: float, sampled: float) -> float:
        s = self.step
        return (s["base_s"] + s["per_token_s"] * tokens + s["per_sample_s"] * sampled
                + s["per_attn_s"] * attn + s["per_kv_s"] * kv + s["per_dense_s"] * tokens * kv)


def parse_profile(d: object, where: str = "profile") -> ProfileDoc:
    """A profile's content (a profile file's JSON, a cluster's ``profile`` table), checked and parsed
    once into a :class:`ProfileDoc`: absent optional fields take their defaults, a ``jitter`` table
    its defaults for the fields it leaves out, and a field of no use to the simulator other than
    ``source``, ``fit``, ``reference`` and ``anchor`` is dropped. Errors are one line naming the field."""
    if not isinstance(d, Mapping):
        raise UserError("a profile must be a JSON object", where)
    version = d.get("llmlb_profile")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise UserError(f"not an llmlb profile of version {' or '.join(map(str, READABLE_VERSIONS))} "
                        f"(llmlb_profile = {version!r}); write one with llmlb calibrate", where)
    step, engine = d.get("step"), d.get("engine")
    if not isinstance(step, Mapping) or not isinstance(engine, Mapping):
        raise UserError("needs a 'step' and an 'engine' object", where)

    def term(k: str, default: float | None = None) -> float:
        v = step.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise UserError(f"must be a number >= 0, got {v!r}", f"{where}: step.{k}")
        return v

    coeffs: StepCoefficients = {"base_s": term("base_s"), "per_token_s": term("per_token_s"),
                                "per_sample_s": term("per_sample_s"), "per_attn_s": term("per_attn_s"),
                                "per_kv_s": term("per_kv_s"), "per_dense_s": term("per_dense_s", 0.0)}
    if not coeffs["base_s"] + coeffs["per_token_s"] + coeffs["per_sample_s"] > 0:
        raise UserError("a step must take time: base_s, per_token_s or per_sample_s must be > 0", f"{where}: step")

    def count(k: str) -> int:
        v = engine.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"must be a positive integer, got {v!r}", f"{where}: engine.{k}")
        return v

    seqs, tokens, block, blocks, length = (count(k) for k in ENGINE_INTS)
    if tokens < seqs:
        raise UserError("max_num_batched_tokens must be >= max_num_seqs", f"{where}: engine")
    caching = engine.get("enable_prefix_caching", True)
    if not isinstance(caching, bool):
        raise UserError(f"must be true or false, got {caching!r}", f"{where}: engine.enable_prefix_caching")
    settings: EngineSettings = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "block_size": block,
                                "num_kv_blocks": blocks, "max_model_len": length, "enable_prefix_caching": caching}

    def seconds(k: str) -> float:
        v = d.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise UserError(f"must be a number >= 0, got {v!r}", f"{where}: {k}")
        return v

    doc: ProfileDoc = {"llmlb_profile": next(v for v in READABLE_VERSIONS if v == version),
                       "engine": settings, "step": coeffs,
                       "request_overhead_s": seconds("request_overhead_s"),
                       "request_per_prompt_token_s": seconds("request_per_prompt_token_s"),
                       "frontend_cpu_s": seconds("frontend_cpu_s"),
                       "jitter": _jitter(d["jitter"], f"{where}: jitter") if d.get("jitter") is not None else None}
    share = d.get("frontend_wait_share")
    if share is not None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise UserError(f"must be a number from 0 to 1, got {share!r}", f"{where}: frontend_wait_share")
        doc["frontend_wait_share"] = float(share)
    if d.get("reference") is not None:
        doc["reference"] = _reference(d["reference"], f"{where}: reference")
    if d.get("anchor") is not None:
        doc["anchor"] = _anchor(d["anchor"], f"{where}: anchor")
    if d.get("source") is not None:
        doc["source"] = _json_object(d["source"], f"{where}: source")
    if d.get("fit") is not None:
        doc["fit"] = _json_object(d["fit"], f"{where}: fit")
    return doc


def _jitter(table: object, where: str) -> JitterTable:
    """A profile's ``jitter`` table, checked (sim/jitter.py), with what calibrate measured it on."""
    out = JitterSpec.from_dict(table, where).to_dict()
    assert isinstance(table, Mapping)       # JitterSpec.from_dict refused anything else
    for k in COUNTS:
        v = table.get(k)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UserError(f"must be a count >= 0, got {v!r}", f"{where}.{k}")
            out[k] = v
    span = table.get("drift_span_s")
    if span is not None:
        if isinstance(span, bool) or not isinstance(span, (int, float)) or not span >= 0:
            raise UserError(f"must be a number of seconds >= 0, got {span!r}", f"{where}.drift_span_s")
        out["drift_span_s"] = span
    return out


def _fields(table: object, ints: tuple[str, ...], seconds: tuple[str, ...], where: str) -> dict[str, float]:
    """A table's integer (>= 1) and number (finite, >= 0) fields, each required (one-line errors)."""
    if not isinstance(table, Mapping):
        raise UserError(f"must be a table of {', '.join(ints + seconds)}", where)
    out: dict[str, float] = {}
    for k in ints:
        v = table.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"must be a positive integer, got {v!r}", f"{where}.{k}")
        out[k] = v
    for k in seconds:
        v = table.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise UserError(f"must be a number >= 0, got {v!r}", f"{where}.{k}")
        out[k] = float(v)
    return out


def _reference(table: object, where: str) -> Reference:
    """A profile's ``reference`` table, checked (module docstring)."""
    v = _fields(table, ("batch", "context", "tokens", "probes"), ("step_s",), where)
    if not v["step_s"] > 0:
        raise UserError(f"a step takes time: must be > 0, got {v['step_s']!r}", f"{where}.step_s")
    return {"batch": int(v["batch"]), "context": int(v["context"]), "tokens": int(v["tokens"]),
            "step_s": v["step_s"], "probes": int(v["probes"])}


def _anchor(table: object, where: str) -> Anchor:
    """A profile's ``anchor`` table, checked: its scale must be the ratio of its two steps (module
    docstring), so a hand edit of one figure cannot leave the file saying two things."""
    v = _fields(table, ("probes",), ("scale", "reference_step_s", "calibration_step_s", "span_s",
                                     "calibration_drift_sigma", "calibration_drift_period_s"), where)
    if not (v["reference_step_s"] > 0 and v["calibration_step_s"] > 0):
        raise UserError("reference_step_s and calibration_step_s must be > 0", where)
    if not math.isclose(v["scale"], v["reference_step_s"] / v["calibration_step_s"], rel_tol=1e-6):
        raise UserError(f"must be reference_step_s / calibration_step_s "
                        f"({v['reference_step_s'] / v['calibration_step_s']:.6g}), got {v['scale']!r}", f"{where}.scale")
    return {"scale": v["scale"], "reference_step_s": v["reference_step_s"],
            "calibration_step_s": v["calibration_step_s"], "probes": int(v["probes"]), "span_s": v["span_s"],
            "calibration_drift_sigma": v["calibration_drift_sigma"],
            "calibration_drift_period_s": v["calibration_drift_period_s"]}


def _json_object(value: object, where: str) -> dict[str, object]:
    """A copy of a JSON object the profile carries without reading it (``source``, ``fit``)."""
    if not isinstance(value, Mapping):
        raise UserError("must be an object", where)
    try:
        copy: dict[str, object] = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise UserError(f"must be JSON ({exc})", where) from None
    return copy


def read_profile(path: str | Path) -> ProfileDoc:
    """A profile file's content, parsed (one-line errors naming the file)."""
    path = Path(path)
    if not path.is_file():
        raise UserError("no such profile file" if not path.exists() else "not a file, expected a profile (.json)",
                        path)
    try:
        d: object = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"not a JSON profile ({exc})", path) from None
    return parse_profile(d, str(path))


def resolve_profile(value: object, base: str | Path | None = None, where: str = "cluster.profile") -> ProfileDoc | None:
    """A cluster's ``profile`` setting as the profile's content: a path (relative to ``base`` when
    given) is read, a table is parsed, None stays None."""
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        path = Path(value)
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        return read_profile(path)
    return parse_profile(value, where)


class ProfileCost:
    """The replica's cost model from a measured profile: the interface of
    :class:`~llmlb_bench.sim.cost.CostModel` that replicas and fleets use."""

    def __init__(self, profile: EngineProfile, model: Model, gpu: GPU, tp: int = 1, pp: int = 1) -> None:
        self.profile = profile
        self.model, self.gpu, self.tp, self.pp = model, gpu, tp, pp
        self.gpus = tp * pp
        self.expert_load = None
        self.block_size = profile.block_size
        self.kv_blocks = profile.num_kv_blocks
        s = profile.step
        self._base, self._tok, self._smp = s["base_s"], s["per_token_s"], s["per_sample_s"]
        self._attn, self._kv, self._dense = s["per_attn_s"], s["per_kv_s"], s["per_dense_s"]
        self._req, self._req_token = profile.request_overhead_s, profile.request_per_prompt_token_s
        #: engine seconds each request dispatched here takes from the steps (see the module docstring)
        self.frontend_cpu_s = profile.frontend_cpu_s
        #: its parts: on the step the arriving request waits behind, and after a first token (module docstring)
        self.frontend_wait_s = profile.frontend_cpu_s * profile.frontend_wait_share
        self.frontend_after_s = profile.frontend_cpu_s - self.frontend_wait_s
        #: the fastest possible decode step (one request, no context): a floor for step times
        self.min_step_s = self._base + self._tok + self._smp
        self.context_slope = max(self._attn + self._kv, _MIN_SLOPE)
        #: a decode step's growth per token of context per request decoding, beyond ``context_slope``
        #: (the dense attention term's: ``per_dense_s`` x the batch's tokens; sim/replica.py cuts runs by it)
        self.dense_slope = self._dense
        self.idle_power_w = self.gpus * gpu.idle_w
        self._dyn_w = tp * (gpu.max_w - gpu.idle_w)
        #: a measured engine has no KV swap (vLLM v1 recomputes preempted requests)
        self.swap_block_s = 0.0

    def swap_blocks(self, swap_space_gib: float) -> int:
        return 0

    def run_step(self, tokens: int, attn: float, kv: float, sampled: int) -> tuple[float, float]:
        """(step time, power) of a step; see the module docstring."""
        compute = self._tok * tokens + self._smp * sampled
        total = self._base + compute + self._attn * attn + self._kv * kv
        if self._dense:
            total += self._dense * tokens * kv
        g = self.gpu
        return total, self.idle_power_w + self._dyn_w * busy_activity(g.memory_power_fraction, g.compute_power_scale,
                                                                      compute / total if total > 0 else 0.0)

    def request_overhead(self, requests: int, prompt_tokens: int) -> float:
        """Seconds ``requests`` requests of ``prompt_tokens`` prompt tokens in all spend between their
        dispatch and the engine's waiting queue (see the module docstring)."""
        return self._req * requests + self._req_token * prompt_tokens

    def decode_time(self, seqs: int, context: float) -> float:
        return self.run_step(seqs, context, context, seqs)[0]
