"""Energy and cost per token.

* Energy of a replica = sum over its series samples of ``power_w x (t_s -
  previous t_s)``: ``power_w`` is the mean power over the interval ending at
  the sample (as the simulator and the replayer write it), so this is exact;
  rows without power (the replayer's scraped load signals) are not samples. Average power
  per replica = its energy / the time its samples span. Run energy = the sum
  over replicas (idle power included). Runs without power samples fall back
  to the energy attributed to requests (``requests.energy_j``, which leaves
  idle power out); ``energy_source`` says which was used.
* J per output token = run energy / output tokens of ok requests;
  J per SLO-compliant token = run energy / output tokens of good requests
  (the ML.ENERGY and DynamoLLM framing: energy spent, per useful token).
* Cost = fleet price per hour x duration (the run's, as for throughput).
  The price is the one given (``--price-per-hour``, for the whole fleet) or,
  for simulated runs, the GPU catalog's ``price_per_hour`` x GPUs
  (replicas x tensor-parallel degree of every pool in run.json). Dollars per
  million good tokens = cost / good output tokens x 1e6.
"""

from __future__ import annotations

from typing import Mapping, TypedDict

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.meta import table
from llmlb_bench.metrics.run_figures import EnergyFigures
from llmlb_bench.metrics.sql import exact_sum
from llmlb_bench.store.views import Catalog

_SERIES_ENERGY_SQL = f"""
SELECT run_id, target, {exact_sum('power_w * (t_s - prev_t)')} AS energy_j, max(t_s) - min(prev_t) AS span_s
FROM (SELECT run_id, target, t_s, power_w, lag(t_s) OVER (PARTITION BY run_id, target ORDER BY t_s) AS prev_t
      FROM series WHERE power_w IS NOT NULL)
WHERE prev_t IS NOT NULL
GROUP BY ALL ORDER BY run_id, target
"""


class RunEnergyInputs(TypedDict):
    """What :func:`energy_and_cost` reads of one run: its run.json, duration and counts."""

    meta: Mapping[str, object]
    duration_s: float
    energy_j: float | None          # the sum of requests.energy_j (None: no request has one)
    output_tokens: int
    good_tokens: int | None         # None without an SLO


def fleet(meta: Mapping[str, object]) -> tuple[int | None, float | None]:
    """(GPUs, catalog price per hour of all of them) of a simulated run, from its run.json config."""
    cluster = table(meta, "config", "cluster")
    pools = cluster.get("pools")
    if not isinstance(pools, list) or not pools:
        return None, None
    per_pool = [int(p.get("replicas", 0)) * int(p.get("tp", 1)) * int(p.get("pp", 1)) for p in pools]
    gpus = sum(per_pool)
    from llmlb_bench.sim import load_catalog  # the simulator's catalog: only needed for simulated runs

    try:
        catalogs = cluster.get("catalogs")
        catalog = load_catalog(catalogs if isinstance(catalogs, list) else ())
        price = sum(n * catalog.gpu(p["gpu"]).price_per_hour for n, p in zip(per_pool, pools))
    except (UserError, KeyError):
        return gpus, None
    return gpus, price


def energy_and_cost(cat: Catalog, runs: Mapping[str, RunEnergyInputs],
                    price_per_hour: float | None = None) -> dict[str, EnergyFigures]:
    """``{run_id: {...}}`` for each run of ``runs``."""
    per_target: dict[str, dict[str, dict[str, float]]] = {}
    for r in cat.rows(_SERIES_ENERGY_SQL):
        per_target.setdefault(r["run_id"], {})[r["target"]] = {"energy_j": r["energy_j"], "span_s": r["span_s"]}
    out: dict[str, EnergyFigures] = {}
    for run_id, info in runs.items():
        targets = per_target.get(run_id) or {}
        power = {t: v["energy_j"] / v["span_s"] for t, v in targets.items() if v["span_s"]}
        if targets:
            total, source = sum(v["energy_j"] for v in targets.values()), "series"
        elif info["energy_j"] is not None:
            total, source = info["energy_j"], "requests"
        else:
            total, source = None, None
        gpus, catalog_price = fleet(info["meta"])
        price = price_per_hour if price_per_hour is not None else catalog_price
        duration = info["duration_s"]
        cost = price * duration / 3600.0 if price is not None and duration else None
        good, tokens = info.get("good_tokens"), info["output_tokens"]
        out[run_id] = {
            "energy_j": total,
            "energy_source": source,
            "attributed_energy_j": info["energy_j"],
            "j_per_output_token": total / tokens if total is not None and tokens else None,
            "j_per_good_token": total / good if total is not None and good else None,
            "avg_power_w": power or None,
            "avg_power_per_replica_w": sum(power.values()) / len(power) if power else None,
            "gpus": gpus,
            "price_per_hour": price,
            "price_source": "given" if price_per_hour is not None else ("catalog" if price is not None else None),
            "cost_usd": cost,
            "usd_per_m_output_tokens": cost / tokens * 1e6 if cost is not None and tokens else None,
            "usd_per_m_good_tokens": cost / good * 1e6 if cost is not None and good else None,
        }
    return out
