"""Benchmark: generate N requests of a preset and write them to Parquet.

Usage: python benchmarks/workload_generate.py [--requests 10000000] [--spec workloads/chat.toml]

Prints the generation time, the write time and requests per second for each
and for both together. The target is >= 1M generated requests/s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from llmlb_bench.schema import write_trace
from llmlb_bench.workload import generate, load_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--spec", default=str(Path(__file__).resolve().parents[1] / "workloads" / "chat.toml"))
    args = parser.parse_args()
    spec = load_spec(args.spec).replace(requests=args.requests)
    start = time.perf_counter()
    table = generate(spec)
    gen_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.parquet"
        start = time.perf_counter()
        write_trace(table, path, spec=spec.to_dict(), block_size=spec.block_size)
        write_s = time.perf_counter() - start
        size = path.stat().st_size
    n = table.num_rows
    print(f"spec            {args.spec}")
    print(f"requests        {n:,}")
    print(f"generate        {gen_s:8.2f} s   {n / gen_s / 1e6:6.2f} M req/s")
    print(f"write parquet   {write_s:8.2f} s   {n / write_s / 1e6:6.2f} M req/s   {size / 1e6:,.0f} MB")
    print(f"total           {gen_s + write_s:8.2f} s   {n / (gen_s + write_s) / 1e6:6.2f} M req/s")


if __name__ == "__main__":
    main()
