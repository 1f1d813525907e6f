#!/usr/bin/env python3
"""The performance table of issue 11, every figure next to its peer, in one sitting.

  Scripts/bench-perf [--runs N] [--quick] [--node-args "--threads 1"]

--node-args: flags given to every presenced this starts (each single node, each cluster node,
the fan-out node). Its peers are single-threaded (Redis; nghttpd runs one worker unless told
otherwise): `--node-args "--threads 1"` measures presenced like them, with one event loop.

Rows (each a median of --runs where it is a rate):
  SetState, h2load 50 clients x 1 in flight, one hot channel    vs  Redis DIY presence (peers redis)
  CPU per SetState (the node's utime+stime / calls)              vs  Redis's (single-threaded: 1/rate)
  the HTTP/2 floor of those two rows: nghttpd answering 5 bytes to the same h2load, and Redis's own CPU
  SetState p99 at half of the measured rate (presencectl bench setstate --rate)
  Health/Check under h2load                                      vs  nghttpd (peers http2)
  the same against nghttpd answering 5 bytes to Health's own h2load, and CPU per call of each
  GetOnlineUsers, 100-user page with state, h2load as nghttpd's  vs  nghttpd
  memory per membership, 1 M memberships; time to build them in-process (presence-bench memory)
  memory per idle HTTP/2 connection (10,000 connections)
  CPU per write in a 3-node cluster (summed) vs one node, the same load over 8 channels
  event deliveries/s, 1 channel x 1,000 subscribers
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import REL, ROOT, running_node  # noqa: E402
import bench_presence as bp  # noqa: E402
import bench_transport as bt  # noqa: E402
import bench_cluster as bc  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def kv(text):
    return dict(x.split("=", 1) for x in text.split() if "=" in x)


REDIS_SCRIPT = ("redis.call('SADD','ch:'..ARGV[1],ARGV[2]); redis.call('HSET','st:'..ARGV[1]..':'..ARGV[2],'mic','on'); "
                "return redis.call('PUBLISH','ev:'..ARGV[1],ARGV[2])")


def redis_cpu_per_call(n=300000):
    """Redis's own CPU per call (its utime+stime / calls) under the peer's load (`peers redis`:
    redis-benchmark, 50 clients, the SADD+HSET+PUBLISH script), measured on a server started here."""
    from benchlib import free_port, wait_for_port
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, p, "redis-server")
        c0 = cpu_seconds(p.pid)
        subprocess.run(["redis-benchmark", "-p", str(port), "-q", "-c", "50", "-n", str(n), "-r", "100000", "eval", REDIS_SCRIPT,
                        "0", "lobby", "__rand_int__"], capture_output=True, timeout=600, check=True)
        return (cpu_seconds(p.pid) - c0) / n * 1e6
    finally:
        p.kill()
        p.wait()


def nghttpd_floor(msg, n, clients, streams):
    """The HTTP/2 floor of a row: nghttpd (one worker, nghttp2's own C server) answering a 5-byte
    file to the row's h2load (its clients, streams in flight and gRPC-framed request body and
    headers): a server that does nothing per request. Returns (rate, nghttpd's CPU per request, µs)."""
    from benchlib import free_port, wait_for_port
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "tiny"), "wb") as f:
        f.write(b"\x00" * 5)
    port = free_port()
    p = subprocess.Popen(["nghttpd", "--no-tls", "-d", d, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, p, "nghttpd")
        c0 = cpu_seconds(p.pid)
        rate = h2load_fixed(port, "/tiny", msg, n=n, clients=clients, streams=streams)
        return rate, (cpu_seconds(p.pid) - c0) / n * 1e6
    finally:
        p.kill()
        p.wait()


def h2load_fixed(port, path, msg, n=200000, clients=16, streams=32):
    """h2load with one fixed gRPC request, the parameters nghttpd's peer run uses."""
    body = tempfile.NamedTemporaryFile(delete=False)
    body.write(b"\x00" + len(msg).to_bytes(4, "big") + msg)
    body.close()
    out = subprocess.run(["h2load", "-n", str(n), "-c", str(clients), "-m", str(streams), "-t", "1", "-d", body.name,
                          "-H", "content-type: application/grpc", "-H", "te: trailers", f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, timeout=600).stdout
    os.unlink(body.name)
    ok = re.search(r"(\d+) succeeded, (\d+) failed", out)
    if not ok or ok.group(2) != "0":
        raise SystemExit(f"h2load {path} failed:\n" + out)
    return float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))


