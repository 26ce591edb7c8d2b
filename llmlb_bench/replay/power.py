"""Energy on real hardware: power read during a replay, stored per target, and attributed to requests.

``--power-source`` says where power comes from, given once for the whole
fleet (one power domain shared by every endpoint, stored under the target
name ``fleet``, or under the endpoint's URL when there is only one) or once
per ``--endpoint``, in the same order (one domain each):

* ``nvml`` or ``nvml:0,1``: the energy counters of local NVIDIA GPUs
  (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver
  loaded; all GPUs, or those indices), summed; needs ``nvidia-ml-py``
  (extra ``nvml``) and a driver, so it only works where the GPUs are local;
* ``prometheus:URL``: a DCGM exporter (or any Prometheus text endpoint):
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (millijoule counter) when it is
  there, else ``DCGM_FI_DEV_POWER_USAGE`` (watts), summed over its GPUs;
* ``constant:WATTS``: a given constant power.

A :class:`PowerSampler` thread reads every domain every ``interval``
seconds (from just before the first send to the end of the run) on the
replayer's clock, so it costs the event loop nothing but a rare GIL switch.
Each reading becomes a series row ``(t_s, target, power_w)`` whose
``power_w`` is the mean power since the previous reading: the counter's
difference over the elapsed time, or for a power gauge the mean of the two
readings (trapezoid); failed readings are left out, so the next row spans
the gap. The sum of ``power_w x (t_s - previous t_s)`` is then the domain's
energy over the run, as ``llmlb report`` computes it.

Attribution (:func:`attribute`, the simulator's rule carried over): the
energy of a domain's interval is split among the requests of its endpoints
by the tokens they had processed in that interval. A request's prompt
tokens (the server's count when it reported one, less cached tokens) count
as processed evenly between ``sent_s`` and ``first_token_s``; each output
token counts at the time it was received. An interval in which no request
processed a token is idle: its energy stays in the domain's total but goes
to no request (``summary.energy.idle_j``), so attributed + idle = total.
Requests finished before a resume keep the energy of the run they were in.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Callable, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.errors import UserError
from llmlb_bench.run_summary import DomainEnergy, DomainReadings, EnergySummary
from llmlb_bench.schema import REQUESTS, SERIES
from llmlb_bench.store.parts import read_parts, replace_table
from llmlb_bench.store.run import REQUESTS_FILE, SERIES_FILE
from llmlb_bench.store.sink import layout

#: the target name of a domain that several endpoints share
FLEET = "fleet"
DCGM_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"


@dataclass
class Reading:
    """One reading: a cumulative energy counter (J) or an instantaneous power (W)."""

    energy_j: float | None = None
    power_w: float | None = None


class PowerSource(Protocol):
    """Where one domain's power comes from; ``read`` may raise OSError when a reading fails."""

    name: str

    def read(self) -> Reading: ...


@dataclass
class Constant:
    watts: float
    name: str = "constant"

    def read(self) -> Reading:
        return Reading(power_w=self.watts)


class Nvml:
    """Local NVIDIA GPUs' energy counters through NVML (the ``nvidia-ml-py`` package)."""

    def __init__(self, indices: Sequence[int] | None) -> None:
        try:
            import pynvml
        except ImportError:
            raise UserError("reading GPU energy needs the 'nvidia-ml-py' package: pip install "
                            "'llmlb-bench[nvml]'", "--power-source") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            picked = list(indices) if indices is not None else list(range(count))
            if not picked or any(not 0 <= i < count for i in picked):
                raise UserError(f"NVML sees {count} GPUs here; cannot read {picked or 'any'}", "--power-source")
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in picked]
            self.read()
        except pynvml.NVMLError as exc:
            raise UserError(f"NVML cannot read GPU energy here ({exc})", "--power-source") from None
        self.name = f"nvml:{','.join(map(str, picked))}"

    def read(self) -> Reading:
        try:
            mj = sum(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles)
        except self._nvml.NVMLError as exc:
            raise OSError(str(exc)) from None
        return Reading(energy_j=mj / 1e3)


class Prometheus:
    """A DCGM exporter's ``/metrics``: the energy counter when present, else the power gauge."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        if not re.match(r"^https?://[^/@]+(/|$)", url):  # no credentials: the URL is stored in run.json
            raise UserError("expected prometheus:http(s)://HOST:PORT[/path], without credentials (the URL is "
                            "not echoed here, as it may hold one)", "--power-source")
        self.url = url if re.match(r"^https?://[^/]+/.", url) else url.rstrip("/") + "/metrics"
        self.timeout = timeout
        self.name = f"prometheus:{self.url}"
        try:
            self.read()
        except OSError as exc:
            raise UserError(f"cannot read {self.url}: {exc}", "--power-source") from None

    def read(self) -> Reading:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:
                text = resp.read().decode("utf-8", "replace")
        except (urllib.error.URLError, TimeoutError) as exc:
            raise OSError(str(getattr(exc, "reason", exc))) from None
        sums = _sum_metrics(text, (DCGM_ENERGY, DCGM_POWER))
        if DCGM_ENERGY in sums:
            return Reading(energy_j=sums[DCGM_ENERGY] / 1e3)
        if DCGM_POWER in sums:
            return Reading(power_w=sums[DCGM_POWER])
        raise OSError(f"neither {DCGM_ENERGY} nor {DCGM_POWER} in {self.url}")


def _sum_metrics(text: str, names: Sequence[str]) -> dict[str, float]:
    """Values of the named metrics in Prometheus text exposition, summed over label sets."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        # label values may hold spaces (DCGM's modelName): the value follows the last "}"
        head, _, rest = line.rpartition("}") if "}" in line else line.partition(" ")
        name = head.split("{", 1)[0].strip()
        if name in names:
            try:
                sums[name] = sums.get(name, 0.0) + float(rest.split()[0])
            except (ValueError, IndexError):
                continue
    return sums


@dataclass
class Domain:
    """Power that several endpoints (or one) draw together, stored under ``target``."""

    target: str
    endpoints: list[str]
    source: PowerSource


def open_sources(specs: Sequence[str], endpoints: Sequence[str]) -> list[Domain]:
    """Parse and open ``--power-source`` values (once for all endpoints, or once per endpoint);
    each source is read once here, so a source that cannot work fails before the run."""
    if len(specs) not in (1, len(endpoints)):
        raise UserError(f"give one power source for the fleet or one per endpoint ({len(endpoints)}), "
                        f"not {len(specs)}", "--power-source")
    sources = [_open(s) for s in specs]
    if len(sources) == 1:
        return [Domain(endpoints[0] if len(endpoints) == 1 else FLEET, list(endpoints), sources[0])]
    return [Domain(ep, [ep], src) for ep, src in zip(endpoints, sources)]


def _open(spec: str) -> PowerSource:
    kind, _, arg = spec.partition(":")
    if kind == "constant":
        try:
            watts = float(arg)
        except ValueError:
            watts = -1.0
        if not watts >= 0:
            raise UserError(f"constant power needs watts >= 0, e.g. constant:700 (got {spec!r})", "--power-source")
        return Constant(watts, f"constant:{watts:g}")
    if kind == "nvml":
        try:
            indices = [int(i) for i in arg.split(",")] if arg else None
        except ValueError:
            raise UserError(f"expected nvml or nvml:0,1,... (got {spec!r})", "--power-source") from None
        return Nvml(indices)
    if kind == "prometheus":
        return Prometheus(arg)
    raise UserError(f"unknown power source {spec!r} (nvml, prometheus:URL or constant:WATTS)", "--power-source")


@dataclass
class _Samples:
    times: list[float] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)
    failed: int = 0


class PowerSampler:
    """Reads every domain every ``interval`` seconds on a background thread, from ``start`` to ``stop``."""

    def __init__(self, domains: list[Domain], interval: float, clock: Callable[[], float] = perf_counter) -> None:
        self.domains = domains
        self.interval = interval
        self._clock = clock
        self._samples = [_Samples() for _ in domains]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llmlb-power", daemon=True)

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        """Take a last reading (closing the last interval) and stop the thread."""
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        for dom, s in zip(self.domains, self._samples):
            t = self._clock()
            try:
                reading = dom.source.read()
            except OSError:
                s.failed += 1
                continue
            s.times.append(t)
            s.readings.append(reading)

    def series(self, t0: float) -> dict[str, list[object]]:
        """Series rows (``t_s``, ``target``, ``power_w``): the mean power over the interval each
        reading ends; the first reading gets its successor's value, since no interval ends there."""
        rows: dict[str, list[object]] = {"t_s": [], "target": [], "power_w": []}
        for dom, s in zip(self.domains, self._samples):
            power = [_mean_power(s.times[k - 1], s.readings[k - 1], s.times[k], s.readings[k])
                     for k in range(1, len(s.times))]
            for k, t in enumerate(s.times):
                rows["t_s"].append(t - t0)
                rows["target"].append(dom.target)
                rows["power_w"].append(power[max(k - 1, 0)] if power else s.readings[0].power_w)
        return rows

    def describe(self) -> dict[str, DomainReadings]:
        """Per domain target: its source and how many readings worked and failed."""
        return {d.target: {"source": d.source.name, "readings": len(s.times), "failed_readings": s.failed}
                for d, s in zip(self.domains, self._samples)}


def _mean_power(t1: float, r1: Reading, t2: float, r2: Reading) -> float:
    dt = t2 - t1
    if r1.energy_j is not None and r2.energy_j is not None:
        return (r2.energy_j - r1.energy_j) / dt if dt > 0 else 0.0
    return ((r1.power_w or 0.0) + (r2.power_w or 0.0)) / 2


