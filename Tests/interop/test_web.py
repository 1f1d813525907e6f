"""The HTTP/1.1 front door (WEB.md): health and readiness probes, /metrics read by hand and scraped by
Debian's real Prometheus server from a 3-node cluster under load. Every wait is bounded."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import Node, free_port, presenced_binary
from test_cluster import Cluster, wait_until
from test_presence import Session
from test_hostile import rss_kib

import presence_pb2 as p
import presence_pb2_grpc as pg

MSG = p.CHANNEL_TYPE_MESSAGE


def get(port, path, method="GET", timeout=5):
    """(status, body) of one request to the node's HTTP port."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text, name, **labels):
    """The value of one sample in an exposition, or None."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


def test_probes_routes_and_refusals(node):
    assert get(node.http_port, "/healthz") == (200, "ok\n")
    wait_until("ready", lambda: get(node.http_port, "/readyz")[0] == 200, 10)
    assert get(node.http_port, "/nope")[0] == 404
    assert get(node.http_port, "/metrics", method="POST")[0] == 405
    # a malformed request: 400 and the connection closes
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=5) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 400 ")


def test_readyz_is_503_until_the_node_joins():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)   # a seed that never answers
    n = Node("--seeds", f"127.0.0.1:{silent.getsockname()[1]}", node_id="lonely")
    try:
        assert get(n.http_port, "/healthz")[0] == 200
        assert get(n.http_port, "/readyz")[0] == 503
        # no seed answered within its wait: it serves as a cluster of one, and is ready
        wait_until("ready alone", lambda: get(n.http_port, "/readyz")[0] == 200, 15)
    finally:
        n.finish()
        silent.close()


def test_metrics_count_calls_sessions_and_memberships(node):
    stub = pg.PresenceStub(node.channel)
    s = Session(stub, "ann")
    stub.Join(p.JoinRequest(session_id=s.id, channel_name="lobby", channel_type=MSG, with_presence=True), timeout=5)
    stub.SetState(p.SetStateRequest(session_id=s.id, channel_name="lobby", channel_type=MSG,
                                    items=[p.StateItem(key="mic", value="on")]), timeout=5)
    with pytest.raises(Exception):
        stub.Join(p.JoinRequest(session_id=s.id, channel_name="", channel_type=MSG), timeout=5)
    status, text = get(node.http_port, "/metrics")
    assert status == 200
    assert "# TYPE presenced_grpc_calls_total counter" in text
    assert metric(text, "presenced_grpc_calls_total", method="presence.v1.Presence/Join", code="OK") == 1
    assert metric(text, "presenced_grpc_calls_total", method="presence.v1.Presence/Join", code="INVALID_ARGUMENT") == 1
    assert metric(text, "presenced_grpc_calls_total", method="presence.v1.Presence/SetState", code="OK") == 1
    assert metric(text, "presenced_grpc_call_duration_seconds_count", method="presence.v1.Presence/SetState") == 1
    assert metric(text, "presenced_sessions", state="connected") == 1
    assert metric(text, "presenced_memberships") == 1
    assert metric(text, "presenced_channels", role="owner") == 1
    assert metric(text, "presenced_members", status="alive") == 1
    assert metric(text, "presenced_connections", port="grpc") >= 1
    assert metric(text, "presenced_process_resident_memory_bytes") > 1 << 20
    assert metric(text, "presenced_process_open_fds") > 3
    s.cancel()
    # the stream broke: the session waits to resume
    wait_until("disconnected", lambda: metric(get(node.http_port, "/metrics")[1], "presenced_sessions", state="disconnected") == 1, 10)


class Prometheus:
    """Debian's prometheus server scraping the given HTTP ports every 0.5 s, from a scratch dir."""

    def __init__(self, targets):
        self.dir = tempfile.mkdtemp(prefix="presenced-prom-")
        self.port = free_port()
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
                    "scrape_configs:\n  - job_name: presenced\n    static_configs:\n"
                    f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, q):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in body["data"]["result"]}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_prometheus_scrapes_a_three_node_cluster_under_load():
    assert shutil.which("prometheus"), "Scripts/ensure-deps installs Debian's prometheus"
    cluster = Cluster(3, total=3)
    prom = None
    sessions = []
    try:
        nodes = cluster.live()
        prom = Prometheus([f"127.0.0.1:{n.http_port}" for n in nodes])
        # load: two sessions per node, each joining channels and setting state in a loop
        stubs = [pg.PresenceStub(n.channel) for n in nodes]
        for i, stub in enumerate(stubs):
            for k in range(2):
                s = Session(stub, f"user-{i}-{k}")
                sessions.append((stub, s))
        for round_ in range(20):
            for j, (stub, s) in enumerate(sessions):
                ch = f"room-{(j + round_) % 4}"
                stub.Join(p.JoinRequest(session_id=s.id, channel_name=ch, channel_type=MSG, with_presence=True), timeout=5)
                stub.SetState(p.SetStateRequest(session_id=s.id, channel_name=ch, channel_type=MSG,
                                                items=[p.StateItem(key="round", value=str(round_))]), timeout=5)

        def up():
            r = prom.query("up")
            return len(r) == 3 and all(v == 1 for v in r.values())
        wait_until("prometheus scrapes all three nodes", up, 30)
        # sessions per node, as Prometheus stored them
        wait_until("two connected sessions on every node",
                   lambda: sorted(prom.query('presenced_sessions{state="connected"}').values()) == [2, 2, 2], 20)
        # calls by method and code, summed over the cluster
        wait_until("every SetState counted", lambda: prom.query(
            'sum(presenced_grpc_calls_total{method="presence.v1.Presence/SetState",code="OK"})') == {(): 120.0}, 20)
        # members alive, as each node sees them
        wait_until("three members alive on every node",
                   lambda: sorted(prom.query('presenced_members{status="alive"}').values()) == [3, 3, 3], 20)
        # presencectl top reads the same metrics: a row per node, its sessions, and the total
        ctl = os.path.join(os.path.dirname(presenced_binary()), "presencectl")
        out = subprocess.run([ctl, "top", "--http", ",".join(f"127.0.0.1:{n.http_port}" for n in nodes), "--interval", "0.3", "--count", "1"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[2:]}
        assert {"node-0", "node-1", "node-2", "total"} <= set(rows), out.stdout
        assert rows["node-0"][1] == "3" and rows["node-0"][2] == "2" and rows["total"][1] == "6", out.stdout
        # the latency histograms arrive whole (a quantile can be computed from them)
        wait_until("every SetState timed", lambda: prom.query(
            'sum(presenced_grpc_call_duration_seconds_bucket{method="presence.v1.Presence/SetState",le="+Inf"})') == {(): 120.0}, 20)
    finally:
        for _, s in sessions:
            s.cancel()
        if prom:
            prom.stop()
        cluster.stop()


def test_pipelined_requests_that_are_never_read_cannot_pile_answers_up(node):
    # 20,000 requests for the 8.7 KB demo page (174 MB of answers), and nothing read
    before = rss_kib(node.proc.pid)
    s = socket.create_connection(("127.0.0.1", node.http_port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    s.settimeout(5)
    try:
        for _ in range(20):
            s.sendall(request * 1000)
    except (OSError, socket.timeout):
        pass   # the server stopped reading, or closed the connection: either is fine
    time.sleep(0.5)
    grown = rss_kib(node.proc.pid) - before
    assert grown < 32 * 1024, f"the node grew by {grown} KiB"
    s.close()
    assert get(node.http_port, "/healthz")[0] == 200


def test_a_client_that_half_closes_gets_its_whole_answer(node):
    s = socket.create_connection(("127.0.0.1", node.http_port), timeout=10)
    s.sendall(b"GET /presence.js HTTP/1.0\r\n\r\n")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")][0].split(b":")[1])
    assert head.startswith(b"HTTP/1.1 200") and len(body) == length
