#!/usr/bin/env python3
"""Transport benchmark (issue 2): unary grpc.health.v1.Health/Check under h2load against presenced,
and, in the same sitting, nghttpd serving a small file (../shared/bench/peers http2), as ratios.
Also p50/p99 latency at half of presenced's measured rate, and resident memory per idle connection.

Usage: Scripts/bench-transport [--runs N]    (prints a Markdown table; installs h2load/nghttpd if missing)
Figures on this 2-core machine are noisy: each is the median of N runs.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import PEERS, REL, ROOT, free_port, start_node as start_presenced, wait_for_port  # noqa: E402

BIN = os.path.join(REL, "presenced")
H2LOAD = ["h2load", "-n", "200000", "-c", "16", "-m", "32", "-t", "1"]


def start_node(threads=None):
    return start_presenced(*(["--threads", str(threads)] if threads else []))


def h2load(port, extra=(), log=None):
    body = tempfile.NamedTemporaryFile(delete=False)
    body.write(b"\x00\x00\x00\x00\x00")  # one empty HealthCheckRequest, gRPC-framed
    body.close()
    cmd = H2LOAD + list(extra) + ["-d", body.name, "-H", "content-type: application/grpc", "-H", "te: trailers"]
    if log:
        cmd += [f"--log-file={log}"]
    cmd.append(f"http://127.0.0.1:{port}/grpc.health.v1.Health/Check")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    os.unlink(body.name)
    m = re.search(r"finished in .*?, ([\d.]+) req/s", out)
    ok = re.search(r"(\d+) succeeded, (\d+) failed", out)
    if not m or not ok or ok.group(2) != "0":
        raise SystemExit("h2load failed:\n" + out)
    return float(m.group(1))


def nghttpd_rate():
    out = subprocess.run([PEERS, "http2"], capture_output=True, text=True, timeout=300).stdout
    m = re.search(r"rate=([\d.]+)", out)
    if not m:
        raise SystemExit("peers http2 failed:\n" + out)
    return float(m.group(1))


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


LATENCY_CLIENTS = 64


def latency(url, rate, grpc=True, body_path=None):
    """p50/p99 (ms) with `rate` req/s offered for 3 s by 64 clients, one request in flight each
    (`body_path`: a gRPC-framed request to send; default an empty one)."""
    log = tempfile.NamedTemporaryFile(delete=False).name
    per_client = max(1, int(rate / LATENCY_CLIENTS))
    cmd = ["h2load", "-D", "3", "-c", str(LATENCY_CLIENTS), "-m", "1", "-t", "1", "--rps", str(per_client), f"--log-file={log}"]
    body = None
    if grpc and body_path:
        cmd += ["-d", body_path, "-H", "content-type: application/grpc", "-H", "te: trailers"]
    elif grpc:
        body = tempfile.NamedTemporaryFile(delete=False)
        body.write(b"\x00\x00\x00\x00\x00")
        body.close()
        cmd += ["-d", body.name, "-H", "content-type: application/grpc", "-H", "te: trailers"]
    cmd.append(url)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    rate_done = float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))
    durations = [int(line.split("\t")[2]) / 1000.0 for line in open(log) if line.count("\t") >= 2]
    os.unlink(log)
    if body:
        os.unlink(body.name)
    return rate_done, percentile(durations, 0.5), percentile(durations, 0.99)


def start_nghttpd():
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "small"), "w") as f:
        f.write("x" * 66)
    port = free_port()
    p = subprocess.Popen(["nghttpd", "--no-tls", "-d", d, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, p, "nghttpd")
    return p, port


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def idle_connections(count=10000):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    p, port = start_node()
    try:
        # warm up: one connection, so lazily built tables are not charged to the 10,000
        warm = socket.create_connection(("127.0.0.1", port))
        warm.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        time.sleep(0.5)
        before = rss_kib(p.pid)
        socks = []
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # preface + empty SETTINGS
        ack = bytes([0, 0, 0, 4, 1, 0, 0, 0, 0])  # SETTINGS ACK
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(preface + ack)
            socks.append(s)
        # let the server read everything and answer
        for s in socks:
            s.settimeout(5)
            s.recv(4096)
        # an idle connection's steady state: its frame buffer is given back after 2 s with nothing
        # sent (HTTP2Settings.releaseIdleBuffersAfter)
        time.sleep(3.5)
        after = rss_kib(p.pid)
        for s in socks:
            s.close()
        warm.close()
        return before, after, (after - before) * 1024 / count
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    subprocess.run([os.path.join(ROOT, "Scripts", "ensure-deps"), "--bench"], check=True)
    subprocess.run(["swift", "build", "-c", "release", "--product", "presenced"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    peer, one, two = [], [], []
    for _ in range(a.runs):
        peer.append(nghttpd_rate())
        p, port = start_node(threads=1)
        h2load(port, ["-n", "20000"])  # warm-up
        one.append(h2load(port))
        p.terminate(); p.wait()
        p, port = start_node()
        h2load(port, ["-n", "20000"])
        two.append(h2load(port))
        p.terminate(); p.wait()
    peer_m, one_m, two_m = statistics.median(peer), statistics.median(one), statistics.median(two)
    half = two_m / 2
    lat = {}
    for threads in (1, None):
        p, port = start_node(threads=threads)
        lat[threads] = latency(f"http://127.0.0.1:{port}/grpc.health.v1.Health/Check", half)
        p.terminate(); p.wait()
    p, port = start_nghttpd()
    ng_done, ng_p50, ng_p99 = latency(f"http://127.0.0.1:{port}/small", half, grpc=False)
    p.terminate(); p.wait()
    before, after, per_conn = idle_connections()
    print(f"runs={a.runs} nghttpd={[round(x) for x in peer]} presenced_threads1={[round(x) for x in one]} presenced_default={[round(x) for x in two]}")
    print()
    print("| figure | presenced | nghttpd (peer, same sitting) | ratio |")
    print("|---|---|---|---|")
    print(f"| Health/Check req/s, `--threads 1` (median of {a.runs}) | {one_m:,.0f} | {peer_m:,.0f} | {one_m / peer_m:.2f} |")
    print(f"| Health/Check req/s, default threads (2) (median of {a.runs}) | {two_m:,.0f} | {peer_m:,.0f} | {two_m / peer_m:.2f} |")
    for threads, label in ((1, "`--threads 1`"), (None, "default threads (2)")):
        done, p50, p99 = lat[threads]
        print(f"| latency, {label}, at half of presenced's rate ({half:,.0f} req/s offered: 64 clients, 1 in flight each; served {done:,.0f} / nghttpd {ng_done:,.0f}) | p50 {p50:.2f} ms, p99 {p99:.2f} ms | p50 {ng_p50:.2f} ms, p99 {ng_p99:.2f} ms | p99 {p99 / ng_p99:.2f} |")
    print(f"| RSS with 10,000 idle h2c connections | {before / 1024:.1f} MiB → {after / 1024:.1f} MiB = {per_conn / 1024:.2f} KiB/connection | | |")


if __name__ == "__main__":
    main()
