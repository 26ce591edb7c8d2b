"""``llmlb engine``: start local real engines (vLLM's CPU build, llama.cpp's llama-server) on
127.0.0.1 and keep them up until Ctrl-C, for users without GPUs (see docs/engines.md)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.lazy import Group
from llmlb_bench.cli.app import app, console
from llmlb_bench.errors import UserError

engine_app = typer.Typer(help="Start local real engines on 127.0.0.1 (no GPU needed): vLLM's CPU build or "
                         "llama-server, with a tiny random-weight model written locally. See docs/engines.md.\n\n"
                         "Example:  llmlb engine vllm --replicas 2 --port 8000",
                         no_args_is_help=True, cls=Group)
app.add_typer(engine_app, name="engine")


def _model_dir(model: str, scratch: Path) -> Path:
    """``tiny``: write the tiny model into ``scratch``; else a folder with an HF config."""
    from llmlb_bench.engines.vllm import write_tiny_model

    if model == "tiny":
        return write_tiny_model(scratch / "tiny")
    path = Path(model)
    if not (path / "config.json").is_file():
        raise UserError("not a model folder (no config.json); give a Hugging Face model folder or 'tiny'", "--model")
    return path


def _lora_modules(specs: list[str], model: str) -> dict[str, Path | None]:
    """``--lora`` values as name -> PEFT folder (None: write a tiny adapter), checked up front."""
    out: dict[str, Path | None] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not name or (sep and not folder):
            raise UserError(f"expected NAME or NAME=DIR, got {spec!r}", "--lora")
        if name in out:
            raise UserError(f"adapter {name!r} given twice", "--lora")
        if sep and not (Path(folder) / "adapter_config.json").is_file():
            raise UserError(f"{folder}: not a PEFT adapter folder (no adapter_config.json)", "--lora")
        if not sep and model != "tiny":
            raise UserError(f"give {name}=DIR: random adapters are written only for --model tiny", "--lora")
        out[name] = Path(folder) if sep else None
    return out


def _serve_forever(urls: list[str], what: str) -> None:
    console.print(f"{what} ready; press Ctrl-C to stop")
    for url in urls:
        print(url, flush=True)
    while True:
        time.sleep(3600)


@engine_app.command("vllm")
def vllm(
    replicas: Annotated[int, typer.Option("--replicas", "-n", min=1, help="Number of servers, each pinned to its own CPU core (about 4 GB of memory each).")] = 1,
    model: Annotated[str, typer.Option("--model", help="Hugging Face model folder, or 'tiny' for a tiny random-weight LLaMA written locally.")] = "tiny",
    port: Annotated[Optional[int], typer.Option("--port", min=1, max=65535, help="Port of the first replica; the others follow. Default: free ports.")] = None,
    cores: Annotated[Optional[str], typer.Option("--cores", help="Comma-separated CPU cores, one per replica. Default: replica k on the k-th usable core.")] = None,
    served_model: Annotated[str, typer.Option("--served-model-name", help="Model name requests must use.")] = "tiny",
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", min=1, help="Running requests per scheduler step.")] = 16,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option("--max-num-batched-tokens", min=1, help="Token budget of one scheduler step (default: vLLM's).")] = None,
    num_gpu_blocks: Annotated[Optional[int], typer.Option("--num-gpu-blocks-override", min=1, help="KV cache blocks (128 tokens each on CPU); small values force preemption.")] = None,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="vLLM's automatic prefix caching.")] = True,
    kv_space: Annotated[int, typer.Option("--kv-space-gib", min=1, help="Memory for the KV cache per replica (VLLM_CPU_KVCACHE_SPACE).")] = 2,
    speculative_config: Annotated[Optional[str], typer.Option("--speculative-config", help="vLLM's speculative decoding settings as a JSON object, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_max\":4}' (docs/speculative.md).")] = None,
    vllm_arg: Annotated[Optional[list[str]], typer.Option("--vllm-arg", help="One more argument passed to 'vllm serve' as is (repeat: --vllm-arg=--seed --vllm-arg=1).")] = None,
    log_dir: Annotated[Optional[Path], typer.Option("--log-dir", help="Keep each replica's log here as vllm-<k>.log.")] = None,
    lora: Annotated[Optional[list[str]], typer.Option("--lora", help="A LoRA adapter served as model NAME: NAME=DIR (a PEFT folder), or NAME alone for a tiny random rank-8 adapter written locally (repeatable; turns on --enable-lora).")] = None,
    max_loras: Annotated[int, typer.Option("--max-loras", min=1, help="Distinct adapters in one running batch (vLLM's --max-loras).")] = 1,
    max_lora_rank: Annotated[int, typer.Option("--max-lora-rank", min=1, help="Largest adapter rank served (vLLM's --max-lora-rank).")] = 8,
    max_cpu_loras: Annotated[Optional[int], typer.Option("--max-cpu-loras", min=1, help="Adapters cached in CPU memory (default: vLLM's, --max-loras).")] = None,
    reasoning: Annotated[bool, typer.Option("--reasoning", help="vLLM's deepseek_r1 reasoning parser, and a logits processor that makes the tiny model reason for each request's vllm_xargs.reasoning_tokens (what llmlb replay sends for a trace's reasoning rows; docs/engines.md).")] = False,
) -> None:
    """Start vLLM CPU replicas, print their URLs, and run until Ctrl-C (then stop every process).

    Needs vLLM's CPU build: scripts/install_vllm_cpu.sh (about 3 minutes, 2.5 GB, cached).
    Requests use ignore_eos to get full-length outputs from the random model.

    Examples:

        llmlb engine vllm --replicas 2 --port 8000

        llmlb engine vllm --lora a1 --lora a2 --lora a3 --max-loras 2      # three tiny adapters, two slots
    """
    from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, find_vllm, write_tiny_adapter

    adapters = _lora_modules(lora or [], model)
    spec = None
    if speculative_config is not None:
        try:
            spec = json.loads(speculative_config)
        except ValueError as exc:
            raise UserError(f"not JSON: {exc}", "--speculative-config") from None
        if not isinstance(spec, dict):
            raise UserError("must be a JSON object, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":4}'",
                            "--speculative-config")
    if find_vllm() is None:
        raise UserError("vLLM's CPU build is not installed: run scripts/install_vllm_cpu.sh (or set LLMLB_VLLM_PYTHON)",
                        "llmlb engine vllm")
    core_list = None
    if cores is not None:
        try:
            core_list = [int(c) for c in cores.split(",")]
        except ValueError:
            raise UserError(f"expected comma-separated core numbers, got {cores!r}", "--cores") from None
        if len(core_list) != replicas:
            raise UserError(f"{replicas} replicas need {replicas} cores, got {len(core_list)}", "--cores")
    with tempfile.TemporaryDirectory(prefix="llmlb-engine-") as scratch:
        model_dir = _model_dir(model, Path(scratch))
        modules = {name: str(path or write_tiny_adapter(Path(scratch) / "lora" / name, model_dir, rank=max_lora_rank,
                                                        seed=k))
                   for k, (name, path) in enumerate(adapters.items())}
        settings = VllmSettings(served_model=served_model, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens, num_gpu_blocks=num_gpu_blocks,
                                prefix_caching=prefix_caching, kv_space_gib=kv_space, lora_modules=modules,
                                max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras,
                                speculative_config=spec, reasoning=reasoning, extra_args=tuple(vllm_arg or ()))
        console.print(f"starting {replicas} vLLM replica(s) serving {model_dir.name} as {served_model!r} "
                      "(35-60 s each with --enforce-eager)")
        try:
            with VllmReplicas(model_dir, replicas, cores=core_list, settings=settings, port=port,
                              log_dir=log_dir) as fleet:
                console.print(f"model folder: {model_dir} (--tokenizer it for exact prompt lengths)",
                              highlight=False, soft_wrap=True)
                _serve_forever(fleet.urls, f"{replicas} vLLM replica(s)")
        except RuntimeError as exc:
            raise UserError(str(exc).splitlines()[0], "llmlb engine vllm") from None


@engine_app.command("llama-server")
def llama_server(
    port: Annotated[Optional[int], typer.Option("--port", min=1, max=65535, help="Port (default: a free one).")] = None,
    slots: Annotated[int, typer.Option("--slots", min=1, help="Concurrent requests (llama-server's -np).")] = 8,
    threads: Annotated[int, typer.Option("--threads", min=1, help="CPU threads (llama-server's -t).")] = 1,
) -> None:
    """Start llama.cpp's llama-server with a tiny random-weight GGUF model, print its URL, and run until Ctrl-C.

    Needs the binary from scripts/build_llama_server.sh (about 7.5 minutes on 2 cores, cached)
    and the gguf package (test extra).

    Example:

        llmlb engine llama-server --port 8080
    """
    from llmlb_bench.engines.llama import LlamaServer, find_llama_server, write_tiny_llama
    from llmlb_bench.pypi_routers.launch import free_ports

    binary = find_llama_server()
    if binary is None:
        raise UserError("llama-server is not built: run scripts/build_llama_server.sh (or set LLMLB_LLAMA_SERVER)",
                        "llmlb engine llama-server")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UserError("writing the tiny GGUF model needs the 'gguf' package: pip install gguf",
                        "llmlb engine llama-server") from None
    with tempfile.TemporaryDirectory(prefix="llmlb-engine-") as scratch:
        model = write_tiny_llama(Path(scratch) / "tiny.gguf", n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=512)
        try:
            with LlamaServer(binary, model, port if port is not None else free_ports(1)[0], slots=slots,
                             threads=threads) as server:
                _serve_forever([server.url], "llama-server")
        except RuntimeError as exc:
            raise UserError(str(exc).splitlines()[0], "llmlb engine llama-server") from None
