"""Executors: the local process pool and Ray write identical runs, and the same curves up to rounding."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sweep import LocalExecutor, make_executor, parse_sweep, run_sweep
from sweep_helpers import close

REPO = Path(__file__).resolve().parents[1]


def _square(x: int, offset: int) -> int:
    return x * x + offset


def _grid(values: list[float], seeds: list[int], requests: int = 100):
    data = {
        "name": "exec", "slo": "ttft=400ms,tpot=50ms", "seeds": seeds,
        "workloads": {"chat": {"spec": str(REPO / "workloads" / "chat.toml"), "requests": requests}},
        "clusters": {"two": {"replicas": 2}, "four": {"replicas": 4, "max_num_seqs": 64}},
        "policies": {"round_robin": {}, "least_outstanding": {}, "p2c": {"policy": "power_of_d", "args": {"d": 2}},
                     "random": {}, "least_tokens": {}},
        "load": {"rate_scale": values},
    }
    return parse_sweep(data, "exec.toml", REPO)


def test_local_pool_yields_every_task_once_with_shared_arguments():
    with LocalExecutor(2) as ex:
        got = dict(ex.run(_square, range(20), 5))
    assert got == {x: x * x + 5 for x in range(20)}


def test_executor_choice_errors_are_user_errors():
    with pytest.raises(UserError, match="unknown executor 'slurm'"):
        make_executor("slurm")
    with pytest.raises(UserError, match="--address needs --executor ray"):
        make_executor("local", address="auto")
    with pytest.raises(UserError, match="must be >= 1"):
        make_executor("local", workers=0)


@pytest.mark.slow
def test_local_pool_and_local_ray_give_identical_runs_and_curves(tmp_path):
    """40 cells here (each is simulated and summarised); benchmarks/sweep_executors.py runs the 200."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'llmlb-bench[ray]')")
    spec = _grid([0.3, 0.9], seeds=[1, 2])
    with make_executor("local", 2) as ex:
        local = run_sweep(spec, tmp_path / "local", ex)
    with make_executor("ray", 2) as ex:
        ray = run_sweep(spec, tmp_path / "ray", ex)
    assert len(local.cells) == 40 and local.ran == ray.ran == 40
    for cell in local.cells:
        a = pq.read_table(local.root / cell.run_id / "requests.parquet")
        b = pq.read_table(ray.root / cell.run_id / "requests.parquet")
        assert a.equals(b), cell.run_id
    # the figures agree to rounding: metrics' ITL mean can differ in the last bit between two copies of the same
    # run in different folders (its per-bucket sums are added in the aggregate's row order)
    assert close(local.curves, ray.curves)
