"""The local engine launchers (llmlb_bench.engines) and ``llmlb engine``.

Fast: the tiny HF model folder (safetensors layout, tokenizer properties the
replayer's prompt sharing relies on), the command line and environment of a
replica, and the command's errors. Slow: ``llmlb engine vllm`` started as a real
process, used, and stopped by SIGTERM, leaving no process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import cli
from engines_helpers import require_module, vllm_python
from test_cli_errors import assert_one_line_error

from llmlb_bench.engines.tiny_hf import word_token_ids
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.replay.prompts import PIECES, PromptBuilder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_the_tiny_model_folder_is_a_complete_llama_checkpoint(tiny: Path):
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "bfloat16"
    raw = (tiny / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], h]
    assert header[f"model.layers.{layers - 1}.self_attn.k_proj.weight"]["shape"] == [kv, h]
    assert len([k for k in header if k != "__metadata__"]) == 3 + 9 * layers
    end = max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")
    assert len(raw) == 8 + n + end  # the data offsets cover the file exactly
    # bfloat16 is float32's upper half: the stored norm weights are exactly 1.0
    start = 8 + n + header["model.norm.weight"]["data_offsets"][0]
    ones = np.frombuffer(raw[start:start + 2 * h], "<u2").astype(np.uint32) << 16
    assert np.all(ones.view(np.float32) == 1.0)
    tok = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tok["add_bos_token"] is False and "add_generation_prompt" in tok["chat_template"]


def _tensor(folder: Path, name: str) -> np.ndarray:
    """One stored bfloat16 tensor of a tiny model folder, as float32."""
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    t = json.loads(raw[8:8 + n])[name]
    lo, hi = t["data_offsets"]
    bits = np.frombuffer(raw[8 + n + lo:8 + n + hi], "<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(t["shape"])


def test_an_unreachable_eos_zeroes_its_output_row_and_leaves_every_other_weight(tiny: Path, tmp_path: Path):
    """reachable_eos=False (for engines that cannot be told to ignore EOS): EOS's logit is exactly 0
    where the largest other logit of any hidden state is positive, all but surely, so greedy decoding
    never ends early; the seed's other weights are the default model's, bit for bit."""
    other = write_tiny_model(tmp_path / "no-eos", reachable_eos=False)
    eos = json.loads((tiny / "config.json").read_text())["eos_token_id"]
    head, head0 = _tensor(other, "lm_head.weight"), _tensor(tiny, "lm_head.weight")
    assert np.all(head[eos] == 0.0) and np.any(head0[eos] != 0.0)
    assert np.array_equal(np.delete(head, eos, axis=0), np.delete(head0, eos, axis=0))
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
        assert np.array_equal(_tensor(other, name), _tensor(tiny, name)), name
    # any hidden state: the largest of the other 1000-odd random logits is positive
    states = np.random.default_rng(0).standard_normal((200, head.shape[1])).astype(np.float32)
    logits = states @ head.T
    assert np.all(logits.max(axis=1) > logits[:, eos]) and np.all(logits[:, eos] == 0.0)


def test_words_only_leaves_greedy_decoding_nothing_but_whole_words(tiny: Path, tmp_path: Path):
    """words_only=True (for engines without allowed_token_ids): every output row but the whole prompt
    words' is zero, so their logits are exactly 0 where the largest word's is positive (all but surely,
    with hundreds of words): greedy decoding emits words only, EOS never; the words' rows and every other
    weight are the default model's, bit for bit."""
    other = write_tiny_model(tmp_path / "words", words_only=True)
    words = word_token_ids(other)
    assert words == word_token_ids(tiny) and len(words) > 100
    head, head0 = _tensor(other, "lm_head.weight"), _tensor(tiny, "lm_head.weight")
    rest = np.setdiff1d(np.arange(head.shape[0]), words)
    assert np.all(head[rest] == 0.0) and np.array_equal(head[words], head0[words])
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
        assert np.array_equal(_tensor(other, name), _tensor(tiny, name)), name
    states = np.random.default_rng(0).standard_normal((200, head.shape[1])).astype(np.float32)
    assert set(np.argmax(states @ head.T, axis=1)) <= set(words)