# -- attribution -----------------------------------------------------------------
def attribute(series: pa.Table, requests: pa.Table, domains: Sequence[tuple[str, Sequence[str]]]
              ) -> tuple[np.ndarray, dict[str, DomainEnergy]]:
    """Energy (J) of each row of ``requests`` (NaN where no domain covers its target) and
    per-domain totals, from the power rows of ``series`` (see the module docstring for the rule)."""
    n = requests.num_rows
    energy = np.full(n, np.nan)
    targets = np.asarray(requests.column("target").to_pylist(), dtype=object)
    sent = _floats(requests, "sent_s")
    first = _floats(requests, "first_token_s")
    prompt = _floats(requests, "server_input_tokens")
    prompt = np.where(np.isnan(prompt), _floats(requests, "input_tokens"), prompt)
    prompt = np.maximum(prompt - np.nan_to_num(_floats(requests, "cached_tokens")), 0.0)
    tokens = requests.column("token_times").combine_chunks()
    seg_row = np.asarray(pc.list_parent_indices(tokens), dtype=np.int64)
    flat = pc.list_flatten(tokens)
    seg_t = np.asarray(flat.field("start_s"), dtype=float)
    seg_n = np.asarray(flat.field("count"), dtype=float)
    power_rows = series.filter(pc.is_valid(series.column("power_w")))
    summary: dict[str, DomainEnergy] = {}
    for target, endpoints in domains:
        rows = power_rows.filter(pc.equal(power_rows.column("target"), target)).sort_by("t_s")
        t = np.asarray(rows.column("t_s"), dtype=float)
        e = np.diff(t) * np.asarray(rows.column("power_w"), dtype=float)[1:]  # energy of (t[k-1], t[k]]
        mine = np.isin(targets, list(endpoints))
        energy[mine & ~np.isnan(sent)] = 0.0
        rows_i, ks, ws = [], [], []  # (request row, interval, tokens processed in it)
        if e.size:
            seg = mine[seg_row]
            rows_i.append(seg_row[seg])
            ks.append(np.searchsorted(t, seg_t[seg], side="left") - 1)  # interval k is (t[k], t[k+1]]
            ws.append(seg_n[seg])
            for i in np.flatnonzero(mine & ~np.isnan(sent) & ~np.isnan(first) & (prompt > 0)):
                k, w = _spread(sent[i], first[i], prompt[i], t)
                rows_i.append(np.full(k.size, i))
                ks.append(k)
                ws.append(w)
        r = np.concatenate(rows_i) if rows_i else np.zeros(0, dtype=np.int64)
        k = np.concatenate(ks) if ks else np.zeros(0, dtype=np.int64)
        w = np.concatenate(ws) if ws else np.zeros(0)
        inside = (k >= 0) & (k < e.size) & (w > 0)
        r, k, w = r[inside], k[inside], w[inside]
        total_w = np.bincount(k, weights=w, minlength=e.size)
        np.add.at(energy, r, e[k] * w / total_w[k])
        summary[target] = {"endpoints": list(endpoints), "energy_j": float(e.sum()),
                           "attributed_j": float(e[total_w > 0].sum()), "idle_j": float(e[total_w == 0].sum()),
                           "span_s": float(t[-1] - t[0]) if t.size > 1 else 0.0}
    return energy, summary


def _floats(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(pc.fill_null(table.column(name).cast(pa.float64()), np.nan), dtype=float)


def _spread(start: float, end: float, tokens: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of ``t`` and the part of ``tokens`` spread evenly over [start, end] in each
    (all at ``end`` when the span has no length)."""
    if end <= start:
        return np.array([np.searchsorted(t, end, side="left") - 1]), np.array([tokens])
    lo = max(int(np.searchsorted(t, start, side="right")) - 1, 0)
    hi = min(int(np.searchsorted(t, end, side="left")), t.size - 1)
    k = np.arange(lo, hi)
    overlap = np.minimum(end, t[k + 1]) - np.maximum(start, t[k])
    return k, tokens * np.clip(overlap, 0.0, None) / (end - start)


def join_energy(run_dir: Path, domains: Sequence[tuple[str, Sequence[str]]], keep_ids: set[int]) -> EnergySummary:
    """Fill ``energy_j`` of a closed run's requests.parquet from its series.parquet (rows whose
    request id is in ``keep_ids`` keep theirs); returns the energy summary for run.json."""
    req_path = run_dir / REQUESTS_FILE
    requests = read_parts(req_path, REQUESTS)
    series = read_parts(run_dir / SERIES_FILE, SERIES).select(["t_s", "target", "power_w"])
    energy, per_domain = attribute(series, requests, domains)
    keep = np.isin(np.asarray(requests.column("request_id")), np.fromiter(keep_ids, dtype=np.int64))
    old = _floats(requests, "energy_j")
    energy = np.where(keep, old, energy)
    column = pa.array(energy, pa.float64(), mask=np.isnan(energy))
    table = requests.set_column(requests.schema.get_field_index("energy_j"), "energy_j", column)
    schema = REQUESTS.schema.with_metadata(REQUESTS.metadata())
    replace_table(req_path, [table.cast(schema)], schema, **layout(REQUESTS.schema))
    total = sum(d["energy_j"] for d in per_domain.values())
    idle = sum(d["idle_j"] for d in per_domain.values())
    return {"energy_j": total, "attributed_j": float(np.nansum(energy[~keep])), "idle_j": idle,
            "domains": per_domain,
            "rule": "each interval's energy split among the domain's requests by tokens processed in it "
                    "(prompt tokens evenly from sent to first token, output tokens when received); "
                    "intervals without tokens are idle"}
