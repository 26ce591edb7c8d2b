"""Ray across two network hosts: a head and a worker in network namespaces joined by a veth pair.

Each host is a network namespace of this machine with its own interface and
address in a private /30 that exists only between the two namespaces (no
route leads anywhere else). The head host runs the Ray head (no CPUs, so no
task or actor can land there), the no-op server and the driver (``llmlb``
commands run inside it); the worker host runs a Ray worker node with 2 CPUs,
so every actor and every sweep task runs there and the load crosses the
veth to the head host's address. The hosts share this machine's kernel: one
clock (the true offset is zero, so the measured offsets must be within their
own uncertainty) and one file system (what a real cluster needs instead is
in docs/sweeps.md and docs/replay.md).

Runs as root (``ip netns``). It skips only when neither root nor in CI; in CI
it runs. Every process started in the namespaces is killed and the
namespaces deleted at the end, whatever happened (about 60 s in all).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import make_trace
from llmlb_bench.replay.witness import received_count
from llmlb_bench.schema import write_trace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
RAY = str(Path(PY).with_name("ray"))
PORT_GCS, PORT_SERVER = 6379, 8000
#: how long a host's Ray start-up may take: a hang's bound, not a speed
HANG_S = 600.0


def _sh(*cmd: str, timeout: float = 60, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check, env=env)


class TwoHosts:
    """Two namespaces ``head`` and ``worker``, one veth pair, Ray head + worker node, a no-op server."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.head, self.worker = f"llmlb-h{tag}", f"llmlb-w{tag}"
        self.veth = (f"lh{tag}", f"lw{tag}")
        net = 16 + os.getpid() % 200  # 10.213.<net>.0/30, only inside these two namespaces
        self.head_ip, self.worker_ip = f"10.213.{net}.1", f"10.213.{net}.2"
        self.dir = Path(tempfile.mkdtemp(prefix="llmlb-mh-"))  # short: Ray's socket paths have a length limit
        token = self.dir / "token"
        token.write_text(secrets.token_hex(32))
        # Ray turns on token authentication on the head when a token exists in ~/.ray; every process
        # of this cluster gets the same private token instead
        self.env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
                        RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO))
        self.made: list[str] = []
        #: a command's time limit: 120 s, or 10x the cluster's start-up on a machine slower than this one
        #: (a replay across the hosts took over 120 s pinned to one core beside a busy loop)
        self.timeout = 120.0

    def up(self) -> None:
        for ns in (self.head, self.worker):
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
        a, b = self.veth
        _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        _sh("ip", "link", "set", a, "netns", self.head)
        _sh("ip", "link", "set", b, "netns", self.worker)
        for ns, dev, ip in ((self.head, a, self.head_ip), (self.worker, b, self.worker_ip)):
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        common = ["--object-store-memory", str(150 << 20), "--disable-usage-stats", "--include-dashboard=false"]
        start = time.monotonic()    # the cluster's start-up paces the commands' time limits (self.timeout)
        self.run(self.head, RAY, "start", "--head", "--node-ip-address", self.head_ip, "--port", str(PORT_GCS),
                 "--num-cpus", "0", "--temp-dir", str(self.dir / "ray-head"), *common, timeout=HANG_S)
        self.run(self.worker, RAY, "start", "--address", self.gcs, "--node-ip-address", self.worker_ip,
                 "--num-cpus", "2", "--temp-dir", str(self.dir / "ray-worker"),
                 *[c for c in common if c != "--include-dashboard=false"], timeout=HANG_S)
        self.timeout = max(120.0, 10 * (time.monotonic() - start))
        self.server = subprocess.Popen(["ip", "netns", "exec", self.head, PY, "-m", "llmlb_bench.replay.noop_server",
                                        "--host", self.head_ip, "--port", str(PORT_SERVER), "--itl-ms", "2"],
                                       stdout=subprocess.PIPE, text=True, env=self.env)
        line = self.server.stdout.readline() if self.server.stdout else ""
        assert line.startswith("listening on "), line

    @property
    def gcs(self) -> str:
        return f"{self.head_ip}:{PORT_GCS}"

    @property
    def url(self) -> str:
        return f"http://{self.head_ip}:{PORT_SERVER}"

    def run(self, ns: str, *cmd: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """``cmd`` on host ``ns`` (its network namespace); ``timeout`` by default :attr:`timeout`."""
        out = _sh("ip", "netns", "exec", ns, *cmd, timeout=timeout or self.timeout, check=False, env=self.env)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[:3])} ... exited {out.returncode}: {out.stderr[-2000:]}")
        return out

    def popen(self, ns: str, *cmd: str) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.env)

    def python(self, ns: str, code: str) -> str:
        return self.run(ns, PY, "-c", code).stdout

    def pids(self, ns: str) -> list[int]:
        out = _sh("ip", "netns", "pids", ns, check=False)
        return [int(p) for p in out.stdout.split()]

    def down(self) -> None:
        """Kill every process in both namespaces (by pid, never by name), delete them and the files."""
        for _ in range(3):
            pids = [p for ns in self.made for p in self.pids(ns)]
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        for ns in self.made:
            _sh("ip", "netns", "del", ns, check=False)  # takes its end of the veth pair, and so the pair
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts(request):
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("network namespaces need root (this test runs in CI)")
    import ray  # noqa: F401  (the test extra has it: missing, the test fails)
    h = TwoHosts()
    request.addfinalizer(h.down)  # before anything is made: a half-made setup is removed too
    h.up()
    return h


