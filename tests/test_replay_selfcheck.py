"""What the client's self-check can and cannot see, and the server-side cross-check that covers the gap.

The servers are real loopback servers: the no-op streaming server, and the
same protocol behind a listening socket whose accept loop stops for a few
seconds while the kernel keeps completing handshakes and buffering requests
(what a stalled server process looks like from the client).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from conftest import cli, make_trace
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.noop_server import NoopConfig, NoopProtocol
from llmlb_bench.replay.witness import received_count
from replay_helpers import ServerThread, run_replay, servers  # noqa: F401 (fixture)


def _meta(run_dir) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_run_json_records_the_event_loop_that_ran(servers, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("uvloop")  # a core dependency on CPython/Linux; absent only on other platforms
    url, _ = servers.noop()
    trace = make_trace(n=5, rate=50.0, output_tokens=4)
    summary, _, run_dir = run_replay(trace, [url], tmp_path, run_id="default")
    assert summary["client"]["event_loop"] == "uvloop"
    monkeypatch.setenv("LLMLB_EVENT_LOOP", "asyncio")
    summary, rows, run_dir = run_replay(trace, [url], tmp_path, run_id="asyncio")
    assert summary["client"]["event_loop"] == "asyncio" == _meta(run_dir)["summary"]["client"]["event_loop"]
    assert [r["status"] for r in rows] == ["ok"] * 5


def test_received_count_reads_the_noop_counter_and_vllms_finished_running_waiting():
    assert received_count("# TYPE llmlb:requests_received_total counter\nllmlb:requests_received_total 7\n") == 7
    vllm = ('vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0\n'
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
            'vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10.0\n')
    assert received_count(vllm) == 11
    assert received_count("llamacpp:requests_processing 2\n") is None  # no count of requests received


def test_an_on_time_server_agrees_with_the_client(servers, tmp_path):  # noqa: F811
    url, cfg = servers.noop()
    trace = make_trace(n=60, rate=40.0, output_tokens=4)  # 1.5 s
    summary, rows, run_dir = run_replay(trace, [url], tmp_path, options=ReplayOptions(scrape_s=0.2))
    client = _meta(run_dir)["summary"]["client"]
    check = client["server_check"]
    ep = check["endpoints"][url]
    assert check["available"] and ep["sent"] == ep["received"] == cfg.received == 60 and ep["readings"] >= 5
    # what the server's own clock says: how long after its send each request was read. The witness's
    # lag is a lower bound of it (a request missing from a count was read after the count was asked
    # for), so it flags a server that kept up only if this machine really held the server back by
    # more than the limit (not a bound on this machine's speed: a loaded one may do that)
    late = max(cfg.records[str(r["request_id"])][0] - client["t0_clock_s"] - r["sent_s"] for r in rows)
    assert ep["lag_s"] <= late + 1e-3
    assert check["flagged"] == (ep["lag_s"] > check["lag_limit_s"])
    assert not check["flagged"] or late > check["lag_limit_s"]


class StallingServer:
    """The no-op server's protocol behind a real listening socket whose accept loop can be stopped:
    connections made meanwhile wait in the kernel's backlog, their requests in its buffers."""

    def __init__(self, loop_thread: ServerThread, cfg: NoopConfig) -> None:
        self.loop, self.cfg = loop_thread.loop, cfg
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stalled_until = 0.0
        self.stall_after: tuple[int, float] | None = None
        self.accepted = 0
        self.closing = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def stall(self, after: int, seconds: float) -> None:
        """Stop accepting for ``seconds`` once ``after`` connections have been accepted: at a point of
        the run's progress (a stall after a fixed delay from the test's start fell before the first
        send where the replayer's start-up took longer)."""
        self.stall_after = (after, seconds)

    def _accept(self) -> None:
        while not self.closing:
            if time.monotonic() < self.stalled_until:
                time.sleep(0.01)
                continue
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            conn.setblocking(False)
            self.accepted += 1
            if self.stall_after is not None and self.accepted == self.stall_after[0]:
                self.stalled_until = time.monotonic() + self.stall_after[1]
            asyncio.run_coroutine_threadsafe(
                self.loop.connect_accepted_socket(lambda: NoopProtocol(self.cfg), conn), self.loop)

    def close(self) -> None:
        self.closing = True
        self.thread.join(timeout=5)
        self.sock.close()


def test_a_server_that_stops_accepting_is_flagged_though_the_client_sent_on_time(servers, tmp_path, capsys):  # noqa: F811
    cfg = NoopConfig(ttft_s=1.0)  # each stream holds its connection for a second: new requests need new ones
    srv = StallingServer(servers, cfg)
    try:
        trace = make_trace(n=150, rate=50.0, output_tokens=2)  # 3 s
        srv.stall(after=20, seconds=2.5)   # at about 0.4 s, while the first streams hold their connections
        summary, rows, run_dir = run_replay(trace, [srv.url], tmp_path, options=ReplayOptions(scrape_s=0.25))
    finally:
        srv.close()
    assert [r["status"] for r in rows] == ["ok"] * 150  # every request answered in the end
    client = _meta(run_dir)["summary"]["client"]
    # the server's clock: requests read seconds after they were handed to the kernel (the stall's 2.5 s
    # less the wait of the first request it caught), and the client's own view shows nothing of the
    # kind: its sends were less late than that
    t0 = client["t0_clock_s"]
    late = max(cfg.records[str(r["request_id"])][0] - t0 - r["sent_s"] for r in rows)
    assert late > 1.5 and max(r["sent_s"] - r["scheduled_s"] for r in rows) < late
    # ... which the cross-check sees in the server's count
    check = client["server_check"]
    assert check["available"] and check["flagged"]
    # a lower bound of the server's own lateness (a request missing from a count was read after it)
    assert check["lag_limit_s"] < check["lag_s"] <= late + 1e-3
    assert check["endpoints"][srv.url]["received"] == 150
    code, out, _ = cli(["report", str(run_dir), "--format", "md"], capsys)
    line = next(x for x in out.splitlines() if "server behind the sends" in x)
    assert code == 0 and f"{check['lag_s']:.2f} YES" in line
