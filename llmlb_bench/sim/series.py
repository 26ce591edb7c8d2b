"""Per-replica samples over simulated time for series.parquet.

Every ``interval_s`` of simulated time each replica reports its waiting
queue, running batch, KV blocks in use (exact at the sample time, also
inside a decode run) and its average power since the previous sample.
Samples are buffered and written in batches.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from llmlb_bench.sim.replica import Replica
from llmlb_bench.sim.results import RowSink

_COLUMNS = ("t_s", "target", "waiting", "running", "kv_blocks_used", "kv_blocks_total", "power_w")


class SeriesSampler:
    def __init__(self, sink: RowSink, replicas: Sequence[Replica], interval_s: float, batch_rows: int = 65536) -> None:
        self.sink = sink
        self.replicas = replicas
        self.interval = interval_s
        self.batch_rows = batch_rows
        self._k = 0                     # index of the next tick (t = k * interval: no accumulated error)
        self.next_t = 0.0
        self._last_t = 0.0
        self._last_e = [0.0] * len(replicas)
        #: LoRA: each replica's adapter loads at its previous sample (the column only when a pool serves adapters)
        self._lora = any(r.lora is not None for r in replicas)
        self._last_loads = [0] * len(replicas)
        self._cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS + (("adapter_loads",) if self._lora else ())}

    def track(self, rep: Replica) -> None:
        """A replica joined the fleet (autoscaling): sampled from its creation on."""
        self._last_e.append(0.0)
        self._last_loads.append(0)

    def sample_until(self, t: float, final: bool = False) -> None:
        """Take every sample due before ``t`` (and at ``t`` itself when ``final``)."""
        c = self._cols
        while self.next_t < t or (final and self.next_t <= t):
            tick = self.next_t
            dt = tick - self._last_t
            for rep in self.replicas:
                if rep.created_at > tick or (rep.retired_at is not None and rep.retired_at < self._last_t):
                    continue          # not yet in the fleet, or retired before this interval
                e = rep.energy_at(tick)
                c["t_s"].append(tick)
                c["target"].append(rep.name)
                c["waiting"].append(len(rep.waiting))
                c["running"].append(len(rep.running))
                c["kv_blocks_used"].append(rep.blocks_used_at(tick))
                c["kv_blocks_total"].append(rep.kv.total)
                c["power_w"].append((e - self._last_e[rep.index]) / dt if dt > 0 else rep.cost.idle_power_w)
                self._last_e[rep.index] = e
                if self._lora:
                    loads = rep.lora.loads if rep.lora is not None else 0
                    c["adapter_loads"].append(loads - self._last_loads[rep.index] if rep.lora is not None else None)
                    self._last_loads[rep.index] = loads
            self._last_t = tick
            self._k += 1
            self.next_t = self._k * self.interval
            if len(c["t_s"]) >= self.batch_rows:
                self.flush()

    def flush(self) -> None:
        c = self._cols
        if c["t_s"]:
            self.sink.write({k: (np.array(v) if k not in ("target", "adapter_loads") else v) for k, v in c.items()})
        self._cols = {k: [] for k in c}
