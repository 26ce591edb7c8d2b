"""``llmlb serve`` on the command line: one-line errors, and a real process that serves and stops
cleanly on Ctrl-C (SIGTERM is covered by the replay comparison in test_serve_replay.py)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.fleet import Fleet
from tests.conftest import CTRL_C
from tests.serve_helpers import post_json, request

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("args,fragment", [
    (["--speed", "0"], "--speed"),
    (["--port-per-replica", "0", "--policy", "round_robin"], "--policy"),
    (["--gpu", "tpu-v9"], "gpu"),
    (["--policy", "nope"], "--policy"),
    (["--replicas", "3", "--port-per-replica", "65534"], "--port-per-replica"),
    (["--mean-output-tokens", "0.5"], "--mean-output-tokens"),
    (["--cluster", str(ROOT / "clusters" / "disaggregated.toml")], "mixed pools only"),
])
def test_bad_options_are_one_line_errors(args, fragment, capsys):
    code, err = run_cli(["serve", *args], capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], err


def test_a_busy_port_is_a_one_line_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, err = run_cli(["serve", "--port", str(taken.getsockname()[1])], capsys)
    assert code == 2 and err.startswith("error: --port: cannot listen on 127.0.0.1:") and "Traceback" not in err


def test_the_process_serves_and_stops_on_ctrl_c():
    """A heterogeneous fleet from a cluster file (2 H100 + 3 A100 replicas) behind one port."""
    proc = subprocess.Popen([sys.executable, "-m", "llmlb_bench", "serve", "--cluster", "clusters/hetero.toml",
                             "--port", "0", "--served-model-name", "sim-8b"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **CTRL_C)
    try:
        name, url = proc.stdout.readline().split()
        assert name == "router" and url.startswith("http://127.0.0.1:")
        assert json.loads(request(url, "GET", "/v1/models")[2])["data"][0]["id"] == "sim-8b"
        info = [ln for ln in request(url, "GET", "/metrics")[2].decode().splitlines()
                if ln.startswith("vllm:cache_config_info")]
        h100, a100 = (ClusterConfig.build(replicas=1, gpu=g) for g in ("h100-sxm", "a100-80g"))
        blocks = 2 * Fleet(h100, 16).replicas[0].kv.total + 3 * Fleet(a100, 16).replicas[0].kv.total
        assert f'num_gpu_blocks="{blocks}"' in info[0]
        status, body = post_json(url, "/v1/completions", {"model": "sim-8b", "prompt": "a b c", "max_tokens": 3,
                                                          "ignore_eos": True})
        assert status == 200 and body["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)   # a hang's bound: it returns once the server stopped
    assert proc.returncode == 0, err
    assert "stopped: 1 requests finished, 0 aborted, 0 rejected, 3 tokens generated" in out
    assert "Traceback" not in err
