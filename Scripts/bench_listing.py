#!/usr/bin/env python3
"""GetOnlineUsers with pages kept encoded, against the same node keeping none and against nghttpd.

  Scripts/bench-listing [--runs N] [--before DIR]

Each round, interleaved: nghttpd under h2load (peers http2); a release node with `--listing-cache 0`;
one with the default cache; and, with --before, the presenced binary in DIR (an older build, for an
A/B) — GetOnlineUsers of a 100-user page with state under h2load, and SetState under h2load for the
nodes with a cache. Prints the raw rates and their medians as ratios of nghttpd's.
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import bench_perf as perf  # noqa: E402
import bench_presence as bp  # noqa: E402
import bench_transport as bt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", help="a directory holding an older presenced binary to compare with")
    a = ap.parse_args()
    subprocess.run([os.path.join(benchlib.ROOT, "Scripts", "ensure-deps"), "--bench"], check=True)
    subprocess.run(["swift", "build", "-c", "release"], cwd=benchlib.ROOT, check=True, stdout=subprocess.DEVNULL)
    built = benchlib.REL
    nodes = ([("before", a.before, ())] if a.before else []) + [("no cache", built, ("--listing-cache", "0")), ("kept", built, ())]
    rates = {"nghttpd": []} | {label: [] for label, _, _ in nodes}
    setstate = {label: [] for label, _, extra in nodes if not extra}
    for _ in range(a.runs):
        rates["nghttpd"].append(bt.nghttpd_rate())
        for label, rel, extra in nodes:
            benchlib.REL = rel  # (start_node reads it on each start)
            try:
                with benchlib.running_node(*extra) as (_, port):
                    rates[label].append(perf.online_users_h2load(port))
                    if label in setstate:
                        setstate[label].append(bp.h2load_setstate(port))
            finally:
                benchlib.REL = built
    n = statistics.median(rates["nghttpd"])
    print("raw GetOnlineUsers/s:", {k: [round(x) for x in v] for k, v in rates.items()})
    print("raw SetState/s:", {k: [round(x) for x in v] for k, v in setstate.items()})
    for label, _, _ in nodes:
        m = statistics.median(rates[label])
        print(f"GetOnlineUsers {label}: {m:,.0f}/s = {m / n:.2f} of nghttpd {n:,.0f}/s")
    for label, v in setstate.items():
        print(f"SetState {label}: {statistics.median(v):,.0f}/s")


if __name__ == "__main__":
    main()
