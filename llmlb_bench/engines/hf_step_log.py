"""``transformers serve`` with its continuous-batching engine's own log of steps and requests (a diagnosis tool).

    python hf_step_log.py FOLDER serve MODEL [transformers serve flags]

(what :class:`llmlb_bench.engines.transformers_serve.TransformersServe` runs with ``engine_log=``).
This file runs in the ENGINE's interpreter, which need not have llmlb-bench installed: it imports
only the standard library and transformers, and is run by path, not as a module.

Why: a client sees the engine's steps only through streamed tokens (``llmlb_bench/decode_steps.py``
reads them), which cannot tell a step that took long from a request the engine did not schedule,
nor say how much of a step was planning it in Python and how much the forward pass; and it sees a
request's time to first token whole, not what of it was the HTTP server's, the engine's queue's or
the prefill's. On the H200 run of docs/fidelity-runs.md the replays' steps were three times the
calibration's at the same batch, and the engine's own record was what was missing. This wraps
transformers' ``ContinuousBatchProcessor.prepare_next_batch`` and ``update_batch`` and
``ContinuousBatchingManager.add_request`` (named alike in transformers 5.17-5.19; a version without
them stops here with one line) and writes two CSV files into FOLDER.

``steps.csv``, one row per engine step:

* ``planned_s``: wall-clock time (``time.time()``) when the engine began to plan the step;
* ``forward_s``: when planning ended (its inputs built) and the forward pass began;
* ``update_s``: when the forward pass had returned its tokens (the update began);
* ``done_s``: when the requests' states were updated and their outputs handed to the server;
* ``scheduled``: requests in the step; ``q_tokens``: tokens it computed (prefill chunks and one per
  decoding request); ``kv_read``: KV tokens it read; ``active`` / ``waiting``: the scheduler's
  requests admitted and waiting when the step was planned.

``requests.csv``, one row per request that finished: ``prompt_tokens``, ``output_tokens``, and when
the server handed it to the engine (``added_s``: tokenised, after HTTP), when a step first scheduled
it (``scheduled_s``: that step's ``planned_s``), when the step that sampled its first token ended
(``first_token_s``) and when its last one's did (``done_s``).

Each row is written when its step or request ends (a few microseconds a step): uvicorn ends on a
SIGTERM by raising it again once shut down, so nothing would run at exit.
"""

from __future__ import annotations

import csv
import os
import sys
import threading
import time
from typing import Any

FIELDS = ("planned_s", "forward_s", "update_s", "done_s", "scheduled", "q_tokens", "kv_read", "active", "waiting")
REQUEST_FIELDS = ("prompt_tokens", "output_tokens", "added_s", "scheduled_s", "first_token_s", "done_s")


class Log:
    """One CSV file, a row written (and flushed) at a time, from any thread."""

    def __init__(self, path: str, fields: tuple[str, ...]) -> None:
        self._out = open(path, "w", newline="")
        self._writer = csv.writer(self._out)
        self._lock = threading.Lock()
        self.write(list(fields))

    def write(self, row: list[Any]) -> None:
        with self._lock:
            self._writer.writerow(row)
            self._out.flush()


def wrap(processor: Any, manager: Any, folder: str) -> None:
    """Wrap ``processor`` (the ContinuousBatchProcessor class) and ``manager`` (ContinuousBatchingManager)
    so that every step and every request is logged into ``folder``."""
    prepare, update, add = processor.prepare_next_batch, processor.update_batch, manager.add_request
    steps, requests = Log(os.path.join(folder, "steps.csv"), FIELDS), Log(os.path.join(folder, "requests.csv"),
                                                                          REQUEST_FIELDS)
    lock = threading.Lock()
    #: request id -> [prompt tokens, added, scheduled, first token] (times None until they happen)
    pending: dict[str, list[Any]] = {}

    def added(self: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        # booked before the engine can see it (the server names its requests), so that a step planned
        # at once still finds it; a request the engine named itself is booked after
        given = kwargs.get("request_id", args[0] if args else None)
        entry = [len(input_ids), time.time(), None, None]
        if given is not None:
            with lock:
                pending[given] = entry
        request_id = add(self, input_ids, *args, **kwargs)
        with lock:
            if given is not None and request_id != given:
                pending.pop(given, None)
            if request_id is not None:
                pending.setdefault(request_id, entry)
        return request_id

    def planned(self: Any) -> bool:
        t0 = time.time()
        ready = bool(prepare(self))
        if ready:
            io = self.inputs_and_outputs
            batch = [f.state for f in getattr(io, "requests_in_batch", ()) or ()]
            with lock:
                for state in batch:
                    mine = pending.get(state.request_id)
                    if mine is not None and mine[2] is None:
                        mine[2] = t0
            self._llmlb_step = [t0, time.time(), len(batch), getattr(io, "total_seqlen_q", -1),
                                getattr(io, "max_kv_read", -1), len(self.scheduler.active_requests),
                                len(self.scheduler.waiting_requests)], batch
        return ready

    def updated(self: Any) -> None:
        t2 = time.time()
        update(self)
        step = getattr(self, "_llmlb_step", None)
        if step is None:
            return
        self._llmlb_step = None
        row, batch = step
        t3 = time.time()
        steps.write([*row[:2], t2, t3, *row[2:]])
        ended = []
        with lock:
            for state in batch:
                mine = pending.get(state.request_id)
                if mine is None:
                    continue
                if mine[3] is None and state.generated_tokens:
                    mine[3] = t3
                if state.status.name == "FINISHED":
                    ended.append([mine[0], len(state.generated_tokens), *mine[1:], t3])
                    del pending[state.request_id]
        for r in ended:
            requests.write(r)

    processor.prepare_next_batch, processor.update_batch, manager.add_request = planned, updated, added


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "serve":
        sys.exit("usage: hf_step_log.py FOLDER serve MODEL [transformers serve flags]")
    try:
        from transformers.cli.transformers import main as transformers_main
        from transformers.generation.continuous_batching.continuous_api import (ContinuousBatchingManager,
                                                                                ContinuousBatchProcessor)
    except ImportError as e:
        sys.exit(f"hf_step_log: this transformers has no continuous batching to log: {e}")
    if not (all(hasattr(ContinuousBatchProcessor, m) for m in ("prepare_next_batch", "update_batch"))
            and hasattr(ContinuousBatchingManager, "add_request")):
        sys.exit("hf_step_log: this transformers' continuous batching has no prepare_next_batch/update_batch/add_request")
    os.makedirs(argv[0], exist_ok=True)
    wrap(ContinuousBatchProcessor, ContinuousBatchingManager, argv[0])
    sys.argv = ["transformers", *argv[1:]]
    transformers_main()


if __name__ == "__main__":
    main(sys.argv[1:])