def online_users_h2load(port):
    """GetOnlineUsers of a 100-member channel, with state, under h2load."""
    holder = subprocess.Popen([os.path.join(REL, "presencectl"), "--server", f"127.0.0.1:{port}", "bench", "populate",
                               "--channel", "bench-online", "--members", "100"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = holder.stdout.readline()
    if "ready" not in line:
        raise SystemExit("populate failed: " + line)

    def field(n, data):
        return bytes([n << 3 | 2, len(data)]) + data
    msg = field(1, b"bench-online") + bytes([0x10, 1]) + bytes([0x20, 1])  # channel, MESSAGE, include_state
    try:
        return h2load_fixed(port, "/presence.v1.Presence/GetOnlineUsers", msg, n=100000)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def cluster_cpu_per_write(size, duration=5, replication=None, node_args=()):
    """CPU per SetState summed over every node of a `size`-node cluster (replication factor
    `replication`, default min(size, 2)), 50 clients over 8 channels; returns (µs, writes/s)."""
    c = bc.Cluster(size, "--replication-factor", str(replication or min(size, 2)), *node_args)
    try:
        if size > 1:
            time.sleep(3)  # let the members find each other
        pids = [p.pid for p in c.procs.values()]
        before = sum(cpu_seconds(p) for p in pids)
        out = kv(bc.ctl(c.address(0), "bench", "setstate", "--duration", str(duration), "--channels", "8", "--channel", "spread"))
        after = sum(cpu_seconds(p) for p in pids)
        calls = int(out["calls"])
        return (after - before) / calls * 1e6, float(out["rate"])
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one run, 200,000 memberships (a smoke test of the script)")
    ap.add_argument("--node-args", default="", help="flags for every presenced started, e.g. \"--threads 1\"")
    a = ap.parse_args()
    runs = 1 if a.quick else a.runs
    node_args = a.node_args.split()
    subprocess.run([os.path.join(ROOT, "Scripts", "ensure-deps"), "--bench"], check=True)
    subprocess.run(["swift", "build", "-c", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    bc.stubs()
    redis, nghttpd, h2set, cpu, health, online = [], [], [], [], [], []
    redis_cpus, floors, health_floors, health_cpu = [], [], [], []
    for _ in range(runs):
        redis.append(bp.redis_peer()[0])
        redis_cpus.append(redis_cpu_per_call())
        floors.append(nghttpd_floor(bp.setstate_message(b"0123456789abcdef"), 300000, 50, 1))
        health_floors.append(nghttpd_floor(b"", 200000, 16, 32))
        nghttpd.append(bt.nghttpd_rate())
        with running_node(*node_args) as (p, port):
            c0 = cpu_seconds(p.pid)
            rate = bp.h2load_setstate(port)
            cpu.append((cpu_seconds(p.pid) - c0) / 300000 * 1e6)
            h2set.append(rate)
            c0 = cpu_seconds(p.pid)
            health.append(bt.h2load(port))
            health_cpu.append((cpu_seconds(p.pid) - c0) / 200000 * 1e6)
            online.append(online_users_h2load(port))
    r_rate, n_rate = statistics.median(redis), statistics.median(nghttpd)
    s_rate, s_cpu = statistics.median(h2set), statistics.median(cpu)
    with running_node(*node_args) as (_, port):
        half = bp.ctl(port, "bench", "setstate", "--clients", "50", "--duration", "5", "--rate", str(int(s_rate / 2)))
        # the same offered load from h2load (C, 64 clients paced with --rps): the server's share of
        # the latency, without the Swift client's scheduling on the same two cores
        req = bp.SetStateRequest(port)
        try:
            h2_half = bt.latency(req.url, s_rate / 2, body_path=req.body)
        finally:
            req.close()
    # (its peer: nghttpd serving a small file under the same paced h2load. h2load starts its
    # clients together and paces each alike, so the requests come in bursts of 64: this row says
    # what that generator measures of a server that does nothing per request)
    ng, ng_port = bt.start_nghttpd()
    try:
        ng_half = bt.latency(f"http://127.0.0.1:{ng_port}/small", s_rate / 2, grpc=False)
    finally:
        ng.kill()
        ng.wait()
    users = "20000" if a.quick else "100000"
    mem = kv(subprocess.run([os.path.join(REL, "presence-bench"), "memory", "--users", users], capture_output=True, text=True, timeout=900).stdout)
    idle_before, idle_after, per_conn = bt.idle_connections(2000 if a.quick else 10000)
    one_cpu, one_rate = cluster_cpu_per_write(1, node_args=node_args)
    three_cpu, three_rate = cluster_cpu_per_write(3, node_args=node_args)
    with running_node("--max-instant-events", "100000", *node_args) as (_, port):
        fan = bp.ctl(port, "bench", "fanout", "--subscribers", "1000", "--publishers", "4", "--duration", "5", "--connections", "8")
    redis_cpu = 1e6 / r_rate
    redis_measured = statistics.median(redis_cpus)
    floor_rate, floor_cpu = statistics.median(f[0] for f in floors), statistics.median(f[1] for f in floors)
    hf_rate, hf_cpu = statistics.median(f[0] for f in health_floors), statistics.median(f[1] for f in health_floors)
    h_rate, h_cpu = statistics.median(health), statistics.median(health_cpu)
    print(f"raw: redis={[round(x) for x in redis]} nghttpd={[round(x) for x in nghttpd]} h2load_setstate={[round(x) for x in h2set]} "
          f"cpu_us={[round(x, 1) for x in cpu]} redis_cpu_us={[round(x, 1) for x in redis_cpus]} "
          f"floor={[(round(r), round(c, 1)) for r, c in floors]} health_floor={[(round(r), round(c, 2)) for r, c in health_floors]} "
          f"health_cpu_us={[round(x, 2) for x in health_cpu]} health={[round(x) for x in health]} online={[round(x) for x in online]}")
    print(f"raw: half={half} h2load_half={h2_half} memory={mem} idle_kib={idle_before}->{idle_after} one_node=({one_cpu:.1f} us, {one_rate:.0f}/s) "
          f"three_nodes=({three_cpu:.1f} us, {three_rate:.0f}/s) fanout={fan}")
    print()
    if node_args:
        print(f"presenced started with: {' '.join(node_args)}")
    print("| figure | presenced | peer (same sitting) | ratio | goal |")
    print("|---|---|---|---|---|")
    print(f"| SetState, h2load 50 clients x 1 in flight, one hot channel (median of {runs}) | {s_rate:,.0f}/s | Redis DIY presence {r_rate:,.0f}/s | {s_rate / r_rate:.2f} | ≥ 1.5 |")
    print(f"| CPU per SetState (node utime+stime / calls) | {s_cpu:.1f} µs | Redis 1/rate = {redis_cpu:.1f} µs | {s_cpu / redis_cpu:.2f} | ≤ 0.67 |")
    print(f"| HTTP/2 floor of the two rows above: nghttpd answering 5 bytes to the same h2load (median of {runs}) | "
          f"{s_rate / floor_rate:.2f} of its rate, {s_cpu / floor_cpu:.2f}x its CPU | nghttpd {floor_rate:,.0f}/s, {floor_cpu:.1f} µs; "
          f"Redis's own CPU {redis_measured:.1f} µs | nghttpd / Redis: {floor_rate / r_rate:.2f} (rate), {floor_cpu / redis_measured:.2f} (CPU) | |")
    print(f"| SetState p99 at half of the measured rate ({int(s_rate / 2):,}/s offered), presencectl (Swift, 50 clients) | {float(half['p99_ms']):.2f} ms (p50 {float(half['p50_ms']):.2f}, served {float(half['rate']):,.0f}/s) | | | < 1 ms |")
    print(f"| the same, h2load (64 clients, --rps) | {h2_half[2]:.2f} ms (p50 {h2_half[1]:.2f}, served {h2_half[0]:,.0f}/s) | nghttpd, a small file, same h2load: {ng_half[2]:.2f} ms (p50 {ng_half[1]:.2f}) | {h2_half[2] / ng_half[2]:.2f} | < 1 ms |")
    print(f"| Health/Check under h2load (median of {runs}) | {statistics.median(health):,.0f}/s | nghttpd {n_rate:,.0f}/s | {statistics.median(health) / n_rate:.2f} | ≥ 0.9 |")
    print(f"| Health/Check against its floor: nghttpd answering 5 bytes to the same h2load (POST, gRPC-framed body; median of {runs}) | "
          f"{h_rate:,.0f}/s, {h_cpu:.2f} µs CPU per call | nghttpd {hf_rate:,.0f}/s, {hf_cpu:.2f} µs | {h_rate / hf_rate:.2f} (rate), {h_cpu / hf_cpu:.2f}x (CPU) | |")
    print(f"| GetOnlineUsers, 100-user page with state, h2load (median of {runs}) | {statistics.median(online):,.0f}/s | nghttpd {n_rate:,.0f}/s | {statistics.median(online) / n_rate:.2f} | ≥ 0.3 |")
    print(f"| memory per membership ({int(mem['memberships']):,} memberships) | {float(mem['bytes_per_membership']):.0f} B | | | ≤ 200 B |")
    print(f"| time to build {int(mem['memberships']):,} memberships in-process | {float(mem['build_s']):.1f} s | | | ≤ 10 s (1 M) |")
    print(f"| memory per idle HTTP/2 connection | {per_conn / 1024:.1f} KiB | | | ≤ 8 KiB |")
    print(f"| CPU per write, 3-node cluster (summed) vs one node, 50 clients over 8 channels | {three_cpu:.1f} µs vs {one_cpu:.1f} µs | | {three_cpu / one_cpu:.2f} | ≤ 2 |")
    print(f"| event deliveries/s, 1 channel x 1,000 subscribers | {float(fan['deliveries_per_s']):,.0f} | | | ≥ 2 M |")


if __name__ == "__main__":
    main()
