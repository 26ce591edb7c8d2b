"""Azure LLM inference traces (Azure/AzurePublicDataset): 2023, 2024 and multimodal 2025.

Columns ``TIMESTAMP, ContextTokens, GeneratedTokens`` (+ ``NumImages`` in
the 2025 multimodal trace). The three releases write timestamps differently
(naive with a 7-digit fraction; ``+00:00`` with the fraction dropped when it
is zero; ISO with ``Z``); :func:`timestamps_ns` reads all of them. The image
count is kept; how many tokens the images became is not in the trace, so
``image_tokens`` stays 0 and ``ContextTokens`` is taken as the full prompt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from llmlb_bench.workload.importers.tabular import ADAPTER_NAMES, Columns, adapters, assemble, check_file, concat, csv_batches, numbers, \
    timestamps_ns

COLUMNS = Columns(
    required={"time": ["TIMESTAMP"], "input": ["ContextTokens"], "output": ["GeneratedTokens"]},
    optional={"images": ["NumImages"], "adapter": list(ADAPTER_NAMES)},
)


def read_azure(path: str | Path, kind: str = "chat") -> pa.Table:
    path = check_file(path)
    times, inputs, outputs, images, adapter = [], [], [], [], []
    for line, cols in csv_batches(path, COLUMNS, {"time": pa.string(), "adapter": pa.string()}):
        times.append(timestamps_ns(cols["time"], "TIMESTAMP", path, line))
        inputs.append(numbers(cols["input"], "ContextTokens", path, line))
        outputs.append(numbers(cols["output"], "GeneratedTokens", path, line))
        if "images" in cols:
            images.append(numbers(cols["images"], "NumImages", path, line))
        if "adapter" in cols:
            adapter.append(cols["adapter"])
    t = concat(times)
    arrival = (t - t.min()) / 1e9 if t.size else np.zeros(0)  # a header-only file: assemble says so
    n = len(arrival)
    return assemble(arrival, concat(inputs), concat(outputs), source=path,
                    images=concat(images).astype(np.int16) if images else None,
                    adapter=adapters(concat(adapter)) if adapter else None,
                    kind=pa.array(np.full(n, kind)).dictionary_encode())
