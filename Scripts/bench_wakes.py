#!/usr/bin/env python3
"""Where a cluster write's CPU goes: CPU per write and the node threads' sleeps per write.

  Scripts/bench-wakes [--seconds S]

Runs `presencectl bench setstate` (8 channels, spread) against one node and against the first
of a 3-node cluster (replication factor 2), with 1 client and with 50, with the default loops and
with `--threads 1`, and prints for each: writes/s, CPU per write on each node (utime+stime from
/proc) and summed, and the voluntary context switches of every node thread per write (each is a
thread going to sleep in epoll_wait or on a lock, and so a wake-up to come). With one client every
call finds the node asleep: CPU per sleep is what one sleep and wake-up costs on this machine,
call included. (Threads that end during a run take their counts with them; the nodes' threads
are their loops, which live as long as the node.)
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cluster as bc  # noqa: E402
from benchlib import ROOT  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sleeps(pid):
    total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass  # (a thread that ended meanwhile)
    return total


def measure(nodes, clients, threads_one, seconds):
    extra = ["--threads", "1"] if threads_one else []
    c = bc.Cluster(nodes, "--replication-factor", str(min(nodes, 2)), *extra)
    try:
        time.sleep(3 if nodes > 1 else 0.5)  # (let the members find each other)
        pids = [p.pid for p in c.procs.values()]
        cpu0, sl0 = [cpu_seconds(p) for p in pids], [sleeps(p) for p in pids]
        out = bc.ctl(c.address(0), "bench", "setstate", "--duration", str(seconds), "--clients", str(clients),
                     "--channels", "8", "--channel", "spread")
        cpu1, sl1 = [cpu_seconds(p) for p in pids], [sleeps(p) for p in pids]
    finally:
        c.stop()
    calls = int(re.search(r"calls=(\d+)", out).group(1))
    if calls == 0:
        raise SystemExit(f"no calls answered: {out}")
    rate = float(re.search(r"rate=(\d+)", out).group(1))
    cpu = [(b - a) / calls * 1e6 for a, b in zip(cpu0, cpu1)]
    slp = [(b - a) / calls for a, b in zip(sl0, sl1)]
    return rate, cpu, slp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    a = ap.parse_args()
    subprocess.run(["swift", "build", "-c", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    print("| nodes | clients | loops | writes/s | CPU µs per write (each node) | summed | sleeps per write (each node) | summed | CPU µs per sleep |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads_one in (True, False):
        for clients in (1, 50):
            for nodes in (1, 3):
                rate, cpu, slp = measure(nodes, clients, threads_one, a.seconds)
                per_sleep = sum(cpu) / sum(slp) if sum(slp) > 0.05 else float("nan")
                print(f"| {nodes} | {clients} | {'1' if threads_one else 'default'} | {rate:,.0f} | "
                      f"{', '.join(f'{x:.1f}' for x in cpu)} | {sum(cpu):.1f} | {', '.join(f'{x:.2f}' for x in slp)} | "
                      f"{sum(slp):.2f} | {per_sleep:.0f} |", flush=True)


if __name__ == "__main__":
    main()
