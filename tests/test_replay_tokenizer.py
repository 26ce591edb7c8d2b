"""Exact prompt lengths with a local tokenizer (``--tokenizer``), built by the test with ``tokenizers``.

Three kinds of tokenizer, each trained here on a small corpus: byte-level
BPE (GPT-2 / Llama-3 style), SentencePiece-style BPE with a ``▁`` added at
the start of the text (Llama-2 / Mistral style, where a prompt's first word
costs one more token than elsewhere) and a word-level one that drops
whitespace (BERT style, where the newline filler costs nothing).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from conftest import cli
from replay_helpers import servers  # noqa: F401  (a fixture)

from llmlb_bench.errors import UserError
from llmlb_bench.replay.lengths import check_lengths, load_tokenizer, local_counter, piece_costs
from llmlb_bench.replay.prompts import WORDS, PromptBuilder
from llmlb_bench.schema import TRACE, write_trace

tokenizers = pytest.importorskip("tokenizers", reason="the 'tokenizers' package (extra 'tokenizer') is absent")
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402


def _corpus() -> list[str]:
    rng = random.Random(7)
    words = list(WORDS) + ["tokenizer", "prefix", "cache", "latency", "serving", "replica"]
    return [" ".join(rng.choice(words) for _ in range(40)) for _ in range(300)]


def byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # few merges: most words cost several tokens, of varied counts
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=330, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def sentencepiece_style() -> Tokenizer:
    """Laid out like Llama-2's tokenizer.json: ``▁`` prepended and spaces replaced by the
    normaliser, no pre-tokeniser, so a prompt starting with " the" begins "▁▁the"."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    return tok


def word_level() -> Tokenizer:
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS + ("Hello",)))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


KINDS = {"byte_level_bpe": byte_level_bpe, "sentencepiece_style": sentencepiece_style, "word_level": word_level}


def _trace(n: int = 40, seed: int = 3) -> pa.Table:
    """Lengths from 1 to 3,000 tokens; families of requests sharing 0 to 6 leading blocks."""
    rng = random.Random(seed)
    lengths = [1, 2, 3, 5, 16, 17, 31, 3000] + [rng.randint(1, 600) for _ in range(n - 8)]
    hashes = [[1000 * (i % 4) + k for k in range(rng.randint(0, 6))] + [10**6 + 100 * i + k for k in range(40)]
              for i in range(n)]
    return TRACE.conform(pa.table({
        "request_id": pa.array(range(n), pa.int64()), "arrival_s": [0.005 * i for i in range(n)],
        "input_tokens": pa.array(lengths, pa.int32()), "output_tokens": pa.array([2] * n, pa.int32()),
        "prefix_hashes": pa.array(hashes, pa.list_(pa.uint64()))}), "t")


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_prompt_has_exactly_the_traces_token_count(kind):
    tok = KINDS[kind]()
    count = local_counter(tok)
    after, lead = asyncio.run(piece_costs(count, "--tokenizer"))
    if kind == "byte_level_bpe":
        assert len(set(after)) > 3  # words of varied costs, so exact filling has work to do
    if kind == "sentencepiece_style":
        assert all(a == b + 1 for a, b in zip(lead[:-1], after))  # the leading ▁ makes a first word dearer
    if kind == "word_level":
        assert after[-1] == 0  # whitespace is dropped: the newline filler is never used
    builder = PromptBuilder(16, after, lead)
    trace = _trace()
    check = asyncio.run(check_lengths(trace, builder, count, rows=trace.num_rows))
    # a prompt cannot be shorter than its first piece costs at the start: 2 tokens ("▁", "▁the")
    # under the SentencePiece-style tokenizer, so its 1-token request is the one it misses
    shortest = 2 if kind == "sentencepiece_style" else 1
    assert check["checked"] == trace.num_rows and check["exact"] == trace.num_rows - (shortest - 1), check
    if shortest > 1:
        assert check["worst"] == {"request_id": 0, "input_tokens": 1, "counted": 2}
    # every length up to 200, with and without hashes, counted by the tokenizer itself
    for n in range(shortest, 201):
        for hashes in ([], [5, 6, 7]):
            text = builder.text(n, hashes, request_id=n)
            assert len(tok.encode(text, add_special_tokens=False).ids) == n, (kind, n, hashes, text)


