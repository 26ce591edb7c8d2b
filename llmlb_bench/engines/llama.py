"""A real serving engine on a CPU, without a model download: llama.cpp ``llama-server`` and a tiny
random-weight LLaMA written in GGUF.

Why this ships in the package (not only in tests): users without a GPU,
or who want to try a routing policy before renting one, get a real
third-party engine on their laptop, that batches concurrent requests,
streams and reports usage (``llama-server`` does, at thousands of tokens
per second on this tiny model); the replayer's real-engine test and
benchmark use the same code. The binary comes from
scripts/build_llama_server.sh (cached outside the checkout); writing the
model needs the ``gguf`` package. docs/engines.md tells how to start it.

Shape of the model and why:

* byte-level GPT-2 tokenizer (256 byte tokens, one dummy merge, BOS, EOS):
  one ASCII character is one token, so prompt lengths are exact through
  the server's ``/tokenize`` and no tokenizer file is needed;
* no BOS added to prompts, so ``usage.prompt_tokens`` equals the prompt's
  length;
* weights are random, but dimension 0 of the residual stream is a large
  constant (every embedding has it, no layer writes to it) and the final
  norm keeps only that dimension, so the output layer alone decides which
  tokens can be sampled: the lowercase letters, never EOS or a partial
  UTF-8 byte, hence one token per stream chunk and no early stop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: token ``b`` is the printable character standing for byte ``b``."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_tiny_llama(path: str | Path, *, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 4096, seed: int = 0) -> Path:
    """Write the model to ``path`` (about 0.4 MB with the defaults) and return the path."""
    import gguf  # optional: only this helper needs it

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = _byte_tokens() + ["<s>", "</s>"]
    bos, eos = 256, 257
    n_vocab = len(tokens)
    head_dim = n_embd // n_head

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llmlb-tiny-random")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges([f"{tokens[ord('a')]} {tokens[ord('b')]}"])  # llama.cpp wants at least one
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    embd = rand(n_vocab, n_embd)
    embd[:, 0] = 10.0  # the constant that steers the output layer
    w.add_tensor("token_embd.weight", embd)
    norm = np.zeros(n_embd, np.float32)
    norm[0] = 1.0
    w.add_tensor("output_norm.weight", norm)
    out = rand(n_vocab, n_embd)
    out[:, 0] = -1.0
    letters = np.arange(ord("a"), ord("z") + 1)
    out[letters, 0] = 1.0 + rng.uniform(0.0, 0.05, len(letters)).astype(np.float32)
    w.add_tensor("output.weight", out)
    for i in range(n_layer):
        o, down = rand(n_embd, n_embd), rand(n_embd, n_ff)
        o[0, :] = 0.0  # no layer writes to dimension 0
        down[0, :] = 0.0
        for name, t in (("attn_norm", np.ones(n_embd, np.float32)), ("attn_q", rand(n_embd, n_embd)),
                        ("attn_k", rand(n_head_kv * head_dim, n_embd)), ("attn_v", rand(n_head_kv * head_dim, n_embd)),
                        ("attn_output", o), ("ffn_norm", np.ones(n_embd, np.float32)),
                        ("ffn_gate", rand(n_ff, n_embd)), ("ffn_up", rand(n_ff, n_embd)), ("ffn_down", down)):
            w.add_tensor(f"blk.{i}.{name}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def find_llama_server() -> Path | None:
    """``$LLMLB_LLAMA_SERVER``, else the build script's cache, else ``llama-server`` on PATH."""
    env = os.environ.get("LLMLB_LLAMA_SERVER")
    if env:
        return Path(env)
    cache = Path(os.environ.get("LLMLB_CACHE_DIR", Path.home() / ".cache" / "llmlb-bench"))
    built = cache / "llama.cpp" / "bin" / "llama-server"
    if built.is_file():
        return built
    found = shutil.which("llama-server")
    return Path(found) if found else None


class LlamaServer:
    """``llama-server`` on 127.0.0.1 serving ``model`` as ``tiny``; a context manager.

    ``threads`` defaults to 1: llama.cpp's worker threads spin while they
    wait, which starves a small shared machine."""

    def __init__(self, binary: Path, model: Path, port: int, slots: int = 8, ctx: int = 32768,
                 threads: int = 1) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self._cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx),
                     "-np", str(slots), "-t", str(threads), "--no-webui", "--metrics", "-a", "tiny"]
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "LlamaServer":
        # its log goes to a file: an undrained pipe fills up and then blocks the server mid-run
        self._log = tempfile.TemporaryFile()
        self._proc = proc = subprocess.Popen(self._cmd, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                self._log.seek(0)
                err = self._log.read().decode(errors="replace")[-2000:]
                self._log.close()
                raise RuntimeError(f"llama-server did not start: {err}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # busy slots can keep it from stopping politely
                self._proc.kill()
                self._proc.wait()
            self._log.close()