def _nodes(h: TwoHosts) -> dict[str, str]:
    """Ray node id -> its address, as the cluster sees them."""
    out = h.python(h.head, "import json, ray; ray.init(address=%r, log_to_driver=False, configure_logging=False); "
                           "print(json.dumps({n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() "
                           "if n['Alive']}))" % h.gcs)
    return json.loads(out.strip().splitlines()[-1])


def _received(h: TwoHosts) -> float:
    """The server's count of requests received so far (it serves every test of the module)."""
    text = h.python(h.head, "import urllib.request; print(urllib.request.urlopen(%r).read().decode())"
                    % f"{h.url}/metrics")
    count = received_count(text)
    assert count is not None
    return count


def _replay(h: TwoHosts, trace: Path, run_id: str, *extra: str) -> list[str]:
    return [PY, "-m", "llmlb_bench", "replay", str(trace), "-e", h.url, "--workers", "2", "--executor", "ray",
            "--address", h.gcs, "--results", str(h.dir / "res"), "--run-id", run_id, "--no-progress", *extra]


def test_replay_load_comes_from_the_worker_host_to_the_head_hosts_address(hosts, tmp_path):
    h = hosts
    nodes = _nodes(h)
    assert sorted(nodes.values()) == sorted([h.head_ip, h.worker_ip])
    trace = h.dir / "trace.parquet"
    write_trace(make_trace(n=200, rate=100.0, output_tokens=8), trace)
    h.run(h.head, *_replay(h, trace, "across"))
    run_dir = h.dir / "res" / "across"
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "complete"
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert sorted(r["request_id"] for r in rows) == list(range(200)) and {r["status"] for r in rows} == {"ok"}
    client = meta["summary"]["client"]
    actors = client["ray_workers"]
    assert len(actors) == 2 and {nodes[a["node_id"]] for a in actors} == {h.worker_ip}
    for a in actors:  # one kernel clock: the true offset is 0, within what the round trip allows (whatever
        # the round trip took: its length is the machine's, a loaded one's is tens of milliseconds)
        assert abs(a["offset_s"]) <= a["uncertainty_s"] + 1e-4 and a["uncertainty_s"] == a["rtt_s"] / 2
        assert abs(a["offset_after_s"]) <= a["uncertainty_after_s"] + 1e-4
    # the server on the head host received what the worker host's actors sent, when they sent it
    check = client["server_check"]
    assert check["available"] and not check["flagged"]
    assert check["endpoints"][h.url]["received"] == 200
    stats = json.loads(h.python(h.head, "import urllib.request; print(urllib.request.urlopen(%r).read().decode())"
                                % f"{h.url}/stats"))
    # each request was read after its merged send time and answered before its merged first token time,
    # within the uncertainty of its actor's mapping (true on any machine; a mapping off by more than a
    # request's time to first token fails one side)
    t0 = client["t0_clock_s"]
    err = max(a["uncertainty_s"] + abs(a["shift_s"]) for a in actors) + 1e-3
    read = [stats[str(r["request_id"])][0] - t0 - r["sent_s"] for r in rows]
    wrote = [r["first_token_s"] - (stats[str(r["request_id"])][1] - t0) for r in rows]
    assert min(read) > -err and min(wrote) > -err, (min(read), min(wrote), err)


