"""Energy during a replay: power sources, series rows, and attribution of energy to requests.

NVML cannot run here (no NVIDIA driver): its counter is stood in for by a
fake counter source with the same contract (cumulative joules, read on the
replayer's clock), which exercises everything after the read. DCGM-style
metrics come from a real aiohttp server on 127.0.0.1.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from conftest import cli, make_trace
from replay_helpers import servers  # noqa: F401  (a fixture)

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.energy import _SERIES_ENERGY_SQL
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.replay.noop_server import NoopConfig
from llmlb_bench.replay.power import Domain, PowerSampler, Reading, attribute, open_sources
from llmlb_bench.schema import REQUESTS, write_trace
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog


class FakeCounter:
    """An energy counter like NVML's: joules since some origin, growing at ``watts``."""

    name = "fake-counter"

    def __init__(self, watts: float, clock=time.perf_counter, fail_on: set[int] = frozenset()) -> None:
        self.watts, self.clock, self.fail_on, self.reads = watts, clock, fail_on, 0
        #: the clock at each reading that worked (the counter's own time, a moment after the sampler's)
        self.read_at: list[float] = []

    def read(self) -> Reading:
        self.reads += 1
        if self.reads in self.fail_on:
            raise OSError("no answer")
        self.read_at.append(self.clock())
        return Reading(energy_j=1234.0 + self.watts * self.read_at[-1])


def _requests(rows: list[dict]) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in REQUESTS.schema.names if name != "run_id"}
    cols["run_id"] = ["r"] * len(rows)
    return pa.table(cols, schema=REQUESTS.schema)


def test_attribution_splits_each_intervals_energy_by_tokens_processed():
    # power rows for target A: intervals (0,1], (1,2], (2,3] hold 100, 200 and 50 J; a scraped
    # load row (no power) at 1.5 is not a sample; B has no power source
    series = pa.table({"t_s": [0.0, 1.0, 1.5, 2.0, 3.0], "target": ["A"] * 5,
                       "power_w": pa.array([100.0, 100.0, None, 200.0, 50.0], pa.float32())})
    seg = lambda *pairs: [{"start_s": t, "gap_s": 0.0, "count": n} for t, n in pairs]  # noqa: E731
    reqs = _requests([
        # prompt of 40 tokens all inside (0,1]; output tokens at 0.6 (1) and 1.5 (3)
        {"request_id": 0, "target": "A", "status": "ok", "sent_s": 0.2, "first_token_s": 0.6, "input_tokens": 40,
         "token_times": seg((0.6, 1), (1.5, 3))},
        # the server counted 25 prompt tokens, 5 of them cached: 20 spread over [0.5, 1.5], half in each
        {"request_id": 1, "target": "A", "status": "ok", "sent_s": 0.5, "first_token_s": 1.5, "input_tokens": 99,
         "server_input_tokens": 25, "cached_tokens": 5, "token_times": seg((1.5, 1), (1.8, 1))},
        {"request_id": 2, "target": "B", "status": "ok", "sent_s": 0.1, "first_token_s": 0.2, "input_tokens": 5,
         "token_times": seg((0.2, 1))},
        {"request_id": 3, "target": "A", "status": "not_sent", "input_tokens": 5},
    ])
    energy, summary = attribute(series, reqs, [("A", ["A"])])
    # interval 1: request 0 did 41 tokens, request 1 did 10; interval 2: 3 and 12; interval 3: idle
    assert energy[0] == pytest.approx(100 * 41 / 51 + 200 * 3 / 15)
    assert energy[1] == pytest.approx(100 * 10 / 51 + 200 * 12 / 15)
    assert np.isnan(energy[2]) and np.isnan(energy[3])
    assert summary["A"]["endpoints"] == ["A"]  # pytest >= 9.2 refuses approx over nested values
    assert {k: v for k, v in summary["A"].items() if k != "endpoints"} == pytest.approx(
        {"energy_j": 350.0, "attributed_j": 300.0, "idle_j": 50.0, "span_s": 3.0})


def test_a_counter_source_gives_exact_mean_power_and_missed_readings_leave_no_hole():
    now = [10.0]
    src = FakeCounter(300.0, clock=lambda: now[0], fail_on={3})
    sampler = PowerSampler([Domain("A", ["A"], src)], interval=1e6, clock=lambda: now[0])
    for t in (10.0, 10.5, 11.0, 12.5, 13.0):  # the third reading fails
        now[0] = t
        sampler._sample()
    rows = sampler.series(t0=10.0)
    assert rows["t_s"] == [0.0, 0.5, 2.5, 3.0]  # the failed reading is left out ...
    assert rows["power_w"] == pytest.approx([300.0] * 4)  # ... and the next row spans the gap
    assert sampler.describe()["A"] == {"source": "fake-counter", "readings": 4, "failed_readings": 1}


