"""``llmlb calibrate``: fit the simulator's step-time model to a live OpenAI-compatible endpoint.

:func:`calibrate` reads the engine's settings (:mod:`.endpoint`), replays the
probes (:mod:`.probes`), fits the coefficients of the typical step (:mod:`.fit`),
measures the steps' spread around it and the engine's drift over the calibration
(:mod:`.dispersion`), measures how much of the frontend's CPU per request the arriving
request itself waits for (:mod:`.frontend`), notes the drift reference probe's typical step (the profile's ``reference``,
which :mod:`.anchor` compares with the same probe sent over a longer run) and returns the
profile (:mod:`llmlb_bench.sim.profile`) with the fit's residuals in it.
docs/fidelity.md says what the profile predicts, and how well.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from llmlb_bench import __version__
from llmlb_bench.calibrate.anchor import reference
from llmlb_bench.calibrate.dispersion import Jitter, dispersion
from llmlb_bench.calibrate.endpoint import EngineInfo, discover
from llmlb_bench.calibrate.fit import Fit, drift_samples, fit, observations
from llmlb_bench.calibrate.frontend import wait_share
from llmlb_bench.calibrate.probes import DRIFT_PROBES, INTERFERENCE_PAIRS, ProbePlan, ProbeRun, Prober, kept_runs, plan
from llmlb_bench.errors import UserError
from llmlb_bench.replay import ReplayOptions, preflight
from llmlb_bench.sim.profile import PROFILE_VERSION, STEP_TERMS, ProfileDoc, parse_profile
from llmlb_bench.store.run import write_text_atomic

__all__ = ["Calibration", "calibrate", "discover", "plan", "refit"]

#: a calibration's record beside its probe runs (the engine's settings, the plan, how prompt lengths were
#: known, when, the seed): what :func:`refit` needs besides the runs
CALIBRATION_JSON = "calibration.json"


@dataclass
class Calibration:
    profile: ProfileDoc
    fit: Fit
    #: the steps' spread around the fitted step and the engine's drift (the profile's ``jitter``), with
    #: the counts they rest on
    jitter: Jitter
    engine: EngineInfo
    plan: ProbePlan


def calibrate(url: str, given: Mapping[str, int | None], *, options: ReplayOptions | None = None,
              max_prompt: int | None = None, batches: Sequence[int] | None = None,
              contexts: Sequence[int] | None = None, decode_tokens: int = 48, repeats: int = 3,
              results: Path | None = None, seed: int = 0, interference: bool = True,
              drift_probes: int = DRIFT_PROBES, interference_pairs: int | None = INTERFERENCE_PAIRS,
              dense_attention: str = "auto", mixed: bool = True) -> Calibration:
    """Probe ``url`` and fit its profile. ``given``: engine settings from flags (None = ask the
    engine); probe runs go to ``results`` (a scratch folder when None); ``interference``: send the
    probe that measures ``frontend_cpu_s`` (else it is 0); ``drift_probes``: drift reference probes
    over the calibration (0: none; the drift is then measured from the decode groups' repeats alone);
    ``interference_pairs``: interference pairs sent (None: ``repeats``), whose readings' median is
    ``frontend_cpu_s``; ``dense_attention``: auto, on or off (calibrate/fit.py ``dense_test``); ``mixed``:
    send the mixed-step probe (calibrate/probes.py)."""
    options = options or ReplayOptions(api="completions")
    info = discover(url, given, options.model)
    options = ReplayOptions(**{**options.__dict__, "model": info.model})
    p = plan(info.settings, max_prompt, batches, contexts, decode_tokens, repeats, interference, drift_probes,
             interference_pairs, mixed)
    pre = preflight([url], options)
    measured_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="llmlb-calibrate-") as tmp:
        root = Path(results) if results is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        record = {"engine": asdict(info), "plan": asdict(p), "prompt_lengths": pre.prompt_lengths,
                  "measured_at": measured_at, "seed": seed}
        runs = Prober(url, pre, options, root, seed).all(p)
        # written once every probe has ended: a calibration stopped half-way leaves none, and refit refuses it
        write_text_atomic(root / CALIBRATION_JSON, json.dumps({**record, "runs": len(runs)}, indent=1) + "\n")
    return _calibration(runs, info, p, pre.prompt_lengths, measured_at, dense_attention, seed)


def refit(root: Path, dense_attention: str = "auto", mixed: bool = True, interference: bool = True) -> Calibration:
    """Fit again the probe runs a calibration kept in ``root`` (``--results``), with no engine probed:
    ``dense_attention`` as in :func:`calibrate`; ``mixed`` / ``interference`` False leave the mixed-step
    probe's / the interference pairs' runs out (as if they had not been sent: ``frontend_cpu_s`` 0
    without the pairs). One calibration refitted two ways compares two fits on the same draw of the
    engine's speed, which two calibrations cannot (docs/fidelity-runs.md, "The mixed probe on vLLM")."""
    path = root / CALIBRATION_JSON
    try:
        doc = json.loads(path.read_text())
        info = EngineInfo(**doc["engine"])
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["plan"].items()}
        p = ProbePlan(**fields)
        lengths, measured_at, seed = str(doc["prompt_lengths"]), str(doc["measured_at"]), int(doc["seed"])
        sent = int(doc["runs"])
    except FileNotFoundError:
        raise UserError("not found: refit reads a folder of probe runs that llmlb calibrate --results kept "
                        "(written when its probes end: a calibration that was stopped has none)", path) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"not a calibration's record ({type(exc).__name__}: {exc})", path) from None
    kept = kept_runs(root)
    if len(kept) != sent:
        raise UserError(f"{len(kept)} probe runs in the folder where the calibration sent {sent}", root)
    runs = [r for r in kept if (mixed or r.kind != "mixed") and (interference or r.kind != "interference")]
    return _calibration(runs, info, p, lengths, measured_at, dense_attention, seed)


