"""Run Vidur's simulator once and print its timings as one JSON line.

Runs inside Vidur's own virtualenv (never imported by llmlb-bench); called by
benchmarks/sim_vs_vidur.py with the arguments of ``python -m vidur.main``:

    .bench/vidur-venv/bin/python benchmarks/peers/vidur_run.py --cluster_config_num_replicas 4 ...

It does what ``vidur.main`` does (parse the config, seed, build, run) but times
the phases apart, because they mean different things for a comparison:
``setup`` reads the trace and trains or loads the execution-time predictor (a
one-off per configuration, cached on disk), ``loop`` is the discrete-event
simulation itself, ``output`` writes Vidur's metric files. Peak RSS is the
whole process's, including imports and predictor.
"""

from __future__ import annotations

import json
import resource
import time

T0 = time.perf_counter(), time.process_time()

from vidur.config import SimulationConfig  # noqa: E402
from vidur.simulator import Simulator  # noqa: E402
from vidur.utils.random import set_seeds  # noqa: E402


def _since(mark: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - mark[0], time.process_time() - mark[1]


def main() -> None:
    imported = time.perf_counter(), time.process_time()
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    sim = Simulator(config)
    setup = _since(imported)
    started = time.perf_counter(), time.process_time()
    marks: dict[str, tuple[float, float]] = {}
    write_output = sim._write_output

    # Simulator.run() ends by writing its metric files; mark where the event loop stops.
    def timed_write_output() -> None:
        marks["loop"] = _since(started)
        marks["loop_end"] = time.perf_counter(), time.process_time()
        write_output()

    sim._write_output = timed_write_output
    sim.run()
    output = _since(marks["loop_end"])
    print(json.dumps({
        "import_wall_s": round(imported[0] - T0[0], 2),
        "setup_wall_s": round(setup[0], 2), "setup_cpu_s": round(setup[1], 2),
        "loop_wall_s": round(marks["loop"][0], 2), "loop_cpu_s": round(marks["loop"][1], 2),
        "output_wall_s": round(output[0], 2), "output_cpu_s": round(output[1], 2),
        "sim_time_s": round(float(sim._time), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "output_dir": config.metrics_config.output_dir,
    }))


if __name__ == "__main__":
    main()
