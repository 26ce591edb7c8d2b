"""How one vLLM CPU replica's speed drifts over minutes, against what one calibration sees (issue 28).

``llmlb calibrate`` measures the engine's speed drift (``jitter.drift_sigma``,
``drift_period_s``; calibrate/dispersion.py) from a reference decode probe repeated over the
calibration, about half a minute. A drift slower than that is invisible to it, or read as a
smaller one. This script sends the same reference probe (calibrate/probes.py: ``DRIFT_BATCH``
requests of ``DRIFT_CONTEXT`` prompt tokens, ``--tokens`` each) every ``--every`` seconds for
``--minutes`` to one replica (pinned to core 1, this client on core 0; run it on a quiet machine)
and estimates the drift twice: over the whole span, and over consecutive slices as long as a
calibration (``--slice``), so the two can be read side by side. Every probe's median step is kept
(``--out``), to be looked at, not only summarised.

    flock /tmp/llmlb-measure.lock .venv/bin/python benchmarks/engine_drift.py --minutes 4 --out drift.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from llmlb_bench.calibrate.dispersion import drift
from llmlb_bench.calibrate.endpoint import discover
from llmlb_bench.calibrate.fit import drift_samples
from llmlb_bench.calibrate.probes import DRIFT_BATCH, DRIFT_CONTEXT, Prober, ProbeRun
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.replay import ReplayOptions, preflight

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import BUDGET, SEQS  # noqa: E402


def probe(args: argparse.Namespace, url: str, work: Path) -> list[ProbeRun]:
    """The reference probe every ``args.every`` seconds for ``args.minutes``, after a warm-up, as
    ``llmlb calibrate`` sends it (same options, same probe)."""
    info = discover(url, {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET})
    options = ReplayOptions(api="completions", tokenize=True, model=info.model)
    prober = Prober(url, preflight([url], options), options, work / "runs")
    block = info.settings["block_size"]
    prober.prefill([64, 256, 512], 1, block)            # warm-up, unused
    runs: list[ProbeRun] = []
    start = time.monotonic()
    while time.monotonic() - start < 60 * args.minutes:
        time.sleep(max(0.0, start + len(runs) * args.every - time.monotonic()))
        runs.append(prober.decode(min(DRIFT_BATCH, SEQS), DRIFT_CONTEXT, args.tokens, block, "drift"))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=4.0, help="how long to probe")
    ap.add_argument("--every", type=float, default=1.0, help="seconds from one probe's start to the next's")
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per request (calibrate's --decode-tokens)")
    ap.add_argument("--slice", type=float, default=30.0, help="seconds per slice (about one calibration)")
    ap.add_argument("--out", type=Path, default=None, help="every figure as JSON")
    ap.add_argument("--url", default=None, help="probe this running endpoint instead of starting a vLLM CPU replica "
                    "(e.g. a GPU engine, or llmlb serve --profile with a known drift)")
    args = ap.parse_args()
    if not args.url:
        os.sched_setaffinity(0, {0})        # this client on core 0, the replica on core 1
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:],
                           "load_average_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="llmlb-drift-") as tmp:
        work = Path(tmp)
        if args.url:
            runs = probe(args, args.url, work)
        else:
            model = write_tiny_model(work / "tiny")
            settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
            with VllmReplicas(model, 1, cores=[1], settings=settings) as reps:
                runs = probe(args, reps.urls[0], work)
    samples = drift_samples(runs)
    out["probes"] = [{"at_s": round(s.at_s, 3), "median_step_ms": round(1e3 * math.exp(s.log_step), 4),
                      "noise_sd": round(math.sqrt(s.noise_var), 4)} for s in samples]
    out["whole"] = drift(samples)
    t0 = samples[0].at_s if samples else 0.0
    out["slices"] = []
    k = 0
    while samples and t0 + k * args.slice < samples[-1].at_s:
        part = [s for s in samples if t0 + k * args.slice <= s.at_s < t0 + (k + 1) * args.slice]
        out["slices"].append({"from_s": k * args.slice, **drift(part),
                              "median_step_ms": round(1e3 * math.exp(float(np.median([s.log_step for s in part]))), 4)
                              if part else None})
        k += 1
    logs = np.array([s.log_step for s in samples])
    out["log_sd_of_medians"] = round(float(np.std(logs, ddof=1)), 4) if logs.size > 1 else None
    out["load_average_end"] = os.getloadavg()
    print(f"{len(samples)} probes over {samples[-1].at_s - t0 if samples else 0:.0f} s; median step "
          f"{1e3 * math.exp(float(np.median(logs))) if logs.size else float('nan'):.3f} ms, log sd of the medians "
          f"{out['log_sd_of_medians']}; drift over the whole span: {out['whole']}")
    for s in out["slices"]:
        print(f"  slice from {s['from_s']:.0f} s: median step {s['median_step_ms']} ms, drift log sd {s['drift_sigma']}, "
              f"period {s['drift_period_s']} s ({s['drift_windows']} windows)")
    print(f"load average {out['load_average_start']} -> {out['load_average_end']}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