def test_replay_with_a_counter_source_conserves_energy(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(ttft_s=0.02, itl_s=0.01))
    trace = make_trace(n=40, rate=40.0, output_tokens=20)
    options = ReplayOptions(power_interval_s=0.1, scrape_s=0.1)
    counter = FakeCounter(500.0)
    domains = [Domain(url, [url], counter)]
    with RunStore(tmp_path, config={}, backend="replay", run_id="e") as run:
        replay(trace, [url], make_policy("round_robin"), run, options, pre=preflight([url], options), power=domains)
    rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    series = pq.read_table(run.dir / "series.parquet")
    summary = json.loads((run.dir / "run.json").read_text())["summary"]
    # each reading's time as the sampler stamped it, and the counter's own time a moment later: the mean
    # power of an interval is the counter's increase over the stamps' interval, exactly (a loaded machine
    # lengthens the moment, by more than 1% of a 0.1 s interval: it was held to 500 W within 1% here)
    power = [(t, p) for t, p in zip(series.column("t_s").to_pylist(), series.column("power_w").to_pylist())
             if p is not None]
    stamps = np.array([t for t, _ in power]) + summary["client"]["t0_clock_s"]
    read = np.array(counter.read_at[-len(power):])
    assert len(power) >= 10 and len(counter.read_at) == len(power) and np.all(read >= stamps)
    assert [p for _, p in power[1:]] == pytest.approx(500.0 * np.diff(read) / np.diff(stamps), rel=1e-6)
    assert series.column("waiting").null_count < series.num_rows  # scraped signals beside the power rows
    energy = summary["energy"]
    assert all(r["status"] == "ok" and r["energy_j"] > 0 for r in rows)
    assert sum(r["energy_j"] for r in rows) == pytest.approx(energy["attributed_j"])
    assert energy["attributed_j"] + energy["idle_j"] == pytest.approx(energy["energy_j"])
    assert energy["domains"][url]["span_s"] == pytest.approx(stamps[-1] - stamps[0], rel=1e-6)
    assert energy["energy_j"] == pytest.approx(500.0 * (read[-1] - read[0]), rel=1e-6)
    # the report's energy (SQL over series.parquet) is the same total
    [row] = Catalog([tmp_path]).query(_SERIES_ENERGY_SQL).to_pylist()
    assert row["target"] == url and row["energy_j"] == pytest.approx(energy["energy_j"])
    assert energy["domains"][url]["source"] == "fake-counter" and energy["interval_s"] == 0.1


def _dcgm_app(kind: str, answered: list[int]) -> web.Application:
    """A DCGM exporter's /metrics for two GPUs: 150 W + 250 W, as a gauge or as mJ counters;
    ``answered`` gets the two counters' sum at each answer."""
    start = time.perf_counter()

    async def metrics(request: web.Request) -> web.Response:
        lines = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature.", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
        total = 0
        for gpu, watts in ((0, 150.0), (1, 250.0)):
            labels = f'gpu="{gpu}",UUID="GPU-{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="h"'
            lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 40")
            if kind == "gauge":
                lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {watts}")
            else:
                mj = int(5e8 + watts * 1e3 * (time.perf_counter() - start))
                total += mj
                lines.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {mj}")
        answered.append(total)
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@pytest.mark.parametrize("kind", ["gauge", "counter"])
def test_cli_reads_a_dcgm_exporter_and_fills_energy(servers, tmp_path, capsys, kind):  # noqa: F811
    url, _ = servers.noop(NoopConfig(itl_s=0.005))
    answered: list[int] = []
    dcgm = servers.aiohttp(_dcgm_app(kind, answered))
    write_trace(make_trace(n=30, rate=30.0, output_tokens=10), tmp_path / "t.parquet")
    code, out, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, "--power-source", f"prometheus:{dcgm}",
                           "--power-interval", "0.2", "--results", str(tmp_path / "res"), "--run-id", "p",
                           "--no-progress"], capsys)
    assert code == 0, err
    assert "kJ attributed to requests" in out
    energy = json.loads((tmp_path / "res" / "p" / "run.json").read_text())["summary"]["energy"]
    assert energy["domains"][url]["endpoints"] == [url]
    assert energy["domains"][url]["source"] == f"prometheus:{dcgm}/metrics"
    power = [p for p in pq.read_table(tmp_path / "res" / "p" / "series.parquet").column("power_w").to_pylist()
             if p is not None]
    if kind == "gauge":  # read exactly
        assert power == pytest.approx([400.0] * len(power))
        assert energy["energy_j"] == pytest.approx(400.0 * energy["domains"][url]["span_s"], rel=1e-6)
    else:
        # a counter read over HTTP is stamped a little before the exporter answers, which moves energy
        # between neighbouring intervals but not out of the run: the run's energy is the counters' increase
        # from its first reading to its last (the exporter's first answer is the check before the run).
        # Not 400 W over the stamps' span: how much later than its stamp the last answer came, against the
        # first, is this machine's (it was held within 5% here)
        assert len(answered) == len(power) + 1
        assert energy["energy_j"] == pytest.approx((answered[-1] - answered[1]) / 1e3, rel=1e-6)
    rows = pq.read_table(tmp_path / "res" / "p" / "requests.parquet").to_pylist()
    assert sum(r["energy_j"] for r in rows) == pytest.approx(energy["attributed_j"])
    assert energy["domains"][url]["idle_j"] >= 0 and energy["domains"][url]["failed_readings"] == 0


