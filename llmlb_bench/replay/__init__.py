"""Replay a trace against real OpenAI-compatible endpoints (vLLM, SGLang, TGI, llama.cpp, ...).

``replay(trace, endpoints, policy, run, options)`` sends every request at
its trace time, routes it with a shared routing policy, streams the
response and writes one result row per trace request; see
:mod:`llmlb_bench.replay.runner` for the timing model and docs/replay.md.
"""

from llmlb_bench.replay.options import ReplayOptions, Timeouts
from llmlb_bench.replay.preflight import Preflight, preflight
from llmlb_bench.replay.resume import Resume, prepare_resume
from llmlb_bench.replay.entry import replay

__all__ = ["Preflight", "ReplayOptions", "Resume", "Timeouts", "preflight", "prepare_resume", "replay"]
