#!/usr/bin/env python3
"""WebSocket benchmarks (issue 10), each next to the gRPC path measured in the same sitting on the same node:

  SetState round trips/s, 50 clients one call in flight each: presencectl bench ws-setstate vs bench setstate
  Fan-out: 1,000 WebSocket sessions in one channel, 4 gRPC publishers changing state at full speed:
      presencectl bench ws-fanout vs bench fanout (1,000 gRPC subscribers)
  Memory per idle session: 2,000 WebSocket sessions vs 2,000 gRPC sessions (node RSS from /metrics)

Usage: Scripts/bench-web [--runs N]   (prints a Markdown table)
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import REL, ROOT, free_port, wait_for_port  # noqa: E402


def node(*extra):
    port, http = free_port(), free_port()
    p = subprocess.Popen([os.path.join(REL, "presenced"), "--node-id", "bench", "--listen", f"127.0.0.1:{port}",
                          "--peer-listen", f"127.0.0.1:{free_port()}", "--http-listen", f"127.0.0.1:{http}", "--log-level", "error", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, p, "presenced")
    wait_for_port(http, p, "presenced http")
    return p, port, http


def ctl(port, http, *args):
    out = subprocess.run([os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", *args, "--http", f"127.0.0.1:{http}"]
                         if args[1].startswith("ws-") or args[1] == "idle" else
                         [os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", *args],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit("presencectl failed: " + out.stderr)
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    subprocess.run([os.path.join(ROOT, "Scripts", "ensure-deps"), "--bench"], check=True)
    subprocess.run(["swift", "build", "-c", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    ws, grpc = [], []
    p, port, http = node()
    for _ in range(a.runs):
        grpc.append(ctl(port, http, "bench", "setstate", "--clients", "50", "--duration", "5"))
        ws.append(ctl(port, http, "bench", "ws-setstate", "--clients", "50", "--duration", "5"))
    p.terminate(); p.wait()
    p, port, http = node("--max-instant-events", "100000")
    gfan = ctl(port, http, "bench", "fanout", "--subscribers", "1000", "--publishers", "4", "--duration", "5", "--connections", "8")
    wfan = ctl(port, http, "bench", "ws-fanout", "--subscribers", "1000", "--publishers", "4", "--duration", "5")
    p.terminate(); p.wait()
    p, port, http = node()
    widle = ctl(port, http, "bench", "ws-idle", "--sockets", "2000")
    p.terminate(); p.wait()
    p, port, http = node()
    gidle = ctl(port, http, "bench", "idle", "--sockets", "2000")
    p.terminate(); p.wait()
    w_rate = statistics.median(float(x["rate"]) for x in ws)
    g_rate = statistics.median(float(x["rate"]) for x in grpc)
    w_p99 = statistics.median(float(x["p99_ms"]) for x in ws)
    g_p99 = statistics.median(float(x["p99_ms"]) for x in grpc)
    print(f"raw: ws={[round(float(x['rate'])) for x in ws]} grpc={[round(float(x['rate'])) for x in grpc]}")
    print(f"raw: ws_fanout={wfan} grpc_fanout={gfan}")
    print(f"raw: ws_idle={widle} grpc_idle={gidle}")
    print()
    print("| figure | WebSocket | gRPC, same sitting | ratio |")
    print("|---|---|---|---|")
    print(f"| SetState round trips/s, 50 clients (median of {a.runs}) | {w_rate:,.0f} (p99 {w_p99:.2f} ms) | {g_rate:,.0f} (p99 {g_p99:.2f} ms) | {w_rate / g_rate:.2f} |")
    wd, gd = float(wfan["deliveries_per_s"]), float(gfan["deliveries_per_s"])
    print(f"| Fan-out: 1,000 subscribers in one channel, 4 publishers | {wd:,.0f} deliveries/s | {gd:,.0f} deliveries/s | {wd / gd:.2f} |")
    wi, gi = float(widle["bytes_per_socket"]), float(gidle["bytes_per_session"])
    print(f"| Memory per idle session (2,000 sessions, node RSS) | {wi / 1024:,.1f} KiB | {gi / 1024:,.1f} KiB | {wi / gi:.2f} |")


if __name__ == "__main__":
    main()
