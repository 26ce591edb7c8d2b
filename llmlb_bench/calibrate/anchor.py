"""Anchor a calibrated profile to the engine's long-run typical speed (issue 28).

One calibration lasts about half a minute; the engine's speed drifts over minutes (on vLLM's CPU
build the base step moved 2.2x between three calibrations two minutes apart, and a 3-minute probe
kept finding slower and faster spells at lags of 100-200 s; docs/fidelity.md). The calibrated step
model is therefore one draw of that drift, and that draw moved a fidelity run's whole bias by more
than any model term. Drawing the slow drift around it (sim/jitter.py) does not help: the
calibration's own draw is then counted twice.

Instead, whoever replays a trace against the engine for a while (``llmlb validate``,
benchmarks/fidelity.py) sends the calibration's drift **reference probe** (calibrate/probes.py:
a few requests decoding at once, the profile's ``reference`` table) between its replays, a few
seconds each time, all through the run (:class:`AnchorProbe`). Their windows' typical steps over
minutes give the engine's long-run median speed on that probe; the calibration measured the same
probe in the same way (``reference.step_s``, the median of its own windows), so their ratio is how
much faster or slower the engine was while it was calibrated, free of the step model's residuals.
:func:`anchored` multiplies every step coefficient by that ratio and replaces the drift with the one
measured from these probes over minutes: a simulation then draws the drift around the long-run
median, the point those probes measured, not around one calibration's draw. ``frontend_cpu_s`` is
rescaled with the steps: calibrate reads it in the step model's time (each interference pair against
its own control window, calibrate/fit.py), and on a core the frontend shares with the steps its work
runs at the steps' speed. The request overhead (a delay beside the steps, measured on lone requests)
and the per-step jitter keep their calibrated values.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Sequence

import numpy as np

from llmlb_bench.calibrate.dispersion import DriftSample, drift
from llmlb_bench.calibrate.fit import drift_samples
from llmlb_bench.calibrate.probes import DRIFT_CONTEXT, ProbePlan, Prober, ProbeRun
from llmlb_bench.errors import UserError
from llmlb_bench.replay import ReplayOptions, preflight
from llmlb_bench.sim.jitter import JitterSpec
from llmlb_bench.sim.profile import Anchor, ProfileDoc, Reference, StepCoefficients, parse_profile

#: reference probes sent back to back at each slot: the short lags tell the drift's fast part
PROBES_PER_SLOT = 3
#: fewest reference windows an anchor rests on (a median of fewer says little about minutes)
MIN_ANCHOR_PROBES = 4


def reference(runs: Sequence[ProbeRun], p: ProbePlan) -> Reference | None:
    """The calibration's drift reference probe and its typical step: the median over its windows
    (None without drift probes, or when none gave a window)."""
    logs = [s.log_step for s in drift_samples([r for r in runs if r.kind == "drift"])]
    if not logs:
        return None
    return {"batch": p.drift_batch, "context": DRIFT_CONTEXT, "tokens": p.decode_tokens,
            "step_s": round(math.exp(float(np.median(logs))), 9), "probes": len(logs)}


def reference_of(profile: ProfileDoc) -> Reference:
    """The reference probe a profile can be anchored on (one-line error when it has none, or is
    anchored already: its ``reference.step_s`` no longer describes its step model)."""
    ref = profile.get("reference")
    if ref is None:
        raise UserError("has no reference probe to anchor on (calibrate it again with llmlb calibrate, "
                        "--drift-probes 2 or more; or --no-anchor)", "profile")
    if "anchor" in profile:
        raise UserError("is anchored already; anchor the calibrated profile (or --no-anchor)", "profile")
    return ref


class AnchorProbe:
    """Sends a profile's reference probe to ``url`` between a run's replays (:meth:`slot`), every
    window's time on one clock; :meth:`samples` are its windows' typical steps."""

    def __init__(self, url: str, profile: ProfileDoc, options: ReplayOptions, root: Path,
                 per_slot: int = PROBES_PER_SLOT, seed: int = 0) -> None:
        self.ref = reference_of(profile)
        self.block_size = profile["engine"]["block_size"]
        self.per_slot = per_slot
        # a stream of request ids of its own: with the calibration's seed (the callers pass the same one)
        # the prober would reuse the calibration's ids, and a request's prompt text comes from its id
        own_seed = random.Random(f"anchor:{seed}").randrange(1 << 62)
        self.prober = Prober(url, preflight([url], options), options, root, own_seed)
        self.runs: list[ProbeRun] = []

    def slot(self) -> None:
        """``per_slot`` reference probes, back to back."""
        r = self.ref
        for _ in range(self.per_slot):
            self.runs.append(self.prober.decode(r["batch"], r["context"], r["tokens"], self.block_size, "drift"))

    def samples(self) -> list[DriftSample]:
        return drift_samples(self.runs)


def anchored(profile: ProfileDoc, samples: Sequence[DriftSample]) -> ProfileDoc:
    """``profile`` with its step model and ``frontend_cpu_s`` rescaled to the long-run median of
    ``samples`` (the reference probe's windows over a run) and the drift those windows measured (module docstring); the
    ``anchor`` table says by how much, on how many probes over what span."""
    ref = reference_of(profile)
    if len(samples) < MIN_ANCHOR_PROBES:
        raise UserError(f"{len(samples)} reference windows; an anchor needs {MIN_ANCHOR_PROBES} or more", "anchor")
    long_run = math.exp(float(np.median([s.log_step for s in samples])))
    scale = long_run / ref["step_s"]
    jitter = profile["jitter"] if profile["jitter"] is not None else JitterSpec().to_dict()
    times = [s.at_s for s in samples]
    anchor: Anchor = {"scale": scale, "reference_step_s": long_run, "calibration_step_s": ref["step_s"],
                      "probes": len(samples), "span_s": round(max(times) - min(times), 2),
                      "calibration_drift_sigma": jitter["drift_sigma"],
                      "calibration_drift_period_s": jitter["drift_period_s"]}
    s = profile["step"]
    step: StepCoefficients = {"base_s": s["base_s"] * scale, "per_token_s": s["per_token_s"] * scale,
                              "per_sample_s": s["per_sample_s"] * scale, "per_attn_s": s["per_attn_s"] * scale,
                              "per_kv_s": s["per_kv_s"] * scale, "per_dense_s": s["per_dense_s"] * scale}
    doc = {**profile, "step": step, "frontend_cpu_s": profile["frontend_cpu_s"] * scale,
           "jitter": {**jitter, **drift(samples)}, "anchor": anchor}
    return parse_profile(doc, "anchored profile")
