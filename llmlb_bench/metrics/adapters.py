"""LoRA adapter loads: how often each target copied an adapter into a GPU slot.

A load is the cost LoRA-affinity routing avoids (sim/lora.py: adapter bytes
over the host link, plus a read from storage when the host cache misses), so
the report counts them beside latency. The simulator writes each replica's
loads since its previous sample as the series column ``adapter_loads``; real
vLLM publishes no counter of them, so replayed runs have none (null).
"""

from __future__ import annotations

from llmlb_bench.metrics.run_figures import AdapterLoads
from llmlb_bench.store.views import Catalog


def adapter_loads(cat: Catalog) -> dict[str, AdapterLoads]:
    """``{run_id: {"total": loads, "per_target": {target: loads}}}`` for runs whose series count loads."""
    if cat.holds_no_value("series", "adapter_loads"):
        return {}
    rows = cat.rows("SELECT run_id, target, sum(adapter_loads)::BIGINT AS loads FROM series "
                    "WHERE adapter_loads IS NOT NULL GROUP BY ALL ORDER BY run_id, target")
    out: dict[str, AdapterLoads] = {}
    for r in rows:
        run = out.setdefault(r["run_id"], {"total": 0, "per_target": {}})
        run["total"] += r["loads"]
        run["per_target"][r["target"]] = r["loads"]
    return out
