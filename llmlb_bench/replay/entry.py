"""``replay()``: one replay of a trace against endpoints, in this process or in workers.

The entry point every caller uses (the CLI, ``llmlb calibrate``'s probes, capacity searches, router
benchmarks). It sets up what surrounds a run — the preflight, the server witness
(:mod:`llmlb_bench.replay.witness`), power sampling — and hands the run itself to the
:class:`~llmlb_bench.replay.runner.Replayer` or to several workers (:mod:`llmlb_bench.replay.workers`).
Kept out of ``runner.py`` so that nothing the replayer needs imports back up to here.
"""

from __future__ import annotations

import pyarrow as pa

from llmlb_bench.policies import Policy
from llmlb_bench.replay.client import ReplayResult
from llmlb_bench.replay.options import ReplayOptions
from llmlb_bench.replay.power import Domain, PowerSampler, join_energy, open_sources
from llmlb_bench.replay.preflight import Preflight, preflight
from llmlb_bench.replay.resume import Resume
from llmlb_bench.replay.runner import Replayer
from llmlb_bench.replay.witness import ServerWitness, server_check
from llmlb_bench.store import RunStore


def replay(trace: pa.Table, endpoints: list[str], policy: Policy, run: RunStore,
           options: ReplayOptions | None = None, *, pre: Preflight | None = None,
           resume: Resume | None = None, power: list[Domain] | None = None) -> ReplayResult:
    """Replay ``trace`` against ``endpoints`` with client-side routing by ``policy``.

    Rows go to ``run.requests``; the client self-check to
    ``run.summary["client"]`` and totals to ``run.summary["replay"]``.
    ``pre`` is the result of :func:`preflight` and ``power`` that of
    :func:`~llmlb_bench.replay.power.open_sources` when the caller already
    has them (the CLI does, before creating the run folder). With power
    sources, power goes to ``run.series`` and, when the run store closes,
    energy to the requests' ``energy_j`` and ``run.summary["energy"]``.
    Raises KeyboardInterrupt after Ctrl-C or SIGTERM, once every row is written.
    """
    options = options or ReplayOptions()
    pre = pre or preflight(endpoints, options, trace)
    if power is None and options.power_sources:
        power = open_sources(options.power_sources, [ep.url for ep in pre.endpoints])
    sampler = PowerSampler(power, options.power_interval_s) if power else None
    if sampler is not None:
        sampler.start()
    witness = ServerWitness([ep.url for ep in pre.endpoints], options.scrape_s) if options.scrape_s else None
    try:
        if witness is not None:
            witness.__enter__()
        if options.workers > 1 and options.executor == "ray":
            from llmlb_bench.replay.ray_workers import replay_on_ray

            return replay_on_ray(trace, pre, policy, run, options, resume)
        if options.workers > 1:
            from llmlb_bench.replay.workers import replay_in_workers

            return replay_in_workers(trace, pre, policy, run, options, resume)
        return Replayer(trace, pre, policy, run, options, resume).run()
    finally:
        if witness is not None:
            witness.__exit__()
            _keep_server_check(witness, run, resume)
        if sampler is not None:
            _keep_power(sampler, run, resume)


def _keep_server_check(witness: ServerWitness, run: RunStore, resume: Resume | None) -> None:
    """Sent against received (replay.witness.server_check) into ``summary.client`` once the
    requests file is closed; rows carried over by ``--resume`` were sent in another run."""
    t0 = _client_t0(run)
    if t0 is None:  # the run never started
        return
    carried = pa.array(sorted(resume.done_ids) if resume is not None else [], pa.int64())

    def finalize(store: RunStore) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        rows = pq.read_table(store.dir / "requests.parquet", columns=["request_id", "target", "sent_s"])
        if len(carried):
            rows = rows.filter(pc.invert(pc.is_in(rows.column("request_id"), value_set=carried)))
        readings = dict(zip(witness.urls, witness.readings))
        # run_summary.py keeps this section untyped (ClientNotes.server_check); the copy is its plain dict
        store.summary["client"]["server_check"] = server_check(rows, readings, t0)
    run.finalizers.append(finalize)


def _keep_power(sampler: PowerSampler, run: RunStore, resume: Resume | None) -> None:
    """Power readings into the series, and energy into the requests once the store closes."""
    sampler.stop()
    t0 = _client_t0(run)
    if t0 is None:  # the run never started
        return
    run.series.write(sampler.series(t0))
    domains = [(d.target, d.endpoints) for d in sampler.domains]
    keep = set(resume.done_ids) if resume is not None else set()

    def finalize(store: RunStore) -> None:
        energy = join_energy(store.dir, domains, keep)
        for target, info in sampler.describe().items():
            energy["domains"][target] = {**energy["domains"][target], **info}
        store.summary["energy"] = {**energy, "interval_s": sampler.interval}
    run.finalizers.append(finalize)


def _client_t0(run: RunStore) -> float | None:
    """The replay client's clock at the run's origin; None when the run never started (no client figures)."""
    client = run.summary.get("client")
    return None if client is None else client["t0_clock_s"]