def test_sweep_cells_run_on_the_worker_host(hosts, tmp_path):
    h = hosts
    spec = h.dir / "mh.toml"
    spec.write_text(f"""name = "mh"
slo = "ttft=400ms,tpot=50ms"
seeds = [1]
[workloads.chat]
spec = "{REPO / 'workloads' / 'chat.toml'}"
requests = 60
[clusters.two]
replicas = 2
[policies.round_robin]
[policies.least_outstanding]
[load]
rate_scale = [0.5]
""")
    out = h.run(h.head, PY, "-m", "llmlb_bench", "sweep", str(spec), "--executor", "ray", "--address", h.gcs,
                "--results", str(h.dir / "sweep-ray"), "--format", "json", timeout=2.5 * h.timeout)
    remote = json.loads(out.stdout)
    local = subprocess.run([PY, "-m", "llmlb_bench", "sweep", str(spec), "--workers", "1", "--results",
                            str(tmp_path / "sweep-local"), "--format", "json"], capture_output=True, text=True,
                           timeout=2.5 * h.timeout, env=h.env)
    assert local.returncode == 0, local.stderr
    # the head has no CPU: every cell ran on the worker host, and gave the same runs as a local pool
    runs = sorted(p.parent.name for p in (h.dir / "sweep-ray" / "mh").glob("*/requests.parquet"))
    assert len(runs) == 2
    for run_id in runs:
        a = pq.read_table(h.dir / "sweep-ray" / "mh" / run_id / "requests.parquet")
        b = pq.read_table(tmp_path / "sweep-local" / "mh" / run_id / "requests.parquet")
        assert a.equals(b), run_id
    assert remote.keys() == json.loads(local.stdout).keys()


def test_an_actor_lost_with_its_hosts_raylet_leaves_a_partial_run_with_every_row(hosts):
    """Last: the worker host's raylet is killed about 2.5 s into a 12 s replay; its node is gone for good.

    The moment is read from the run's own progress, not from a clock: the server's count of requests
    received (each poll of it starts a Python in the head's namespace, seconds apart on a loaded
    machine, so the replay is long enough that a late poll still kills it mid-run), 125 requests of
    600 at 50/s: 2 s of schedule after the first 25, and no sooner than 3 s after them (actors that
    started late catch up in a burst), in which the parent, taking the actors' rows once a second,
    has taken some. A slower machine only waits longer; the replay ending first fails the test."""
    h = hosts
    trace = h.dir / "trace-lost.parquet"
    write_trace(make_trace(n=600, rate=50.0, output_tokens=4), trace)
    proc = h.popen(h.head, *_replay(h, trace, "lost"))
    raylet = None
    try:
        before = _received(h)
        while proc.poll() is None and _received(h) < before + 25:
            time.sleep(0.2)
        sending = time.monotonic()   # and at least three of the parent's once-a-second collections later
        while proc.poll() is None and (_received(h) < before + 125 or time.monotonic() < sending + 3.0):
            time.sleep(0.2)
        assert proc.poll() is None, "the replay ended before the raylet could be killed"
        raylet = next(p for p in h.pids(h.worker) if b"raylet" in Path(f"/proc/{p}/cmdline").read_bytes())
        os.kill(raylet, signal.SIGKILL)
        _, err = proc.communicate(timeout=1.5 * h.timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert raylet is not None
    assert proc.returncode != 0, err
    run_dir = h.dir / "res" / "lost"
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "partial", err
    actors = meta["summary"]["client"]["ray_workers"]
    assert len(actors) == 2 and all("error" in a for a in actors)
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert sorted(r["request_id"] for r in rows) == list(range(600))  # one row per request all the same
    statuses = {r["status"] for r in rows}
    assert "ok" in statuses and statuses <= {"ok", "error", "not_sent"}
    ok = [r for r in rows if r["status"] == "ok"]
    lost = [r for r in rows if r["status"] != "ok"]
    assert lost and all(r["error"] == "interrupted" for r in lost if r["status"] == "error")
    assert min(r["scheduled_s"] for r in lost) > min(r["scheduled_s"] for r in ok)
