#!/usr/bin/env python3
"""An A/B of presenced binaries: the same `presencectl bench` load against each, rounds alternating
(A B, B A, ...) so a drift of the noisy VM falls on both, and the node's CPU (utime + stime from
/proc) per call or delivery, which is steadier here than the rate.

    Scripts/ab --rounds 8 /tmp/presenced-before /tmp/presenced-after [--load setstate|fanout|online]
               [--node-args "--threads 1"]   (loads: setstate, fanout, online, online-h2load, health)

Keep a copy of the release binary before a change (`cp .build/release/presenced /tmp/...`), build
the change, and compare the two. Prints each run, then the medians and the change in CPU per call,
and the median of each round's ratio to the first binary (paired within a round, so a drift of the
machine between rounds cancels out).
"""
import argparse
import os
import statistics
import subprocess

import bench_perf
import bench_transport
from benchlib import REL, start_node

LOADS = {
    "setstate": ["bench", "setstate", "--clients", "50", "--duration", "6"],
    "fanout": ["bench", "fanout", "--subscribers", "1000", "--publishers", "4", "--connections", "8", "--duration", "6"],
    "online": ["bench", "online-users", "--clients", "50", "--duration", "6"],
}


# Loads driven by h2load, as Scripts/bench-perf runs them: (run(port) -> rate, calls it sends).
H2LOAD_LOADS = {
    # GetOnlineUsers of a 100-member page with state
    "online-h2load": (bench_perf.online_users_h2load, 100000),
    # grpc.health.v1.Health/Check, 16 connections x 32 in flight
    "health": (bench_transport.h2load, 200000),
}


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(binary, load, node_args=()):
    node, port = start_node("--max-instant-events", "100000", *node_args, binary=binary)
    if load in H2LOAD_LOADS:
        run, calls = H2LOAD_LOADS[load]
        try:
            before = cpu_seconds(node.pid)
            rate = run(port)
            used = cpu_seconds(node.pid) - before
        finally:
            node.terminate()
            node.wait()
        return rate, used / calls * 1e6
    try:
        before = cpu_seconds(node.pid)
        out = subprocess.run([os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", *LOADS[load]],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        used = cpu_seconds(node.pid) - before
    finally:
        node.terminate()
        node.wait()
    line = [l for l in out.splitlines() if l.startswith("bench=")][-1]
    kv = dict(x.split("=", 1) for x in line.split() if "=" in x)
    count = int(kv.get("calls", kv.get("deliveries", "0")))
    return float(kv.get("rate", "0")), used / max(count, 1) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", nargs="+", help="two or more presenced binaries")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--load", choices=sorted([*LOADS, *H2LOAD_LOADS]), default="setstate")
    ap.add_argument("--node-args", default="", help="more flags for every node, e.g. \"--threads 1\"")
    args = ap.parse_args()
    node_args = args.node_args.split()
    results = {b: [] for b in args.binaries}
    for r in range(args.rounds):
        for b in (args.binaries if r % 2 == 0 else args.binaries[::-1]):
            rate, us = one_run(b, args.load, node_args)
            results[b].append((rate, us))
            print(f"round {r} {b}: rate={rate:.0f}/s cpu={us:.2f} us/call", flush=True)
    first = results[args.binaries[0]]
    base = statistics.median(x[1] for x in first)
    for b in args.binaries:
        rate = statistics.median(x[0] for x in results[b])
        us = statistics.median(x[1] for x in results[b])
        paired = statistics.median(x[1] / f[1] for x, f in zip(results[b], first))
        print(f"{b}: median rate {rate:.0f}/s, median node CPU {us:.2f} us/call ({(us / base - 1) * 100:+.1f}% vs first; "
              f"median of the rounds' ratios {(paired - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
