"""Options shared by several commands (declared once, used by each)."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from llmlb_bench.errors import UserError

if TYPE_CHECKING:
    from llmlb_bench.sim.config import ClusterConfig

ResultsDir = Annotated[Path, typer.Option("--results", "-r", help="Results directory (one folder per run).")]
def _checked_slo(value: Optional[str]) -> Optional[str]:
    """Parse --slo as the command line is read, so a bad SLO stops a command before any work."""
    from llmlb_bench.metrics.slo import Slo

    Slo.parse(value)
    return value


def checked_name(param: typer.CallbackParam, value: Optional[str]) -> Optional[str]:
    """Check a name that becomes a folder (--run-id, --name) as the command line is read."""
    from llmlb_bench.names import check_name

    return None if value is None else check_name(value, param.opts[0])


RunId = Annotated[Optional[str], typer.Option("--run-id", callback=checked_name,
                                              help="Run id, the run's folder name (default: <label>-<time>-<hex>).")]
SloOpt = Annotated[
    Optional[str],
    typer.Option("--slo", callback=_checked_slo,
                 help="Per-request SLO, e.g. ttft=500ms,tpot=50ms,e2e=20s (units us/ms/s; ms if omitted)."),
]
PolicyArgs = Annotated[
    Optional[list[str]],
    typer.Option("--policy-arg", help="Policy parameter key=value (repeatable)."),
]
Seed = Annotated[int, typer.Option("--seed", help="Seed for every random choice of the run.")]
# the engine settings llmlb calibrate (and llmlb validate's calibration) take where the engine does not publish them
EngineMaxSeqs = Annotated[Optional[int], typer.Option("--max-num-seqs", min=1, help="The engine's max_num_seqs (default: what the engine publishes, else vLLM's 256).")]
EngineMaxTokens = Annotated[Optional[int], typer.Option("--max-batched-tokens", min=1, help="The engine's max_num_batched_tokens (default: what it publishes, else vLLM's 2048).")]
EngineBlockSize = Annotated[Optional[int], typer.Option("--block-size", min=1, help="The engine's KV block size in tokens (default: vllm:cache_config_info).")]
EngineKvBlocks = Annotated[Optional[int], typer.Option("--kv-blocks", min=1, help="KV blocks of the engine (default: vllm:cache_config_info num_gpu_blocks).")]
EngineModelLen = Annotated[Optional[int], typer.Option("--max-model-len", min=2, help="Longest prompt + output (default: /v1/models max_model_len).")]
EnginePrefixCaching = Annotated[Optional[bool], typer.Option("--prefix-caching/--no-prefix-caching", help="Whether the engine caches prompt prefixes (default: what it publishes, else on).")]


def engine_given(max_num_seqs: Optional[int], max_batched_tokens: Optional[int], block_size: Optional[int],
                 kv_blocks: Optional[int], max_model_len: Optional[int],
                 prefix_caching: Optional[bool]) -> dict[str, Optional[int]]:
    """The Engine* flags as the settings calibrate.endpoint.discover takes (None: not given)."""
    return {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_batched_tokens, "block_size": block_size,
            "num_kv_blocks": kv_blocks, "max_model_len": max_model_len, "enable_prefix_caching": prefix_caching}


ForceLength = Annotated[bool, typer.Option(
    "--force-length/--no-force-length",
    help="Send min_tokens and ignore_eos so outputs have the trace's length (vLLM, SGLang, llama.cpp); "
    "off for engines that refuse them (transformers serve answers 422), whose outputs then end at "
    "max_tokens or their EOS.")]
#: closed loop, the same in the replayer and the simulator (trace_schedule.py)
Users = Annotated[Optional[int], typer.Option("--users", min=1, help="Closed loop: this many users, each sending the trace's next request when its last one ended (default: open loop at trace times).")]
ThinkTime = Annotated[float, typer.Option("--think-time", min=0.0, help="Closed loop: seconds a user waits between requests.")]

# cluster shape (the simulator's ClusterConfig fields). Every flag defaults to None: unset
# flags leave the --cluster file's value, or ClusterConfig's default, in force.
#: ClusterConfig's defaults, as the flags' help shows them. Written out, not read from ClusterConfig:
#: importing the simulator (numpy, pyarrow, the policies) would cost every command's --help about a
#: second; tests/test_cli_startup.py checks that they equal ClusterConfig's, so they cannot drift.
_DEFAULT = {"replicas": 4, "gpu": "a100-80g", "model": "llama-3-8b", "tp": 1, "pp": 1, "scheduler": "fcfs",
            "signal_refresh_s": 0.0}
ClusterFile = Annotated[Optional[Path], typer.Option(
    "--cluster", help="Cluster TOML: ClusterConfig fields, [\\[pools]] for mixed or disaggregated fleets, "
                      "\\[autoscale], \\[moe] (see clusters/). Flags below override its top-level fields.")]
Replicas = Annotated[Optional[int], typer.Option("--replicas", min=1, help=f"Number of replicas \\[default: {_DEFAULT['replicas']}].")]
Gpu = Annotated[Optional[str], typer.Option(
    "--gpu", help=f"GPU type from the catalog (see docs/simulator.md) \\[default: {_DEFAULT['gpu']}].")]
Model = Annotated[Optional[str], typer.Option("--model", help=f"Model from the catalog \\[default: {_DEFAULT['model']}].")]
Tp = Annotated[Optional[int], typer.Option("--tp", min=1, help=f"Tensor-parallel degree per replica \\[default: {_DEFAULT['tp']}].")]
Pp = Annotated[Optional[int], typer.Option("--pp", min=1, help="Pipeline-parallel stages per replica (each on tp "
                                                               f"GPUs) \\[default: {_DEFAULT['pp']}].")]
MaxSeqs = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", min=1, help="Max running requests per replica \\[default: vLLM's default for the GPU].")]
MaxTokens = Annotated[Optional[int], typer.Option(
    "--max-batched-tokens", min=1, help="Token budget per engine step \\[default: vLLM's default for the GPU].")]
SchedulerOpt = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Engine-level scheduler of each replica: fcfs, priority, sjf, vtc, deadline "
                        f"or package.module:Class (see llmlb policies) \\[default: {_DEFAULT['scheduler']}].")]
SchedulerArgs = Annotated[
    Optional[list[str]],
    typer.Option("--scheduler-arg", help="Engine scheduler parameter key=value (repeatable)."),
]
SignalRefresh = Annotated[Optional[float], typer.Option(
    "--signal-refresh", min=0.0, help="Seconds between scrapes of the replicas' queue and KV signals that "
                                      "routers read (0 = always fresh; the router's own counts are exact) "
                                      f"\\[default: {_DEFAULT['signal_refresh_s']:g}].")]

ProfileOpt = Annotated[Optional[Path], typer.Option(
    "--profile", help="Measured engine profile (JSON from llmlb calibrate) for every pool: its step times and KV "
                      "blocks replace the roofline's, its engine settings fill those not given (docs/fidelity.md).")]
NoJitter = Annotated[bool, typer.Option(
    "--no-jitter", help="Every step takes the profile's median time: no step-time jitter drawn from the "
                        "profile's measured spread (docs/fidelity.md).")]


#: the cluster flags, in the order --help lists them (see :func:`cluster_flags`)
_CLUSTER_FLAGS = tuple(
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False if name == "no_jitter" else None,
                      annotation=option)
    for name, option in (("cluster_file", ClusterFile), ("replicas", Replicas), ("gpu", Gpu), ("model", Model),
                         ("tp", Tp), ("pp", Pp), ("max_num_seqs", MaxSeqs), ("max_batched_tokens", MaxTokens),
                         ("scheduler", SchedulerOpt), ("scheduler_arg", SchedulerArgs),
                         ("signal_refresh", SignalRefresh), ("profile", ProfileOpt), ("no_jitter", NoJitter)))


@dataclass(frozen=True)
class ClusterFlags:
    """The cluster flags as given on the command line (None: not given)."""

    cluster_file: Path | None = None
    replicas: int | None = None
    gpu: str | None = None
    model: str | None = None
    tp: int | None = None
    pp: int | None = None
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    scheduler: str | None = None
    scheduler_arg: list[str] | None = None
    signal_refresh: float | None = None
    profile: Path | None = None
    no_jitter: bool = False

    def config(self) -> "ClusterConfig":
        """The cluster the flags describe: the --cluster file (or defaults) with given flags on top."""
        from llmlb_bench.policies import parse_args
        from llmlb_bench.sim import ClusterConfig, load_cluster

        flags = {"replicas": self.replicas, "gpu": self.gpu, "model": self.model, "tp": self.tp, "pp": self.pp,
                 "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_batched_tokens,
                 "scheduler": self.scheduler,
                 "scheduler_args": parse_args(self.scheduler_arg, "--scheduler-arg") or None,
                 "signal_refresh_s": self.signal_refresh, "jitter": False if self.no_jitter else None}
        given = {k: v for k, v in flags.items() if v is not None}
        cfg = load_cluster(self.cluster_file, given) if self.cluster_file is not None else ClusterConfig.from_dict(given)
        return cfg.with_profile(self.profile) if self.profile is not None else cfg


def cluster_flags(without: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the cluster flags (--cluster, --replicas, --gpu, ..., less those named in
    ``without``) in place of its parameter ``cluster: ClusterFlags``, which receives them.

    Why a decorator: Typer reads a command's options from its signature, so
    every command that simulates would otherwise repeat the same eleven
    parameters; here they are declared once and spliced into each signature
    where ``cluster`` stands (which is also where --help lists them). Any: a Typer command of any
    signature."""
    flags = [p for p in _CLUSTER_FLAGS if p.name not in without]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(command, eval_str=True)
        params = [q for p in sig.parameters.values() for q in (flags if p.name == "cluster" else [p])]

        @functools.wraps(command)
        def with_flags(**kwargs: Any) -> Any:
            given = {p.name: kwargs.pop(p.name) for p in flags}
            return command(cluster=ClusterFlags(**given), **kwargs)

        with_flags.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        with_flags.__annotations__ = {p.name: p.annotation for p in params} | {"return": sig.return_annotation}
        return with_flags

    return decorate


class ReportFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    md = "md"
    html = "html"


class TableFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


# ---- options of the commands that replay against endpoints (replay, capacity, calibrate) ----------------

class WorkerExecutor(str, Enum):
    process = "process"
    ray = "ray"


class DenseAttention(str, Enum):
    """Whether calibrate's fit takes the dense attention term (calibrate/fit.py ``dense_test``)."""

    auto = "auto"
    on = "on"
    off = "off"


#: calibrate's choice of the dense attention term (sim/profile.py ``per_dense_s``), in calibrate and validate
DenseAttentionOpt = Annotated[DenseAttention, typer.Option(
    "--dense-attention", help="The step model's dense attention term (per_dense_s x tokens x kv: engines that attend with "
    "one masked product over the whole step, as transformers without flash attention): auto keeps it where an "
    "F-test says the probes show it, on fits it always (an engine known to attend so), off leaves it out.")]


class Api(str, Enum):
    chat = "chat"
    completions = "completions"


Workers = Annotated[int, typer.Option("--workers", min=1, help="Client processes sharing the run when one core cannot keep the schedule (each routes its share with its own copy of the policy).")]
Executor = Annotated[WorkerExecutor, typer.Option("--executor", help="Where the --workers run: local processes, or Ray actors spread over the nodes of a Ray cluster for loads one machine cannot generate (each actor's clock offset is measured and corrected; extra 'ray').")]
RayAddress = Annotated[Optional[str], typer.Option("--address", help="Ray cluster for --executor ray: auto, host:port or ray://host:10001 (default: a private local Ray instance).")]


def check_workers(workers: int, executor: WorkerExecutor, address: str | None) -> None:
    """The combinations of --workers, --executor and --address that mean something."""
    if executor is WorkerExecutor.ray and workers < 2:
        raise UserError("Ray actors share the load of --workers 2 or more", "--executor")
    if address is not None and executor is not WorkerExecutor.ray:
        raise UserError("--address needs --executor ray", "--address")
    if address is not None:     # before any results folder exists (a cluster that is not there hangs ray.init)
        from llmlb_bench.raycluster import check_address
        check_address(address)
