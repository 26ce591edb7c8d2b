"""What every gymnasium environment over the simulator shares: the simulation in a greenlet.

An environment here drives the *same* :class:`~llmlb_bench.sim.simulation.Simulation`
as ``llmlb simulate``; nothing is simulated twice. The simulation runs in a
greenlet (a C-level coroutine) with a proxy policy: where the proxy needs the
agent (a routing decision in :class:`~llmlb_bench.learn.env.RouteEnv`, a tick of
:class:`~llmlb_bench.learn.admission.AdmissionEnv`), it switches to the caller
of ``step``, which builds the observation from the simulator's own state at
that instant and returns; the next ``step`` switches back with the action. So
the event loop keeps its shape.

This base class owns the episode (its trace from :mod:`llmlb_bench.learn.episodes`,
seeded and split), the rewards (:mod:`llmlb_bench.learn.rewards`: a request's
reward when it ends, attributed to the decisions recorded for it in
``_open``), the greenlet and the last step. Subclasses build the proxy, the
observations and what ``info`` says about a decision.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Generic, Mapping, Sequence, TypeAlias, TypeVar

import gymnasium
import pyarrow as pa
from greenlet import getcurrent, greenlet

from llmlb_bench.errors import UserError
from llmlb_bench.learn.episodes import Episodes
from llmlb_bench.learn.rewards import Ended, Reward, zero_costs
from llmlb_bench.policies.base import Policy, RouteRequest, View
from llmlb_bench.sim.config import ClusterConfig, load_cluster
from llmlb_bench.sim.simulation import Simulation
from llmlb_bench.workload import WorkloadSpec

Obs = TypeVar("Obs")
Act = TypeVar("Act")
#: what the simulation's greenlet returns when the run has ended
_END = object()
#: what an environment's episodes come from (episodes.Episodes.from_source)
Workload: TypeAlias = "str | Path | WorkloadSpec | pa.Table"
#: an environment's fleet: a ClusterConfig, a --cluster file, a mapping of its fields, or the default
Cluster: TypeAlias = "ClusterConfig | str | Path | Mapping[str, object] | None"


class _Rows:
    """A sink that keeps what the simulator writes (the requests rows, for comparison), or drops it."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.batches: list[pa.Table] = []

    def write(self, columns: Mapping[str, Sequence[object] | pa.Array]) -> None:
        if self.keep:
            self.batches.append(pa.table(dict(columns)))


class _Run:
    """The ``run`` argument of :class:`Simulation`: a requests sink and a series sink."""

    def __init__(self, keep: bool) -> None:
        self.requests = _Rows(keep)
        self.series = _Rows(False)