@pytest.mark.parametrize("kind", list(KINDS))
def test_exact_prompts_still_share_exactly_the_hashed_prefix(kind):
    tok = KINDS[kind]()
    after, lead = asyncio.run(piece_costs(local_counter(tok), "--tokenizer"))
    b = PromptBuilder(16, after, lead)
    a, c, d = b.text(64, [1, 2, 3, 4], 0), b.text(64, [1, 2, 8, 9], 1), b.text(64, [5, 6, 7, 8], 2)
    ids_a, ids_c, ids_d = (tok.encode(t, add_special_tokens=False).ids for t in (a, c, d))
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_c)) if x != y)
    assert 32 <= shared < 40  # two shared blocks of 16 tokens, then they part
    assert ids_a[:4] != ids_d[:4]  # no shared hash, no shared text
    assert b.text(64, [1, 2, 3, 4], 0) == PromptBuilder(16, after, lead).text(64, [1, 2, 3, 4], 0)  # deterministic


def _usage_server(servers, tok: Tokenizer) -> str:  # noqa: F811
    """An OpenAI-compatible server that counts prompt tokens with ``tok`` (as a real engine would)."""
    async def models_(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt_tokens = len(tok.encode(body["prompt"], add_special_tokens=False).ids)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await resp.write(b'data: {"choices":[{"text":"x"}]}\n\n')
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": body["max_tokens"]}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models_)
    app.router.add_post("/v1/completions", complete)
    return servers.aiohttp(app)




def test_cli_tokenizer_makes_the_servers_prompt_counts_equal_the_trace(servers, tmp_path, capsys):  # noqa: F811
    tok = sentencepiece_style()
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    url = _usage_server(servers, tok)
    trace = _trace(n=30)
    write_trace(trace, tmp_path / "t.parquet")
    code, out, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, "--api", "completions",
                           "--tokenizer", str(folder), "--results", str(tmp_path / "res"), "--run-id", "k",
                           "--no-progress", "--scrape-interval", "0"], capsys)
    assert code == 0, err
    rows = pq.read_table(tmp_path / "res" / "k" / "requests.parquet").to_pylist()
    assert len(rows) == 30 and all(r["status"] == "ok" for r in rows)
    # exact, but for the 1-token request, which the check found and the user was told about
    assert [r["request_id"] for r in rows if r["server_input_tokens"] != r["input_tokens"]] == [0]
    assert "29 of 30 sampled prompts" in err and "request 0: 2 tokens for 1" in err
    replay = json.loads((tmp_path / "res" / "k" / "run.json").read_text())["summary"]["replay"]
    assert replay["prompt_lengths"] == f"exact (local tokenizer {folder})"
    assert (replay["prompt_length_check"]["exact"], replay["prompt_length_check"]["checked"]) == (29, 30)
    # without it, one word per token: the same server counts otherwise
    code, _, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, "--api", "completions",
                         "--results", str(tmp_path / "res"), "--run-id", "a", "--no-progress",
                         "--scrape-interval", "0"], capsys)
    assert code == 0, err
    rows = pq.read_table(tmp_path / "res" / "a" / "requests.parquet").to_pylist()
    assert sum(r["server_input_tokens"] != r["input_tokens"] for r in rows) > 20


def _one_line_error(tmp_path, capsys, extra):
    write_trace(_trace(n=10), tmp_path / "t.parquet")
    code, _, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", "http://127.0.0.1:9", *extra,
                         "--results", str(tmp_path / "res")], capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert not (tmp_path / "res").exists()
    return lines[0]


def test_tokenizer_errors_are_one_line(tmp_path, capsys, monkeypatch):
    assert "no such file" in _one_line_error(tmp_path, capsys, ["--tokenizer", str(tmp_path / "nope.json")])
    (tmp_path / "empty").mkdir()
    assert "holds no tokenizer.json" in _one_line_error(tmp_path, capsys, ["--tokenizer", str(tmp_path / "empty")])
    (tmp_path / "bad.json").write_text('{"model": 3}')
    assert "not a tokenizer.json" in _one_line_error(tmp_path, capsys, ["--tokenizer", str(tmp_path / "bad.json")])
    word_level().save(str(tmp_path / "ok.json"))
    assert "not both" in _one_line_error(tmp_path, capsys, ["--tokenizer", str(tmp_path / "ok.json"), "--tokenize"])
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the extra were not installed
    line = _one_line_error(tmp_path, capsys, ["--tokenizer", str(tmp_path / "ok.json")])
    assert "pip install 'llmlb-bench[tokenizer]'" in line


def test_load_tokenizer_takes_a_file_or_its_folder(tmp_path):
    word_level().save(str(tmp_path / "tokenizer.json"))
    for path in (tmp_path, tmp_path / "tokenizer.json", str(tmp_path)):
        assert load_tokenizer(path).encode("the of", add_special_tokens=False).ids == [1, 2]
    with pytest.raises(UserError):
        load_tokenizer(tmp_path / "missing")
