"""Scripted paper reproductions (``llmlb repro``): each module states a paper's claim as
simulated runs plus a check of its direction and rough size; see docs/repro.md."""

from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict
from llmlb_bench.repro.registry import REPRODUCTIONS, get
from llmlb_bench.repro.runner import Outcome, evaluate, run

__all__ = ["Arm", "Column", "Outcome", "REPRODUCTIONS", "Reproduction", "Verdict", "evaluate", "get", "run"]
