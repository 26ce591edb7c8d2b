"""The results store: one folder per run with requests.parquet, series.parquet and run.json."""

from llmlb_bench.store.run import RunStore, new_run_id
from llmlb_bench.store.sink import ParquetSink

__all__ = ["ParquetSink", "RunStore", "new_run_id"]