def test_one_source_for_several_endpoints_is_one_fleet_domain(servers):  # noqa: F811
    a, _ = servers.noop()
    b, _ = servers.noop()
    [fleet] = open_sources(["constant:700"], [a, b])
    assert (fleet.target, fleet.endpoints, fleet.source.read().power_w) == ("fleet", [a, b], 700.0)
    per = open_sources(["constant:300", "constant:400"], [a, b])
    assert [(d.target, d.endpoints) for d in per] == [(a, [a]), (b, [b])]


def test_power_source_errors_are_one_line_and_write_nothing(servers, tmp_path, capsys, monkeypatch):  # noqa: F811
    url, _ = servers.noop()
    write_trace(make_trace(n=2), tmp_path / "t.parquet")

    def error(*sources: str) -> str:
        args = [a for s in sources for a in ("--power-source", s)]
        code, _, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, *args,
                             "--results", str(tmp_path / "res")], capsys)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1, err
        assert not (tmp_path / "res").exists()
        return lines[0]

    assert "unknown power source 'rapl'" in error("rapl")
    assert "watts >= 0" in error("constant:-3")
    line = error("prometheus:http://user:secret@127.0.0.1:9")
    assert "without credentials" in line and "secret" not in line
    assert "one power source for the fleet or one per endpoint" in error("constant:1", "constant:2")
    assert "cannot read http://127.0.0.1:9/metrics" in error("prometheus:http://127.0.0.1:9")
    assert "neither DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION nor DCGM_FI_DEV_POWER_USAGE" in error(f"prometheus:{url}/metrics")
    line = error("nvml")  # no NVIDIA driver on this machine
    assert "NVML cannot read GPU energy here" in line or "NVML sees" in line or "nvidia-ml-py" in line
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if the extra were not installed
    assert "pip install 'llmlb-bench[nvml]'" in error("nvml")


def test_open_sources_rejects_a_count_that_fits_neither_rule():
    with pytest.raises(UserError, match="one per endpoint"):
        open_sources(["constant:1", "constant:2"], ["a", "b", "c"])


def test_worker_processes_share_the_parents_power_readings(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(itl_s=0.005))
    options = ReplayOptions(workers=2, power_sources=["constant:250"], power_interval_s=0.1, scrape_s=None)
    with RunStore(tmp_path, config={}, backend="replay", run_id="w") as run:
        replay(make_trace(n=40, rate=50.0, output_tokens=8), [url], make_policy("round_robin"), run, options,
               pre=preflight([url], options))
    rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    energy = json.loads((run.dir / "run.json").read_text())["summary"]["energy"]
    assert len(rows) == 40 and all(r["status"] == "ok" and r["energy_j"] > 0 for r in rows)
    assert sum(r["energy_j"] for r in rows) == pytest.approx(energy["attributed_j"])
    assert energy["energy_j"] == pytest.approx(250.0 * energy["domains"][url]["span_s"])
    assert energy["domains"][url]["source"] == "constant:250"
