"""One run end to end: trace + cluster (or endpoints) + policy -> a stored run.

:func:`simulate_run` is shared by ``llmlb simulate``, ``llmlb run`` and
simulated sweeps; :func:`replay_run` by ``llmlb replay`` and ``llmlb
capacity``'s probes. So the run.json of every run records the same
reproduction recipe, whichever command made it, and the commands only parse.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import pyarrow as pa

from llmlb_bench.compiled_core import running as running_core
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.cache_accounting import keep_accounting
from llmlb_bench.metrics.sample import sample_ranges
from llmlb_bench.policies import make_policy
from llmlb_bench.schema import trace_block_size, trace_spec
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore

if TYPE_CHECKING:  # the replayer is imported by replay_run only: simulated sweeps' workers never load it
    from llmlb_bench.replay import ReplayOptions
    from llmlb_bench.replay.power import Domain
    from llmlb_bench.replay.preflight import Preflight
    from llmlb_bench.replay.resume import Resume
    from llmlb_bench.run_summary import SelfCheck


def simulate_run(trace: pa.Table, trace_path: Path, cluster: ClusterConfig, policy: str,
                 policy_args: Mapping[str, object], seed: int, results: Path,
                 label: str | None = None, run_id: str | None = None,
                 sweep: Mapping[str, object] | None = None, users: int | None = None,
                 think_s: float = 0.0) -> RunStore:
    """Simulate ``trace`` under ``policy`` and store it; returns the closed run.

    ``users``: a closed loop of that many users thinking ``think_s`` between requests (kept in run.json
    as ``config.closed_loop``); None: open loop at the trace's times.

    ``sweep``: the run's coordinates in a sweep, kept in run.json as ``config.sweep``
    so queries can group a sweep's runs by workload, cluster, policy, rate and seed.
    """
    pol = make_policy(policy, policy_args, seed=seed)  # repeats with other seeds re-draw randomised choices
    config: dict[str, object] = {
        "cluster": cluster.to_dict(),
        "policy": {"name": policy, "args": dict(policy_args)},
        "seed": seed,
    }
    if sweep is not None:
        config["sweep"] = dict(sweep)
    if users is not None:
        config["closed_loop"] = {"users": users, "think_s": think_s}
    store = RunStore(results, config=config, backend="sim", label=label or policy, run_id=run_id,
                     trace_path=trace_path, trace_rows=trace.num_rows, trace_spec=trace_spec(trace),
                     token_sample=sample_ranges(trace.column("request_id")))
    units: dict[str, int] = {}      # filled from the simulator's summary: its caching replicas
    keep_accounting(store, trace, units)
    with store as run:
        run.summary.update(simulate(trace, cluster, pol, run, seed=seed, users=users, think_s=think_s))
        run.summary["sim_core"] = running_core()  # compiled or pure Python, and why (compiled_core.py)
        units.update(run.summary.get("prefix_cache_units") or {})
    return store


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a replay; the run is kept as partial in ``run_dir`` (``--resume`` it)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"run kept as partial in {run_dir}")
        self.run_dir = run_dir


def replay_run(trace: pa.Table, trace_path: Path, pre: Preflight, policy: str, policy_args: Mapping[str, object],
               seed: int, results: Path, options: ReplayOptions, *, label: str | None = None,
               run_id: str | None = None, sweep: Mapping[str, object] | None = None, resume: Resume | None = None,
               power: list[Domain] | None = None, self_check: SelfCheck | None = None) -> RunStore:
    """Replay ``trace`` against the endpoints ``pre`` checked, routed by ``policy``; returns the closed run.

    ``resume``: continue that partial run (its folder, moved aside by ``prepare_resume``, is put
    back if the replay is refused before it starts). ``self_check`` (the client timed on a no-op
    server) goes into the summary's ``client`` section. Ctrl-C raises :class:`RunInterrupted`.
    """
    from llmlb_bench.calibrate.endpoint import cache_block_size
    from llmlb_bench.replay import replay

    pol = make_policy(policy, policy_args, seed=seed)   # fresh state: every run routes from scratch
    config: dict[str, object] = {"endpoints": [ep.url for ep in pre.endpoints], "models": pre.models,
                                 "policy": {"name": policy, "args": dict(policy_args)}, "seed": seed,
                                 "options": options.describe()}
    if sweep is not None:
        config["sweep"] = dict(sweep)
    store = RunStore(resume.results_dir if resume else results, config=config, backend="replay",
                     label=label or policy, run_id=resume.run_id if resume else run_id, trace_path=trace_path,
                     trace_rows=trace.num_rows, trace_spec=trace_spec(trace))
    # the KV block each engine caches in, where it says (vLLM's cache_config_info), else the
    # trace's block; engines that say their prefix caching is off are left out
    blocks = {ep.url: cache_block_size(ep.url) for ep in pre.endpoints}
    units = {url: trace_block_size(trace) if b is None else b for url, b in blocks.items() if b != 0}
    keep_accounting(store, trace, units)
    try:
        with store:
            replay(trace, [ep.url for ep in pre.endpoints], pol, store, options, pre=pre, resume=resume,
                   power=power)
            if self_check is not None:
                store.summary["client"]["self_check"] = self_check
    except FileExistsError:
        if resume is not None:
            resume.restore()
        raise UserError("a run with this id already exists", store.dir) from None
    except UserError:
        if resume is not None and not store.dir.exists():
            resume.restore()  # refused before anything was done (the store left no folder)
        raise
    except KeyboardInterrupt:
        if resume is not None:
            resume.discard_backup()  # the new partial run holds the carried rows too
        raise RunInterrupted(store.dir) from None
    if resume is not None:
        resume.discard_backup()
    return store
