"""``llmlb calibrate``: probe a live endpoint and write the simulator profile that predicts it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import (Api, DenseAttention, DenseAttentionOpt, EngineBlockSize, EngineKvBlocks,
                                    EngineMaxSeqs, EngineMaxTokens, EngineModelLen, EnginePrefixCaching, ForceLength,
                                    engine_given)
from llmlb_bench.console import Table
from llmlb_bench.errors import UserError


#: the options that shape the probes (what --refit cannot change: the runs were sent already)
PROBING = ("api", "model", "max_num_seqs", "max_batched_tokens", "block_size", "kv_blocks", "max_model_len",
           "prefix_caching", "max_prompt", "batches", "contexts", "decode_tokens", "repeats", "tokenize", "tokenizer",
           "force_length", "results", "seed", "interference_pairs", "drift_probes")


def _ints(text: Optional[str], flag: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"expected comma-separated positive integers, got {text!r}", flag) from None
    if not values or min(values) < 1:
        raise UserError(f"expected comma-separated positive integers, got {text!r}", flag)
    return values


@app.command()
def calibrate(
    ctx: typer.Context,
    endpoint: Annotated[Optional[str], typer.Argument(help="Base URL of an OpenAI-compatible server (vLLM, llama-server, llmlb serve, ...); none with --refit.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile file to write (JSON); give it to simulate, run, serve, sweep or repro with --profile, or as profile = in a cluster TOML.")] = Path("profile.json"),
    api: Annotated[Api, typer.Option("--api", help="Which API the probes call (completions: no chat template around the prompt).")] = Api.completions,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model name to send (default: the endpoint's first /v1/models entry).")] = None,
    max_num_seqs: EngineMaxSeqs = None,
    max_batched_tokens: EngineMaxTokens = None,
    block_size: EngineBlockSize = None,
    kv_blocks: EngineKvBlocks = None,
    max_model_len: EngineModelLen = None,
    prefix_caching: EnginePrefixCaching = None,
    max_prompt: Annotated[Optional[int], typer.Option("--max-prompt", min=8, help="Longest prefill probe (default: twice the step budget, within the model length and KV).")] = None,
    batches: Annotated[Optional[str], typer.Option("--batches", help="Decode probe batch sizes, e.g. 1,2,4,8 (default: powers of two up to max_num_seqs, at most 64).")] = None,
    contexts: Annotated[Optional[str], typer.Option("--contexts", help="Decode probe prompt lengths, e.g. 16,512,1024 (default: 16, a quarter and half of --max-prompt).")] = None,
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", min=8, help="Output tokens of each decode probe request.")] = 48,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Times each prefill probe length and each decode group is sent (the fit takes the median: 3 outvote one disturbed repeat).")] = 3,
    tokenize: Annotated[bool, typer.Option("--tokenize", help="Exact prompt lengths from the endpoint's /tokenize.")] = False,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="A local tokenizer.json (or folder) for exact prompt lengths.")] = None,
    force_length: ForceLength = True,
    results: Annotated[Optional[Path], typer.Option("--results", "-r", help="Keep the probe runs in this folder (default: a scratch folder, deleted).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the probes' prompts and order.")] = 0,
    interference: Annotated[bool, typer.Option("--interference/--no-interference", help="Send the interference probe (lone arrivals during a decode window) that measures frontend_cpu_s, the engine time each arrival's frontend work takes (off: the profile's frontend_cpu_s is 0).")] = True,
    interference_pairs: Annotated[Optional[int], typer.Option("--interference-pairs", min=1, help="Interference pairs sent (a control and a run with arrivals, 2-3 s each on vLLM CPU); frontend_cpu_s is the median of their readings (default: --repeats).")] = None,
    dense_attention: DenseAttentionOpt = DenseAttention.auto,
    mixed: Annotated[bool, typer.Option("--mixed/--no-mixed", help="Send the mixed-step probe (lone arrivals prefilling one chunk beside a decoding batch at a short and a long context; each arrival sent as a pilot request of the batch ends), whose steps price a chunk beside a batch and show per_dense_s where the engine has it.")] = True,
    refit: Annotated[Optional[Path], typer.Option("--refit", help="Fit again the probe runs an earlier calibration kept with --results FOLDER, probing nothing: to compare fits on one draw of the engine's speed (--dense-attention; --no-mixed and --no-interference leave those probes' runs out). The probing options do not apply.")] = None,
    drift_probes: Annotated[Optional[int], typer.Option("--drift-probes", min=0, help="Times a small reference decode probe is sent over the calibration (first, last and evenly between the others; default 10), to measure how the engine's speed drifts over time (jitter.drift_sigma, drift_period_s); 0: none, the drift then rests on the decode groups' repeats alone.")] = None,
) -> None:
    """Fit the simulator's step-time model to ENDPOINT: prefill probes of growing prompt length, concurrent decodes at growing batch and context, and repeated prefixes; print the fit and its residuals and write the profile.

    Engine settings are read from the engine where it publishes them (vLLM's vllm:cache_config_info, /v1/models, llama.cpp's /props) or given as flags; see docs/fidelity.md.

    Example:

        llmlb calibrate http://127.0.0.1:8000 --max-num-seqs 16 --max-batched-tokens 2048 -o vllm-cpu.json

    Fit the same probe runs again another way (kept with --results), probing nothing:

        llmlb calibrate http://127.0.0.1:8000 -r probes -o with-mixed.json
        llmlb calibrate --refit probes --no-mixed -o without-mixed.json
    """
    from llmlb_bench.calibrate import calibrate as run_calibration, refit as refit_calibration
    from llmlb_bench.replay import ReplayOptions
    from llmlb_bench.store.run import write_text_atomic

    if output.exists() and output.is_dir():
        raise UserError("is a folder, expected a profile file to write", output)
    if refit is not None:
        # (the source's enum is Click's, which Typer >= 0.20 vendors as typer._click: compared by name)
        probing = [param.opts[0] for param in ctx.command.params if param.name in PROBING
                   and getattr(ctx.get_parameter_source(param.name), "name", None) == "COMMANDLINE"]
        if endpoint is not None or probing:
            raise UserError(f"fits kept runs, so {', '.join(([endpoint] if endpoint else []) + probing)} cannot "
                            "apply (the probes were sent when the runs were kept)", "--refit")
        cal = refit_calibration(refit, dense_attention.value, mixed=mixed, interference=interference)
    elif endpoint is None:
        raise UserError("give the ENDPOINT to probe, or --refit FOLDER of kept probe runs", "llmlb calibrate")
    else:
        given = engine_given(max_num_seqs, max_batched_tokens, block_size, kv_blocks, max_model_len, prefix_caching)
        options = ReplayOptions(api=api.value, model=model, tokenize=tokenize,
                                tokenizer=str(tokenizer) if tokenizer else None, force_output_length=force_length)
        cal = run_calibration(endpoint, given, options=options, max_prompt=max_prompt,
                              batches=_ints(batches, "--batches"), contexts=_ints(contexts, "--contexts"),
                              decode_tokens=decode_tokens, repeats=repeats, results=results, seed=seed,
                              interference=interference, interference_pairs=interference_pairs,
                              dense_attention=dense_attention.value, mixed=mixed,
                              **({} if drift_probes is None else {"drift_probes": drift_probes}))
    info = cal.engine
    console.print(f"[bold]{info.kind}[/] at {info.url}, model {info.model}: " + ", ".join(
        f"{k} {v} ({info.sources[k]})" for k, v in info.settings.items()), highlight=False, soft_wrap=True)
    t = Table("probe", "observation", "measured ms", "predicted ms", "error %", title="Fit residuals")
    for o in cal.fit.observations:
        t.add_row(o.probe, o.what + (f" [dim](median of {o.repeats})[/]" if o.repeats > 1 else "")
                  + (" [dim](outlier)[/]" if o.outlier else ""), f"{1e3 * o.measured_s:.2f}",
                  f"{1e3 * o.predicted_s:.2f}", f"{100 * o.error:+.1f}")
    console.print(t)
    for kind, s in cal.fit.summary().items():
        console.print(f"{kind}: {s['observations']} observations, mean |error| {s['mean_abs_error_pct']}%, "
                      f"max {s['max_abs_error_pct']}%" + (f", {s['outliers']} outliers" if s["outliers"] else ""),
                      highlight=False)
    step = cal.profile["step"]
    console.print("step_s = {base_s:.4g} + {per_token_s:.4g} x tokens + {per_sample_s:.4g} x sampled + "
                  "{per_attn_s:.4g} x attn + {per_kv_s:.4g} x kv".format(**step)
                  + (f" + {step['per_dense_s']:.4g} x tokens x kv" if step["per_dense_s"] else "")
                  + f";  request overhead {1e3 * cal.profile['request_overhead_s']:.3f} ms + "
                    f"{1e6 * cal.profile['request_per_prompt_token_s']:.3f} us x prompt tokens"
                  + f", of which {1e3 * cal.profile['frontend_cpu_s']:.3f} ms per request taken from the steps"
                  + (f" (median of {len(cal.fit.frontend['pairs_ms'])} interference pairs: "
                     f"{', '.join(f'{v:.1f}' for v in cal.fit.frontend['pairs_ms'])} ms)" if cal.fit.frontend else "")
                  + (f" ({cal.profile['frontend_wait_share']:.2f} of it on the arriving request's own wait)"
                     if "frontend_wait_share" in cal.profile else ""),
                  highlight=False)
    j = cal.jitter
    console.print(f"step spread over {j['steps']} decode steps in {j['windows']} windows: lognormal sigma "
                  f"{j['sigma']:.3f}; {j['slow_phases']} slow phases"
                  + (f" ({j['slow_rate_hz']:.3g} per second, {1e3 * j['slow_mean_s']:.1f} ms long, "
                     f"x{j['slow_factor']:.2f})" if j["slow_phases"] else ""), highlight=False)
    console.print(f"engine speed drift over {j['drift_span_s']:.0f} s ({j['drift_windows']} repeated windows): "
                  + (f"log sd {j['drift_sigma']:.3f}, correlation time {j['drift_period_s']:.3g} s"
                     if j["drift_sigma"] else "none beyond the windows' own noise"), highlight=False)
    ref = cal.profile.get("reference")
    if ref is not None:
        console.print(f"reference probe ({ref['batch']} requests x {ref['tokens']} tokens): typical step "
                      f"{1e3 * ref['step_s']:.3f} ms over {ref['probes']} windows (what llmlb validate anchors on)",
                      highlight=False)
    for note in cal.fit.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    if info.assumed:
        console.print(f"[yellow]assumed (not published by the engine, not given):[/] {', '.join(info.assumed)}",
                      highlight=False)
    write_text_atomic(output, json.dumps(cal.profile, indent=2) + "\n")
    console.print(f"wrote {output}", highlight=False)
