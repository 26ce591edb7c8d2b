"""Benchmark: import large traces (Azure CSV, BurstGPT CSV, Mooncake JSONL) of N rows each.

Usage: python benchmarks/workload_import.py [--rows 2000000]

Writes synthetic files in the published layouts into a temporary folder (the
real traces are too small to time), imports each with ``llmlb trace import``'s
code path, and prints rows per second and peak memory growth. With
../shared/data present it also times the real Azure 2023 and Mooncake files.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from llmlb_bench.workload.importers import import_trace

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


def azure_csv(path: Path, n: int, rng: np.random.Generator) -> None:
    ns = 1_700_000_000_000_000_000 + np.cumsum(rng.exponential(2e8, n)).astype(np.int64)
    stamps = pc.strftime(pa.array(ns, pa.timestamp("ns")), format="%Y-%m-%d %H:%M:%S")
    pcsv.write_csv(pa.table({"TIMESTAMP": stamps, "ContextTokens": rng.integers(1, 8000, n),
                             "GeneratedTokens": rng.integers(1, 1000, n)}), path)


def burstgpt_csv(path: Path, n: int, rng: np.random.Generator) -> None:
    models = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 2, n).astype(np.int32)),
                                            pa.array(["ChatGPT", "GPT-4"])).cast(pa.string())
    logs = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 2, n).astype(np.int32)),
                                          pa.array(["Conversation log", "API log"])).cast(pa.string())
    req, resp = rng.integers(1, 4000, n), rng.integers(0, 1000, n)
    pcsv.write_csv(pa.table({"Timestamp": np.cumsum(rng.exponential(0.5, n)), "Model": models,
                             "Request tokens": req, "Response tokens": resp, "Total tokens": req + resp,
                             "Log Type": logs}), path)


def mooncake_jsonl(path: Path, n: int, rng: np.random.Generator) -> None:
    t = np.cumsum(rng.exponential(300, n)).astype(np.int64)
    lengths = rng.integers(1, 8192, n)
    with open(path, "w") as f:  # written in chunks of lines: a benchmark fixture, not the code under test
        for start in range(0, n, 100_000):
            lines = []
            for i in range(start, min(n, start + 100_000)):
                blocks = -(-int(lengths[i]) // 512)
                lines.append(json.dumps({"timestamp": int(t[i]), "input_length": int(lengths[i]),
                                         "output_length": 100, "hash_ids": list(range(i, i + blocks))}))
            f.write("\n".join(lines) + "\n")


def timed(fmt: str, path: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    table = import_trace(fmt, path).table
    elapsed = time.perf_counter() - start
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    size = path.stat().st_size / 1e6
    print(f"{fmt:11s} {path.name:38s} {table.num_rows:>11,} rows {size:8.0f} MB {elapsed:7.2f} s "
          f"{table.num_rows / elapsed / 1e6:6.2f} M rows/s  peak RSS +{grew:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"azure-2023": Path(tmp) / "azure.csv", "burstgpt": Path(tmp) / "burstgpt.csv",
                 "mooncake": Path(tmp) / "mooncake.jsonl"}
        azure_csv(files["azure-2023"], args.rows, rng)
        burstgpt_csv(files["burstgpt"], args.rows, rng)
        mooncake_jsonl(files["mooncake"], args.rows // 2, rng)
        for fmt, path in files.items():
            timed(fmt, path)
    if DATA.is_dir():
        timed("azure-2023", DATA / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv")
        timed("mooncake", DATA / "mooncake-fast25" / "conversation_trace.jsonl")


if __name__ == "__main__":
    main()
