"""The seeded fault schedule (RELIABILITY.md, "The fault model"), one fault at a time, and the
membership convergence measured after each (invariant 6).

Kinds (durations scale with --presence-timeout T):
  crash0          kill -9, restarted with the same id and ports after 0.2 s (faster than detection)
  crash3          kill -9, restarted after 3 s
  crashforever    kill -9, not restarted (only while at least 3 other nodes run and no other node is
                  down for good); a later slot may bring it back ("rejoin"), and the end of the run does
  rolling         SIGTERM (graceful leave), bounded wait for the exit, started again with the same id
  rollall         (not in the default set) a whole rolling update: every node in turn, as above,
                  each after the cluster converged (bounded)
  pause-short     SIGSTOP for 1.5 s, then SIGCONT (shorter than T)
  pause-long      SIGSTOP for T + 2 s
  partition-short one node's link down for T/2 (netns only)
  partition-long  one node's link down for T + 2 s (netns only)
  linkcut-short   the A<->B link only (blackhole routes), T/2 (netns only)
  linkcut-long    the same for T + 2 s (netns only)
  peerscut-short  one node cut off from every other node (blackhole routes to each) while its clients
                  still reach it, T/2 (netns only)
  peerscut-long   the same for T + 2 s (netns only)
  slow            one node's peer link through the proxy at 50 ms ± 20 ms per chunk and 5% ~200 ms
                  stalls, for 6 s

A fault starts every 6-9 s (seeded) after the previous one started, but never before the previous
one ended and the cluster converged (or the 10 s bound on that passed)."""
import random
import threading
import time

import grpc

from clock import now

DEFAULT_KINDS = ["crash0", "crash3", "crashforever", "rolling", "pause-short", "pause-long", "partition-short",
                 "partition-long", "linkcut-short", "linkcut-long", "peerscut-short", "peerscut-long", "slow"]
ALL_KINDS = DEFAULT_KINDS + ["rollall"]
NETNS_ONLY = {"partition-short", "partition-long", "linkcut-short", "linkcut-long", "peerscut-short", "peerscut-long"}
CONVERGENCE_BOUND = 3.0      # invariant 6
CONVERGENCE_WAIT = 10.0      # how long we keep measuring past the bound

ADMIN_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 100),
                 ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]


class Fault:
    def __init__(self, kind, nodes, t_start):
        self.kind = kind
        self.nodes = nodes             # node ids concerned
        self.client_nodes = []         # node indices whose clients lose their connection
        self.cut_off = []              # node indices cut off from every other node, clients still in reach
        self.t_start = t_start
        self.t_end = None
        self.convergence = None        # seconds from t_end until one membership view (None: not within the wait)
        self.views = None              # the membership views when it did not converge in time
        self.trace = []                # while converging: when each node stopped answering or disagreeing
        self.notes = []

    def label(self):
        return f"{self.kind} {','.join(self.nodes)}"

    def trace_lines(self):
        """The convergence trace as text: when which nodes lagged, and why."""
        return [f"+{at:.2f}s lagging: " + ("; ".join(f"{n}: {w}" for n, w in sorted(lagging.items())) or "none")
                for at, lagging in self.trace]

    def describe(self):
        end = f"{self.t_end:.2f}s" if self.t_end is not None else "?"
        conv = f"converged in {self.convergence:.2f}s" if self.convergence is not None else "NOT converged"
        out = f"{self.t_start:8.2f}s..{end:>8}  {self.label()}  ({conv})"
        if self.notes:
            out += "  " + "; ".join(self.notes)
        return out

    def to_json(self):
        return {"kind": self.kind, "nodes": self.nodes, "t_start": round(self.t_start, 3),
                "t_end": None if self.t_end is None else round(self.t_end, 3),
                "convergence_s": None if self.convergence is None else round(self.convergence, 3),
                "notes": self.notes}


