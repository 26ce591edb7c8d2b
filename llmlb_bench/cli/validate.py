"""``llmlb validate``: replay a trace against an endpoint K times, simulate it with the endpoint's
profile under N seeds (``--sim-seeds``), and say how far the simulator's figures are from the engine's."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import (Api, DenseAttention, DenseAttentionOpt, EngineBlockSize, EngineKvBlocks,
                                    EngineMaxSeqs, EngineMaxTokens, EngineModelLen, EnginePrefixCaching, ForceLength,
                                    ResultsDir, Seed, engine_given)
from llmlb_bench.errors import UserError


def _pct(v: float) -> str:
    return f"{100 * v:+.1f}" if math.isfinite(v) else "n/a"


def _ms(v: float) -> str:
    return f"{1e3 * v:.2f}" if math.isfinite(v) else "n/a"


@app.command()
def validate(
    endpoint: Annotated[str, typer.Argument(help="Base URL of an OpenAI-compatible server (vLLM, SGLang, llama-server, llmlb serve, ...).")],
    trace: Annotated[Optional[Path], typer.Option("--trace", "-t", help="Trace to replay and simulate (default: chat-like Poisson traffic at --load of the profile's capacity).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", "-k", min=2, help="Real replays (at least 2: a spread needs two).")] = 5,
    sim_seeds: Annotated[Optional[int], typer.Option("--sim-seeds", min=2, help="Simulator seeds (seed j simulates replay j mod K's trace). Default: 30 when the profile simulated has a speed drift (drift_sigma > 0; an anchored profile has the run's), else --repeats: a drift as slow as a replay draws about one replica speed per seed, so the median over 5 seeds is five draws of that speed, not the model's median (on vLLM CPU seeds 1-5 put every figure +39%; docs/fidelity.md).")] = None,
    profile: Annotated[Optional[Path], typer.Option("--profile", help="The endpoint's profile (from llmlb calibrate); default: calibrate first.")] = None,
    requests: Annotated[int, typer.Option("--requests", min=4, help="Requests of the default trace.")] = 100,
    load: Annotated[float, typer.Option("--load", min=0.01, max=1.5, help="Default trace: arrival rate as a fraction of the profile's simulated capacity.")] = 0.5,
    api: Annotated[Api, typer.Option("--api", help="Which API to call.")] = Api.completions,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model name to send (default: the endpoint's first /v1/models entry).")] = None,
    tokenize: Annotated[bool, typer.Option("--tokenize", help="Exact prompt lengths from the endpoint's /tokenize.")] = False,
    force_length: ForceLength = True,
    max_num_seqs: EngineMaxSeqs = None,
    max_batched_tokens: EngineMaxTokens = None,
    block_size: EngineBlockSize = None,
    kv_blocks: EngineKvBlocks = None,
    max_model_len: EngineModelLen = None,
    prefix_caching: EnginePrefixCaching = None,
    max_prompt: Annotated[Optional[int], typer.Option("--max-prompt", min=8, help="Calibration: longest prefill probe.")] = None,
    interference_pairs: Annotated[Optional[int], typer.Option("--interference-pairs", min=1, help="Calibration: interference pairs sent, whose readings' median is frontend_cpu_s (default: as llmlb calibrate).")] = None,
    anchor: Annotated[Optional[bool], typer.Option("--anchor/--no-anchor", help="Send the profile's reference probe before every replay and after the last, and simulate with the step model rescaled to their long-run median and their drift; the profile as calibrated is simulated too, on the same seeds, and shown on one line beneath (default: when the profile has a reference probe; see docs/fidelity.md).")] = None,
    dense_attention: DenseAttentionOpt = DenseAttention.auto,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Requests sent first and counted for nothing (the first requests after a start are slow).")] = 16,
    results: ResultsDir = Path("results"),
    seed: Seed = 0,
) -> None:
    """Is the simulator right about THIS engine? Calibrate it (or take --profile), replay the trace --repeats times and simulate it under --sim-seeds seeds, then print per figure the bias (median simulated / median real - 1, with a bootstrap interval), both sides' spread over the repeats, the per-request E2E MAPE, the engine's decode steps by batch on both sides (a diagnosis: where the latencies miss, does the step model?), and a one-line verdict against the aims (|bias| <= 5% E2E/TPOT p50/p90, <= 10% TTFT, spread within 0.5-2x). Every replay and simulation is stored as an ordinary run (compare any two with llmlb report); see docs/fidelity.md.

    Example:

        llmlb validate http://127.0.0.1:8000 --trace my-trace.parquet --repeats 5 --max-num-seqs 16

    An engine that refuses min_tokens/ignore_eos (transformers serve) and publishes no settings:

        llmlb validate http://127.0.0.1:8000 --no-force-length --model MODEL --block-size 16 --kv-blocks 4096 --max-num-seqs 64 --max-batched-tokens 2048
    """
    from llmlb_bench.replay import ReplayOptions
    from llmlb_bench.schema import read_trace
    from llmlb_bench.sim.profile import read_profile
    from llmlb_bench.validate import default_trace, validate as run_validation

    # everything a user gave is checked before any probe or replay
    table = read_trace(trace) if trace is not None else None
    prof = read_profile(profile) if profile is not None else None
    if prof is not None and dense_attention is not DenseAttention.auto:
        raise UserError("applies to the calibration, and --profile skips it (set per_dense_s in the profile instead)",
                        "--dense-attention")
    if anchor and prof is not None:
        from llmlb_bench.calibrate.anchor import reference_of

        reference_of(prof)      # one line if it cannot be anchored
    if results.exists() and not results.is_dir():
        raise UserError("is a file, expected a results folder", results)
    options = ReplayOptions(api=api.value, model=model, tokenize=tokenize, force_output_length=force_length)
    if prof is None:
        from llmlb_bench.calibrate import calibrate

        console.print(f"calibrating {endpoint} ...", highlight=False)
        given = engine_given(max_num_seqs, max_batched_tokens, block_size, kv_blocks, max_model_len, prefix_caching)
        cal = calibrate(endpoint, given, options=options, max_prompt=max_prompt, seed=seed,
                        interference_pairs=interference_pairs, dense_attention=dense_attention.value)
        prof = cal.profile
        results.mkdir(parents=True, exist_ok=True)
        path = results / "calibrated-profile.json"
        path.write_text(json.dumps(prof, indent=2) + "\n")
        console.print(f"profile written to {path}: typical step {1e3 * prof['step']['base_s']:.2f} ms + ..., "
                      f"jitter sigma {cal.jitter['sigma']:.3f}, speed drift log sd "
                      f"{cal.jitter['drift_sigma']:.3f}", highlight=False, soft_wrap=True)
    if anchor is None:      # by default whenever the profile can be
        anchor = "reference" in prof and "anchor" not in prof
    if table is None:
        table = default_trace(prof, requests, load, seed)
        console.print(f"default trace: {table.num_rows} requests at {load:.0%} of the profile's capacity", highlight=False)
    results.mkdir(parents=True, exist_ok=True)
    v = run_validation(endpoint, table, repeats, prof, options, results, seed=seed, warmup=warmup, anchor=anchor,
                       sim_seeds=sim_seeds, say=lambda line: console.print(line, highlight=False))
    from llmlb_bench.console import Table

    t = Table("figure", "real median ms", "sim median ms", "bias %", "95% interval %", "real spread %",
              "sim spread %", "aim", title=f"Simulated ({len(v.sim_runs)} seeds) vs real ({repeats} replays)")
    for c in v.comparison.figures:
        from llmlb_bench.validate import BIAS_AIMS

        aim = BIAS_AIMS.get(c.figure)
        t.add_row(c.figure, f"{1e3 * sorted(c.real)[len(c.real) // 2]:.1f}", f"{1e3 * sorted(c.sim)[len(c.sim) // 2]:.1f}",
                  _pct(c.bias), f"[{_pct(c.low)}, {_pct(c.high)}]", f"{100 * c.real_spread:.1f}",
                  f"{100 * c.sim_spread:.1f}", f"±{100 * aim:.0f}%" if aim else "")
    console.print(t)
    if v.comparison.steps:
        steps = Table("batch", "real ms", "sim ms", "sim/real - 1 %", "steps real", "steps sim",
                      title="Decode steps by batch: median length per token (a diagnosis, no aim)")
        for b in v.comparison.steps:
            steps.add_row(b.batch, _ms(b.real_s), _ms(b.sim_s), _pct(b.ratio), str(b.real_steps), str(b.sim_steps))
        console.print(steps)
    mape = v.comparison.mape
    if mape:
        console.print(f"per-request E2E MAPE: {100 * sorted(mape)[len(mape) // 2]:.1f}% (median over {len(mape)} "
                      f"replay/seed pairs; range {100 * min(mape):.1f}-{100 * max(mape):.1f}%)", highlight=False)
    console.print(f"load average {v.load_average[0]:.2f} at the start, {v.load_average[1]:.2f} at the end",
                  highlight=False)
    console.print(f"runs in {results}: real {', '.join(v.real_runs)}; simulated {', '.join(v.sim_runs)} "
                  f"(compare: llmlb report {results / v.real_runs[0]} {results / v.sim_runs[0]})",
                  highlight=False, soft_wrap=True)
    console.print(v.comparison.verdict(), highlight=False, soft_wrap=True)
    if v.calibrated is not None:
        from llmlb_bench.validate import BIAS_AIMS

        biases = ", ".join(f"{c.figure} {_pct(c.bias)}%" for c in v.calibrated.figures if c.figure in BIAS_AIMS)
        console.print(f"the profile as calibrated, without the anchor, the same seeds ({v.calibrated_runs[0]}...): "
                      f"bias {biases}; {v.calibrated.verdict()}", highlight=False, soft_wrap=True)
