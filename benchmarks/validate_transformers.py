"""`llmlb validate` against Hugging Face `transformers serve` (continuous batching), on a GPU or a CPU.

vLLM's CPU build is the engine the other fidelity benchmarks use; a user with a GPU runs whatever
engine they serve with. This script is the GPU check issue 28 asks for, with the one engine that
runs on a bare GPU machine from a few megabytes of wheels (transformers, torch and their serving
extra): it writes a random-weight LLaMA of the chosen shape (engines/tiny_hf.py; no download, EOS
unreachable so that answers have the ``max_tokens`` asked for, since `transformers serve` refuses
``ignore_eos`` and ``min_tokens``, and whole words only, so that every token streams as text: a
token that decodes to none reads as a late first token), starts `transformers serve MODEL --continuous-batching` on
127.0.0.1 with the given paged-KV settings, and runs `llmlb validate` against it with the same
settings (``--no-force-length``; `/v1/models` lists no model, so ``--model`` names the folder).
Where `nvidia-smi` is there it samples the GPU's power, utilisation and SM clock every 200 ms over
the whole validation (``power.csv``): a measured power trace beside the simulated one.

    python benchmarks/validate_transformers.py --device cuda --shape 1b --out gpu-validate
    python benchmarks/validate_transformers.py --device cpu --shape tiny --repeats 2 --requests 30 --out cpu-validate
    # another transformers (the GPU's 5.17, say) from a virtualenv of its own, on the CPU; small settings keep
    # the calibration to minutes on two cores
    python benchmarks/validate_transformers.py --python VENV/bin/python --device cpu --shape tiny --repeats 3 \
        --requests 80 --max-batched-tokens 256 --kv-blocks 512 --max-num-seqs 16 --out cpu-validate-517

``--engine-log`` runs the server through ``llmlb_bench/engines/hf_step_log.py``: the engine's own record
of every step (``engine/steps.csv``: when it was planned, its forward pass began and ended, the update
ended; requests, tokens, KV read, active and waiting) and request (``engine/requests.csv``: handed to the
engine, first scheduled, first token, done), summarised after the validation: the steps by batch, split
into planning, forward pass and update, and the requests' time in the engine's queue and to their first
token, so that what the client sees as slow can be placed; then `benchmarks/engine_log_fit.py` fits the
step model to the logged steps (with and without the dense attention term) and simulates the validation
again with it, so that a miss can be told to be the step model's or not.

Writes into ``--out``: ``validate.log`` (the command's table and verdict), ``validate.json`` (the
comparison, as `llmlb validate` stores it), ``calibrated-profile.json``, ``anchored-profile.json``
where anchored, ``serve.log``, ``power.csv`` where sampled, and ``runs.tar.gz`` (every replay and
simulation as an ordinary run; `llmlb report` compares any two).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine_log_fit import report as engine_log_report  # noqa: E402  (this folder: the script's own)
from llmlb_bench.decode_steps import BUCKETS, bucket_name  # noqa: E402
from llmlb_bench.engines.tiny_hf import write_tiny_model  # noqa: E402
from llmlb_bench.engines.transformers_serve import TransformersServe  # noqa: E402

#: model shapes: (hidden, intermediate, layers, heads, kv heads); "1b" is Llama 3.2 1B's body
#: (its 128k vocabulary left out: the tokenizer is the tiny one, 1,024 tokens); "deep" has many small
#: layers, so that on a CPU its steps are mostly Python dispatching operators, as the 1B model's were
#: on the H200 (a host-bound engine)
SHAPES = {"tiny": (256, 512, 4, 4, 2), "deep": (64, 128, 32, 4, 2), "1b": (2048, 8192, 16, 32, 8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="transformers serve --device (cuda, cuda:0, cpu)")
    ap.add_argument("--python", default=None,
                    help="the interpreter that runs transformers serve (one with transformers' serving extra; "
                         "default: this one)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="the random model's shape")
    ap.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (both sides)")
    ap.add_argument("--kv-blocks", type=int, default=4096, help="KV blocks of the engine (both sides)")
    ap.add_argument("--max-batched-tokens", type=int, default=2048, help="tokens per engine step (both sides)")
    ap.add_argument("--max-num-seqs", type=int, default=64,
                    help="sequences per step the simulator allows (transformers' scheduler has no such "
                         "limit, only the token budget: the calibration's largest decode batch)")
    ap.add_argument("--repeats", type=int, default=5, help="real replays (llmlb validate --repeats)")
    ap.add_argument("--requests", type=int, default=100, help="requests of the default trace")
    ap.add_argument("--trace", type=Path, default=None,
                    help="the trace to validate with (llmlb validate --trace; default: its default trace, "
                         "--requests at --load of the profile's capacity)")
    ap.add_argument("--load", type=float, default=0.5, help="the trace's rate as a fraction of capacity")
    ap.add_argument("--profile", type=Path, default=None,
                    help="the engine's profile from an earlier calibration (llmlb validate --profile): no calibration")
    ap.add_argument("--engine-log", action="store_true",
                    help="run the server through engines/hf_step_log.py: the engine's own log of steps and requests "
                         "(engine/steps.csv, engine/requests.csv), summarised after the validation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds the server may take to start")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds llmlb validate may take; then it is stopped and what it stored is kept")
    ap.add_argument("--out", type=Path, required=True, help="folder for the results (created)")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="validate-hf-"))
    hidden, inter, layers, heads, kv_heads = SHAPES[args.shape]
    t0 = time.monotonic()
    model = write_tiny_model(work / f"model-{args.shape}", hidden_size=hidden, intermediate_size=inter,
                             num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, reachable_eos=False,
                             words_only=True)
    print(f"model {args.shape} written in {time.monotonic() - t0:.1f} s", flush=True)
    engine = TransformersServe(model, python=args.python, device=args.device, block_size=args.block_size, kv_blocks=args.kv_blocks,
                               max_batched_tokens=args.max_batched_tokens, log=args.out / "serve.log",
                               startup_timeout_s=args.ready_timeout,
                               engine_log=args.out / "engine" if args.engine_log else None)
    results = work / "results"
    power = None
    t0 = time.monotonic()
    with engine:
        print(f"server ready in {time.monotonic() - t0:.1f} s", flush=True)
        if args.device.startswith("cuda") and shutil.which("nvidia-smi"):
            power = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,power.draw,utilization.gpu,clocks.sm,memory.used",
                 "--format=csv,nounits", "-lms", "200"],
                stdout=open(args.out / "power.csv", "wb"), stderr=subprocess.DEVNULL)
        cmd = [sys.executable, "-m", "llmlb_bench", "validate", engine.url, *engine.calibrate_flags(),
               "--repeats", str(args.repeats), "--requests", str(args.requests), "--load", str(args.load),
               "--max-num-seqs", str(args.max_num_seqs), "--results", str(results),
               "--seed", str(args.seed)]
        cmd += ["--profile", str(args.profile.resolve())] if args.profile else []
        cmd += ["--trace", str(args.trace.resolve())] if args.trace else []
        env = {**os.environ, "COLUMNS": "160",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with open(args.out / "validate.log", "w") as vlog:
            try:
                rc = subprocess.run(cmd, stdout=vlog, stderr=subprocess.STDOUT, env=env, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
                print(f"llmlb validate stopped after {args.timeout:g} s", file=vlog)
        if power is not None:
            power.terminate()
    print((args.out / "validate.log").read_text(), flush=True)
    if args.engine_log:
        print(engine_summary(args.out / "engine"), flush=True)
    for name in ("calibrated-profile.json", "anchored-profile.json"):
        if (results / name).exists():
            shutil.copy(results / name, args.out / name)
    for table in results.glob("validate-*.json"):
        shutil.copy(table, args.out / "validate.json")
    if results.exists():
        with tarfile.open(args.out / "runs.tar.gz", "w:gz") as tar:
            tar.add(results, arcname="runs")
    shutil.rmtree(work, ignore_errors=True)
    if args.engine_log and rc == 0:
        engine_log_report(args.out, seeds=12)
    sys.exit(rc)


def engine_summary(folder: Path) -> str:
    """The engine's steps by the requests in them: count, and the medians of the whole step, its planning
    (inputs built in Python), its forward pass (to the tokens on the host) and its update (outputs handed
    to the server), in ms, with the share of wall time the engine spent in steps; then its requests'
    time from being handed to the engine to their first scheduling (the engine's queue), to their first
    token and to their last, median and p90 in ms."""
    import numpy as np

    path = folder / "steps.csv"
    log = np.genfromtxt(path, delimiter=",", names=True, ndmin=1)
    if not log.size:
        return f"{path}: no engine steps logged"
    parts = {"step": log["done_s"] - log["planned_s"], "plan": log["forward_s"] - log["planned_s"],
             "forward": log["update_s"] - log["forward_s"], "update": log["done_s"] - log["update_s"]}
    lines = [f"engine steps ({path.name}): {log.size}; busy {parts['step'].sum() / (log['done_s'][-1] - log['planned_s'][0]):.0%} "
             "of the span from the first to the last", "batch   steps   step ms   plan ms   forward ms   update ms"]
    for lo, hi in BUCKETS:
        sel = (log["scheduled"] >= lo) & (log["scheduled"] <= (hi if hi is not None else np.inf))
        if sel.any():
            lines.append(f"{bucket_name(lo, hi):7s} {int(sel.sum()):6d}   " + "   ".join(
                f"{1e3 * float(np.median(v[sel])):7.2f}" for v in parts.values()))
    req = np.genfromtxt(folder / "requests.csv", delimiter=",", names=True, ndmin=1)
    if req.size:
        lines.append(f"engine requests ({req.size}): ms from being handed to the engine, median / p90")
        for name, v in (("to first scheduled (queue)", req["scheduled_s"] - req["added_s"]),
                        ("to first token", req["first_token_s"] - req["added_s"]),
                        ("to last token", req["done_s"] - req["added_s"])):
            lines.append(f"  {name:28s} {1e3 * np.median(v):9.2f} / {1e3 * np.percentile(v, 90):9.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