class Admin:
    """Admin.Members / Admin.Ring on every node, through connections of their own."""

    def __init__(self, env):
        self.env = env
        self.chans = {}

    def stub(self, node):
        ch = self.chans.get(node.index)
        if ch is None:
            ch = self.chans[node.index] = grpc.insecure_channel(node.client_address, options=ADMIN_OPTIONS)
        return self.env.ag.AdminStub(ch)

    def view(self, node, why=None):
        """(alive node ids, ring member ids) as the node sees them, or None if it does not answer
        (then `why` gets the reason, and the node's connection is dropped: one that went through a
        network fault may sit in TCP's retransmission backoff for seconds after the fault ends,
        which says nothing of the node's view)."""
        try:
            stub = self.stub(node)
            members = stub.Members(self.env.a.MembersRequest(), timeout=0.8)
            ring = stub.Ring(self.env.a.RingRequest(channel_name="ch-0", channel_type=1, user_id="u00"), timeout=0.8)
        except grpc.RpcError as e:
            if why is not None:
                why.append(e.code().name if hasattr(e, "code") else "error")
            ch = self.chans.pop(node.index, None)
            if ch is not None:
                ch.close()
            return None
        alive = frozenset(m.node_id for m in members.members if m.status == 1)
        return alive, frozenset(ring.ring_members)

    def converged(self, nodes, lagging=None):
        """Whether every node reports the alive membership and ring `nodes`, and the views; `lagging`
        (if given) gets, per node that does not, why: the error it answered with, or its view."""
        expected = frozenset(n.node_id for n in nodes)
        views = {}
        for n in nodes:
            why = []
            v = self.view(n, why)
            views[n.node_id] = v
            if lagging is not None and (v is None or v[0] != expected or v[1] != expected):
                lagging[n.node_id] = f"no answer ({why[0]})" if v is None else \
                    f"alive={','.join(sorted(v[0]))} ring={','.join(sorted(v[1]))}"
        ok = all(v is not None and v[0] == expected and v[1] == expected for v in views.values())
        return ok, views

    def measure(self, nodes, since, wait=CONVERGENCE_WAIT, abort=None, trace=None):
        """Seconds from `since` until every node reports the same alive membership and ring (the
        set of `nodes`); None if that did not happen within `wait`. `trace` (if given) gets each
        change in which nodes lag and why, as (seconds since `since`, {node: why})."""
        views = {}
        last = None
        while now() - since < wait:
            if abort is not None and abort.is_set():
                return None, views
            lagging = {}
            ok, views = self.converged(nodes, lagging)
            if trace is not None and lagging != last:
                trace.append((round(now() - since, 2), lagging))
                last = lagging
            if ok:
                return max(0.0, now() - since), views
            time.sleep(0.15)
        return None, views

    def close(self):
        for ch in self.chans.values():
            ch.close()
        self.chans.clear()


def format_views(views):
    out = []
    for nid, v in sorted(views.items()):
        if v is None:
            out.append(f"{nid}: no answer")
        else:
            out.append(f"{nid}: alive={','.join(sorted(v[0]))} ring={','.join(sorted(v[1]))}")
    return "; ".join(out)