def _calibration(runs: Sequence[ProbeRun], info: EngineInfo, p: ProbePlan, prompt_lengths: str, measured_at: str,
                 dense_attention: str, seed: int) -> Calibration:
    """The profile of the probe ``runs`` (the fit, the spread and drift, the reference, the frontend's wait)."""
    obs, notes, windows = observations(runs, info.settings["max_num_batched_tokens"])
    result = fit(obs, notes, dense_attention)
    spread = dispersion(windows, drift_samples(runs))
    profile: dict[str, object] = {
        "llmlb_profile": PROFILE_VERSION,
        "source": {"endpoint": info.url, "engine": info.kind, "model": info.model,
                   "measured_at": measured_at,
                   "tool_version": __version__, "settings_from": info.sources, "assumed": info.assumed,
                   "prompt_lengths": prompt_lengths},
        "engine": dict(info.settings),
        "step": {k: result.coefficients[k] for k in STEP_TERMS},
        "request_overhead_s": result.coefficients["request_overhead_s"],
        "request_per_prompt_token_s": result.coefficients["request_per_prompt_token_s"],
        "frontend_cpu_s": result.coefficients["frontend_cpu_s"],
        "jitter": spread,
        "reference": reference(runs, p),
        "fit": {"by_probe": result.summary(), "notes": result.notes,
                "observations": [{"probe": o.probe, "what": o.what, "measured_s": round(o.measured_s, 6),
                                  "predicted_s": round(o.predicted_s, 6), "outlier": o.outlier,
                                  "repeats": o.repeats}
                                 for o in result.observations],
                **({"frontend_cpu": result.frontend} if result.frontend is not None else {}),
                **({"dense": result.dense} if result.dense is not None else {})},
    }
    # parsed as every reader parses it: the file must load where it is used
    doc = parse_profile(profile, "calibrated profile")
    if doc["frontend_cpu_s"] > 0:
        # how much of it the arriving request waits for (calibrate/frontend.py): reported in the fit, not
        # applied (frontend_wait_share stays 1): on vLLM CPU the share it read made TTFT 12-20% optimistic
        # where the whole charge on the wait was within -6..+13% (docs/fidelity-runs.md, 2026-12-02 16:00)
        profile["fit"] = {**doc.get("fit", {}), "frontend_wait": wait_share(runs, doc, seed)}
        doc = parse_profile(profile, "calibrated profile")
    return Calibration(doc, result, spread, info, p)
