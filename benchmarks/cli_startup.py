"""CLI start-up: wall and CPU time of ``llmlb --help``, a command's ``--help`` and ``llmlb policies``.

    python benchmarks/cli_startup.py                  # 10 rounds, commands interleaved
    python benchmarks/cli_startup.py --rounds 20 --against main~5

Each round runs every command once as a fresh process (``python -m llmlb_bench ...``, output to
/dev/null), interleaved so that a busy spell of the machine hits every command alike; prints per
command the median, min and max of wall time and of the child's CPU time (user + system). With
``--against REF`` the same commands also run from a checkout of REF (a temporary git worktree), in
the same rounds, for a before/after comparison side by side. Aim (issue 23): <= 0.3 s for ``--help``
and for a command's ``--help`` on a quiet 2-core machine. Report the load average beside the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = (["--help"], ["simulate", "--help"], ["report", "--help"], ["trace", "stats", "--help"], ["replay", "--help"],
            ["policies"])


def once(tree: Path, argv: list[str]) -> tuple[float, float]:
    """(wall s, child CPU s) of one start-up from the package in ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "llmlb_bench", *argv], cwd=tree, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(tree)}, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--against", help="a git ref to compare with, run side by side")
    args = ap.parse_args()
    trees = {"this tree": REPO}
    tmp = None
    if args.against:
        tmp = tempfile.mkdtemp(prefix="llmlb-startup-")
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", tmp, args.against], check=True,
                       capture_output=True)
        trees[args.against] = Path(tmp)
    try:
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                for argv in COMMANDS:
                    samples.setdefault((label, " ".join(argv)), []).append(once(tree, argv))
        print(f"load average {os.getloadavg()[0]:.2f} (1 min); {args.rounds} rounds, interleaved")
        print(f"{'tree':12} {'command':24} {'wall median [min, max] s':>28} {'cpu median [min, max] s':>28}")
        for (label, cmd), runs in samples.items():
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            print(f"{label:12} {cmd:24} {statistics.median(walls):8.3f} [{min(walls):.3f}, {max(walls):.3f}]"
                  f"      {statistics.median(cpus):8.3f} [{min(cpus):.3f}, {max(cpus):.3f}]")
    finally:
        if tmp:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", tmp], check=False)


if __name__ == "__main__":
    main()
