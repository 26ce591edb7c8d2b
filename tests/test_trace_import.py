"""Importers: every format from a small synthetic file, error paths, and the real public traces."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.compute as pc
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.schema import TRACE
from llmlb_bench.workload.importers import import_trace


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def rows(table):
    return table.to_pylist()


def test_azure_timestamp_variants(tmp_path):
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n"
                 "2023-11-16 18:15:47,10,1\n")
    t = import_trace("azure-2023", path).table
    assert t.schema.equals(TRACE.schema)
    assert np.allclose(t.column("arrival_s").to_numpy(), [0.0, 0.31941, 4.314579])
    assert t.column("input_tokens").to_pylist() == [374, 10, 396]  # sorted by arrival
    path = write(tmp_path, "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00+00:00,1,1\n2024-05-10 00:00:00.5+00:00,2,2\n2024-05-10 01:00:01-01:00,3,3\n")
    assert np.allclose(import_trace("azure-2024", path).table.column("arrival_s").to_numpy(), [0, 0.5, 7201])
    path = write(tmp_path, "c.csv", "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
                 "2025-03-01T10:00:00.250Z,2,900,30\n2025-03-01T10:00:01Z,0,100,10\n")
    t = import_trace("azure-mm-2025", path, tenant="mm").table
    assert t.column("images").to_pylist() == [2, 0] and t.column("arrival_s").to_pylist() == [0.0, 0.75]
    assert t.column("tenant").to_pylist() == ["mm", "mm"]


@pytest.mark.parametrize("text,problem", [
    ("TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46,1,1\n", "missing column 'ContextTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\nyesterday,2,2\n",
     "line 3: column 'TIMESTAMP' has a bad timestamp 'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-5,1\n", "line 2: column 'ContextTokens' is negative"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,abc,1\n", "line 2: column 'ContextTokens' is not a number ('abc')"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n2023-11-16 18:15:47,5x,1\n", "line 3: column 'ContextTokens' is not a number ('5x')"),
    ("", "empty file"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests in the file"),
])
def test_azure_errors_name_file_line_and_column(tmp_path, text, problem):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(UserError) as info:
        import_trace("azure-2023", path)
    line = info.value.line()
    assert "\n" not in line and str(path) in line and problem in line, line


BURST_V1 = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,API log\n"
            "118,ChatGPT,417,276,693,Conversation log\n")
BURST_V3 = ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "1.5,aa,0.4,ChatGPT,100,10,110,Conversation log\n2.0,bb,1.1,GPT-4,200,0,200,API log\n"
            "9.0,aa,2.0,ChatGPT,300,30,330,Conversation log\n")


def test_burstgpt_by_header_names_and_failures(tmp_path):
    t = import_trace("burstgpt", write(tmp_path, "v1.csv", BURST_V1)).table
    assert t.column("arrival_s").to_pylist() == [0.0, 40.0, 113.0]
    assert t.column("tenant").to_pylist() == ["ChatGPT", "GPT-4", "ChatGPT"]
    assert t.column("kind").to_pylist() == ["conversation", "api", "conversation"]
    assert t.column("output_tokens").to_pylist() == [18, 0, 276]  # the failure is kept
    assert import_trace("burstgpt", write(tmp_path, "v1b.csv", BURST_V1), drop_failed=True).table.num_rows == 2
    t3 = import_trace("burstgpt", write(tmp_path, "v3.csv", BURST_V3)).table
    assert t3.column("input_tokens").to_pylist() == [100, 200, 300]  # not shifted by the inserted columns
    s = t3.column("session_id").to_pylist()
    assert s[0] == s[2] != s[1]


def test_mooncake_and_bailian(tmp_path):
    lines = [{"timestamp": 1500, "input_length": 1025, "output_length": 7, "hash_ids": [0, 1, 2]},
             {"timestamp": 0, "input_length": 512, "output_length": 3, "hash_ids": [0]}]
    t = import_trace("mooncake", write(tmp_path, "m.jsonl", "\n".join(json.dumps(x) for x in lines))).table
    assert t.column("arrival_s").to_pylist() == [0.0, 1.5]
    assert t.column("prefix_hashes").to_pylist() == [[0], [0, 1, 2]]
    records = [
        {"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 5, "type": "text",
         "turn": 1, "hash_ids": [1, 2, 3]},
        {"chat_id": 9, "parent_chat_id": 7, "timestamp": 3.0, "input_length": 60, "output_length": 5, "type": "text",
         "turn": 2, "hash_ids": [1, 2, 3, 4]},
        {"chat_id": 11, "parent_chat_id": 9, "timestamp": 8.0, "input_length": 80, "output_length": 5,
         "type": "search", "turn": 3, "hash_ids": [1, 2, 3, 4, 5]},
        {"chat_id": 3, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 16, "output_length": 2,
         "type": "image", "turn": 1, "hash_ids": [8]},
    ]
    imported = import_trace("bailian", write(tmp_path, "q.jsonl", "\n".join(json.dumps(x) for x in records)))
    assert imported.block_size == 16
    r = rows(imported.table)
    assert [x["arrival_s"] for x in r] == [0.0, 0.5, 2.5, 7.5]
    assert [x["parent_id"] for x in r] == [None, None, 0, 2]
    assert [x["after_parent_s"] for x in r] == [None] * 4  # timed by arrival_s, not after completion
    assert r[0]["session_id"] == r[2]["session_id"] == r[3]["session_id"] != r[1]["session_id"]
    assert [x["turn"] for x in r] == [1, 1, 2, 3] and r[3]["kind"] == "search"


def test_jsonl_errors(tmp_path):
    with pytest.raises(UserError, match="missing column 'hash_ids'"):
        import_trace("mooncake", write(tmp_path, "m.jsonl", '{"timestamp": 1, "input_length": 2, "output_length": 3}\n'))
    with pytest.raises(UserError, match="not JSON lines"):
        import_trace("mooncake", write(tmp_path, "n.jsonl", "[1, 2]\n"))
    with pytest.raises(UserError, match="no such file"):
        import_trace("mooncake", tmp_path / "absent.jsonl")
    with pytest.raises(UserError, match="unknown format"):
        import_trace("azure-1999", tmp_path / "x")


def test_sharegpt_single_and_multi_turn(tmp_path):
    conv = [{"id": "a", "conversations": [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 800},
                                          {"from": "human", "value": "z" * 40}, {"from": "gpt", "value": "w" * 80}]},
            {"id": "b", "conversations": [{"from": "system", "value": "s" * 400}, {"from": "human", "value": "q" * 4},
                                          {"from": "gpt", "value": "r" * 4}]},
            {"id": "c", "conversations": [{"from": "gpt", "value": "orphan"}]}]
    path = write(tmp_path, "s.json", json.dumps(conv))
    single = rows(import_trace("sharegpt", path, rate=2.0).table)
    assert sorted((r["input_tokens"], r["output_tokens"]) for r in single) == [(100, 200), (101, 1)]
    multi = import_trace("sharegpt", path, rate=2.0, multi_turn=True, think_s=5.0).table
    r = rows(multi)
    second = next(x for x in r if x["turn"] == 2)
    first = r[second["parent_id"]]
    assert second["input_tokens"] == 100 + 200 + 10 and second["output_tokens"] == 20
    assert second["prefix_hashes"][:100 // 16] == first["prefix_hashes"][:100 // 16]
    assert math.isclose(second["arrival_s"], first["arrival_s"] + second["after_parent_s"])
    with pytest.raises(UserError, match="no 'conversations' list"):
        import_trace("sharegpt", write(tmp_path, "bad.json", '[{"id": 1}]'), rate=1.0)


def test_servegen_directory(tmp_path):
    (tmp_path / "chunk-0-trace.csv").write_text("0,2.0,1.5,Gamma,0.44,1.1\n600,0,0,,0,0\n1200,1.0,0.8,Weibull,1.3,1.0\n")
    (tmp_path / "chunk-0-dataset.json").write_text(json.dumps({
        "0": {"input_tokens": "{100: 0.5, 300: 0.5}", "output_tokens": "{50: 1.0}"},
        "1200": {"input_tokens": "{1000: 1.0}", "output_tokens": "{20: 0.25, 40: 0.75}"}}))
    imported = import_trace("servegen", tmp_path, seed=3)
    t = imported.table
    arrival = t.column("arrival_s").to_numpy()
    assert abs((arrival < 600).sum() - 1200) < 150 and not ((arrival >= 600) & (arrival < 1200)).any()
    late = arrival >= 1200
    assert abs(late.sum() - 600) < 100
    inp = t.column("input_tokens").to_numpy()
    assert set(inp[~late]) == {100, 300} and set(inp[late]) == {1000}
    assert set(t.column("tenant").to_pylist()) == {"client-0"}
    assert imported.spec["tenants"]["client-0@0"]["arrival"]["family"][0] == "gamma"
    (tmp_path / "chunk-0-trace.csv").write_text("0,2.0,1.5,Lognormal,0.44,1.1\n")
    with pytest.raises(UserError, match="unknown distribution 'Lognormal'"):
        import_trace("servegen", tmp_path)


# ---------------------------------------------------------------- real public traces (skipped when absent)

def test_real_azure_2023_code(shared_data):
    t = import_trace("azure-2023", shared_data / "traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv").table
    arrival = t.column("arrival_s").to_numpy()
    assert t.num_rows == 8819
    assert abs((t.num_rows - 1) / arrival.max() - 2.57) < 0.01
    assert np.median(t.column("input_tokens").to_numpy()) == 1469


def test_real_mooncake_conversation(shared_data):
    imported = import_trace("mooncake", shared_data / "traces/mooncake-fast25/conversation_trace.jsonl")
    t = imported.table
    assert t.num_rows == 12031 and imported.block_size == 512
    lengths = pc.list_value_length(t.column("prefix_hashes")).to_numpy()
    assert np.array_equal(lengths, -(-t.column("input_tokens").to_numpy() // 512))


@pytest.mark.slow
def test_real_servegen_clients(shared_data):
    for name in ("language-m-large", "deepseek-r1", "mm-image"):
        t = import_trace("servegen", shared_data / "traces/servegen" / name).table
        assert t.num_rows > 10_000
    assert t.column("images").to_numpy().max() >= 1  # mm-image carries images


def test_cli_import_and_errors(tmp_path, capsys):
    from llmlb_bench.cli import main
    from llmlb_bench.schema import read_trace, trace_block_size

    src = write(tmp_path, "ok.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,10,2\n"
                "2023-11-16 18:15:47.5,20,3\n")
    out = tmp_path / "ok.parquet"
    main(["trace", "import", "azure-2023", str(src), "-o", str(out), "--kind", "code"])
    assert "2 requests" in capsys.readouterr().out
    assert read_trace(out).column("kind").to_pylist() == ["code", "code"]
    lines = [{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}]
    mc = write(tmp_path, "m.jsonl", json.dumps(lines[0]) + "\n")
    main(["trace", "import", "mooncake", str(mc), "-o", str(tmp_path / "m.parquet")])
    assert trace_block_size(read_trace(tmp_path / "m.parquet")) == 512
    capsys.readouterr()
    bad = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-45 99:00:00,1,1\n")
    with pytest.raises(SystemExit) as info:
        main(["trace", "import", "azure-2023", str(bad), "-o", str(tmp_path / "bad.parquet")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "bad.csv" in err and "line 2" in err and "bad timestamp" in err
    assert not (tmp_path / "bad.parquet").exists()
    with pytest.raises(SystemExit):
        main(["trace", "import", "nope", str(bad), "-o", str(tmp_path / "x.parquet")])
    assert "unknown format 'nope'" in capsys.readouterr().err


def _bailian(tmp_path):
    records = [
        {"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 5, "type": "text",
         "turn": 1, "hash_ids": [1]},
        {"chat_id": 9, "parent_chat_id": 7, "timestamp": 3.0, "input_length": 60, "output_length": 5, "type": "text",
         "turn": 2, "hash_ids": [1, 2]},
        {"chat_id": 11, "parent_chat_id": 9, "timestamp": 8.0, "input_length": 80, "output_length": 5,
         "type": "text", "turn": 3, "hash_ids": [1, 2, 3]},
        {"chat_id": 3, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 16, "output_length": 2,
         "type": "image", "turn": 1, "hash_ids": [8]},
    ]
    return write(tmp_path, "q.jsonl", "\n".join(json.dumps(x) for x in records))


@pytest.mark.parametrize(("limit", "duration", "arrivals"), [
    (3, None, [0.0, 0.5, 2.5]), (None, 1.0, [0.0, 0.5]), (3, 0.6, [0.0, 0.5]), (10, None, [0.0, 0.5, 2.5, 7.5]),
    (1, 100.0, [0.0])])
def test_import_caps_first_requests_and_first_seconds(tmp_path, limit, duration, arrivals):
    t = import_trace("bailian", _bailian(tmp_path), limit=limit, duration_s=duration).table
    r = rows(t)
    assert [x["arrival_s"] for x in r] == arrivals
    kept = {x["request_id"] for x in r}
    assert all(x["parent_id"] is None or x["parent_id"] in kept for x in r)  # sessions cut, never orphaned


def test_servegen_duration_shortens_the_spec_itself(tmp_path):
    (tmp_path / "chunk-0-trace.csv").write_text("0,2.0,1.5,Gamma,0.44,1.1\n600,1.0,1.0,Gamma,1.0,1.0\n")
    (tmp_path / "chunk-0-dataset.json").write_text(json.dumps({
        "0": {"input_tokens": "{100: 1.0}", "output_tokens": "{50: 1.0}"},
        "600": {"input_tokens": "{200: 1.0}", "output_tokens": "{50: 1.0}"}}))
    whole = import_trace("servegen", tmp_path, seed=3)
    short = import_trace("servegen", tmp_path, seed=3, duration_s=300.0)
    arrival = short.table.column("arrival_s").to_numpy()
    assert short.spec["duration_s"] == 300.0 and arrival.max() < 300.0 < whole.table.column("arrival_s").to_numpy().max()
    assert abs(len(arrival) - 600) < 100       # 2 req/s for 300 s


def test_cli_import_limit_and_its_errors(tmp_path, capsys):
    from llmlb_bench.cli import main
    from llmlb_bench.schema import read_trace

    out = tmp_path / "q.parquet"
    main(["trace", "import", "bailian", str(_bailian(tmp_path)), "-o", str(out), "--limit", "2"])
    assert read_trace(out).num_rows == 2 and "2 requests" in capsys.readouterr().out
    for flag, value in (("--limit", "0"), ("--duration", "0")):
        with pytest.raises(SystemExit) as info:
            main(["trace", "import", "bailian", str(_bailian(tmp_path)), "-o", str(tmp_path / "x.parquet"), flag, value])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.startswith(f"error: {flag}:") and not (tmp_path / "x.parquet").exists()