def test_prompts_tokenize_block_by_block(tiny: Path):
    """Why shared trace prefixes stay shared token prefixes: a prompt's tokens are its blocks'
    tokens in order, no special token is added, and every prompt word is one token."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    count = [len(t.encode(p, add_special_tokens=False).ids) for p in PIECES]
    assert count[:-1] == [1] * (len(PIECES) - 1)
    b = PromptBuilder(16)
    blocks = [b.text(16, [h], 0) for h in (11, 12, 13)]
    whole = t.encode("".join(blocks)).ids
    assert whole == [i for blk in blocks for i in t.encode(blk).ids] and len(whole) == 48


def test_exact_prompts_keep_their_shared_token_prefix_with_multi_token_words(tmp_path: Path):
    """A smaller vocabulary splits most prompt words into 2-5 tokens, so exact filling (whole
    words, then a shortest exact combination) does real work: lengths stay exact, and two prompts
    that share k prefix hashes share at least their first k blocks of tokens."""
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    from llmlb_bench.replay.lengths import load_tokenizer, local_counter, piece_costs

    t = load_tokenizer(write_tiny_model(tmp_path / "v400", vocab_size=400, num_layers=1))
    after, lead = asyncio.run(piece_costs(local_counter(t), "test"))
    assert max(after) >= 4 and sum(c > 1 for c in after) > len(after) / 2  # the hard case
    b, rng = PromptBuilder(16, after, lead), np.random.default_rng(4)
    for r in range(150):
        n = int(rng.integers(20, 600))
        k = int(rng.integers(0, n // 16 + 1))
        prompts = [b.text(n, [1000 + j for j in range(k)] + [salt + 1000 * r + j for j in range(n // 16 + 1 - k)],
                          r + salt) for salt in (10**6, 5 * 10**6)]
        ids = [t.encode(p, add_special_tokens=False).ids for p in prompts]
        assert len(ids[0]) == len(ids[1]) == n
        assert ids[0][:k * 16] == ids[1][:k * 16]


def test_each_replica_is_pinned_to_its_core_on_loopback(tiny: Path):
    fleet = VllmReplicas(tiny, 2, cores=[1, 0], port=9100, python=Path("/venv/bin/python"),
                         settings=[VllmSettings(), VllmSettings(num_gpu_blocks=40, max_num_batched_tokens=512)])
    assert fleet.urls == ["http://127.0.0.1:9100", "http://127.0.0.1:9101"]
    cmd = fleet.command(1)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "9101"
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "40" and "--enable-prompt-tokens-details" in cmd
    assert "--num-gpu-blocks-override" not in fleet.command(0)
    env = fleet.env(0)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
    with pytest.raises(ValueError):
        VllmReplicas(tiny, 2, settings=[VllmSettings(), VllmSettings(served_model="other")])
    # the frontend (API server, engine core) runs on the replica's core unless told otherwise
    assert fleet.frontend_cores == [{1}, {0}]
    split = VllmReplicas(tiny, 1, cores=[1], frontend_cores=[[0]], python=Path("/venv/bin/python"))
    assert split.frontend_cores == [{0}] and split.env(0)["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    for bad in ([[0]], [[0], []]):
        with pytest.raises(ValueError, match="frontend cores"):
            VllmReplicas(tiny, 2, cores=[0, 1], frontend_cores=bad)


def test_engine_command_errors_are_one_line(tmp_path: Path, capsys, monkeypatch):
    code, _, err = cli(["engine", "vllm", "--model", str(tmp_path)], capsys)
    if "not installed" in err:  # the first check: no vLLM here
        assert_one_line_error(code, err, "scripts/install_vllm_cpu.sh")
    else:
        assert_one_line_error(code, err, "--model", "no config.json")
    monkeypatch.setenv("LLMLB_VLLM_PYTHON", sys.executable)
    code, _, err = cli(["engine", "vllm", "--replicas", "2", "--cores", "0"], capsys)
    assert_one_line_error(code, err, "--cores", "2 replicas need 2 cores")
    monkeypatch.setenv("LLMLB_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("LLMLB_VLLM_PYTHON")
    code, _, err = cli(["engine", "vllm"], capsys)
    assert_one_line_error(code, err, "not installed", "scripts/install_vllm_cpu.sh")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
def test_llmlb_engine_vllm_serves_until_sigterm_and_leaves_nothing(tmp_path: Path):
    vllm_python()
    proc = subprocess.Popen([sys.executable, "-m", "llmlb_bench", "engine", "vllm", "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, lines = None, []
        deadline = time.monotonic() + 600
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            url = line.strip() if line.startswith("http://127.0.0.1:") else None
        assert url, "".join(lines)
        with urllib.request.urlopen(url + "/v1/models", timeout=120) as r:
            assert json.loads(r.read())["data"][0]["id"] == "tiny"
        server_pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _is_child(int(p), proc.pid))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 130  # like Ctrl-C (a hang's bound: it returns once stopped)
        deadline = time.monotonic() + 120    # generous: the loop ends once the group is gone
        while _group_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(server_pid)  # API server, engine core and worker all gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _is_child(pid: int, parent: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent
