"""llmlb's replayer, GuideLLM, AIPerf and a bare aiohttp loop side by side against one truth server.

The no-op streaming server (llmlb_bench.replay.noop_server) runs pinned to
one core and records, per request, when it read the request and when it
wrote the first token, on the system-wide monotonic clock; each client runs
pinned to the other core (GuideLLM and AIPerf with all their worker
processes). Every request streams 32 one-token chunks. For every request,
whichever tool sent it::

    send lateness   = server's read time - the time the tool's schedule gave the request
    TTFT inflation  = the tool's own first-token time - the server's first write

(both on one clock: the peers' wall-clock stamps are moved onto
``perf_counter`` by the offset between the two clocks, read here). The
schedule is the tool's own: llmlb's ``scheduled_s``, GuideLLM's
``targeted_start``, and for AIPerf, which keeps no schedule per request,
the constant-rate grid ``first credit + k / rate`` in credit order, and
for the bare aiohttp loop (benchmarks/peers/aiohttp_loop.py: one asyncio
loop, one ClientSession, one task per request) its own sleep target. Open
loop at constant rates (default 500 and 1,000 requests/s, 10 s), tokens 2 ms
apart; capacity with the whole answer written at once, every tool closed
loop at a concurrency of 256 (llmlb ``users=256``, GuideLLM's
``throughput`` profile, AIPerf ``--concurrency 256``, the aiohttp loop's 256
tasks); completed requests over the span from the first send to the last
completion. llmlb runs as installed (``pip install llmlb-bench``: uvloop and
orjson where they have wheels); the event loop that ran is printed.

GuideLLM and AIPerf are installed, each into its own virtualenv under
.bench/ (git-ignored), on first use, and use a byte-level BPE tokenizer
trained here with the ``tokenizers`` package (.bench/peer-tokenizer; for
AIPerf also laid out as a local Hugging Face cache entry, since it resolves
local paths through the hub cache when offline), with HF_HUB_OFFLINE=1:
nothing reaches a hub. The machine's load average and core noise are
printed with every run, because on a shared machine they decide the p99s.

    flock /tmp/llmlb-measure.lock python benchmarks/replay_vs_peers.py [--rates 500 1000] [--seconds 10]
        [--repeat 3] [--tools llmlb aiohttp guidellm aiperf] [--no-capacity]

Every figure is printed per round as it is measured; the table at the end
gives each tool's median over the rounds with the range (min-max) and each
peer's figure as a multiple of llmlb's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.replay.prompts import WORDS
from llmlb_bench.replay.selfcheck import noop_server, server_records
from llmlb_bench.schema import TRACE
from llmlb_bench.store import RunStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_throughput import machine_noise  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / ".bench"
OUTPUT_TOKENS = 32
INPUT_TOKENS = 128
#: the capacity runs: closed loop at this concurrency; llmlb's trace has this many requests
CONCURRENCY, CAPACITY_REQUESTS = 256, 20_000
PEERS = {"guidellm": "guidellm==0.8.1", "aiperf": "aiperf==0.13.0"}
TOOLS = ("llmlb", "aiohttp", *PEERS)
AIOHTTP_LOOP = Path(__file__).resolve().parent / "peers" / "aiohttp_loop.py"
HF_REPO = "llmlb/bench-tokenizer"
_REVISION = "0" * 40


# -- setup ---------------------------------------------------------------------
def peer_venv(tool: str) -> Path:
    """The tool's virtualenv under .bench/, created and installed when missing."""
    venv = BENCH / f"{tool}-venv"
    exe = venv / "bin" / tool
    if not exe.exists():
        print(f"installing {PEERS[tool]} into {venv.relative_to(ROOT)} (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        with open(BENCH / f"{tool}-install.log", "w") as log:
            subprocess.run([str(venv / "bin" / "pip"), "install", PEERS[tool]], check=True, stdout=log,
                           stderr=subprocess.STDOUT)
    return exe


def build_tokenizer() -> tuple[Path, Path]:
    """A byte-level BPE tokenizer trained on the prompt words; saved as a plain folder (GuideLLM)
    and as a local Hugging Face cache entry (AIPerf). Returns (folder, HF_HOME)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder, hf_home = BENCH / "peer-tokenizer", BENCH / "peer-hf-cache"
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS + ("tok",)) for _ in range(50)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    snapshot = hf_home / "hub" / f"models--{HF_REPO.replace('/', '--')}" / "snapshots" / _REVISION
    for where in (folder, snapshot):
        where.mkdir(parents=True, exist_ok=True)
        tok.save(str(where / "tokenizer.json"))
        (where / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "model_max_length": 1 << 20}))
    refs = snapshot.parents[1] / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(_REVISION)
    return folder, hf_home


def clock_offset() -> float:
    """``time.time() - time.perf_counter()``, read at the tightest of a few tries."""
    best = None
    for _ in range(20):
        a = time.perf_counter()
        w = time.time()
        b = time.perf_counter()
        if best is None or b - a < best[0]:
            best = (b - a, w - (a + b) / 2)
    assert best is not None
    return best[1]


def pinned(cpu: int) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, {cpu})


# -- per-request figures -----------------------------------------------------------
def figures(sched: np.ndarray, recv: np.ndarray, client_first: np.ndarray, server_first: np.ndarray,
            total: int) -> dict[str, Any]:
    """Send lateness and TTFT inflation percentiles (ms) and the rate the server saw."""
    def pct(v: np.ndarray) -> dict[str, float]:
        return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "max": float(v.max())}
    span = recv.max() - recv.min()
    return {"ok": int(sched.size), "total": total, "rate": (recv.size - 1) / span if span > 0 else None,
            "lateness": pct((recv - sched) * 1e3), "inflation": pct((client_first - server_first) * 1e3)}


def constant_trace(n: int, rate: float) -> pa.Table:
    arrivals = np.arange(n) / rate
    return TRACE.conform(pa.table({
        "request_id": pa.array(np.arange(n), pa.int64()), "arrival_s": pa.array(arrivals),
        "input_tokens": pa.array(np.full(n, INPUT_TOKENS), pa.int32()),
        "output_tokens": pa.array(np.full(n, OUTPUT_TOKENS), pa.int32())}), "bench")


# -- the three clients -----------------------------------------------------------------
def run_llmlb(url: str, rate: float | None, seconds: float, cpu: int, work: Path) -> tuple[dict, dict]:
    """llmlb in this process, pinned to the client core. Returns (open-loop figures, capacity)."""
    os.sched_setaffinity(0, {cpu})
    table = constant_trace(int(rate * seconds), rate) if rate else constant_trace(CAPACITY_REQUESTS, 1.0)
    options = ReplayOptions(api="chat", scrape_s=None, users=None if rate else CONCURRENCY)
    with RunStore(work, config={}, backend="replay", run_id=f"llmlb-{rate or 'cap'}") as store:
        summary = replay(table, [url], make_policy("round_robin"), store, options, pre=preflight([url], options))
    rows = pq.read_table(store.dir / "requests.parquet")
    ok = rows.filter(pc.equal(rows.column("status"), "ok"))
    t0 = summary["client"]["t0_clock_s"]
    recs = server_records(url)
    keys = [str(r) for r in ok.column("request_id").to_pylist()]
    fig = figures(np.asarray(ok.column("scheduled_s")) + t0, np.array([recs[k][0] for k in keys]),
                  np.asarray(ok.column("first_token_s")) + t0, np.array([recs[k][1] for k in keys]), rows.num_rows)
    ends = np.asarray(ok.column("last_token_s"))
    starts = np.asarray(ok.column("sent_s"))
    cap = {"completed": ok.num_rows, "rps": ok.num_rows / (ends.max() - starts.min()),
           "loop": summary["client"]["event_loop"], "cpu_ms": summary["client"]["cpu_ms_per_request"]}
    return fig, cap


def run_aiohttp(url: str, rate: float | None, seconds: float, cpu: int, work: Path,
                timeout: float) -> tuple[dict | None, dict | None, str | None]:
    """The bare aiohttp loop (benchmarks/peers/aiohttp_loop.py) in its own process on the client core."""
    out = work / f"aiohttp-{rate or 'cap'}.jsonl"
    load = ["--rate", f"{rate:g}"] if rate else ["--concurrency", str(CONCURRENCY)]
    cmd = [sys.executable, str(AIOHTTP_LOOP), url, str(out), *load, "--seconds", f"{seconds:g}",
           "--tokens", str(OUTPUT_TOKENS), "--prompt-words", str(INPUT_TOKENS)]
    why = _run_peer(cmd, dict(os.environ), cpu, work / f"aiohttp-{rate or 'cap'}.log", timeout)
    if why:
        return None, None, why
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    ok = [x for x in lines if x["ok"]]
    recs = server_records(url)
    keys = [str(x["id"]) for x in ok]
    fig = figures(np.array([x["scheduled"] for x in ok]), np.array([recs[k][0] for k in keys]),
                  np.array([x["first"] for x in ok]), np.array([recs[k][1] for k in keys]), len(lines))
    span = max(x["end"] for x in ok) - min(recs[k][0] for k in keys)
    return fig, {"completed": len(ok), "rps": len(ok) / span}, None


def _run_peer(cmd: list[str], env: dict[str, str], cpu: int, log: Path, timeout: float) -> str | None:
    """Run a peer's command pinned to the client core; None when it worked, else why not."""
    with open(log, "w") as out:
        try:
            proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                  preexec_fn=pinned(cpu))
        except subprocess.TimeoutExpired:
            return f"did not finish within {timeout:.0f} s (log: {log})"
    return None if proc.returncode == 0 else f"exit code {proc.returncode} (log: {log})"


def peer_env(hf_home: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HOME=str(hf_home), TOKENIZERS_PARALLELISM="false")
    env.pop("HF_TOKEN", None)
    return env


def run_guidellm(url: str, rate: float | None, seconds: float, cpu: int, work: Path, tok: Path,
                 hf_home: Path, timeout: float) -> tuple[dict | None, dict | None, str | None]:
    out = work / f"guidellm-{rate or 'cap'}.json"
    profile = f"kind=constant,rate={rate:g}" if rate else f"kind=throughput,max_concurrency={CONCURRENCY}"
    cmd = [str(peer_venv("guidellm")), "run", "--backend", f"kind=openai_http,target={url}",
           "--profile", profile, "--constraint", f"kind=max_duration,seconds={seconds:g}",
           "--data", f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--tokenizer", f"kind=huggingface_auto,model={tok}", "--output", f"kind=json,path={out}",
           "--disable-console"]
    why = _run_peer(cmd, peer_env(hf_home), cpu, work / f"guidellm-{rate or 'cap'}.log", timeout)
    if why:
        return None, None, why
    bench = json.loads(out.read_text())["benchmarks"][0]
    ok = bench["requests"]["successful"]
    total = sum(len(bench["requests"][k]) for k in ("successful", "errored", "incomplete"))
    off = clock_offset()
    recs = server_records(url)
    t = [r["info"]["timings"] for r in ok]
    keys = [r["output"].split()[0] for r in ok]  # the server named its record in the first token
    fig = figures(np.array([x["targeted_start"] for x in t]) - off, np.array([recs[k][0] for k in keys]),
                  np.array([x["first_token_iteration"] for x in t]) - off, np.array([recs[k][1] for k in keys]),
                  total)
    span = max(x["request_end"] for x in t) - min(x["request_start"] for x in t)
    return fig, {"completed": len(ok), "rps": len(ok) / span}, None


def run_aiperf(url: str, rate: float | None, seconds: float, cpu: int, work: Path, hf_home: Path,
               timeout: float) -> tuple[dict | None, dict | None, str | None]:
    out = work / f"aiperf-{rate or 'cap'}"
    load = (["--request-rate", f"{rate:g}", "--arrival-pattern", "constant", "--request-count",
             str(int(rate * seconds))] if rate else ["--concurrency", str(CONCURRENCY), "--benchmark-duration",
                                                     f"{seconds:g}"])
    cmd = [str(peer_venv("aiperf")), "profile", "--model", "noop", "--url", url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", HF_REPO, "--isl", str(INPUT_TOKENS), "--osl", str(OUTPUT_TOKENS),
           *load, "--ui", "none", "--artifact-dir", str(out), "--export-level", "records", "--random-seed", "1"]
    why = _run_peer(cmd, peer_env(hf_home), cpu, work / f"aiperf-{rate or 'cap'}.log", timeout)
    if why:
        return None, None, why
    lines = [json.loads(x) for x in (out / "profile_export.jsonl").read_text().splitlines() if x.strip()]
    ok = [x for x in lines if not x.get("error") and "time_to_first_token" in x["metrics"]]
    off = clock_offset()
    recs = server_records(url)
    meta = [x["metadata"] for x in ok]
    start = np.array([m["request_start_ns"] for m in meta]) / 1e9
    first = start + np.array([x["metrics"]["time_to_first_token"]["value"] for x in ok]) / 1e3
    keys = [m["x_request_id"] for m in meta]
    if rate:
        credits = np.array([m["credit_issued_ns"] for m in meta]) / 1e9
        order = np.argsort(credits, kind="stable")
        sched = np.empty_like(credits)
        sched[order] = credits[order[0]] + np.arange(len(order)) / rate
    else:
        sched = start
    fig = figures(sched - off, np.array([recs[k][0] for k in keys]), first - off,
                  np.array([recs[k][1] for k in keys]), len(lines))
    span = max(m["request_end_ns"] for m in meta) / 1e9 - start.min()
    return fig, {"completed": len(ok), "rps": len(ok) / span}, None


# -- driver ----------------------------------------------------------------------------
def measure(tool: str, rate: float | None, args: argparse.Namespace, work: Path, tok: Path,
            hf_home: Path) -> tuple[dict | None, dict | None, str | None]:
    load = os.getloadavg()[0]
    with noop_server(args.server_cpu, itl_ms=args.itl_ms if rate else 0.0) as url:
        if tool == "llmlb":
            fig, cap = run_llmlb(url, rate, args.seconds, args.client_cpu, work)
            why = None
        elif tool == "aiohttp":
            fig, cap, why = run_aiohttp(url, rate, args.seconds, args.client_cpu, work, args.timeout)
        elif tool == "guidellm":
            fig, cap, why = run_guidellm(url, rate, args.seconds, args.client_cpu, work, tok, hf_home, args.timeout)
        else:
            fig, cap, why = run_aiperf(url, rate, args.seconds, args.client_cpu, work, hf_home, args.timeout)
    what = f"{rate:g} req/s" if rate else "capacity"
    if why:
        print(f"  {tool:8s} {what}: could not run: {why}", flush=True)
    elif rate:
        lat, inf = fig["lateness"], fig["inflation"]
        print(f"  {tool:8s} {what}: {fig['ok']}/{fig['total']} ok, server saw {fig['rate']:.1f}/s; lateness ms "
              f"p50 {lat['p50']:.2f} p99 {lat['p99']:.2f}; TTFT inflation ms p50 {inf['p50']:.2f} "
              f"p99 {inf['p99']:.2f} (load average {load:.1f})", flush=True)
    else:
        extra = f"; {cap['loop']}, client CPU {cap['cpu_ms'] * 1e3:.0f} us/request" if "loop" in cap else ""
        print(f"  {tool:8s} {what}: {cap['completed']} completed, {cap['rps']:,.0f} streamed requests/s "
              f"(load average {load:.1f}{extra})", flush=True)
    return fig, cap, why


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--rates", type=float, nargs="+", default=[500.0, 1000.0])
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of each run")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every measurement (median and range tabled)")
    ap.add_argument("--no-capacity", action="store_true")
    ap.add_argument("--itl-ms", type=float, default=2.0, help="server's gap between tokens in open-loop runs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a peer's run may take (startup included)")
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--server-cpu", type=int, default=1)
    args = ap.parse_args()
    print(f"client on CPU {args.client_cpu}, server on CPU {args.server_cpu}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    machine_noise(args.client_cpu)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    BENCH.mkdir(exist_ok=True)
    tok, hf_home = build_tokenizer()
    for tool in args.tools:
        if tool in PEERS:
            peer_venv(tool)
    results: dict[tuple[str, float | None], list[tuple[dict | None, dict | None, str | None]]] = {}
    with tempfile.TemporaryDirectory(dir=BENCH) as tmp:
        for rep in range(args.repeat):
            print(f"round {rep + 1}/{args.repeat}:", flush=True)
            for rate in ([None] if not args.no_capacity else []) + list(args.rates):
                for tool in args.tools:
                    work = Path(tmp) / f"{tool}-{rep}-{rate or 'cap'}"
                    work.mkdir()
                    results.setdefault((tool, rate), []).append(measure(tool, rate, args, work, tok, hf_home))
                    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
            machine_noise(args.client_cpu)
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        keep = BENCH / "logs" / "replay_vs_peers"
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(tmp, keep, ignore=shutil.ignore_patterns("*.parquet", "*.json", "*.jsonl", "inputs*"))
    table(results, args)


def table(results: dict, args: argparse.Namespace) -> None:
    """Each tool's median over the rounds with its range, and each peer's median as a multiple of llmlb's."""
    def values(tool: str, rate: float | None, pick: Callable[[dict, dict], float]) -> list[float]:
        return [pick(f, c) for f, c, why in results.get((tool, rate), []) if not why]

    def cell(v: list[float], base: list[float] | None, fmt: str) -> str:
        if not v:
            return "-".rjust(36)
        med = float(np.median(v))
        text = format(med, fmt) + (f" [{format(min(v), fmt)}-{format(max(v), fmt)}]" if len(v) > 1 else "")
        if base:
            text += f" ({med / float(np.median(base)):.1f}x)"
        return text.rjust(36)

    print(f"\nmedian [min-max] of {args.repeat} round(s); (Nx) = the tool's median as a multiple of llmlb's")
    if not args.no_capacity:
        base = values("llmlb", None, lambda f, c: c["rps"])
        print(f"{'capacity':12s}{'requests/s':>36}   (llmlb's median as a multiple of it)")
        for t in args.tools:
            v = values(t, None, lambda f, c: c["rps"])
            ratio = f"   ({np.median(base) / np.median(v):.1f}x)" if t != "llmlb" and v and base else ""
            print(f"{t:12s}{cell(v, None, ',.0f')}{ratio}")
    keys = [("lateness", "p50"), ("lateness", "p99"), ("inflation", "p50"), ("inflation", "p99")]
    for rate in args.rates:
        print(f"\n{f'{rate:g} req/s':12s}" + "".join(f"{f'{k} {q} ms':>36}" for k, q in keys))
        for t in args.tools:
            row = []
            for k in keys:
                pick = (lambda f, c, k=k: f[k[0]][k[1]])
                base = values("llmlb", rate, pick) if t != "llmlb" else None
                row.append(cell(values(t, rate, pick), base, ".2f"))
            print(f"{t:12s}" + "".join(row))


if __name__ == "__main__":
    main()
