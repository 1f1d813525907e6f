#!/usr/bin/env python3
"""Presence benchmarks (issue 3), each next to its peer from the same sitting.

  SetState round trips/s and p50/p99: presencectl bench setstate (50 clients, like redis-benchmark -c 50)
      peer: ../shared/bench/peers redis (a Lua script doing SADD + HSET + PUBLISH per call)
      also: h2load (C, 50 clients) driving SetState with a fixed request, against the same peer
  p99 at half of the measured SetState rate (presencectl bench setstate --rate)
  GetOnlineUsers of a full 100-user page with state: presencectl bench online-users
  Fan-out: 1,000 presence subscribers in one channel, 4 publishers changing state at full speed
  Memory per (user, channel) membership with 100,000 users x 10 channels: presence-bench memory

Usage: Scripts/bench-presence [--runs N]   (prints a Markdown table)
"""
import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import PEERS, REL, ROOT, start_node  # noqa: E402


def ctl(port, *args):
    out = subprocess.run([os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", *args],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("presencectl failed: " + out.stderr)
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)


def redis_peer():
    out = subprocess.run([PEERS, "redis"], capture_output=True, text=True, timeout=600).stdout
    m = re.search(r"rate=([\d.]+) p50_ms=([\d.]+)", out)
    if not m:
        raise SystemExit("peers redis failed: " + out)
    return float(m.group(1)), float(m.group(2))


def setstate_message(sid):
    """A SetState (protobuf) for session `sid` in channel h2bench: mic=on."""
    def field(n, data):
        return bytes([n << 3 | 2, len(data)]) + data
    return field(1, sid) + field(2, b"h2bench") + bytes([0x18, 1]) + field(4, field(1, b"mic") + field(2, b"on"))


class SetStateRequest:
    """A session held open (`presencectl join`) and a file with one gRPC-framed SetState for it,
    for h2load to send over and over."""

    def __init__(self, port):
        self.holder = subprocess.Popen([os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", "join", "h2bench", "--user", "h2load", "--quiet"],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.holder.stderr.readline()
        sid = re.search(r"session ([0-9a-f]{16})", line).group(1)
        msg = setstate_message(sid.encode())
        body = tempfile.NamedTemporaryFile(delete=False)
        body.write(b"\x00" + struct.pack(">I", len(msg)) + msg)
        body.close()
        self.body = body.name
        self.url = f"http://127.0.0.1:{port}/presence.v1.Presence/SetState"
        self.headers = ["-H", "content-type: application/grpc", "-H", "te: trailers"]

    def close(self):
        self.holder.stdin.write("leave\n")
        self.holder.stdin.flush()
        self.holder.wait(timeout=10)
        os.unlink(self.body)


def h2load_setstate(port):
    """h2load (50 clients, 1 in flight each) sending one fixed SetState for a session held open."""
    req = SetStateRequest(port)
    try:
        out = subprocess.run(["h2load", "-n", "300000", "-c", "50", "-m", "1", "-t", "1", "-d", req.body, *req.headers, req.url],
                             capture_output=True, text=True, timeout=600).stdout
    finally:
        req.close()
    ok = re.search(r"(\d+) succeeded, (\d+) failed", out)
    if not ok or ok.group(2) != "0":
        raise SystemExit("h2load SetState failed:\n" + out)
    return float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    subprocess.run([os.path.join(ROOT, "Scripts", "ensure-deps"), "--bench"], check=True)
    subprocess.run(["swift", "build", "-c", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    redis, ours, h2, online = [], [], [], []
    p, port = start_node()
    for _ in range(a.runs):
        redis.append(redis_peer())
        ours.append(ctl(port, "bench", "setstate", "--clients", "50", "--duration", "5"))
        h2.append(h2load_setstate(port))
        online.append(ctl(port, "bench", "online-users", "--clients", "50", "--duration", "5"))
    r_rate = statistics.median(x[0] for x in redis)
    r_p50 = statistics.median(x[1] for x in redis)
    o_rate = statistics.median(float(x["rate"]) for x in ours)
    o_p50 = statistics.median(float(x["p50_ms"]) for x in ours)
    o_p99 = statistics.median(float(x["p99_ms"]) for x in ours)
    h2_rate = statistics.median(h2)
    half = ctl(port, "bench", "setstate", "--clients", "50", "--duration", "5", "--rate", str(int(o_rate / 2)))
    on_rate = statistics.median(float(x["rate"]) for x in online)
    p.terminate(); p.wait()
    p, port = start_node("--max-instant-events", "100000")
    fan = ctl(port, "bench", "fanout", "--subscribers", "1000", "--publishers", "4", "--duration", "5", "--connections", "8")
    p.terminate(); p.wait()
    mem = subprocess.run([os.path.join(REL, "presence-bench"), "memory"], capture_output=True, text=True, timeout=900).stdout
    memd = dict(kv.split("=", 1) for kv in mem.split() if "=" in kv)
    print(f"raw: redis={[round(x[0]) for x in redis]} setstate={[round(float(x['rate'])) for x in ours]} h2load_setstate={[round(x) for x in h2]} online={[round(float(x['rate'])) for x in online]}")
    print(f"raw: half={half} fanout={fan} memory={memd}")
    print()
    print("| figure | presenced | peer (same sitting) | ratio |")
    print("|---|---|---|---|")
    print(f"| SetState round trips/s, 50 clients (presencectl bench setstate; median of {a.runs}) | {o_rate:,.0f} (p50 {o_p50:.2f} ms, p99 {o_p99:.2f} ms) | Redis SADD+HSET+PUBLISH script, 50 clients: {r_rate:,.0f} (p50 {r_p50:.2f} ms) | {o_rate / r_rate:.2f} |")
    print(f"| SetState round trips/s, 50 clients, h2load with a fixed request (median of {a.runs}) | {h2_rate:,.0f} | {r_rate:,.0f} | {h2_rate / r_rate:.2f} |")
    print(f"| SetState latency at half load ({int(o_rate / 2):,} calls/s offered) | served {float(half['rate']):,.0f}/s, p50 {float(half['p50_ms']):.2f} ms, p99 {float(half['p99_ms']):.2f} ms | | |")
    print(f"| GetOnlineUsers, full page of 100 with state, 50 clients (median of {a.runs}) | {on_rate:,.0f} calls/s ({on_rate * 100:,.0f} users/s) | | |")
    print(f"| Fan-out: 1,000 presence subscribers, 4 publishers at full speed | {float(fan['deliveries_per_s']):,.0f} deliveries/s ({float(fan['rate']):,.0f} state changes/s) | | |")
    print(f"| Memory: {int(memd['memberships']):,} memberships ({int(memd['users']):,} users x 10 channels) | {float(memd['bytes_per_membership']):.0f} bytes/membership (RSS {memd['rss_before_mib']} -> {memd['rss_after_mib']} MiB) | | |")


if __name__ == "__main__":
    main()