class SimulationEnv(gymnasium.Env[Obs, Act], Generic[Obs, Act]):
    """The shared part of the environments (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, workload: Workload, cluster: Cluster, *, slo: str | None, reward: str | Mapping[str, float],
                 split: str, requests: int | None, rate_scale: float, eval_fraction: float, failure_s: float,
                 keep_rows: bool) -> None:
        super().__init__()
        self.cluster = _cluster(cluster)
        self.episodes = Episodes.from_source(workload, split=split, requests=requests, rate_scale=rate_scale,
                                             eval_fraction=eval_fraction)
        self.rewards = Reward.parse(reward, slo, failure_s)
        self.keep_rows = keep_rows
        # Any: greenlet ships no types; what crosses its switch() (actions, decisions) is Any too, and the
        # info dicts and options are typed as gymnasium.Env's own signatures type them
        self._g: Any = None
        self._main: Any = None
        self._sim: Simulation | None = None
        self._run = _Run(False)
        #: request id -> the decisions its reward is attributed to
        self._open: dict[int, list[int]] = {}
        self._completed: list[tuple[int, float]] = []
        self._cost = zero_costs()
        self._reward = 0.0
        self._invalid = False
        self._decisions = 0
        self._episode_seed = 0
        self._end_s = 0.0

    # ---- what subclasses provide ----------------------------------------------------------------------

    def _proxy(self) -> Policy:
        """The simulation's policy for a new episode."""
        raise NotImplementedError

    def _started(self, sim: Simulation) -> None:
        """A new episode's simulation exists (before its first event)."""

    def _observe(self) -> Obs:
        raise NotImplementedError

    def _info(self) -> dict[str, Any]:
        raise NotImplementedError

    def _terminal(self) -> Obs:
        """The observation after the last step."""
        raise NotImplementedError

    def _action(self, action: Any) -> Any:
        """``step``'s action as the proxy reads it."""
        return int(action)

    def _leftovers(self, end_s: float) -> None:
        """The run ended: score what the proxy still holds."""

    # ---- gymnasium API --------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Obs, dict[str, Any]]:
        """A new episode. ``seed`` picks the episode (same seed, same trace and same observations);
        without one, the next episode seed is drawn from the environment's generator."""
        super().reset(seed=seed)
        self._stop()
        self._episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        trace, sim_seed = self.episodes.trace(self._episode_seed)
        if trace.num_rows == 0:
            raise UserError("the episode's trace has no requests", self.episodes.source)
        self._run = _Run(self.keep_rows)
        self._sim = Simulation(trace, self.cluster, self._proxy(), self._run, sim_seed)
        self._started(self._sim)
        self.rewards.reset()
        self._open.clear()
        self._decisions = 0
        self._begin_step()
        self._main = getcurrent()
        self._g = greenlet(self._simulate)
        if self._resume(None) is _END:
            raise UserError("the episode ended before any decision", self.episodes.source)
        return self._observe(), self._info()

    def step(self, action: Any) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        if self._g is None or self._g.dead:
            raise RuntimeError("step() after the episode ended; call reset()")
        self._begin_step()
        if self._resume(self._action(action)) is _END:
            return self._finish()
        return self._observe(), self._reward, False, False, self._info()

    def close(self) -> None:
        self._stop()

    @property
    def view(self) -> View:
        """The simulator's View now (what a built-in policy would be given)."""
        assert self._sim is not None, "reset() first"
        return self._sim.view

    def requests_table(self) -> pa.Table:
        """The requests rows the simulator wrote this episode (``keep_rows=True``; complete once it ended)."""
        return pa.concat_tables(self._run.requests.batches, promote_options="default")

    # ---- the greenlet ---------------------------------------------------------------------------------

    def _resume(self, action: Any) -> object:
        """Run the simulation until its next decision (or its end). As in ``simulate``, the collector's
        automatic passes are off while it runs (they would rescan its many long-lived objects again and
        again); the agent runs with the collector as it found it."""
        if not gc.isenabled():
            return self._g.switch(action)
        gc.disable()
        try:
            return self._g.switch(action)
        finally:
            gc.enable()

    def _simulate(self, _first: object = None) -> object:
        sim = self._sim
        assert sim is not None
        end = sim.run()
        sim.flush(end)
        self._end_s = end
        return _END

    def _yield(self) -> Any:
        """In the simulation's greenlet: a new decision; ``step`` builds its observation and resumes us
        with the agent's action."""
        self._decisions += 1
        return self._main.switch(None)

    def _stop(self) -> None:
        """Abandon a running episode (its greenlet unwinds)."""
        if self._g is not None and not self._g.dead:
            self._g.throw()
        self._g = None

    # ---- rewards --------------------------------------------------------------------------------------

    def _refused(self, req: RouteRequest, now: float, status: str = "rejected") -> None:
        """``req`` never reached a target (refused, or still held at the end)."""
        self._score(req.request_id, Ended(status, req.slo_class, req.tenant, None, max(now - req.arrival_s, 0.0),
                                          0.0, 0))

    def _ended(self, req: RouteRequest) -> None:
        """``req`` ended at its target: its reward from the Outcome the simulator set."""
        o = req.outcome
        assert o is not None            # the simulator sets it: the proxies observe outcomes
        first = o.first_token_s
        tpot = (o.end_s - first) / (o.output_tokens - 1) if first is not None and o.output_tokens > 1 else 0.0
        self._score(req.request_id, Ended(o.status, req.slo_class, req.tenant,
                                          None if first is None else first - req.arrival_s, o.end_s - req.arrival_s,
                                          tpot, o.output_tokens))

    def _score(self, request_id: int, e: Ended) -> None:
        r = self.rewards.ended(e, self._cost)
        self._reward += r
        for d in self._open.pop(request_id, ()):
            self._completed.append((d, r))

    def _begin_step(self) -> None:
        self._reward = 0.0
        self._completed = []
        self._cost = zero_costs()
        self._invalid = False

    def _finish(self) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """The simulation ended: what is still held never went; the episode terms are paid."""
        sim = self._sim
        assert sim is not None
        self._leftovers(self._end_s)
        summary = sim.summary(self._end_s, 0.0)
        energy = float(summary["energy_j"])
        self._reward += self.rewards.episode_reward(energy)
        info = {"completed": self._completed, "cost": self._cost, "invalid": self._invalid,
                "episode": {"terms": self.rewards.episode(energy), "status": summary["status"],
                            "sim_time_s": summary["sim_time_s"], "decisions": self._decisions,
                            "seed": self._episode_seed}}
        return self._terminal(), self._reward, True, False, info


def _cluster(cluster: Cluster) -> ClusterConfig:
    if cluster is None:
        return ClusterConfig.build()
    if isinstance(cluster, ClusterConfig):
        return cluster
    if isinstance(cluster, (str, Path)):
        return load_cluster(cluster)
    return ClusterConfig.from_dict(cluster)
