#!/usr/bin/env python3
"""Cluster benchmarks (issue 4), on loopback with release builds.

  Detection: kill -9 of a node in a 3-node cluster, time until every survivor lists it dead
      (polled through the Admin service every 5 ms); p50/p99 over --kills kills (restarted each time).
  Kill to REMOTE_TIMEOUT: in the same kills, a subscriber on node 0 follows a channel joined by a
      session of the killed node; the time from kill -9 to its REMOTE_TIMEOUT, minus --presence-timeout.
  Idle peer traffic: peer-link requests and bytes received per member per second, 3/5/8 nodes, no clients.
  Routing cost: presencectl bench setstate through a node that does not own the channel (3 nodes)
      versus one node alone; peer: ../shared/bench/peers redis in the same sitting.

  Soak: 3 nodes, both cores saturated for --soak-seconds (default 300): suspicions and deaths logged.

Usage: Scripts/bench-cluster [--kills N] [--runs N] [--idle-seconds S] [--soak-seconds S]
                             [--only kills|idle|routing|soak]       (prints a Markdown table)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import queue
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import PEERS, REL, ROOT, free_port, wait_for_port  # noqa: E402

GEN = tempfile.mkdtemp(prefix="presenced-bench-pygen-")


def stubs():
    from grpc_tools import protoc
    import grpc_tools
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for proto in ("presence.proto", "cluster.proto", "admin.proto"):
        rc = protoc.main(["protoc", f"-I{os.path.join(ROOT, 'Protos')}", f"-I{well_known}",
                          f"--python_out={GEN}", f"--grpc_python_out={GEN}", proto])
        assert rc == 0
    sys.path.insert(0, GEN)


class Cluster:
    def __init__(self, size, *extra, logs=None):
        self.ports = [(free_port(), free_port()) for _ in range(size)]
        self.extra = extra
        self.logs = logs
        self.procs = {}
        for i in range(size):
            self.start(i)

    def start(self, i):
        seeds = ",".join(f"127.0.0.1:{pp}" for j, (_, pp) in enumerate(self.ports) if j != i)
        cp, pp = self.ports[i]
        self.procs[i] = subprocess.Popen(
            [os.path.join(REL, "presenced"), "--node-id", f"node-{i}", "--listen", f"127.0.0.1:{cp}",
             "--peer-listen", f"127.0.0.1:{pp}", "--http-listen", "127.0.0.1:0", "--seeds", seeds, "--log-level", "info" if self.logs else "error", *self.extra],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.logs, f"node-{i}.log"), "a") if self.logs else subprocess.DEVNULL)
        wait_for_port(cp, self.procs[i], f"node-{i}")

    def address(self, i):
        return f"127.0.0.1:{self.ports[i][0]}"

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def admin(grpc, a, ag, address):
    ch = grpc.insecure_channel(address)
    return ch, ag.AdminStub(ch)


def statuses(stub, a):
    r = stub.Members(a.MembersRequest(), timeout=2)
    return {m.node_id: m.status for m in r.members}, r


def wait(what, cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:  # a node still starting
            pass
        time.sleep(0.01)
    raise SystemExit(f"timed out: {what}")


def kills(n_kills, presence_timeout):
    import grpc
    import admin_pb2 as a
    import admin_pb2_grpc as ag
    import presence_pb2 as p
    import presence_pb2_grpc as pg
    c = Cluster(3, "--presence-timeout", str(presence_timeout))
    detect, overhead = [], []
    try:
        chans = [grpc.insecure_channel(c.address(i)) for i in range(3)]
        admins = [ag.AdminStub(ch) for ch in chans]
        everyone = {"node-0", "node-1", "node-2"}
        alive = lambda: all({k for k, s in statuses(admins[i], a)[0].items() if s == 1} == everyone for i in range(3))
        wait("3 nodes alive", alive, 20)
        sub_stub = pg.PresenceStub(chans[0])
        stream = sub_stub.OpenSession(p.OpenSessionRequest(user_id="subscriber"))
        sid = next(stream).opened.session_id
        events = queue.Queue()
        def read():
            try:
                for e in stream:
                    events.put(e)
            except grpc.RpcError:
                pass  # the cluster stopped
        threading.Thread(target=read, daemon=True).start()
        for k in range(n_kills):
            channel = f"bench-kill-{k}"
            sub_stub.Join(p.JoinRequest(session_id=sid, channel_name=channel, channel_type=1, with_presence=True), timeout=5)
            vch = grpc.insecure_channel(c.address(2))
            vstub = pg.PresenceStub(vch)
            vstream = vstub.OpenSession(p.OpenSessionRequest(user_id=f"victim-{k}"))
            vid = next(vstream).opened.session_id
            vstub.Join(p.JoinRequest(session_id=vid, channel_name=channel, channel_type=1), timeout=5)
            while True:
                e = events.get(timeout=10)
                if e.presence.type == p.PRESENCE_EVENT_TYPE_REMOTE_JOIN and e.presence.publisher == f"victim-{k}":
                    break
            killed = time.monotonic()
            c.procs[2].kill()
            c.procs[2].wait()
            seen = {}
            while len(seen) < 2 and time.monotonic() - killed < 10:
                for i in (0, 1):
                    if i not in seen and statuses(admins[i], a)[0].get("node-2") == 3:
                        seen[i] = time.monotonic() - killed
                time.sleep(0.005)
            detect.append(max(seen.values()))
            while True:
                e = events.get(timeout=presence_timeout + 10)
                if e.presence.type == p.PRESENCE_EVENT_TYPE_REMOTE_TIMEOUT and e.presence.publisher == f"victim-{k}":
                    overhead.append(time.monotonic() - killed - presence_timeout)
                    break
            vch.close()
            c.start(2)
            wait("node-2 back", alive, 20)
            time.sleep(0.5)
            print(f"  kill {k + 1}: detected {detect[-1] * 1000:.0f} ms, REMOTE_TIMEOUT at timeout + {overhead[-1] * 1000:.0f} ms", file=sys.stderr)
    finally:
        c.stop()
    return detect, overhead


def idle_traffic(size, seconds):
    import grpc
    import admin_pb2 as a
    import admin_pb2_grpc as ag
    c = Cluster(size)
    try:
        chans = [grpc.insecure_channel(c.address(i)) for i in range(size)]
        admins = [ag.AdminStub(ch) for ch in chans]
        everyone = {f"node-{i}" for i in range(size)}
        wait(f"{size} nodes alive", lambda: all({k for k, s in statuses(s, a)[0].items() if s == 1} == everyone for s in admins), 30)
        time.sleep(3)  # let join gossip settle
        before = [statuses(s, a)[1] for s in admins]
        t0 = time.monotonic()
        time.sleep(seconds)
        after = [statuses(s, a)[1] for s in admins]
        dt = time.monotonic() - t0
        reqs = sum(x.peer_requests_received - y.peer_requests_received for x, y in zip(after, before)) / size / dt
        byts = sum(x.peer_bytes_received - y.peer_bytes_received for x, y in zip(after, before)) / size / dt
        # the Members calls themselves go to the client port, not the peer port
        return reqs, byts
    finally:
        c.stop()


def soak(seconds):
    """3 nodes for `seconds` with both cores saturated (two busy loops at normal priority, plus a
    SetState load through the cluster): counts suspicions and deaths the nodes logged."""
    import grpc
    import admin_pb2 as a
    import admin_pb2_grpc as ag
    logs = tempfile.mkdtemp(prefix="presenced-soak-")
    c = Cluster(3, logs=logs)
    burners = []
    try:
        stub = ag.AdminStub(grpc.insecure_channel(c.address(0)))
        wait("3 nodes alive", lambda: len([1 for s in statuses(stub, a)[0].values() if s == 1]) == 3, 20)
        time.sleep(2)
        marks = {f: os.path.getsize(os.path.join(logs, f)) for f in os.listdir(logs)}
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        load = subprocess.Popen([os.path.join(REL, "presencectl"), "--server", c.address(1), "bench", "setstate",
                                 "--duration", str(seconds), "--clients", "20", "--channel", "soak"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        load.wait(timeout=seconds + 120)
        suspicions = deaths = 0
        for f, start in marks.items():
            with open(os.path.join(logs, f)) as fh:
                fh.seek(start)
                text = fh.read()
            suspicions += text.count("member suspect")
            deaths += text.count("member dead")
        return suspicions, deaths
    finally:
        for b in burners:
            b.kill()
        c.stop()


def ctl(address, *args):
    out = subprocess.run([os.path.join(REL, "presencectl"), "--server", address, *args], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("presencectl failed: " + out.stderr)
    return out.stdout


def setstate(address, channel, duration):
    out = ctl(address, "bench", "setstate", "--duration", str(duration), "--channel", channel)
    return float(re.search(r"rate=([\d.]+)", out).group(1)), out.strip()


def routing(runs, duration):
    single, routed, local, redis = [], [], [], []
    for _ in range(runs):
        c = Cluster(1)
        try:
            single.append(setstate(c.address(0), "bench-setstate", duration)[0])
        finally:
            c.stop()
        c = Cluster(3)
        try:
            import grpc
            import admin_pb2 as a
            import admin_pb2_grpc as ag
            stub = ag.AdminStub(grpc.insecure_channel(c.address(0)))
            wait("3 nodes alive", lambda: len([1 for s in statuses(stub, a)[0].values() if s == 1]) == 3, 20)
            time.sleep(1)
            # a channel node-0 does not own, and one it owns
            remote = next(f"bench-{i}" for i in range(1000) if stub.Ring(a.RingRequest(channel_name=f"bench-{i}", channel_type=1)).channel_owners[0] != "node-0")
            mine = next(f"bench-{i}" for i in range(1000) if stub.Ring(a.RingRequest(channel_name=f"bench-{i}", channel_type=1)).channel_owners[0] == "node-0")
            routed.append(setstate(c.address(0), remote, duration)[0])
            local.append(setstate(c.address(0), mine, duration)[0])
        finally:
            c.stop()
        out = subprocess.run([PEERS, "redis"], capture_output=True, text=True, timeout=600).stdout
        m = re.search(r"rate=([\d.]+)", out)
        redis.append(float(m.group(1)) if m else float("nan"))
    return single, routed, local, redis


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--presence-timeout", type=float, default=2)
    ap.add_argument("--only", choices=["kills", "idle", "routing", "soak"])
    ap.add_argument("--soak-seconds", type=float, default=300)
    args = ap.parse_args()
    subprocess.run([os.path.join(ROOT, "Scripts", "ensure-deps"), "--bench", "--python"], check=True)
    subprocess.run(["swift", "build", "-c", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    stubs()
    rows = []
    med = statistics.median

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

    if args.only in (None, "kills"):
        d, o = kills(args.kills, args.presence_timeout)
        rows.append(f"| detection after kill -9 (3 nodes, {len(d)} kills) | p50 {pct(d, .5) * 1000:.0f} ms, p99 {pct(d, .99) * 1000:.0f} ms, max {max(d) * 1000:.0f} ms | goal p99 <= 1500 ms |")
        rows.append(f"| kill -9 to REMOTE_TIMEOUT beyond --presence-timeout {args.presence_timeout:g} s | p50 +{pct(o, .5) * 1000:.0f} ms, p99 +{pct(o, .99) * 1000:.0f} ms | goal <= +1500 ms |")
    if args.only in (None, "idle"):
        for n in (3, 5, 8):
            r, b = idle_traffic(n, args.idle_seconds)
            rows.append(f"| idle peer traffic, {n} nodes | {r:.1f} requests/s, {b / 1024:.2f} KiB/s received per member | |")
    if args.only in (None, "routing"):
        s, r, l, red = routing(args.runs, 5)
        rows.append(f"| SetState, one node alone (median of {len(s)}) | {med(s):,.0f}/s | Redis {med(red):,.0f}/s: {med(s) / med(red):.2f} |")
        rows.append(f"| SetState through a non-owner, 3 nodes | {med(r):,.0f}/s | {med(r) / med(s):.2f} of one node; Redis {med(r) / med(red):.2f} |")
        rows.append(f"| SetState at the owner, 3 nodes (1 replica copy per write) | {med(l):,.0f}/s | {med(l) / med(s):.2f} of one node |")
    if args.only in (None, "soak"):
        sus, dead = soak(args.soak_seconds)
        rows.append(f"| false suspicions, 3 nodes, {args.soak_seconds:g} s with both cores saturated (2 busy loops + SetState load) | {sus} suspect, {dead} dead | goal 0 |")
    print("| what | measured | peer / goal |")
    print("|---|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
