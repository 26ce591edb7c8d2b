"""``llmlb routers``: install the PyPI routers and run the router scenario suite against them."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.lazy import Group
from llmlb_bench.cli.app import app, console
from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import unknown_choice

routers_app = typer.Typer(help="Real routers under test (vllm-router, sglang-router, smg): install them, run the "
                               "router scenario suite side by side (docs/routers.md).\n\n"
                               "Example:  llmlb routers install && llmlb routers bench", no_args_is_help=True, cls=Group)
app.add_typer(routers_app, name="routers")


@routers_app.command("install")
def install(
    names: Annotated[Optional[list[str]], typer.Argument(help="Routers to install (default: all three).")] = None,
) -> None:
    """Install routers into their own virtual environments under ${LLMLB_CACHE_DIR:-~/.cache/llmlb-bench}/routers/.

    Example:

        llmlb routers install vllm-router smg
    """
    from llmlb_bench.pypi_routers.install import PACKAGES, ensure, package, venv

    chosen = names or list(PACKAGES)
    for name in chosen:  # every name checked before the first (slow) install
        package(name, "NAMES")
    for name in chosen:
        ensure(name)
        console.print(f"{name}: {venv(name)}", highlight=False, soft_wrap=True)


@routers_app.command("bench")
def bench(
    router: Annotated[Optional[list[str]], typer.Option("--router", "-r", help="Router to test (repeatable; default: vllm-router, sglang-router, smg; also llmlb-route, llmlb's own proxy).")] = None,
    scenario: Annotated[Optional[list[str]], typer.Option("--scenario", "-s", help="Scenario (repeatable; default: all; see docs/routers.md).")] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="The routers' --policy; the direct control uses llmlb's policy of that name (round_robin if llmlb has none).")] = "cache_aware",
    scale: Annotated[float, typer.Option("--scale", help="Multiplies each scenario's request count (0.2 for a quick run).")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the scenario traces.")] = 0,
    slo_ttft: Annotated[float, typer.Option("--slo-ttft", help="SLO: seconds to first token, from arrival.")] = 0.5,
    slo_tpot: Annotated[float, typer.Option("--slo-tpot", help="SLO: seconds per output token after the first.")] = 0.05,
    router_cpus: Annotated[Optional[str], typer.Option("--router-cpus", help="Pin each router to these cores (taskset -c).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the runs (<scenario>/<router>/), figures.json and README.md.")] = Path("results/routers"),
) -> None:
    """Every scenario through `direct` (no router) and each router, in front of fresh `llmlb serve` backends.

    Writes ordinary runs (report/query/gate read them), figures.json and a side-by-side README.md.

    Example:

        llmlb routers bench -r vllm-router -r smg -s prefix-50 -s failover --scale 0.5
    """
    from llmlb_bench.pypi_routers.bench import BenchOptions, run_suite
    from llmlb_bench.pypi_routers.install import PACKAGES
    from llmlb_bench.pypi_routers.launch import LLMLB_ROUTE
    from llmlb_bench.pypi_routers.report import markdown
    from llmlb_bench.pypi_routers.scenarios import suite
    from llmlb_bench.store.run import write_text_atomic

    routers = router or list(PACKAGES)
    known = [*PACKAGES, LLMLB_ROUTE]
    for r in routers:
        if r not in known:
            raise unknown_choice("router", r, known, "--router")
    if not scale > 0:
        raise UserError(f"must be > 0, got {scale!r}", "--scale")
    every = suite(scale, seed)
    names = [s.name for s in every]
    for s in scenario or ():
        if s not in names:
            raise unknown_choice("scenario", s, names, "--scenario")
    chosen = [s for s in every if not scenario or s.name in scenario]
    taken = [out / s.name / r for s in chosen for r in ["direct", "sim", *routers] if (out / s.name / r).exists()]
    if taken:
        raise UserError(f"already holds runs of this suite ({taken[0].relative_to(out)}, ...); give another --out",
                        str(out))
    opt = BenchOptions(policy=policy, slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, router_cpus=router_cpus)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    cells = run_suite(chosen, routers, out, opt, progress=lambda line: console.print(line, highlight=False))
    head = [
        "# Routers side by side", "",
        f"Command: `llmlb routers {shlex.join(sys.argv[2:])}`  ",
        f"Routers: {', '.join(routers)}; policy `{policy}`; SLO TTFT <= {slo_ttft} s and TPOT <= {slo_tpot} s "
        f"from arrival; {os.cpu_count()} cores, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start.", "",
        "Figures are defined in docs/routers.md; `direct` is llmlb's own client-side policy talking to the "
        "same backends without a router.", "",
    ]
    write_text_atomic(out / "README.md", "\n".join(head) + markdown(cells, {s.name: s.summary for s in chosen}))
    console.print(f"-> {out / 'README.md'}, {out / 'figures.json'}", highlight=False)
