"""Where the decode probes' slow phases come from (issue 28): one vLLM CPU replica, variants side by side.

``llmlb calibrate`` reads slow phases (``jitter.slow_rate_hz``, ``slow_factor``;
calibrate/dispersion.py) from the decode probes' inter-token gaps: a step above
max(1.5, exp(4 sigma)) x its window's median is slow. On 2026-12-02 it read 18-23 phases per
second at 2.1x, while the fidelity replays' gaps showed far fewer. This script sends, interleaved
and repeated (``--rounds``), to one replica (core 1; this client on core 0):

* ``burst``: the decode probe as calibrate sends it (``--batch`` requests at once, prompt
  ``DRIFT_CONTEXT``, ``--tokens`` each, the calibration's replay options: random tokens);
* ``staggered``: the same requests arriving ``--stagger`` seconds apart (the window in which all
  decode, as calibrate cuts it), random tokens;
* ``burst-words``: the burst with the tiny model's answers kept to whole words (vLLM's
  ``allowed_token_ids``, as the fidelity replays send them);
* ``burst-usage``: the burst with usage in every chunk (vLLM's ``continuous_usage_stats``: a token
  whose text is empty still counts);
* ``lone-words``: one request alone, whole words (is a lone stream's step as slow as a batch's?);
* ``replay-words`` / ``replay-random``: a Poisson trace of the fidelity benchmark's shape at
  ``--rate`` requests/s, with and without whole-word answers; the same rule over each request's
  own gaps (first token to last), each request one window, so its rate is per second of a stream.

For every round and variant, the probes' windows pooled as calibrate pools them: the rule's figures
(calibrate/dispersion.py ``steps``) over each window read from one request (``one_request``: calibrate
before 2026-12-02) and from all its requests together (``all_requests``: calibrate/fit.py
``engine_steps``), and the tokens the server generated (its usage) that the stream showed no text
for (``hidden``: a random model's partial UTF-8 bytes, which vLLM holds back until the character is
whole). The last lines give each variant's range over the rounds. ``--frontend-core 0`` puts the
replica's API server and engine-core process on the client's core and leaves the worker alone on
core 1 (``--variants`` picks the probes): if the slow steps are the frontend's turns on the
worker's core, they go away there.

    .venv/bin/python benchmarks/slow_phases.py --out slow.json   # on an otherwise idle machine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from llmlb_bench.calibrate.dispersion import steps
from llmlb_bench.calibrate.endpoint import discover
from llmlb_bench.calibrate.fit import decode_window, engine_steps, step_gaps
from llmlb_bench.calibrate.probes import DRIFT_CONTEXT, Prober, token_times
from llmlb_bench.engines.tiny_hf import word_token_ids
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.replay import ReplayOptions, preflight
from llmlb_bench.schema import ArrowRow, trace_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import BUDGET, SEQS, Bench, trace_at  # noqa: E402


VARIANTS = ("burst", "staggered", "burst-words", "burst-usage", "lone-words", "replay-words", "replay-random")


def hidden(rows: list[ArrowRow]) -> tuple[int, int]:
    """(tokens the server generated, of them streamed without text) over the ok rows."""
    ok = [r for r in rows if r["status"] == "ok"]
    made = sum(int(r["output_tokens"] or 0) for r in ok)
    seen = sum(token_times(r).size for r in ok)
    return made, made - seen


def probe_windows(rows: list[ArrowRow], merged: bool) -> list[np.ndarray]:
    """The spread's window of a decode probe in the window where all decode: the longest request's
    gaps (calibrate before 2026-12-02) or the steps all its requests saw (fit.engine_steps)."""
    ok = [r for r in rows if r["status"] == "ok" and r["first_token_s"] is not None]
    win = decode_window(ok) if ok else None
    if not win:
        return []
    return [engine_steps(ok, win[2], win[3])] if merged else [max(win[0], key=len)]


def replay_windows(rows: list[ArrowRow]) -> list[np.ndarray]:
    """Each streamed request's own gaps from its first token to its last."""
    return [step_gaps(token_times(r)) for r in rows if r["status"] == "ok" and r["first_token_s"] is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--stagger", type=float, default=0.03)
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--probes", type=int, default=8, help="probes of each kind per round")
    ap.add_argument("--variants", default="", help="comma-separated variants to run (default all: "
                    + ", ".join(VARIANTS) + ")")
    ap.add_argument("--frontend-core", type=int, default=None,
                    help="run the replica's API server and engine-core process on this core, the worker alone on "
                    "core 1 (default: all three on core 1, as the fidelity benchmark runs them): are the slow "
                    "steps the frontend's turns on the worker's core?")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v] or list(VARIANTS)
    if set(names) - set(VARIANTS):
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}")
    frontend = [[args.frontend_core]] if args.frontend_core is not None else None
    os.sched_setaffinity(0, {0})
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:],
                           "load_average_start": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="llmlb-slow-") as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "tiny")
        words: dict[str, object] = {"allowed_token_ids": word_token_ids(model)}
        settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
        with VllmReplicas(model, 1, cores=[1], frontend_cores=frontend, settings=settings) as reps:
            url = reps.urls[0]
            info = discover(url, {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET})
            base = ReplayOptions(api="completions", tokenize=True, model=info.model)
            block = info.settings["block_size"]
            probers = {
                "burst": Prober(url, preflight([url], base), base, work / "p1"),
                "burst-words": Prober(url, preflight([url], base), replace(base, extra_body=words), work / "p2"),
                "burst-usage": Prober(url, preflight([url], base), replace(base, extra_body={
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}), work / "p3"),
            }
            probers["burst"].prefill([64, 256, 512], 1, block)          # warm-up, unused
            bench = Bench(work, words)
            bench_random = Bench(work / "r", {})

            def run(name: str) -> tuple[list[ArrowRow], list[np.ndarray], list[np.ndarray]]:
                """One run of a variant: its rows, and its windows as calibrate read them before
                2026-12-02 (one request's gaps) and now (fit.engine_steps; a replay: each request's gaps)."""
                if name.startswith("burst") or name == "lone-words":
                    p = probers["burst-words" if name == "lone-words" else name]
                    rows = p.decode(1 if name == "lone-words" else args.batch, DRIFT_CONTEXT, args.tokens, block).rows
                elif name == "staggered":
                    p = probers["burst"]
                    # longer outputs, so that the window in which all decode is about as long as the burst's
                    longer = args.tokens + int(args.stagger * (args.batch - 1) / 0.0045)
                    table = trace_table(np.arange(args.batch) * args.stagger, DRIFT_CONTEXT, longer, "probe",
                                        request_id=p._ids(args.batch))
                    rows = p._replay("staggered", table, p.options, block)
                else:
                    b = bench if name == "replay-words" else bench_random
                    rows = b.replay(*b.salted(trace_at("poisson", args.rate, args.requests)), [url])
                    return rows, replay_windows(rows), replay_windows(rows)
                return rows, probe_windows(rows, False), probe_windows(rows, True)

            for k in range(args.rounds):
                for name in names[k % len(names):] + names[:k % len(names)]:
                    # probes are short: several of each per round, pooled as calibrate pools its windows
                    got = [run(name) for _ in range(1 if name.startswith("replay") else args.probes)]
                    rows = [r for g in got for r in g[0]]
                    made, hid = hidden(rows)
                    r: dict[str, Any] = {"round": k, "variant": name, "tokens": made, "hidden": hid,
                                         "one_request": steps([w for g in got for w in g[1]]),
                                         "all_requests": steps([w for g in got for w in g[2]])}
                    out["runs"].append(r)
                    print(json.dumps(r), flush=True)
            for name in names:
                rs = [r for r in out["runs"] if r["variant"] == name]
                line = f"{name:14s} hidden {100 * sum(r['hidden'] for r in rs) / max(1, sum(r['tokens'] for r in rs)):4.1f}%"
                for how in ("one_request", "all_requests"):
                    rate = [r[how]["slow_rate_hz"] for r in rs]
                    fac = [r[how]["slow_factor"] for r in rs]
                    sig = [r[how]["sigma"] for r in rs]
                    line += (f" | {how}: {min(rate):.1f}-{max(rate):.1f}/s at {min(fac):.2f}-{max(fac):.2f}x, "
                             f"sigma {min(sig):.2f}-{max(sig):.2f}")
                print(line, flush=True)
    out["load_average_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
