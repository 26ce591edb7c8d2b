"""``transformers serve`` with its continuous-batching engine's own step log (a diagnosis tool).

    python hf_step_log.py STEPS.csv serve MODEL [transformers serve flags]

(what :class:`llmlb_bench.engines.transformers_serve.TransformersServe` runs with ``step_log=``).
This file runs in the ENGINE's interpreter, which need not have llmlb-bench installed: it imports
only the standard library and transformers, and is run by path, not as a module.

Why: a client sees the engine's steps only through streamed tokens (``llmlb_bench/decode_steps.py``
reads them), which cannot tell a step that took long from a request the engine did not schedule,
nor say how much of a step was planning it in Python and how much the forward pass. On the H200 run
of docs/fidelity.md the replays' steps were three times the calibration's at the same batch, and
the engine's own record of its steps was what was missing. This wraps transformers'
``ContinuousBatchProcessor.prepare_next_batch`` and ``update_batch`` (named alike in transformers
5.17-5.19; a version without them stops here with one line) and writes one CSV row per engine step:

* ``planned_s``: wall-clock time (``time.time()``) when the engine began to plan the step;
* ``forward_s``: when planning ended (its inputs built) and the forward pass began;
* ``update_s``: when the forward pass had returned its tokens (the update began);
* ``done_s``: when the requests' states were updated and their outputs handed to the server;
* ``scheduled``: requests in the step; ``q_tokens``: tokens it computed (prefill chunks and one per
  decoding request); ``kv_read``: KV tokens it read; ``active`` / ``waiting``: the scheduler's
  requests admitted and waiting when the step was planned.

Each row is written when its step ends (a few microseconds a step): uvicorn ends on a SIGTERM by raising
it again once shut down, so nothing would run at exit.
"""

from __future__ import annotations

import csv
import sys
import time
from typing import Any

FIELDS = ("planned_s", "forward_s", "update_s", "done_s", "scheduled", "q_tokens", "kv_read", "active", "waiting")


def wrap(processor: Any, path: str) -> None:
    """Wrap ``processor`` (the ContinuousBatchProcessor class) so that every step is logged to ``path``."""
    prepare, update = processor.prepare_next_batch, processor.update_batch
    out = open(path, "w", newline="")
    writer = csv.writer(out)
    writer.writerow(FIELDS)
    out.flush()

    def planned(self: Any) -> bool:
        t0 = time.time()
        ready = bool(prepare(self))
        if ready:
            io = self.inputs_and_outputs
            self._llmlb_step = [t0, time.time(), len(getattr(io, "requests_in_batch", ()) or ()),
                                getattr(io, "total_seqlen_q", -1), getattr(io, "max_kv_read", -1),
                                len(self.scheduler.active_requests), len(self.scheduler.waiting_requests)]
        return ready

    def updated(self: Any) -> None:
        t2 = time.time()
        update(self)
        step = getattr(self, "_llmlb_step", None)
        if step is not None:
            self._llmlb_step = None
            writer.writerow([*step[:2], t2, time.time(), *step[2:]])
            out.flush()

    processor.prepare_next_batch, processor.update_batch = planned, updated


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "serve":
        sys.exit("usage: hf_step_log.py STEPS.csv serve MODEL [transformers serve flags]")
    try:
        from transformers.cli.transformers import main as transformers_main
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchProcessor
    except ImportError as e:
        sys.exit(f"hf_step_log: this transformers has no continuous batching to log: {e}")
    if not all(hasattr(ContinuousBatchProcessor, m) for m in ("prepare_next_batch", "update_batch")):
        sys.exit("hf_step_log: this transformers' ContinuousBatchProcessor has no prepare_next_batch/update_batch")
    wrap(ContinuousBatchProcessor, argv[0])
    sys.argv = ["transformers", *argv[1:]]
    transformers_main()


if __name__ == "__main__":
    main(sys.argv[1:])
