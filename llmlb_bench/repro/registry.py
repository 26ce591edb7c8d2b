"""Every reproduction by name, in the order of docs/repro.md."""

from __future__ import annotations

from llmlb_bench.repro import (cachedattention, distserve, energy, herding, hetero, intelligent_router, llumnix, lora,
                               mooncake, sarathi, sglang, sjf, speculative, voltana, vtc)
from llmlb_bench.repro.base import Reproduction
from llmlb_bench.tomlfile import unknown_choice

REPRODUCTIONS: dict[str, Reproduction] = {r.name: r for r in (
    distserve.REPRO, sglang.REPRO, herding.REPRO, vtc.REPRO, mooncake.REPRO, sarathi.REPRO, sjf.REPRO,
    llumnix.REPRO, energy.REPRO, hetero.REPRO, cachedattention.REPRO, lora.REPRO, speculative.ACCEPTANCE_REPRO,
    speculative.LOAD_REPRO, voltana.REPRO, intelligent_router.REPRO,
)}


def get(name: str) -> Reproduction:
    if name not in REPRODUCTIONS:
        raise unknown_choice("reproduction", name, REPRODUCTIONS, "llmlb repro run")
    return REPRODUCTIONS[name]
