"""Side by side: llmlb's simulator and Vidur on the same trace and cluster.

    python benchmarks/sim_vs_vidur.py                        # 19k and 100k requests
    python benchmarks/sim_vs_vidur.py --requests 19000 --json

Vidur (microsoft/vidur, MIT, PyPI ``vidur``) is installed on first use into its
own virtualenv, ``.bench/vidur-venv`` (ignored by git), and run as a
subprocess; nothing of it is imported here. The trace is the chat preset
(workloads/chat.toml, ``llmlb gen``) with its request count raised, prompts
clipped the way Vidur's trace reader clips them (prompt + output <= 4096), and
exported to the CSV Vidur's ``trace_replay`` generator reads. Both simulators
get the same cluster: N replicas of one model on one GPU type, TP 1, at most
128 running requests and 4096 batched tokens per step, no chunked prefill
(Vidur's vLLM scheduler has none), no prefix caching, 16-token KV blocks and
the same number of KV blocks per replica (llmlb's capacity figure is passed to
Vidur). Routing: Vidur's ``lor`` global scheduler sends each request to the
replica with the fewest *waiting* requests (ties to the lowest index); llmlb
runs the same rule (its built-in ``fewest_waiting`` policy) unless told to use
another registered policy.

Vidur needs profiling data that PyPI does not ship: version 0.0.26 fetches it
from Hugging Face datasets with ``snapshot_download``, which this benchmark
never lets it reach (``HF_HUB_OFFLINE=1``). It is served instead from a local
Hugging Face cache built under ``.bench/vidur-work``:

* ``mlp.csv`` (real per-layer timings of the linear layers, norms and
  activations) and the all-reduce / send-recv tables are Vidur's own published
  profiles, read from ``../shared/data/profiles/vidur`` (or ``--profiles``);
* ``attention.csv`` (FlashInfer attention kernels) is not available here; a
  stand-in is generated on Vidur's own profiling grid from llmlb's calibrated
  roofline (attention FLOPs and KV reads per layer, see :func:`attention_rows`).

So Vidur's latency predictions here are NOT measurements-based: its attention
times are llmlb's model, its linear-layer times Vidur's measured profiles fed
through its random forests. The latency columns show how far the two
simulators' scheduling and batching models agree on the same inputs, not how
accurate either is. The speed columns are valid as they are. Vidur's random
forest grid is reduced (100 trees, depth 16, 2-fold CV) so that training takes
seconds; it is trained once per configuration and cached, and its time is
reported apart from the simulation's.

Printed per trace size: wall and CPU seconds of the simulation (llmlb: the
``simulate`` call including its Parquet output; Vidur: its event loop and its
metric files, without predictor setup), simulated requests per second of wall
time, peak resident memory of each simulator's process, the speed ratio, and
TTFT / TPOT / E2E percentiles (p50/p90/p99, numpy's linear interpolation; TPOT
= (last - first token) / (output tokens - 1)) with their relative difference.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import lzma
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / ".bench"
VIDUR_VERSION = "0.0.26"
RUNNER = Path(__file__).resolve().parent / "peers" / "vidur_run.py"
PROFILES = REPO.parent / "shared" / "data" / "profiles" / "vidur"
#: llmlb model name -> (Vidur's model config name, folder of its profile)
MODELS = {"llama-3-8b": ("meta-llama/Llama-3-8B", "Meta-Llama-3-8B"),
          "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "Llama-2-7b-hf")}
#: llmlb GPU name -> (Vidur's device, its network profile / node type)
GPUS = {"a100-80g": ("a100", "a100_dgx"), "h100-sxm": ("h100", "h100_dgx")}
PCTS = (50, 90, 99)
FIGURES = ("ttft", "tpot", "e2e")
#: the date Vidur's trace reader filters rows on (any fixed value; the CSV has one)
TRACE_DATE = "2023-08-21"


@dataclass(frozen=True)
class Setup:
    """The cluster both simulators get (Vidur's vLLM scheduler has no chunked prefill)."""

    model: str = "llama-3-8b"
    gpu: str = "a100-80g"
    replicas: int = 4
    max_num_seqs: int = 128          # Vidur's batch_size_cap default and attention-profile grid limit
    max_tokens: int = 4096           # tokens per step, and prompt + output per request (Vidur's defaults)
    block_size: int = 16
    gpu_memory_utilization: float = 0.9

    def cluster(self) -> Any:
        from llmlb_bench.sim import ClusterConfig
        return ClusterConfig.build(replicas=self.replicas, gpu=self.gpu, model=self.model, tp=1,
                                   max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_tokens,
                                   block_size=self.block_size, gpu_memory_utilization=self.gpu_memory_utilization,
                                   chunked_prefill=False, enable_prefix_caching=False, max_model_len=self.max_tokens,
                                   token_times="summary")

    def cost_model(self) -> Any:
        from llmlb_bench.sim.catalog import load_catalog
        from llmlb_bench.sim.cost import CostModel
        cat = load_catalog()
        return CostModel(cat.model(self.model), cat.gpu(self.gpu), 1, max_num_batched_tokens=self.max_tokens,
                         max_num_seqs=self.max_num_seqs, gpu_memory_utilization=self.gpu_memory_utilization,
                         block_size=self.block_size)


# ---------------------------------------------------------------- the trace

def make_trace(requests: int, replicas: int, max_tokens: int) -> Any:
    """The chat preset with ``requests`` rows at its per-replica load, prompts clipped as Vidur clips them.

    Vidur's trace reader shortens the prompt of any request whose prompt + output
    exceeds its ``max_tokens``; doing it here gives llmlb the identical requests.
    """
    import pyarrow as pa

    from llmlb_bench.workload import generate, load_spec
    spec = load_spec(REPO / "workloads" / "chat.toml").replace(requests=requests)
    table = generate(spec, rate_scale=replicas / 4)
    inp = table["input_tokens"].to_numpy()
    out = table["output_tokens"].to_numpy()
    clipped = np.maximum(1, np.minimum(inp, max_tokens - out)).astype(np.int32)
    i = table.schema.get_field_index("input_tokens")
    return table.set_column(i, table.schema.field(i), pa.array(clipped))


def write_vidur_trace(table: Any, path: Path) -> None:
    """The CSV Vidur 0.0.26's trace_replay generator reads (arrival in seconds as ``Time``)."""
    arrival = table["arrival_s"].to_numpy()
    inp = table["input_tokens"].to_numpy()
    out = table["output_tokens"].to_numpy()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for a, p, d in zip(arrival.tolist(), inp.tolist(), out.tolist()):
            w.writerow([TRACE_DATE, repr(a), p, d])


# ---------------------------------------------------------------- Vidur's profiling data

def _attention_grid(max_seq_len: int, max_batch: int) -> list[tuple[int, int, int]]:
    """(prefill_chunk_size, kv_cache_size, batch_size) rows of Vidur's attention profiling grid.

    The same points vidur.profiling.utils.get_attention_input_combinations
    profiles: chunked prefills at multiples of the chunk, full prefills, and
    decodes of 1..max_batch requests over its context-length ladder.
    """
    chunks = [c for c in [*range(32, 129, 32), *range(256, 1025, 128), *range(1536, 8193, 512)]
              if c <= max_seq_len]
    seq_lens = sorted({s for s in [*range(0, 1025, 32), *range(1024, 4097, 64), *range(4096, 65537, 256)]
                       if s < max_seq_len})
    rows = {(c, k * c, 1) for c in chunks for k in range(max_seq_len // c) if c + k * c <= max_seq_len}
    rows |= {(s, 0, 1) for s in seq_lens if s > 0}
    rows |= {(0, s, b) for s in seq_lens if s > 0 for b in range(1, max_batch + 1)}
    return sorted(rows)


def attention_rows(setup: Setup) -> tuple[list[str], list[list[Any]]]:
    """A stand-in for Vidur's attention.csv: llmlb's roofline per layer, in ms, on Vidur's grid.

    Per layer and GPU, a prefill chunk of c tokens after k cached ones does
    4 x heads x head_dim x (c k + c (c + 1) / 2) FLOPs and reads/writes (k + c)
    tokens of KV; a decode batch of b requests with k context tokens each does
    4 x heads x head_dim x b k FLOPs and reads b k tokens of KV. Time =
    hypot(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)), the
    same smooth roofline and calibrated efficiencies as llmlb's step cost;
    saving the new tokens' KV is a pure memory write.
    """
    cm = setup.cost_model()
    m = cm.model
    flops_pair = cm.attn_flops / m.layers / cm.peak_flops          # s per (token, context token) pair
    kv_token = cm.kv_bytes_per_token / m.layers / cm.bandwidth     # s per KV token read or written
    stats = ("min", "max", "mean", "median", "std")
    header = ["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
              "prefill_chunk_size", "kv_cache_size", "batch_size"]
    for op in ("attn_prefill", "attn_decode", "attn_kv_cache_save"):
        header += [f"time_stats.{op}.{s}" for s in stats]
    rows = []
    for c, k, b in _attention_grid(setup.max_tokens, setup.max_num_seqs):
        if c:
            ms = 1e3 * float(np.hypot((c * k + c * (c + 1) / 2) * flops_pair, (k + c) * kv_token))
            prefill, decode = [ms] * 4 + [0.0], [""] * 5
        else:
            ms = 1e3 * float(np.hypot(b * k * flops_pair, b * k * kv_token))
            prefill, decode = [""] * 5, [ms] * 4 + [0.0]
        save = 1e3 * max(c, b) * kv_token
        rows.append([m.hidden, m.heads, m.kv_heads, setup.block_size, 1, c, k, b,
                     *prefill, *decode, save, save, save, save, 0.0])
    return header, rows


def _write_xz_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    path.write_bytes(lzma.compress(buf.getvalue().encode()))


def _hf_dataset(cache: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay ``files`` out as a cached Hugging Face dataset snapshot that offline snapshot_download finds."""
    revision = hashlib.sha1(b"".join(files[k] for k in sorted(files))).hexdigest()
    storage = cache / ("datasets--" + repo_id.replace("/", "--"))
    snap = storage / "snapshots" / revision
    if snap.is_dir():
        return
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(revision)


def prepare_vidur_data(setup: Setup, profiles: Path, work: Path) -> tuple[str, str]:
    """Build the local compute and network datasets Vidur loads; returns their dataset names.

    The names carry a hash of the content so that Vidur's predictor cache
    (keyed by the dataset name) never serves models trained on older files.
    """
    vidur_model, folder = MODELS[setup.model]
    device, network = GPUS[setup.gpu]
    mlp = profiles / "compute" / device / "meta-llama" / folder / "mlp.csv"
    net = profiles / "network" / network
    missing = [p for p in (mlp, net / "all_reduce.csv", net / "send_recv.csv") if not p.is_file()]
    if missing:
        raise SystemExit(f"Vidur profile missing: {missing[0]} (pass --profiles DIR, a copy of Vidur's "
                         "data/profiling with compute/ and network/)")
    tmp = work / "attention.csv.xz"
    _write_xz_csv(tmp, *attention_rows(setup))
    compute = {"mlp.csv.xz": lzma.compress(mlp.read_bytes()), "attention.csv.xz": tmp.read_bytes(),
               "config.json": json.dumps({"model": vidur_model, "device_sku": device}).encode()}
    network_files = {"all_reduce.csv.xz": lzma.compress((net / "all_reduce.csv").read_bytes()),
                     "send_recv.csv.xz": lzma.compress((net / "send_recv.csv").read_bytes()),
                     "config.json": json.dumps({"sku": network}).encode()}
    names = []
    for kind, files in (("compute", compute), ("network", network_files)):
        digest = hashlib.sha1(b"".join(files[k] for k in sorted(files))).hexdigest()[:10]
        name = f"llmlb-local/vidur-{kind}-{device}-{setup.model if kind == 'compute' else network}-{digest}"
        # Vidur passes cache_dir=<predictor cache>/profiling_data/<kind>/ to snapshot_download.
        _hf_dataset(work / "cache" / "profiling_data" / kind, name, files)
        names.append(name)
    return names[0], names[1]


def ensure_vidur(venv: Path) -> Path:
    """The virtualenv's Python with Vidur importable, installing ``vidur==VIDUR_VERSION`` if needed."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import vidur.simulator"],
                                          capture_output=True).returncode == 0:
        return python
    print(f"installing vidur=={VIDUR_VERSION} into {venv} (a few minutes) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"vidur=={VIDUR_VERSION}"], check=True)
    return python


#: the packages Vidur's time rests on; its wheel pins none of them, so each result names them
VIDUR_DEPS = ("numpy", "pandas", "scikit-learn", "scipy")


def vidur_deps(python: Path) -> dict[str, str]:
    """The versions of :data:`VIDUR_DEPS` in Vidur's virtualenv: Vidur has taken 20-55 CPU-s over the
    same trace on different days (docs/simulator.md); what it ran with is part of a ratio's record."""
    code = ("import importlib.metadata as m, json; "
            f"print(json.dumps({{d: m.version(d) for d in {list(VIDUR_DEPS)!r}}}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    deps: dict[str, str] = json.loads(out)
    return deps


def vidur_args(setup: Setup, trace_csv: Path, datasets: tuple[str, str], work: Path, out_dir: Path,
               kv_blocks: int) -> list[str]:
    """Vidur's command line for ``setup`` (the flags of ``python -m vidur.main``)."""
    vidur_model = MODELS[setup.model][0]
    device, network = GPUS[setup.gpu]
    rf = "--random_forrest_execution_time_predictor_config_"
    tg = "--trace_request_generator_config_"
    args = {
        "--seed": 0, "--log_level": "warning",
        "--cluster_config_num_replicas": setup.replicas,
        "--replica_config_model_name": vidur_model, "--replica_config_device": device,
        "--replica_config_network_device": network,
        "--replica_config_num_pipeline_stages": 1, "--replica_config_tensor_parallel_size": 1,
        "--cache_config_block_size": setup.block_size, "--cache_config_num_blocks": kv_blocks,
        "--global_scheduler_config_type": "lor",
        "--replica_scheduler_config_type": "vllm",
        "--vllm_scheduler_config_batch_size_cap": setup.max_num_seqs,
        "--vllm_scheduler_config_max_tokens_in_batch": setup.max_tokens,
        "--request_generator_config_type": "trace_replay",
        tg + "trace_file": trace_csv, tg + "date": TRACE_DATE, tg + "max_tokens": setup.max_tokens,
        tg + "prefill_scale_factor": 1, tg + "decode_scale_factor": 1, tg + "time_scale_factor": 1,
        "--execution_time_predictor_config_type": "random_forrest",
        rf + "model_profiling_dataset": datasets[0], rf + "network_profiling_dataset": datasets[1],
        rf + "cache_dir": work / "cache",
        rf + "k_fold_cv_splits": 2, rf + "num_training_job_threads": 1,
        rf + "num_estimators": 100, rf + "max_depth": 16, rf + "min_samples_split": 2,
        rf + "prediction_max_tokens_per_request": setup.max_tokens,
        rf + "prediction_max_batch_size": setup.max_num_seqs,
        rf + "prediction_max_prefill_chunk_size": setup.max_tokens,
        "--metrics_config_output_dir": out_dir,
    }
    flat = [str(x) for kv in args.items() for x in kv]
    # Plot export needs a Chrome for kaleido; the Chrome trace is an output llmlb has no twin of.
    return flat + ["--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace"]


def run_vidur(python: Path, args: list[str], work: Path) -> dict[str, Any]:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([str(python), str(RUNNER), *args], cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"Vidur failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def vidur_latencies(out_dir: Path) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT and E2E from Vidur's request_metrics.csv."""
    from pyarrow import csv as pacsv
    t = pacsv.read_csv(out_dir / "request_metrics.csv")
    e2e = t["request_e2e_time"].to_numpy()
    ttft = t["prefill_e2e_time"].to_numpy()
    n = t["request_num_decode_tokens"].to_numpy().astype(float)
    multi = n > 1
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft)[multi] / (n[multi] - 1)}


# ---------------------------------------------------------------- llmlb's side

def run_llmlb_child(trace_path: Path, setup: Setup, policy_name: str, results: Path) -> dict[str, Any]:
    """Simulate in this process (a fresh child, so peak RSS is llmlb's alone); print one JSON line."""
    from llmlb_bench.compiled_core import running
    from llmlb_bench.policies import make_policy
    from llmlb_bench.schema import read_trace
    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore
    t0 = time.perf_counter()
    trace = read_trace(trace_path)
    load_s = time.perf_counter() - t0
    cfg = setup.cluster()
    policy = make_policy(policy_name)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with RunStore(results, config={"cluster": cfg.to_dict()}, backend="sim", label="vs-vidur") as run:
        summary = simulate(trace, cfg, policy, run)
    return {"trace_load_s": round(load_s, 2), "wall_s": round(time.perf_counter() - wall0, 2),
            "cpu_s": round(time.process_time() - cpu0, 3), "events": summary["events"],
            "sim_time_s": round(summary["sim_time_s"], 1), "status": summary["status"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "run_dir": str(run.dir), "core": running()}


def llmlb_latencies(run_dir: Path) -> tuple[dict[str, np.ndarray], int]:
    import pyarrow.parquet as pq
    t = pq.read_table(run_dir / "requests.parquet",
                      columns=["scheduled_s", "first_token_s", "last_token_s", "output_tokens", "status"])
    ok = np.asarray(t["status"].to_pylist()) == "ok"
    sched = t["scheduled_s"].to_numpy()[ok]
    first = t["first_token_s"].to_numpy(zero_copy_only=False)[ok]
    last = t["last_token_s"].to_numpy(zero_copy_only=False)[ok]
    n = t["output_tokens"].to_numpy(zero_copy_only=False)[ok].astype(float)
    multi = n > 1
    return ({"ttft": first - sched, "e2e": last - sched, "tpot": (last - first)[multi] / (n[multi] - 1)},
            int(ok.sum()))


def percentiles(lat: dict[str, np.ndarray]) -> dict[str, float]:
    return {f"{f}_p{p}": float(np.percentile(lat[f], p)) for f in FIGURES for p in PCTS}


# ---------------------------------------------------------------- one comparison

def _fresh(d: Path) -> Path:
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def vidur_predictor(python: Path, setup: Setup, datasets: tuple[str, str], work: Path,
                    retrain: bool) -> dict[str, Any]:
    """Train (or load from Vidur's cache) the execution-time predictor with a 200-request run.

    Done before the timed runs so that their setup and peak memory do not
    include the one-off random-forest training. ``retrain`` empties Vidur's
    model and prediction caches first, so the time printed is the training's.
    """
    if retrain:
        for sub in ("predictors", "predictions", "training_predictions"):
            shutil.rmtree(work / "cache" / sub, ignore_errors=True)
    predictors = work / "cache" / "predictors"
    before = set(predictors.iterdir()) if predictors.is_dir() else set()
    d = _fresh(work / "warmup")
    write_vidur_trace(make_trace(200, setup.replicas, setup.max_tokens), d / "trace.csv")
    r = run_vidur(python, vidur_args(setup, d / "trace.csv", datasets, work, d / "vidur",
                                     setup.cost_model().kv_blocks), work)
    trained = bool(set(predictors.iterdir()) - before)
    return {"setup_wall_s": r["setup_wall_s"], "setup_cpu_s": r["setup_cpu_s"], "trained": trained}


def compare(requests: int, setup: Setup, policy: str, python: Path, datasets: tuple[str, str],
            work: Path) -> dict[str, Any]:
    size_dir = _fresh(work / f"n{requests}")
    from llmlb_bench.schema import write_trace
    from llmlb_bench.store.run import host_info
    trace = make_trace(requests, setup.replicas, setup.max_tokens)
    write_trace(trace, size_dir / "trace.parquet")
    write_vidur_trace(trace, size_dir / "trace.csv")
    kv_blocks = setup.cost_model().kv_blocks

    def llmlb(core: str | None) -> dict[str, Any]:
        """llmlb in a child process: the core this checkout runs (None), or ``LLMLB_CORE=core``."""
        env = {**os.environ, **({"LLMLB_CORE": core} if core else {})}
        child = subprocess.run([sys.executable, __file__, "--child-llmlb", str(size_dir / "trace.parquet"),
                                "--policy", policy, "--model", setup.model, "--gpu", setup.gpu,
                                "--replicas", str(setup.replicas), "--results", str(size_dir / f"llmlb-{core}")],
                               capture_output=True, text=True, env=env)
        if child.returncode != 0:
            raise SystemExit(f"llmlb simulation failed:\n{child.stderr[-4000:]}")
        return json.loads(child.stdout.strip().splitlines()[-1])

    ours = llmlb(None)
    # the pure-Python core beside the compiled one (the same rows: tests/test_compiled_core.py)
    pure = llmlb("python") if ours["core"].startswith("compiled") else None
    our_lat, our_ok = llmlb_latencies(Path(ours["run_dir"]))

    vidur = run_vidur(python, vidur_args(setup, size_dir / "trace.csv", datasets, work, size_dir / "vidur",
                                         kv_blocks), work)
    their_lat = vidur_latencies(Path(vidur["output_dir"]))
    ours_pct, theirs_pct = percentiles(our_lat), percentiles(their_lat)
    vidur_sim_wall = vidur["loop_wall_s"] + vidur["output_wall_s"]
    vidur_sim_cpu = vidur["loop_cpu_s"] + vidur["output_cpu_s"]
    return {
        "requests": requests, "setup": asdict(setup), "kv_blocks_per_replica": kv_blocks,
        "llmlb_policy": policy, "vidur_version": VIDUR_VERSION, "vidur_deps": vidur_deps(python),
        "load_average": os.getloadavg()[0], "host": host_info(),
        "llmlb": {**ours, "completed": our_ok, "requests_per_s": round(requests / ours["wall_s"]),
                  "latency": ours_pct},
        "vidur": {**vidur, "sim_wall_s": round(vidur_sim_wall, 2), "sim_cpu_s": round(vidur_sim_cpu, 2),
                  "completed": int(len(their_lat["e2e"])), "requests_per_s": round(requests / vidur_sim_wall),
                  "latency": theirs_pct},
        "speed_ratio_wall": round(vidur_sim_wall / ours["wall_s"], 1),
        "speed_ratio_cpu": round(vidur_sim_cpu / ours["cpu_s"], 1),
        **({"llmlb_pure_python": {k: pure[k] for k in ("wall_s", "cpu_s", "core")},
            "speed_ratio_cpu_pure_python": round(vidur_sim_cpu / pure["cpu_s"], 1)} if pure else {}),
        "latency_rel_diff": {k: round(theirs_pct[k] / ours_pct[k] - 1, 4) for k in ours_pct},
    }


def render(r: dict[str, Any]) -> str:
    s, o, v = r["setup"], r["llmlb"], r["vidur"]
    lines = [
        f"chat preset, {r['requests']:,} requests, {s['replicas']} x {s['model']} on {s['gpu']} (TP 1), "
        f"<= {s['max_num_seqs']} seqs / {s['max_tokens']} tokens per step, no chunked prefill, no prefix cache, "
        f"{r['kv_blocks_per_replica']:,} KV blocks per replica; routing: llmlb {r['llmlb_policy']} vs Vidur lor; "
        f"load average {r['load_average']:.1f}",
        f"{'':34}{'llmlb':>12}{'Vidur ' + r['vidur_version']:>16}{'Vidur / llmlb':>16}",
        f"{'simulation wall (s)':34}{o['wall_s']:>12.2f}{v['sim_wall_s']:>16.2f}{r['speed_ratio_wall']:>15.1f}x",
        f"{'simulation CPU (s)':34}{o['cpu_s']:>12.3f}{v['sim_cpu_s']:>16.2f}{r['speed_ratio_cpu']:>15.1f}x",
        f"{'  of which event loop (s)':34}{'':>12}{v['loop_wall_s']:>16.2f}",
        f"{'llmlb core':34}{o['core']}",
        *([f"{'simulation CPU, pure-Python core':34}{r['llmlb_pure_python']['cpu_s']:>12.2f}{v['sim_cpu_s']:>16.2f}"
           f"{r['speed_ratio_cpu_pure_python']:>15.1f}x"] if "llmlb_pure_python" in r else []),
        f"{'simulated requests/s (wall)':34}{o['requests_per_s']:>12,}{v['requests_per_s']:>16,}",
        f"{'peak RSS of the process (MB)':34}{o['peak_rss_mb']:>12,}{v['peak_rss_mb']:>16,}",
        f"{'setup, not counted (s)':34}{o['trace_load_s']:>12.2f}{v['setup_wall_s']:>16.2f}"
        "   (trace read; Vidur: + loading its cached predictor)",
        f"{'requests completed':34}{o['completed']:>12,}{v['completed']:>16,}",
        f"{'simulated span (s)':34}{o['sim_time_s']:>12.1f}{v['sim_time_s']:>16.1f}",
        "latency (s; Vidur's attention times are llmlb's roofline stand-in, so this is model agreement, "
        "not accuracy)",
    ]
    for k in o["latency"]:
        lines.append(f"  {k:32}{o['latency'][k]:>12.4f}{v['latency'][k]:>16.4f}"
                     f"{100 * r['latency_rel_diff'][k]:>+15.1f}%")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[19_000, 100_000])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama-3-8b")
    ap.add_argument("--gpu", choices=sorted(GPUS), default="a100-80g")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--policy", default="fewest_waiting",
                    help="llmlb's router: fewest_waiting (Vidur's lor rule) or a registered policy name")
    ap.add_argument("--profiles", type=Path, default=PROFILES, help="Vidur's profiling data (compute/, network/)")
    ap.add_argument("--venv", type=Path, default=BENCH / "vidur-venv")
    ap.add_argument("--work", type=Path, default=BENCH / "vidur-work", help="traces, datasets, caches, outputs")
    ap.add_argument("--retrain", action="store_true", help="drop Vidur's cached predictor and time its training")
    ap.add_argument("--json", action="store_true", help="print one JSON object per trace size")
    ap.add_argument("--child-llmlb", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    setup = Setup(model=args.model, gpu=args.gpu, replicas=args.replicas)
    if args.child_llmlb:
        print(json.dumps(run_llmlb_child(args.child_llmlb, setup, args.policy, args.results)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve()
    python = ensure_vidur(args.venv)
    datasets = prepare_vidur_data(setup, args.profiles.resolve(), work)
    predictor = vidur_predictor(python, setup, datasets, work, args.retrain)
    if not args.json:
        print(f"Vidur's execution-time predictor: {predictor['setup_wall_s']:.1f} s wall, "
              f"{predictor['setup_cpu_s']:.1f} s CPU to " + ("train (now cached)" if predictor["trained"]
                                                            else "load from its cache") +
              ", not counted below", flush=True)
    for n in args.requests:
        r = compare(n, setup, args.policy, python, datasets, work)
        r["vidur_predictor"] = predictor
        print(json.dumps(r) if args.json else render(r), flush=True)


if __name__ == "__main__":
    main()
