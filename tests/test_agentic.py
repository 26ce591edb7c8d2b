"""Agentic sessions through the whole flow: tool turns and joins in traces, joins honoured by the
simulator and the replayer, replayed turns threaded through the answers the server returned."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from replay_helpers import run_replay, servers  # noqa: F401  (servers is a fixture)
from sim_helpers import run_sim

from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.prompts import PromptBuilder
from llmlb_bench.replay.threads import Threads
from llmlb_bench.replay.workers import shares
from llmlb_bench.schema import TRACE, read_trace, write_trace
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.trace_columns import TraceColumns
from llmlb_bench.workload.generate import generate
from llmlb_bench.workload.spec import WorkloadSpec

AGENT = {
    "name": "t", "seed": 3, "requests": 200,
    "tenants": {"a": {
        "kind": "agent", "arrival": {"process": "poisson", "rate": 2},
        "input": {"dist": "fixed", "value": 100}, "output": {"dist": "fixed", "value": 20},
        "sessions": {"turns": {"dist": "fixed", "value": 3}, "think_s": {"dist": "fixed", "value": 5},
                     "tools": {"share": 0.5, "tool_s": {"dist": "fixed", "value": 0.5},
                               "tokens": {"dist": "fixed", "value": 40}}},
        "fanout": {"depth": 1, "join": True, "children": {"dist": "fixed", "value": 2},
                   "tool_s": {"dist": "fixed", "value": 1}, "tool_tokens": {"dist": "fixed", "value": 30},
                   "join_tokens": {"dist": "fixed", "value": 10}},
    }},
}


def _agent_trace(**tenant: object) -> pa.Table:
    spec = json.loads(json.dumps(AGENT))
    spec["tenants"]["a"].update(tenant)
    return generate(WorkloadSpec.from_dict(spec))


def test_tool_turns_and_joins_grow_the_context_and_wait_for_every_child():
    t = _agent_trace()
    rows = {r["request_id"]: r for r in t.to_pylist()}
    turns = [r for r in rows.values() if r["turn"] and r["turn"] > 1]
    tool = [r for r in turns if r["after_parent_s"] == 0.5]
    human = [r for r in turns if r["after_parent_s"] == 5.0]
    assert tool and human and len(tool) + len(human) == len(turns)
    for r in turns:  # previous prompt + its reply + the tool's result (40) or the user's message (100)
        p = rows[r["parent_id"]]
        assert r["input_tokens"] == p["input_tokens"] + 20 + (40 if r in tool else 100)
    joins = [r for r in rows.values() if r["wait_ids"]]
    assert joins
    for j in joins:
        kids = [rows[k] for k in j["wait_ids"]]
        p = rows[j["parent_id"]]
        assert len(kids) == 2 and all(k["parent_id"] == j["parent_id"] for k in kids)
        assert j["input_tokens"] == p["input_tokens"] + p["output_tokens"] + 2 * 20 + 10
        assert j["request_id"] > max(j["wait_ids"])  # after its inputs in the trace's order
        # its prompt extends the parent's context: the parent's blocks, then the reply's
        shared = (p["input_tokens"] + p["output_tokens"]) // 16
        assert j["prefix_hashes"][:shared] == kids[0]["prefix_hashes"][:shared]
        assert j["prefix_hashes"][shared + 1:] != kids[0]["prefix_hashes"][shared + 1:len(j["prefix_hashes"])]
    assert generate(WorkloadSpec.from_dict(AGENT)).equals(t)  # deterministic


def test_a_spec_without_tools_or_join_gives_the_same_trace_as_before_them():
    """Tools and joins draw from streams of their own: adding them leaves the other rows alone."""
    plain = _agent_trace(sessions={k: v for k, v in AGENT["tenants"]["a"]["sessions"].items() if k != "tools"},
                         fanout={k: v for k, v in AGENT["tenants"]["a"]["fanout"].items()
                                 if k not in ("join", "join_tokens")})
    assert plain.column("wait_ids").null_count == plain.num_rows
    joined = _agent_trace(sessions={k: v for k, v in AGENT["tenants"]["a"]["sessions"].items() if k != "tools"})
    keep = joined.filter(pa.compute.is_null(joined.column("wait_ids")))
    assert keep.column("input_tokens").to_pylist()[:50] == plain.column("input_tokens").to_pylist()[:50]
    assert keep.column("arrival_s").to_pylist()[:50] == plain.column("arrival_s").to_pylist()[:50]


def test_old_readers_ignore_wait_ids_and_new_readers_read_files_without_it(tmp_path):
    t = _agent_trace()
    write_trace(t, tmp_path / "t.parquet")
    assert read_trace(tmp_path / "t.parquet").column("wait_ids").equals(t.column("wait_ids"))
    old = pq.read_table(tmp_path / "t.parquet").drop(["wait_ids"])
    assert TRACE.conform(old, "t").column("wait_ids").null_count == t.num_rows


def _join_trace() -> pa.Table:
    """Request 0 fans out to 1 and 2 (tool 0.2 s, 0.3 s); 3 joins them (0.1 s after the last)."""
    return TRACE.conform(pa.table({
        "request_id": pa.array([0, 1, 2, 3], pa.int64()), "arrival_s": [0.0, 0.0, 0.0, 0.0],
        "session_id": pa.array([7, 7, 7, 7], pa.int64()), "turn": pa.array([1, None, None, 2], pa.int32()),
        "parent_id": pa.array([None, 0, 0, 0], pa.int64()),
        "after_parent_s": pa.array([None, 0.2, 0.3, 0.1]),
        "wait_ids": pa.array([None, None, None, [1, 2]], pa.list_(pa.int64())),
        "input_tokens": pa.array([64, 96, 112, 160], pa.int32()),
        "output_tokens": pa.array([8, 24, 4, 8], pa.int32()),
    }), "t")


def test_the_simulator_sends_a_join_after_its_last_input_ends_and_copies_session_and_turn(tmp_path):
    req, _, _ = run_sim(tmp_path, _join_trace(), ClusterConfig.build(replicas=2))
    r = {x["request_id"]: x for x in req.to_pylist()}
    assert r[1]["scheduled_s"] == pytest.approx(r[0]["last_token_s"] + 0.2)
    last = max(r[1]["last_token_s"], r[2]["last_token_s"])
    assert r[3]["scheduled_s"] == pytest.approx(last + 0.1)
    assert [r[i]["session_id"] for i in range(4)] == [7] * 4 and [r[i]["turn"] for i in range(4)] == [1, None, None, 2]


class Recorder:
    """An OpenAI-style server that streams ``answer-<id>`` as four chunks (on the chat API after
    ``reasoning`` chunks of vLLM's ``reasoning`` deltas) and keeps each request's body."""

    def __init__(self, reasoning: int = 0) -> None:
        self.bodies: dict[int, dict] = {}
        self.reasoning = reasoning

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "m"}]})

        async def complete(request: web.Request) -> web.StreamResponse:
            rid = int(request.headers["X-Request-Id"])
            body = self.bodies[rid] = await request.json()
            chat = "messages" in body
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(self.reasoning if chat else 0):
                await resp.write(b"data: " + json.dumps({"choices": [{"delta": {"reasoning": " hm"}}]}).encode() + b"\n\n")
            for piece in (" answer", "-", str(rid), " ."):
                choice = {"delta": {"content": piece}} if chat else {"text": piece}
                await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
            usage = {"prompt_tokens": 1, "completion_tokens": 4 + (self.reasoning if chat else 0)}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
                             b"data: [DONE]\n\n")
            return resp

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", complete)
        app.router.add_post("/v1/chat/completions", complete)
        return app


def _words(n: int, rid: int) -> str:
    return PromptBuilder(16).continuation(n, rid)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_replayed_turns_extend_the_previous_prompt_and_the_answer_the_server_returned(servers, tmp_path, api):  # noqa: F811
    rec = Recorder()
    url = servers.aiohttp(rec.app())
    summary, rows, _ = run_replay(_join_trace(), [url], tmp_path, options=ReplayOptions(api=api, scrape_s=None))
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert [r["session_id"] for r in rows] == [7] * 4 and [r["turn"] for r in rows] == [1, None, None, 2]
    b = rec.bodies
    if api == "completions":
        root = b[0]["prompt"]
        assert len(root.split()) == 64
        # the child: the parent's prompt + its answer + 96 - 64 - 4 new tokens of its own
        assert b[1]["prompt"] == root + " answer-0 ." + _words(96 - 64 - 4, 1)
        assert b[2]["prompt"] == root + " answer-0 ." + _words(112 - 64 - 4, 2)
        # the join: the parent's context, then both children's answers, then its own text
        assert b[3]["prompt"] == root + " answer-0 ." + " answer-1 ." + " answer-2 ." + _words(160 - 64 - 12, 3)
    else:
        root = b[0]["messages"]
        assert len(root) == 1 and len(root[0]["content"].split()) == 64
        assert b[1]["messages"] == root + [{"role": "assistant", "content": " answer-0 ."},
                                           {"role": "user", "content": _words(96 - 68, 1)}]
        assert b[3]["messages"] == root + [{"role": "assistant", "content": " answer-0 ."},
                                           {"role": "user", "content": " answer-1 . answer-2 ." + _words(84, 3)}]
    assert rows[3]["sent_s"] >= max(rows[1]["last_token_s"], rows[2]["last_token_s"]) + 0.1


def test_a_threaded_turn_after_reasoning_extends_the_answer_and_budgets_only_its_tokens(servers, tmp_path):  # noqa: F811
    """The history a next turn extends keeps the answer, not the reasoning streamed before it: the
    assistant message is the answer text and the new text is sized as if no reasoning was there."""
    rec = Recorder(reasoning=9)
    url = servers.aiohttp(rec.app())
    _, rows, _ = run_replay(_join_trace(), [url], tmp_path, options=ReplayOptions(api="chat", scrape_s=None))
    assert [r["status"] for r in rows] == ["ok"] * 4 and rows[0]["reasoning_tokens"] == 9
    root = rec.bodies[0]["messages"]
    assert rec.bodies[1]["messages"] == root + [{"role": "assistant", "content": " answer-0 ."},
                                                {"role": "user", "content": _words(96 - 68, 1)}]


def test_without_threading_every_prompt_comes_from_the_trace_hashes(servers, tmp_path):  # noqa: F811
    rec = Recorder()
    url = servers.aiohttp(rec.app())
    run_replay(_join_trace(), [url], tmp_path, options=ReplayOptions(api="completions", thread=False, scrape_s=None))
    builder = PromptBuilder(16)
    assert rec.bodies[1]["prompt"] == builder.text(96, [], 1)
    assert "answer" not in rec.bodies[3]["prompt"]


def test_threads_keep_only_what_a_dependent_still_needs():
    t = _join_trace()
    th = Threads(TraceColumns(t), PromptBuilder(16), chat=False)
    assert [th.keeps(i) for i in range(4)] == [True, True, True, False]
    th.sent(0, "p")
    th.answered(0, " a0", 1)
    assert th.prompt(1, 96, media=False) == "p a0" + _words(95 - 64, 1)
    th.answered(1, " a1", 1)
    th.ended(2)  # failed: its answer is missing, the join goes on without it
    assert th.held() == {"prompts": 1, "answers": 2}
    assert th.prompt(3, 160, media=False) == "p a0 a1" + _words(160 - 64 - 2, 3)
    assert th.held() == {"prompts": 0, "answers": 0}  # nothing left once every dependent is built
    # a dependent whose parent has no answer (failed, or done by an earlier run) uses its hashes
    th2 = Threads(TraceColumns(t), PromptBuilder(16), chat=True)
    assert th2.prompt(1, 96, media=False) is None


def test_worker_shares_keep_a_join_with_every_request_it_waits_for():
    # 0 -> 1, 2 -> 3 joins 1 and 4 (4 has no parent): 0..4 are one family
    t = TRACE.conform(pa.table({
        "request_id": pa.array([0, 1, 2, 3, 4, 5], pa.int64()), "arrival_s": [0.0, 0.1, 0.2, 0.3, 0.05, 0.06],
        "parent_id": pa.array([None, 0, 0, 2, None, None], pa.int64()),
        "wait_ids": pa.array([None, None, None, [1, 4], None, None], pa.list_(pa.int64())),
        "input_tokens": pa.array([8] * 6, pa.int32()), "output_tokens": pa.array([2] * 6, pa.int32())}), "t")
    out = shares(t, 2, closed_loop=False)
    assert sorted(out[0]) == [0, 1, 2, 3, 4] and out[1] == [5]


def test_the_coding_agent_preset_has_tool_turns_with_a_heavy_tail_growing_context_and_joins():
    from llmlb_bench.workload import load_spec

    t = generate(load_spec(Path(__file__).resolve().parents[1] / "workloads" / "coding-agent.toml"))
    rows = t.to_pylist()
    turns = [r for r in rows if r["turn"] and r["turn"] > 1]
    tools = np.array([r["after_parent_s"] for r in turns])
    assert len(turns) > 0.5 * len(rows)
    assert np.percentile(tools, 99) > 10 * np.median(tools)  # a heavy tail of tool times
    by_id = {r["request_id"]: r for r in rows}
    assert all(r["input_tokens"] > by_id[r["parent_id"]]["input_tokens"] for r in turns)  # context grows
    assert sum(1 for r in rows if r["wait_ids"]) > 10


def test_conversation_figures_follow_their_definitions_and_the_documented_sql(tmp_path):
    from metrics_helpers import store_run

    from llmlb_bench.metrics.slo import Slo
    from llmlb_bench.metrics.summary import summarize
    from llmlb_bench.report.document import ReportOptions, build
    from llmlb_bench.report.tables import details
    from llmlb_bench.store.views import Catalog

    # session 0: three ok turns (TTFT 0.1, 0.3, 0.2); session 1: two turns, the second fails;
    # session 2: one turn and an agent child (no turn), TTFT 0.6 > the SLO's 0.5; a row outside
    # any session is not counted
    rows = {
        "request_id": list(range(8)),
        "session_id": [0, 0, 0, 1, 1, 2, 2, None], "turn": [1, 2, 3, 1, 2, 1, None, None],
        "scheduled_s": [0.0, 2.0, 5.0, 1.0, 3.0, 0.5, 1.5, 0.0], "sent_s": [0.0, 2.0, 5.0, 1.0, 3.0, 0.5, 1.5, 0.0],
        "first_token_s": [0.1, 2.3, 5.2, 1.1, None, 1.1, 1.6, 0.1],
        "last_token_s": [1.0, 3.0, 6.5, 2.0, None, 1.4, 2.5, 0.5],
        "input_tokens": [100, 300, 500, 80, 200, 50, 70, 10], "output_tokens": [10, 10, 10, 10, 0, 10, 10, 10],
        "cached_tokens": [0, 96, 288, 0, 0, 0, 48, 0], "status": ["ok"] * 4 + ["error"] + ["ok"] * 3,
    }
    store_run(tmp_path, "c", rows, config={"backend": "sim"}, backend="sim")
    [s] = summarize(Catalog([tmp_path]), Slo.parse("ttft=500ms"))
    c = s["conversations"]
    assert (c["sessions"], c["completed"]) == (3, 2)
    assert c["requests_mean"] == pytest.approx(7 / 3)
    assert c["attainment"] == pytest.approx(1 / 3)  # only session 0 has every request good
    completion = np.array([6.5 - 0.0, 2.5 - 0.5])  # sessions 0 and 2
    assert c["completion_s"]["p50"] == pytest.approx(np.percentile(completion, 50))
    assert c["completion_s"]["p99"] == pytest.approx(np.percentile(completion, 99))
    assert c["tokens"]["input_mean"] == pytest.approx((900 + 280 + 120) / 3)
    assert c["tokens"]["cached_mean"] == pytest.approx((384 + 48) / 3)
    by_turn = {t["turn"]: t for t in c["ttft_by_turn"]}
    assert by_turn[1]["requests"] == 3 and by_turn[1]["p50"] == pytest.approx(0.1)  # 0.1, 0.1, 0.6
    assert by_turn[2]["requests"] == 1 and by_turn[2]["p50"] == pytest.approx(0.3)
    assert by_turn[3]["p99"] == pytest.approx(0.2)
    table = details(build(Catalog([tmp_path]), ReportOptions(slo=Slo.parse("ttft=500ms"))))
    shown = {r[0]: r[1] for r in table.rows}
    assert shown["session attainment (%)"] == "33.3" and shown["TTFT p50 / p99 turn 2 (ms)"] == "300 / 300"
    # the documented SQL gives the same
    user = Catalog([tmp_path], confined=True)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    sql = doc.split("## Conversations", 1)[1].split("```sql\n", 1)[1].split("```", 1)[0]
    first = [q for q in sql.split(";\n") if "completed" in q][0]
    [got] = user.query_read_only(first).to_pylist()
    assert (got["sessions"], got["completed"]) == (3, 2)
    assert got["p99"] == pytest.approx(c["completion_s"]["p99"])


def test_keeping_a_conversations_kv_cuts_later_turns_ttft_and_session_time():
    """The CachedAttention reproduction's direction, read straight from its summaries."""
    from llmlb_bench.repro import REPRODUCTIONS, evaluate

    verdict, s = evaluate(REPRODUCTIONS["cachedattention-multiturn"], "small")
    assert verdict.passed, verdict.evidence
    off, on = s["recompute"], s["kv kept"]
    assert off["cached_tokens"] == 0 and on["cached_tokens"] > 0.8 * on["input_tokens"]
    late = lambda x: x["conversations"]["ttft_by_turn"][-1]["p50"]  # noqa: E731
    assert late(on) < 0.5 * late(off) and on["ttft"]["mean"] < 0.5 * off["ttft"]["mean"]
    assert on["conversations"]["completion_s"]["p50"] < off["conversations"]["completion_s"]["p50"]
    assert on["conversations"]["sessions"] == off["conversations"]["sessions"]


def test_worker_processes_thread_a_conversation_in_the_process_that_holds_it(servers, tmp_path):  # noqa: F811
    rec = Recorder()
    url = servers.aiohttp(rec.app())
    t = _join_trace()
    other = TRACE.conform(pa.table({  # a second, independent family for the other worker
        "request_id": pa.array([10, 11], pa.int64()), "arrival_s": [0.0, 0.0],
        "parent_id": pa.array([None, 10], pa.int64()), "after_parent_s": pa.array([None, 0.0]),
        "input_tokens": pa.array([32, 64], pa.int32()), "output_tokens": pa.array([4, 4], pa.int32())}), "t")
    summary, rows, _ = run_replay(pa.concat_tables([t, other]), [url], tmp_path,
                                  options=ReplayOptions(api="completions", workers=2, scrape_s=None))
    assert summary["statuses"] == {"ok": 6}
    root = rec.bodies[0]["prompt"]
    assert rec.bodies[3]["prompt"].startswith(root + " answer-0 . answer-1 . answer-2 .")
    assert rec.bodies[11]["prompt"].startswith(rec.bodies[10]["prompt"] + " answer-10 .")


def test_a_resumed_run_sends_what_is_left_once_and_joins_wait_only_for_requests_it_sends(servers, tmp_path):  # noqa: F811
    """Requests 0 (the parent) and 1 ended in the interrupted run; the resumed run sends 2 at
    once (its parent is done), and the join 3 after 2 alone. 3's parent answered in the other
    run, whose answers are not stored, so its prompt comes from its hashes."""
    from llmlb_bench.policies import make_policy
    from llmlb_bench.replay import preflight, replay
    from llmlb_bench.replay.resume import prepare_resume
    from llmlb_bench.store import RunStore

    rec = Recorder()
    url = servers.aiohttp(rec.app())
    trace = _join_trace()
    write_trace(trace, tmp_path / "t.parquet")
    with RunStore(tmp_path / "res", config={}, backend="replay", run_id="p", trace_path=tmp_path / "t.parquet") as run:
        run.requests.write({"request_id": [0, 1, 2, 3], "status": ["ok", "ok", "not_sent", "not_sent"],
                            "last_token_s": [0.1, 0.4, None, None]})
    meta_path = tmp_path / "res" / "p" / "run.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "status": "partial"}))
    res = prepare_resume(tmp_path / "res" / "p", tmp_path / "t.parquet")
    opts = ReplayOptions(api="completions", scrape_s=None)
    with RunStore(res.results_dir, config={}, backend="replay", run_id=res.run_id) as run:
        replay(read_trace(tmp_path / "t.parquet"), [url], make_policy("round_robin"), run, opts,
               pre=preflight([url], opts), resume=res)
    res.discard_backup()
    rows = sorted(pq.read_table(tmp_path / "res" / "p" / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert [r["status"] for r in rows] == ["ok"] * 4 and sorted(rec.bodies) == [2, 3]
    assert rows[3]["sent_s"] >= rows[2]["last_token_s"] + 0.1
    assert rec.bodies[3]["prompt"] == PromptBuilder(16).text(160, [], 3)


def test_trace_stats_count_the_joins():
    from llmlb_bench.workload.stats import trace_stats

    t = _agent_trace()
    joins = [r for r in t.column("wait_ids").to_pylist() if r]
    assert trace_stats(t)["joins"] == {"joins": len(joins), "mean_inputs": 2.0}
    assert "joins" not in trace_stats(_join_trace().drop(["wait_ids"]))
