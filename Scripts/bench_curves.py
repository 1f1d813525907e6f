#!/usr/bin/env python3
"""Scaling curves of issue 11, as Markdown tables and PNG plots (matplotlib).

  Scripts/bench-curves [--out docs/perf] [--quick]

  setstate-vs-channel   SetState rate and p99 (50 writers) vs channel size     promise: O(1) per write
  cluster-vs-channel    the same on 3 nodes (replication factor 2): rate and CPU per write, all nodes
  online-vs-channel     GetOnlineUsers (first page, with state) vs channel size promise: O(page)
  fanout-vs-subscribers event deliveries/s vs subscribers of one channel       promise: O(subscribers) per event
  memory-vs-memberships resident bytes per membership vs memberships (in-process)
  memory-vs-connections resident KiB per idle HTTP/2 connection vs connections
  cpu-vs-replication    CPU per write (summed over 3 nodes) vs replication factor 1, 2, 3

Each row is one run; the plots are written to --out (committed in docs/perf, shown in the README).
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import REL, ROOT, running_node  # noqa: E402
import bench_cluster as bc  # noqa: E402
import bench_perf as bpf  # noqa: E402
from bench_presence import ctl  # noqa: E402
import bench_transport as bt  # noqa: E402


def channel_curves(sizes):
    """One node per size: the channel filled with `size` members (with state), then 50 writers
    join it and write, and 8 readers page it."""
    rows = []
    for size in sizes:
        with running_node() as (_, port):
            holder = subprocess.Popen([os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", "bench", "populate",
                                       "--channel", "curve", "--members", str(size)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = holder.stdout.readline()
            if "ready" not in line:
                raise SystemExit(f"populate {size} failed: {line}")
            w = ctl(port, "bench", "setstate", "--clients", "50", "--duration", "4", "--channel", "curve")
            r = ctl(port, "bench", "online-users", "--clients", "8", "--duration", "4", "--channel", "curve", "--members", "0")
            holder.stdin.close()
            holder.wait(timeout=120)
            rows.append((size, float(w["rate"]), float(w["p99_ms"]), float(r["rate"]), float(r["p50_ms"]), float(r["p99_ms"])))
            print(f"channel {size}: setstate {w['rate']}/s p99 {w['p99_ms']} ms; online-users {r['rate']}/s p50 {r['p50_ms']} p99 {r['p99_ms']} ms", flush=True)
    return rows


def fanout_curve(counts):
    rows = []
    for n in counts:
        with running_node("--max-instant-events", "1000000") as (_, port):
            # (one client reads for every subscriber: past ~0.5 M deliveries/s offered to thousands of streams it falls behind
            # and the node cuts it off as a slow reader, so big channels get a paced load)
            pace = ["--rate", str(500_000 // n)] if n >= 3000 else []
            f = ctl(port, "bench", "fanout", "--subscribers", str(n), "--publishers", "4", "--duration", "4",
                    "--connections", str(max(8, n // 400 + 1)), *pace)
            rows.append((n, float(f["deliveries_per_s"]), float(f["rate"])))
            print(f"fanout {n}: {f['deliveries_per_s']} deliveries/s", flush=True)
    return rows


def memory_curve(memberships):
    rows = []
    for m in memberships:
        out = subprocess.run([os.path.join(REL, "presence-bench"), "memory", "--users", str(m // 10)],
                             capture_output=True, text=True, timeout=1200).stdout
        d = bpf.kv(out)
        rows.append((m, float(d["bytes_per_membership"]), float(d["build_s"])))
        print(f"memory {m}: {d['bytes_per_membership']} B/membership, built in {d['build_s']} s", flush=True)
    return rows


def connections_curve(counts):
    rows = []
    for n in counts:
        before, after, per = bt.idle_connections(n)
        rows.append((n, per / 1024, (after - before) / 1024))
        print(f"idle connections {n}: {per / 1024:.1f} KiB each", flush=True)
    return rows


def cluster_channel_curve(sizes):
    """Three nodes, replication factor 2: the channel filled with `size` members through the first
    node, then 50 writers on it; the rate and the CPU per write summed over the nodes (the owner
    and its replica both apply each write: neither may pay per member)."""
    rows = []
    for size in sizes:
        c = bc.Cluster(3, "--replication-factor", "2")
        try:
            time.sleep(3)  # let the members find each other (as bench_perf.cluster_cpu_per_write does)
            holder = subprocess.Popen([os.path.join(REL, "presencectl"), "--server", c.address(0), "bench", "populate",
                                       "--channel", "curve", "--members", str(size)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = holder.stdout.readline()
            if "ready" not in line:
                raise SystemExit(f"populate {size} on 3 nodes failed: {line}")
            pids = [p.pid for p in c.procs.values()]
            before = sum(bpf.cpu_seconds(p) for p in pids)
            w = bpf.kv(bc.ctl(c.address(0), "bench", "setstate", "--clients", "50", "--duration", "4", "--channel", "curve"))
            used = sum(bpf.cpu_seconds(p) for p in pids) - before
            holder.stdin.close()
            holder.wait(timeout=300)
            us = used / max(int(w["calls"]), 1) * 1e6
            rows.append((size, float(w["rate"]), float(w["p99_ms"]), us))
            print(f"3 nodes, channel {size}: setstate {w['rate']}/s p99 {w['p99_ms']} ms, {us:.1f} us CPU per write", flush=True)
        finally:
            c.stop()
    return rows


def replication_curve():
    rows = []
    for rf in (1, 2, 3):
        us, rate = bpf.cluster_cpu_per_write(3, replication=rf)
        rows.append((rf, us, rate))
        print(f"replication {rf}: {us:.1f} us per write, {rate:.0f}/s", flush=True)
    return rows


def plot(path, title, xlabel, xs, series, logx=True, logy=False):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    axes = [ax]
    for i, (label, ys, unit) in enumerate(series):
        a = ax if i == 0 else ax.twinx()
        if i > 0:
            axes.append(a)
        a.plot(xs, ys, marker="o", color=["tab:blue", "tab:red", "tab:green"][i], label=label)
        a.set_ylabel(f"{label} ({unit})", color=["tab:blue", "tab:red", "tab:green"][i])
        a.set_ylim(bottom=0)
        if logy:
            a.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "perf"))
    ap.add_argument("--quick", action="store_true", help="small sizes only (a smoke test of the script)")
    ap.add_argument("--only", default="channel,cluster,fanout,memory,connections,replication",
                    help="the curves to measure now; the others are taken from OUT/curves.json (an earlier run)")
    a = ap.parse_args()
    subprocess.run([os.path.join(ROOT, "Scripts", "ensure-deps"), "--python", "--bench"], check=True)
    subprocess.run(["swift", "build", "-c", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    bc.stubs()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.makedirs(a.out, exist_ok=True)
    q = a.quick
    import json
    saved = os.path.join(a.out, "curves.json")
    results = json.load(open(saved)) if os.path.exists(saved) else {}
    only = set(a.only.split(","))

    def keep(name, rows):
        results[name] = rows
        with open(saved, "w") as f:
            json.dump(results, f, indent=1)
    if "channel" in only:
        keep("channel", channel_curves([10, 100, 1000] if q else [10, 100, 1000, 10000, 100000]))
    if "cluster" in only:
        keep("cluster", cluster_channel_curve([10, 1000] if q else [10, 100, 1000, 10000, 100000]))
    if "fanout" in only:
        # (not 10,000: its joins alone send 50 M REMOTE_JOINs to the one client reading them all,
        # which falls behind and is cut off as a slow reader before the measurement starts)
        keep("fanout", fanout_curve([100, 1000] if q else [100, 300, 1000, 3000, 5000]))
    if "memory" in only:
        keep("memory", memory_curve([10000, 100000] if q else [10000, 100000, 1000000]))
    if "connections" in only:
        # (at most what RLIMIT_NOFILE allows the client and the node: 20,000 on these machines)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 500
        keep("connections", connections_curve([1000, 5000] if q else [n for n in (1000, 5000, 10000, 19000, 50000) if n <= limit]))
    if "replication" in only:
        keep("replication", replication_curve())
    chan, clu, fan, mem, conns, rep = (results[k] for k in ("channel", "cluster", "fanout", "memory", "connections", "replication"))

    plot(os.path.join(a.out, "setstate-vs-channel.png"), "SetState, 50 writers, vs channel size (one node)", "members in the channel",
         [r[0] for r in chan], [("calls/s", [r[1] for r in chan], "/s"), ("p99", [r[2] for r in chan], "ms")])
    plot(os.path.join(a.out, "cluster-vs-channel.png"), "SetState, 50 writers, vs channel size (3 nodes, 2 copies)", "members in the channel",
         [r[0] for r in clu], [("calls/s", [r[1] for r in clu], "/s"), ("CPU per write (all nodes)", [r[3] for r in clu], "µs")])
    plot(os.path.join(a.out, "online-vs-channel.png"), "GetOnlineUsers (first page of 100, with state), 8 readers", "members in the channel",
         [r[0] for r in chan], [("pages/s", [r[3] for r in chan], "/s"), ("p99", [r[5] for r in chan], "ms")])
    plot(os.path.join(a.out, "fanout-vs-subscribers.png"), "Fan-out: one channel, 4 writers (full speed; paced from 3,000 on)", "subscribers",
         [r[0] for r in fan], [("deliveries/s", [r[1] for r in fan], "/s"), ("state changes/s", [r[2] for r in fan], "/s")])
    plot(os.path.join(a.out, "memory-vs-memberships.png"), "Resident memory per membership (in-process)", "memberships",
         [r[0] for r in mem], [("bytes/membership", [r[1] for r in mem], "B"), ("build time", [r[2] for r in mem], "s")])
    plot(os.path.join(a.out, "memory-vs-connections.png"), "Resident memory per idle HTTP/2 connection", "idle connections",
         [r[0] for r in conns], [("per connection", [r[1] for r in conns], "KiB")])
    plot(os.path.join(a.out, "cpu-vs-replication.png"), "CPU per write, 3 nodes, 50 writers over 8 channels", "replication factor",
         [r[0] for r in rep], [("CPU per write (all nodes)", [r[1] for r in rep], "µs"), ("calls/s", [r[2] for r in rep], "/s")], logx=False)

    print()
    print("| members in the channel | SetState calls/s | SetState p99 | GetOnlineUsers pages/s | p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for s, w, wp, r, r50, r99 in chan:
        print(f"| {s:,} | {w:,.0f} | {wp:.2f} ms | {r:,.0f} | {r50:.2f} ms | {r99:.2f} ms |")
    print()
    print("| members in the channel, 3 nodes (replication factor 2) | SetState calls/s | p99 | CPU per write, all nodes |")
    print("|---|---|---|---|")
    for n, w, wp, us in clu:
        print(f"| {n:,} | {w:,.0f} | {wp:.2f} ms | {us:.1f} µs |")
    print()
    print("| subscribers | deliveries/s | state changes/s |")
    print("|---|---|---|")
    for n, d, c in fan:
        print(f"| {n:,} | {d:,.0f} | {c:,.0f} |")
    print()
    print("| memberships | bytes/membership | build time |")
    print("|---|---|---|")
    for m, b, t in mem:
        print(f"| {m:,} | {b:.0f} | {t:.1f} s |")
    print()
    print("| idle connections | KiB each | total |")
    print("|---|---|---|")
    for n, k, t in conns:
        print(f"| {n:,} | {k:.1f} | {t:,.1f} MiB |")
    print()
    print("| replication factor (3 nodes) | CPU per write, all nodes | calls/s |")
    print("|---|---|---|")
    for rf, us, rate in rep:
        print(f"| {rf} | {us:.1f} µs | {rate:,.0f} |")


if __name__ == "__main__":
    main()
