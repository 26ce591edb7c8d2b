"""Replay a trace against a real third-party engine on this CPU: llama.cpp ``llama-server``.

Writes the tiny random-weight model (llmlb_bench.engines.llama),
starts ``llama-server`` with 8 slots, replays a Poisson trace whose prompts
share system prefixes, and prints what the replayer measured together with
the accounting checks: outputs as long as requested (usage, ``ignore_eos``),
one stream chunk per token, prompt lengths exact through ``/tokenize``, and
how much of the input the engine's prefix cache served.

Needs scripts/build_llama_server.sh to have run once and the ``gguf`` package.

    python benchmarks/replay_llama_server.py [--requests 200] [--rate 6]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.engines.llama import LlamaServer, find_llama_server, write_tiny_llama
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.schema import TRACE
from llmlb_bench.store import RunStore


def make_trace(n: int, rate: float, seed: int = 0) -> pa.Table:
    """Poisson arrivals; 4 system prompts of 128 tokens shared by 3 in 4 requests, then unique text."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    own = rng.integers(32, 384, n)
    hashes, inputs = [], []
    for i in range(n):
        system = [100 * (1 + i % 4) + k for k in range(8)] if i % 4 else []
        mine = [10_000 * (i + 1) + k for k in range(int(own[i]) // 16)]
        hashes.append(system + mine)
        inputs.append(16 * len(system) + int(own[i]))
    return TRACE.conform(pa.table({
        "request_id": pa.array(np.arange(n), pa.int64()), "arrival_s": arrivals - arrivals[0],
        "input_tokens": pa.array(inputs, pa.int32()), "output_tokens": pa.array(np.full(n, 32), pa.int32()),
        "prefix_hashes": pa.array(hashes, pa.list_(pa.uint64()))}), "bench")


def pct(v: np.ndarray) -> str:
    return "  ".join(f"p{q} {np.percentile(v, q):.1f}" for q in (50, 90, 99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--slots", type=int, default=8)
    args = ap.parse_args()
    binary = find_llama_server()
    if binary is None:
        sys.exit("llama-server not found: run scripts/build_llama_server.sh first")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_llama(Path(tmp) / "tiny.gguf", n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=512)
        trace = make_trace(args.requests, args.rate)
        options = ReplayOptions(api="completions", tokenize=True)
        with LlamaServer(binary, model, port, slots=args.slots) as server:
            pre = preflight([server.url], options)
            with RunStore(Path(tmp) / "results", config={}, backend="replay", run_id="llama") as run:
                summary = replay(trace, [server.url], make_policy("round_robin"), run, options, pre=pre)
            rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in ok]) * 1e3
    tpot = np.array([(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in ok]) * 1e3
    span = max(r["last_token_s"] for r in ok) - min(r["sent_s"] for r in ok)
    chunks = sum(sum(s["count"] for s in r["token_times"]) for r in ok)
    out = sum(r["output_tokens"] for r in ok)
    inp = sum(r["server_input_tokens"] for r in ok)
    print(f"llama-server ({binary}), tiny random LLaMA (hidden 256, 4 layers), {args.slots} slots, 1 thread")
    print(f"{len(rows)} requests at {args.rate:g}/s: statuses {summary['statuses']}, "
          f"{len(ok) / span:.1f} requests/s and {out / span:,.0f} output tokens/s over {span:.1f} s")
    print(f"TTFT ms {pct(ttft)}   TPOT ms {pct(tpot)}   client dispatch lag p99 "
          f"{summary['client']['dispatch_lag_ms']['p99']} ms")
    print(f"accounting: output = requested for {sum(r['output_tokens'] == r['requested_output_tokens'] for r in ok)}"
          f"/{len(ok)}; stream chunks {chunks} = usage tokens {out}: {chunks == out}; prompt tokens = trace "
          f"input for {sum(r['server_input_tokens'] == r['input_tokens'] for r in ok)}/{len(ok)}")
    systems = {tuple(h[:8]) for h in trace.column("prefix_hashes").to_pylist() if h[0] < 10_000}
    shareable = 128 * (sum(1 for h in trace.column("prefix_hashes").to_pylist() if h[0] < 10_000) - len(systems))
    print(f"prefix cache: {sum(r['cached_tokens'] or 0 for r in ok) / inp:.1%} of {inp:,} prompt tokens served "
          f"from the engine's cache; {shareable / inp:.1%} if every repeat of the 4 shared 128-token system "
          f"prompts hits and nothing else does")


if __name__ == "__main__":
    main()
