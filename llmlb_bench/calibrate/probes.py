"""The black-box probes of ``llmlb calibrate``: small traces replayed against the endpoint.

Each probe is an ordinary trace replayed with the ordinary replayer (its prompt
materialisation, exact lengths with ``--tokenize``, usage counting and
``cached_tokens``), stored as an ordinary run, and turned into observations
of the step-time model (:mod:`llmlb_bench.calibrate.fit`):

* **prefill**: one request at a time (closed loop, one user), one output token,
  prompts from a few tokens to past the step budget: time to first token =
  the request overhead + the prefill steps (chunks of ``max_num_batched_tokens``);
* **decode**: B requests sent at once with prompts of L tokens and the same
  output length, for B up to ``max_num_seqs`` and a few L; the observation is
  the mean step time over the window in which all B decode (after the last
  first token, before the first last token), so staggered admissions and
  prefill chunks stay out of it;
* **cache**: a prompt of whole KV blocks plus a short tail, sent twice in a row
  with the same prefix hashes: the second prefill starts from the cached
  blocks (the engine's ``cached_tokens`` says how many);
* **interference**: B requests decode a long output while lone requests (one
  output token after the first) arrive, one every ``ARRIVAL_EVERY_STEPS``
  steps, during their decode window; each such run follows a control run of
  the same B requests without arrivals, which places the arrivals inside the
  window and measures the window's mean step less its median (the step-time
  jitter's share, which the fit's median step model leaves out). What the
  arrivals cost the batch beyond their own prefill steps is the frontend's CPU
  time taken from the engine (``frontend_cpu_s``, sim/profile.py);
* **mixed**: B requests decode while lone requests arrive one at a time, each prompt one chunk
  beside the decodes (one output token); each arrival is read from the batch's token streams, over
  the steps from the one in progress at its send to the one that computed its chunk (whose tokens
  came with its first token; calibrate/fit.py ``mixed_observations``). Each arrival is the dependent
  of a pilot request of the batch (same prompt, a shorter output), so the client sends it when the
  pilot's last token arrives, a known number of steps into the batch's decoding whatever the
  engine's speed; sent at two batch contexts (16 tokens and the longest prompt probed, within the
  KV cache), so that a chunk's cost that grows with the batch's KV (the dense attention term,
  sim/profile.py ``per_dense_s``) shows in it. Why pilots: arrivals timed from a control run's
  window landed outside the loaded window in 11 of 15 pairs on an engine whose admission moved
  under them (docs/fidelity-runs.md, "Interference pairs at two contexts");
* **drift**: one small decode probe (``DRIFT_BATCH`` requests, the decode
  probes' output length) sent before the first probe, after the last, and at
  even intervals between the others: a fixed reference whose typical step
  moves only with the engine's own speed, over the calibration's whole span
  (calibrate/dispersion.py measures the drift from it and from the decode
  groups' repeats; it is not part of the step fit).

Every probe run records when it started (``ProbeRun.at_s``, seconds on the
calibration's clock), so that repeats of one probe can be compared over time.

Prompts never repeat across probes (fresh salted hashes and request ids), so
only the cache probe's second requests can hit the prefix cache.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypedDict

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import Preflight, ReplayOptions, replay
from llmlb_bench.schema import ArrowRow, read_trace, trace_table, write_trace
from llmlb_bench.store import RunStore


#: the interference probe's arrivals come one per this many decode steps of the control's window (the
#: issue 28 experiment on vLLM CPU: 20 requests/s against ~6 ms steps, one per ~8 steps, slowed the
#: batch by 15%, well above the run-to-run noise; far sparser arrivals would hide in it)
ARRIVAL_EVERY_STEPS = 8
#: requests decoding during the interference probe (at most max_num_seqs - 1: a seat for the arrivals)
INTERFERENCE_BATCH = 8
#: the decoding requests' output, in decode probes' lengths (a window long enough for several arrivals)
INTERFERENCE_TOKENS_PER_DECODE = 4
#: the decoding requests' prompt length
INTERFERENCE_CONTEXT = 16
#: the mixed-step probe: requests decoding, arrivals per run (each sent when a pilot request ends), and
#: the decode steps between arrivals (pilot j = 1, 2, 3 asks for this x (j + 1) tokens; the batch for this x
#: (arrivals + 2) after its admission: :func:`mixed_output`)
MIXED_BATCH = 8
MIXED_ARRIVALS = 3
MIXED_EVERY_STEPS = 8
#: the drift reference probe's requests decoding at once (at most max_num_seqs) and prompt length
DRIFT_BATCH = 4
DRIFT_CONTEXT = 16
#: the drift reference probes sent over a calibration (first and last probe included; --drift-probes)
DRIFT_PROBES = 10
#: the interference pairs (control + run with arrivals) sent over a calibration (--interference-pairs);
#: None: as many as ``repeats``
INTERFERENCE_PAIRS: int | None = None


@dataclass(frozen=True)
class ProbePlan:
    """Which probes to send (sizes already fitted to the engine's limits)."""

    prompts: tuple[int, ...]                 # prefill probe prompt lengths
    repeats: int                             # each prefill length and decode group this many times
    batches: tuple[int, ...]                 # decode probe batch sizes
    contexts: tuple[int, ...]                # decode probe prompt lengths
    decode_tokens: int                       # decode probe output length
    cache_blocks: tuple[int, ...]            # cache probe: whole blocks shared by the pair
    block_size: int
    interference_batch: int = 0              # interference probe: requests decoding (0: no probe)
    interference_prompt: int = 0             # its arrivals' prompt length
    interference_tokens: int = 0             # the decoding requests' output length
    drift_probes: int = 0                    # drift reference probes sent over the calibration (0: none)
    drift_batch: int = 0                     # each one's requests decoding at once
    interference_pairs: int = 0              # interference pairs sent (0: ``repeats`` of them)
    mixed_contexts: tuple[int, ...] = ()     # mixed-step probe: the decoding batch's prompt lengths (empty: no probe)
    mixed_batch: int = 0                     # its requests decoding (pilots aside)
    mixed_prompt: int = 0                    # its arrivals' prompt: one chunk beside the decodes

    @property
    def pairs(self) -> int:
        """The interference pairs sent (``interference_pairs``, or ``repeats`` where it is 0)."""
        return self.interference_pairs or self.repeats

    def requests(self) -> int:
        return ((len(self.prompts) + sum(self.batches) * len(self.contexts) + 2 * len(self.cache_blocks)) * self.repeats
                + self.interference_requests() + self.drift_probes * self.drift_batch
                + len(self.mixed_contexts) * (self.mixed_batch + 2 * MIXED_ARRIVALS) * self.repeats)

    def interference_requests(self) -> int:
        """The interference probe's requests: per pair, a control and a run with arrivals."""
        b = self.interference_batch
        return (2 * b + self.interference_tokens // ARRIVAL_EVERY_STEPS) * self.pairs if b else 0


def plan(settings: Mapping[str, int], max_prompt: int | None, batches: Sequence[int] | None,
         contexts: Sequence[int] | None, decode_tokens: int, repeats: int, interference: bool = True,
         drift_probes: int = DRIFT_PROBES, interference_pairs: int | None = INTERFERENCE_PAIRS,
         mixed: bool = True) -> ProbePlan:
    """Probe sizes within the engine's model length, seats and KV capacity; ``interference_pairs``:
    the interference pairs to send (None: ``repeats``); ``mixed``: send the mixed-step probe."""
    bs, seqs, budget = settings["block_size"], settings["max_num_seqs"], settings["max_num_batched_tokens"]
    kv_tokens = settings["num_kv_blocks"] * bs
    limit = min(settings["max_model_len"] - 2, kv_tokens - bs)
    top = min(max_prompt or 2 * budget, limit)
    grid = sorted({max(8, int(round(top * f))) for f in (0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 1.0)})
    if batches is None:
        batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= seqs] or [1]
        if seqs not in batches and seqs <= 64:
            batches.append(seqs)
    longest = min(top, settings["max_model_len"] - decode_tokens - 1)
    if contexts is None:
        contexts = sorted({16, max(16, longest // 4), max(16, longest // 2)})
    usable = [b for b in batches if b <= seqs]
    # whole blocks a cache pair shares: a quarter, a half, three quarters and all of the largest prompt.
    # WHY four sizes, each repeated: a cache hit's time is the request overhead over the WHOLE prompt
    # plus steps over its 8 new tokens, so only these pairs tell the per-prompt-token overhead (a delay
    # beside the engine) from the step's per-token cost (which stalls the batch); with two lone pairs
    # the split moved 4x between calibrations of one quiet engine (docs/fidelity.md)
    cache = sorted({k for k in (max(1, top * q // (4 * bs)) for q in (1, 2, 3, 4)) if k * bs + 8 <= limit})
    # interference: up to 8 decoding requests, a seat left for the arrivals, whose prompts (a quarter of
    # the largest, one chunk beside the decodes) cost the frontend a typical request's work
    ib = min(INTERFERENCE_BATCH, seqs - 1)
    # mixed steps: a batch and its pilots, a seat and a chunk of the budget beside them for the arrival;
    # the long context as long as the prompts probed, within the KV cache (batch, pilots, the arrival)
    # and the model length (the batch's output after it)
    mb = min(MIXED_BATCH, seqs - MIXED_ARRIVALS - 1)
    chunk = min(budget - mb - MIXED_ARRIVALS, limit - 2)
    n = mb + MIXED_ARRIVALS
    out = mixed_output(mb, 0, chunk) + 1       # the part that does not grow with the context (+1: its rounding up)
    grows = 1 + n / max(chunk, 1)
    long_ctx = min(top, int(((kv_tokens - bs - chunk) / max(n, 1) - out) / grows),
                   int((settings["max_model_len"] - out - 1) / grows))
    mixed_ok = mixed and mb >= 1 and chunk >= 8 and long_ctx >= 16
    return ProbePlan(prompts=tuple(grid), repeats=repeats, batches=tuple(usable), contexts=tuple(contexts),
                     decode_tokens=decode_tokens, cache_blocks=tuple(cache), block_size=bs,
                     interference_batch=max(ib, 0) if interference else 0,
                     interference_prompt=max(8, min(top // 4, budget - ib, limit - 2)),
                     interference_tokens=INTERFERENCE_TOKENS_PER_DECODE * decode_tokens,
                     drift_probes=drift_probes if drift_probes >= 2 else 0, drift_batch=min(DRIFT_BATCH, seqs),
                     interference_pairs=max(0, interference_pairs or 0),
                     mixed_contexts=tuple(sorted({16, long_ctx})) if mixed_ok else (),
                     mixed_batch=mb if mixed_ok else 0, mixed_prompt=chunk if mixed_ok else 0)


def mixed_output(batch: int, context: int, chunk: int) -> int:
    """The output length of a mixed run's decoding requests (:meth:`Prober.mixed`): through the admission of
    the requests sent after them (the rest of the batch and the pilots, about a chunk a step), then past
    the last pilot's end (the pilots are sent last, so admitted last). Why it grows with the context: at
    2,048 tokens each against a budget of 1,024 the admission took 23 steps, during which the first
    requests decoded, and a batch of 40 tokens ended before the second pilot did."""
    admission = -(-(batch + MIXED_ARRIVALS) * context // max(chunk, 1)) + 1
    return admission + MIXED_EVERY_STEPS * (MIXED_ARRIVALS + 2)


def mixed_trace(p: ProbePlan, context: int, ids: np.ndarray) -> pa.Table:
    """A mixed run's trace (:meth:`Prober.mixed`) with request ids ``ids`` (batch, pilots, arrivals)."""
    b, m = p.mixed_batch, MIXED_ARRIVALS
    outputs = [mixed_output(b, context, p.mixed_prompt)] * b + [MIXED_EVERY_STEPS * (j + 2) for j in range(m)] + [1] * m
    return trace_table(np.zeros(b + 2 * m), [context] * (b + m) + [p.mixed_prompt] * m, outputs, "probe",
                       request_id=ids, parent_id=pa.array([None] * (b + m) + ids[b:b + m].tolist(), pa.int64()),
                       after_parent_s=pa.array([None] * (b + m) + [0.0] * m, pa.float64()))


class ProbeParams(TypedDict, total=False):
    """What one probe varied: prefill (prompts, repeats), decode (batch, context, tokens), cache (blocks, prompt),
    interference (batch, context, tokens, prompt, pair, arrivals: 0 in the pair's control)."""

    prompts: list[int]
    repeats: int
    batch: int
    context: int
    tokens: int
    blocks: int
    prompt: int
    pair: int
    arrivals: int


def mixed_params(p: ProbePlan, context: int) -> ProbeParams:
    """A mixed run's parameters: the batch decoding, its context and output, the arrivals' prompt and count."""
    return ProbeParams(batch=p.mixed_batch, context=context, tokens=mixed_output(p.mixed_batch, context, p.mixed_prompt),
                       prompt=p.mixed_prompt, arrivals=MIXED_ARRIVALS)


@dataclass
class ProbeRun:
    """One replayed probe: its kind, parameters and result rows (dicts of the requests table)."""

    kind: str                   # prefill, decode, cache, mixed, interference, drift
    params: ProbeParams
    rows: list[ArrowRow]
    at_s: float = 0.0           # when it started, seconds on the calibration's clock
    #: the trace it replayed, where it is simulated again (the interference runs with arrivals:
    #: calibrate/frontend.py)
    trace: pa.Table | None = None


def served_none(rows: Sequence[ArrowRow], url: str, forced: bool, run_id: str) -> None:
    """UserError when the endpoint served none of a replay's ``rows``. Checked on the first run
    (a calibration's first probe, validate's warm-up: seconds long) so that the command stops
    before the long work: an engine that refuses a field the replayer sends (``transformers
    serve`` answers 422 to ``min_tokens`` and ``ignore_eos``) would otherwise leave every probe
    and figure empty."""
    if not rows or any(r["status"] == "ok" for r in rows):
        return
    first = rows[0]
    hint = ("; an engine that refuses min_tokens or ignore_eos needs --no-force-length"
            if forced and first["http_status"] in (400, 422) else "")
    raise UserError(f"{run_id}: the endpoint served none of {len(rows)} requests; the first: {first['error']}{hint}",
                    url)


class Prober:
    """Replays probe traces against one endpoint into ``root`` (one run per probe)."""

    def __init__(self, url: str, pre: Preflight, options: ReplayOptions, root: Path, seed: int = 0) -> None:
        self.url, self.pre, self.root = url, pre, root
        self.options = replace(options, progress=None, scrape_s=None)
        self.rng = random.Random(seed)
        self._next_id = self.rng.randrange(1 << 40)
        self._runs = 0
        self._t0 = time.monotonic()

    def _ids(self, n: int) -> np.ndarray:
        ids = np.arange(self._next_id, self._next_id + n, dtype=np.int64)
        self._next_id += n
        return ids

    def _run(self, kind: str, params: ProbeParams, table: pa.Table, options: ReplayOptions, block_size: int,
             keep_trace: bool = False) -> ProbeRun:
        """Replay ``table`` as one probe run; its run.json records ``kind``, ``params`` and when it started
        (``config.probe``), so that :func:`kept_runs` reads the same runs back for a refit."""
        run_id = f"{self._runs:03d}-{kind}"
        self._runs += 1
        trace_path = self.root / "traces" / f"{run_id}.parquet"
        write_trace(table, trace_path, block_size=block_size)
        table = read_trace(trace_path)          # with its block size in the metadata, as the replayer reads it
        at_s = time.monotonic() - self._t0
        config = {"endpoints": [self.url], "calibrate": kind, "options": options.describe(),
                  "probe": {"params": dict(params), "at_s": at_s}}
        store = RunStore(self.root, config=config, backend="replay", label=f"calibrate {kind}", run_id=run_id,
                         trace_path=trace_path, trace_rows=table.num_rows)
        with store:
            replay(table, [self.url], make_policy("round_robin", {}), store, options, pre=self.pre)
        import pyarrow.parquet as pq
        rows: list[ArrowRow] = pq.read_table(store.dir / "requests.parquet").to_pylist()
        if self._runs == 1:     # the first probe: a refusing endpoint stops the calibration here
            served_none(rows, self.url, options.force_output_length, f"calibration probe {run_id}")
        return ProbeRun(kind, params, rows, at_s, table if keep_trace else None)

    def prefill(self, prompts: Sequence[int], repeats: int, block_size: int, kind: str = "prefill") -> ProbeRun:
        """The prefill probe (``kind`` prefill), or the warm-up before the others (``kind`` warmup, not fitted)."""
        order = [p for _ in range(repeats) for p in prompts]
        self.rng.shuffle(order)
        n = len(order)
        table = trace_table(np.zeros(n), order, 1, "probe", request_id=self._ids(n))
        return self._run(kind, ProbeParams(prompts=list(prompts), repeats=repeats), table,
                         replace(self.options, users=1, think_s=0.05), block_size)

    def decode(self, batch: int, context: int, tokens: int, block_size: int, kind: str = "decode") -> ProbeRun:
        """A decode group (``kind`` decode) or the drift reference probe (``kind`` drift)."""
        table = trace_table(np.zeros(batch), context, tokens, "probe", request_id=self._ids(batch))
        return self._run(kind, ProbeParams(batch=batch, context=context, tokens=tokens), table, self.options, block_size)

    def cache(self, blocks: int, block_size: int) -> ProbeRun:
        hashes = [self.rng.randrange(1, 1 << 63) for _ in range(blocks)]
        prompt = blocks * block_size + 8
        table = trace_table(np.zeros(2), prompt, 1, "probe", request_id=self._ids(2),
                            prefix_hashes=pa.array([hashes, hashes], pa.list_(pa.uint64())))
        return self._run("cache", ProbeParams(blocks=blocks, prompt=prompt), table,
                         replace(self.options, users=1, think_s=0.05), block_size)

    def interference(self, p: ProbePlan, pair: int) -> list[ProbeRun]:
        """One control run (``interference_batch`` requests decoding, nothing else) and one with lone
        arrivals spread over the control's decode window (see the module docstring). The arrivals'
        times come from the control's window (after the last first token, before the first last
        token, from the first send), so they fall where the whole batch decodes whatever the
        engine's speed; none when the control gave no window."""
        b, tokens = p.interference_batch, p.interference_tokens
        params = ProbeParams(batch=b, context=INTERFERENCE_CONTEXT, tokens=tokens, prompt=p.interference_prompt,
                             pair=pair, arrivals=0)
        table = trace_table(np.zeros(b), INTERFERENCE_CONTEXT, tokens, "probe", request_id=self._ids(b))
        control = self._run("interference", params, table, self.options, p.block_size)
        ok = [r for r in control.rows if r["status"] == "ok" and r["first_token_s"] is not None]
        if len(ok) < b:
            return [control]
        start = min(r["sent_s"] for r in ok)
        t0, t1 = max(r["first_token_s"] for r in ok) - start, min(r["last_token_s"] for r in ok) - start
        times = [token_times(r) - start for r in ok]
        steps = int(np.median([np.count_nonzero((t >= t0) & (t <= t1)) for t in times]))
        n = steps // ARRIVAL_EVERY_STEPS
        if t1 <= t0 or n < 1:
            return [control]
        arrivals = t0 + (t1 - t0) * (np.arange(n) + 0.5) / n
        table = trace_table(np.concatenate([np.zeros(b), arrivals]),
                            [INTERFERENCE_CONTEXT] * b + [p.interference_prompt] * n, [tokens] * b + [2] * n,
                            "probe", request_id=self._ids(b + n))
        with_arrivals: ProbeParams = {**params, "arrivals": n}
        return [control, self._run("interference", with_arrivals, table, self.options, p.block_size, keep_trace=True)]

    def mixed(self, p: ProbePlan, context: int) -> ProbeRun:
        """One mixed-step run (see the module docstring): ``mixed_batch`` requests of ``context`` prompt
        tokens and MIXED_ARRIVALS pilots beside them sent at once, and one arrival of ``mixed_prompt``
        tokens and one output token sent as each pilot ends (a dependent of it, no thread: its prompt
        is its own), MIXED_EVERY_STEPS decode steps after the one before."""
        table = mixed_trace(p, context, self._ids(p.mixed_batch + 2 * MIXED_ARRIVALS))
        return self._run("mixed", mixed_params(p, context), table, replace(self.options, thread=False), p.block_size)

    def all(self, p: ProbePlan) -> list[ProbeRun]:
        """Every probe of the plan after a warm-up: cache pairs, prefill, then the decode groups, then
        the mixed-step runs (cache pairs, decode groups and mixed runs each ``repeats`` times, in random
        order), then the interference
        pairs (``pairs`` of them, one after the other); the drift reference probe before the first, after the last and at
        even intervals between them (``drift_probes`` in all)."""
        self.prefill(p.prompts[::2], 1, p.block_size, "warmup")     # first requests after a start are slow: unused
        pairs = list(p.cache_blocks) * p.repeats
        self.rng.shuffle(pairs)
        groups = [(b, c) for c in p.contexts for b in p.batches] * p.repeats
        self.rng.shuffle(groups)        # so that a slow spell of a shared machine hits no one size only
        probes: list[Callable[[], ProbeRun | list[ProbeRun]]] = [partial(self.cache, k, p.block_size) for k in pairs]
        probes.append(partial(self.prefill, p.prompts, p.repeats, p.block_size))
        probes += [partial(self.decode, b, c, p.decode_tokens, p.block_size) for b, c in groups]
        mixed = list(p.mixed_contexts) * p.repeats
        self.rng.shuffle(mixed)
        probes += [partial(self.mixed, p, c) for c in mixed]
        if p.interference_batch:
            probes += [partial(self.interference, p, k) for k in range(p.pairs)]
        # the reference goes before probe i for every i in `at` (spaced evenly), and once after the last
        at = {round(j * len(probes) / (p.drift_probes - 1)) for j in range(p.drift_probes - 1)} if p.drift_probes else set()
        runs: list[ProbeRun] = []
        for i, probe in enumerate(probes):
            if i in at:
                runs.append(self.decode(p.drift_batch, DRIFT_CONTEXT, p.decode_tokens, p.block_size, "drift"))
            got = probe()
            runs += got if isinstance(got, list) else [got]
        if p.drift_probes:
            runs.append(self.decode(p.drift_batch, DRIFT_CONTEXT, p.decode_tokens, p.block_size, "drift"))
        return runs


def kept_runs(root: Path) -> list[ProbeRun]:
    """The probe runs a calibration kept in ``root`` (``llmlb calibrate --results``), in the order they
    were sent, as :meth:`Prober.all` returned them: each one's kind, parameters and start from its
    run.json (``config.probe``), its rows, and the trace of an interference run with arrivals. One-line
    error for a folder without them."""
    import json

    import pyarrow.parquet as pq
    runs: list[ProbeRun] = []
    for meta_path in sorted(root.glob("*/run.json"), key=lambda m: (len(m.parent.name.split("-")[0]), m.parent.name)):
        config = json.loads(meta_path.read_text()).get("config", {})
        kind, probe = config.get("calibrate"), config.get("probe")
        if kind is None:
            continue
        if not isinstance(probe, dict):
            raise UserError("holds probe runs kept before llmlb recorded each probe's parameters; calibrate "
                            "again with --results to refit", meta_path)
        if kind == "warmup":
            continue
        params = ProbeParams(**probe["params"])  # type: ignore[typeddict-item]
        trace = read_trace(root / "traces" / f"{meta_path.parent.name}.parquet") \
            if kind == "interference" and params.get("arrivals") else None
        rows: list[ArrowRow] = pq.read_table(meta_path.parent / "requests.parquet").to_pylist()
        runs.append(ProbeRun(kind, params, rows, float(probe["at_s"]), trace))
    if not runs:
        raise UserError("holds no probe runs (llmlb calibrate --results FOLDER keeps them)", root)
    return runs


def token_times(row: ArrowRow) -> np.ndarray:
    """A streamed row's token arrival times, sorted (its ``token_times`` segments expanded)."""
    parts = [seg["start_s"] + seg["gap_s"] * np.arange(seg["count"]) for seg in row["token_times"] or []]
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0)
