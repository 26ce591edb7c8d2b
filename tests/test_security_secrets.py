"""Secrets never land in storage or output (docs/security.md).

A real loopback server that echoes the API key in its error body, the way
OpenAI's does ("Incorrect API key provided: Bearer sk-..."); the replay runs
through the real CLI, and the key must appear nowhere: not in any file of the
results (requests.parquet's error column, run.json with its argv), not on
stdout or stderr.
"""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq
from aiohttp import web

from conftest import cli, make_trace
from llmlb_bench.redact import MARK, redact, redact_argv
from llmlb_bench.schema import write_trace
from replay_helpers import servers  # noqa: F401  (fixture)

KEY = "sk-proj-Z9secretVALUE0123456789"
OTHER = "flag-secret-4242-abcdef"


def _echo_app() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def chat(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        return web.json_response({"error": {"message": f"Incorrect API key provided: {auth}. "
                                            f"You passed api_key={auth.split()[-1]}"}}, status=401)
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_a_key_echoed_by_the_server_is_stored_and_printed_nowhere(servers, tmp_path, capsys, monkeypatch):  # noqa: F811
    url = servers.aiohttp(_echo_app())
    write_trace(make_trace(n=4, rate=50.0, output_tokens=3), tmp_path / "t.parquet")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    # a command line as a user may type it, with secrets in options the tool does not have
    monkeypatch.setattr(sys, "argv", ["llmlb", "replay", "--api-key", OTHER, "-H", f"Authorization: Bearer {KEY}"])
    code, out, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, "-r", str(tmp_path / "res"),
                          "--run-id", "k", "--label", f"Bearer {KEY}"], capsys)
    assert code == 0, err
    rows = pq.read_table(tmp_path / "res" / "k" / "requests.parquet").to_pylist()
    assert len(rows) == 4 and {r["status"] for r in rows} == {"error"}
    assert all(r["http_status"] == 401 and MARK in r["error"] and "Incorrect API key" in r["error"] for r in rows)
    for f in (tmp_path / "res").rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert KEY.encode() not in data and OTHER.encode() not in data, f
    meta = json.loads((tmp_path / "res" / "k" / "run.json").read_text())
    assert meta["argv"] == ["llmlb", "replay", "--api-key", MARK, "-H", f"Authorization: {MARK}"]
    assert KEY not in out + err and OTHER not in out + err


def test_an_endpoint_refusing_the_key_at_preflight_prints_it_redacted(servers, tmp_path, capsys, monkeypatch):  # noqa: F811
    async def models(request: web.Request) -> web.Response:
        return web.Response(status=401, text=f"bad key {request.headers.get('Authorization')}")
    app = web.Application()
    app.router.add_get("/v1/models", models)
    url = servers.aiohttp(app)
    write_trace(make_trace(n=2), tmp_path / "t.parquet")
    monkeypatch.setenv("MY_GATEWAY_TOKEN", KEY)
    code, out, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, "-r", str(tmp_path / "res"),
                          "--api-key-env", "MY_GATEWAY_TOKEN"], capsys)
    assert code == 2 and err.startswith("error:") and KEY not in out + err
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())


def test_patterns():
    assert redact("Authorization: Basic dXNlcjpwYXNzd29yZA==") == f"Authorization: {MARK}"
    assert redact("Bearer abc.def-ghi") == f"Bearer {MARK}"
    assert redact('{"api_key": "hunter2hunter2"}') == f'{{"api_key": "{MARK}"}}'
    assert redact("http://user:pa55word@127.0.0.1:8000/v1") == f"http://user:{MARK}@127.0.0.1:8000/v1"
    assert redact("key sk-abcdef123456 rejected") == f"key {MARK} rejected"
    # ordinary error text is left alone
    for text in ("max token limit exceeded", "basic authentication required", "HTTP 500: upstream timeout"):
        assert redact(text) == text
    assert redact_argv(["--max-tokens", "5", "--api-key-env", "X", "--token=abc"]) == \
        ["--max-tokens", "5", "--api-key-env", "X", f"--token={MARK}"]