class Faults:
    def __init__(self, env, kinds, timeout, gap=(6.0, 9.0)):
        self.env = env
        self.cluster = env.cluster
        self.rng = random.Random(f"faults-{env.seed}")
        self.kinds = kinds
        self.timeout = timeout
        self.gap = gap
        self.history = []
        self.down_forever = {}     # node index -> when it was killed
        self.admin = Admin(env)
        self.lock = threading.Lock()
        self.current = None

    # ---- what clients and checks ask

    def break_origin(self, node_index, t):
        """When a stream to `node_index` that the client saw break at `t` really stopped working:
        the start of a fault on that node in force then (or just ended), else `t` itself."""
        if t is None:
            return now()
        with self.lock:
            faults = list(self.history) + ([self.current] if self.current else [])
        best = t
        for f in faults:
            if node_index in f.client_nodes and f.t_start <= t and (f.t_end is None or f.t_end >= t - 1.5):
                best = min(best, f.t_start)
        return best

    def during(self, t0, t1, margin=3.0):
        """The faults overlapping [t0, t1] (a fault counts until `margin` s after it ended)."""
        with self.lock:
            faults = list(self.history) + ([self.current] if self.current else [])
        out = []
        for f in faults:
            end = (f.t_end if f.t_end is not None else now()) + margin
            if f.t_start <= t1 and end >= t0:
                out.append(f)
        return out

    # ---- the schedule

    def hold(self, seconds):
        self.env.aborted.wait(seconds)

    def eligible(self):
        """Nodes a fault may hit now: running, reachable, not down for good."""
        return [n for n in self.cluster.reachable() if n.index not in self.down_forever]

    def choose(self):
        n = self.cluster.n
        live = self.eligible()
        floor = min(3, n - 1)
        can_take_one_out = len(live) - 1 >= floor
        options = []
        for k in self.kinds:
            if k in ("crash0", "crash3", "rolling", "pause-short", "pause-long", "partition-short", "partition-long",
                     "peerscut-short", "peerscut-long"):
                if can_take_one_out:
                    options.append(k)
            elif k == "crashforever":
                if not self.down_forever and len(live) - 1 >= 3:
                    options.append(k)
            elif k in ("linkcut-short", "linkcut-long"):
                if len(live) >= 3:
                    options.append(k)
            elif k == "slow":
                if self.cluster.proxy is not None and live:
                    options.append(k)
            elif k == "rollall":
                options.append(k)
        # a node killed for good comes back in a later slot, half the time once it has been away 15 s
        for idx, t in self.down_forever.items():
            if now() - t > 15 and self.rng.random() < 0.5:
                return "rejoin"
        if not options:
            return None
        return self.rng.choice(options)

    def run(self, until):
        """Injects faults until run time `until` (or until stopped)."""
        env = self.env
        next_start = now()
        while not env.stopped.is_set() and not env.aborted.is_set():
            wait = next_start - now()
            if wait > 0 and env.stopped.wait(wait):
                break
            if now() >= until:
                break
            kind = self.choose()
            if kind is None:
                next_start = now() + 1.0
                continue
            fault = self.perform(kind)
            next_start = max(fault.t_start + self.rng.uniform(*self.gap), now() + 1.0)

    def perform(self, kind):
        env, cluster = self.env, self.cluster
        live = self.eligible()
        fault = Fault(kind, [], now())
        with self.lock:
            self.current = fault
        env.log(f"fault: {kind} starting")
        try:
            if kind == "rejoin":
                idx = sorted(self.down_forever)[0]
                node = cluster.nodes[idx - 1]
                fault.nodes = [node.node_id]
                del self.down_forever[idx]
                cluster.start(node)
            elif kind == "rollall":
                fault.nodes = [n.node_id for n in live]
                for node in live:
                    took, rc, killed = node.terminate(12.0)
                    fault.notes.append(f"{node.node_id} exited in {took:.1f}s (rc={rc}{', killed' if killed else ''})")
                    fault.client_nodes.append(node.index)
                    cluster.start(node)
                    conv, _ = self.admin.measure(self.eligible(), now(), wait=10.0, abort=env.aborted)
                    fault.notes.append(f"{node.node_id} back, converged {'in %.1fs' % conv if conv is not None else 'NOT in 10s'}")
            else:
                node = self.rng.choice(live)
                fault.nodes = [node.node_id]
                if kind in ("crash0", "crash3"):
                    fault.client_nodes = [node.index]
                    node.kill9()
                    self.hold(0.2 if kind == "crash0" else 3.0)
                    cluster.start(node)
                elif kind == "crashforever":
                    fault.client_nodes = [node.index]
                    node.kill9()
                    self.down_forever[node.index] = now()
                elif kind == "rolling":
                    fault.client_nodes = [node.index]
                    took, rc, killed = node.terminate(12.0)
                    fault.notes.append(f"exited in {took:.1f}s (rc={rc}{', had to kill -9' if killed else ''})")
                    cluster.start(node)
                elif kind in ("pause-short", "pause-long"):
                    fault.client_nodes = [node.index]
                    node.pause()
                    self.hold(1.5 if kind == "pause-short" else self.timeout + 2.0)
                    node.resume()
                elif kind in ("partition-short", "partition-long"):
                    fault.client_nodes = [node.index]
                    cluster.partition(node, True)
                    try:
                        self.hold(self.timeout / 2 if kind == "partition-short" else self.timeout + 2.0)
                    finally:
                        cluster.partition(node, False)
                elif kind in ("linkcut-short", "linkcut-long"):
                    other = self.rng.choice([n for n in live if n is not node])
                    fault.nodes.append(other.node_id)
                    cluster.linkcut(node, other, True)
                    try:
                        self.hold(self.timeout / 2 if kind == "linkcut-short" else self.timeout + 2.0)
                    finally:
                        cluster.linkcut(node, other, False)
                elif kind in ("peerscut-short", "peerscut-long"):
                    fault.cut_off = [node.index]
                    others = [n for n in cluster.nodes if n is not node]
                    try:
                        for other in others:
                            cluster.linkcut(node, other, True)
                        self.hold(self.timeout / 2 if kind == "peerscut-short" else self.timeout + 2.0)
                    finally:
                        for other in others:
                            if (node.index, other.index) in cluster.cuts:
                                cluster.linkcut(node, other, False)
                elif kind == "slow":
                    cluster.slow(node, True)
                    try:
                        self.hold(6.0)
                    finally:
                        cluster.slow(node, False)
                else:
                    raise ValueError(f"unknown fault kind {kind}")
        finally:
            fault.t_end = now()
            with self.lock:
                self.history.append(fault)
                self.current = None
        env.log(f"fault: {fault.label()} ended after {fault.t_end - fault.t_start:.1f}s; measuring convergence")
        if not env.aborted.is_set():
            fault.convergence, views = self.admin.measure(self.eligible(), fault.t_end, abort=env.aborted, trace=fault.trace)
            if fault.convergence is None or fault.convergence > CONVERGENCE_BOUND:
                fault.views = format_views(views) if views else "no views"
            if fault.convergence is None or fault.convergence > 1.0:
                for line in fault.trace_lines():
                    env.log(f"fault: {fault.label()}: {line}")
            env.log(f"fault: {fault.label()}: " + (f"converged in {fault.convergence:.2f}s" if fault.convergence is not None
                                                   else f"NOT converged within {CONVERGENCE_WAIT:.0f}s: {fault.views}"))
        return fault

    def end_all(self):
        """Before the final checks: nothing injected any more, every node back (documented choice:
        nodes killed for good are restarted, so that every node of the cluster is checked).
        Returns the rejoin faults it made."""
        made = []
        for idx in sorted(self.down_forever):
            node = self.cluster.nodes[idx - 1]
            fault = Fault("rejoin(end)", [node.node_id], now())
            self.cluster.start(node)
            fault.t_end = now()
            with self.lock:
                self.history.append(fault)
            made.append(fault)
        self.down_forever.clear()
        return made
