"""``llmlb serve``: a simulated fleet behind real OpenAI-compatible HTTP endpoints."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import ClusterFlags, PolicyArgs, Seed, cluster_flags
from llmlb_bench.errors import UserError


@app.command()
@cluster_flags(("signal_refresh",))
def serve(
    cluster: ClusterFlags = ClusterFlags(),
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="One port in front of every replica, routed by --policy (0: any free port).")] = 8000,
    port_per_replica: Annotated[Optional[int], typer.Option("--port-per-replica", min=0, max=65535, help="Replica i listens on BASE + i, each an independent engine (0: any free ports).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind (default: loopback only).")] = "127.0.0.1",
    policy: Annotated[Optional[str], typer.Option("--policy", "-p", help="Routing policy behind the single --port (default least_outstanding; see llmlb policies).")] = None,
    policy_arg: PolicyArgs = None,
    speed: Annotated[float, typer.Option("--speed", help="Simulated seconds per wall-clock second (2 = everything twice as fast).")] = 1.0,
    mean_output_tokens: Annotated[float, typer.Option("--mean-output-tokens", help="Mean answer length (geometric) when a request sets neither ignore_eos nor min_tokens = max_tokens.")] = 256.0,
    served_model_name: Annotated[Optional[str], typer.Option("--served-model-name", help="Model name for /v1/models and requests (default: --model).")] = None,
    lora_modules: Annotated[Optional[list[str]], typer.Option("--lora-modules", help="LoRA adapter names served besides the base model (repeatable; needs a cluster with max_loras > 0, whose slots the replicas model).")] = None,
    seed: Seed = 0,
) -> None:
    """Serve a simulated fleet over OpenAI-compatible HTTP, streaming tokens at the simulated times.

    Each replica is the simulator's vLLM-style engine (continuous batching, paged KV cache, prefix caching, roofline step times), advanced in real time; --cluster takes mixed pools (heterogeneous GPUs), not disaggregation or autoscaling. Prints one line per port ("r0 http://127.0.0.1:8000"), then serves until Ctrl-C or SIGTERM.

    Examples:

        llmlb serve --replicas 4 --port-per-replica 8000      # four engines on 8000..8003

        llmlb serve --replicas 4 --port 8000 --policy power_of_d --gpu h100-sxm --speed 4
    """
    from llmlb_bench.policies import make_policy, parse_args
    from llmlb_bench.serve import ServeOptions, run

    if port_per_replica is not None and policy is not None:
        raise UserError("--policy routes behind the single --port; with --port-per-replica the client routes",
                        "--policy")
    if not speed > 0:
        raise UserError(f"must be > 0, got {speed!r}", "--speed")
    config = cluster.config()
    if port_per_replica is not None and port_per_replica + config.replicas - 1 > 65535:
        raise UserError(f"ports {port_per_replica}..{port_per_replica + config.replicas - 1} go past 65535",
                        "--port-per-replica")
    pol = None
    if port_per_replica is None:
        pol = make_policy(policy or "least_outstanding", parse_args(policy_arg), seed=seed)
    options = ServeOptions(host=host, port=port, port_per_replica=port_per_replica, speed=speed, seed=seed,
                           mean_output_tokens=mean_output_tokens, model_name=served_model_name,
                           lora_modules=tuple(lora_modules or ()))

    def announce(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True)

    totals = run(config, options, pol, announce)
    console.print(f"stopped: {totals['finished']} requests finished, {totals['aborted']} aborted, "
                  f"{totals['rejected']} rejected, {totals['generated_tokens']} tokens generated",
                  highlight=False, soft_wrap=True)
