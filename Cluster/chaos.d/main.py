"""Cluster/chaos: runs N presenced processes, drives model clients against them under a seeded
schedule of faults, then checks every invariant of RELIABILITY.md (see README, "Cluster/chaos")."""
import argparse
import atexit
import collections
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

import grpc

import clock
from clock import now
import protos
from checker import INVARIANTS, Checker, EventIndex, GhostSampler, Violation
from clients import UserClient
from faults import ALL_KINDS, DEFAULT_KINDS, NETNS_ONLY, Admin, Faults, format_views
from model import Model
from machine import MachineLoad
from nodes import Cluster, can_use_netns
import report

ROOT = protos.ROOT
CI_RUNS = [
    # (mode, seed, seconds, faults): about 1.5 min each on a 2-core machine
    ("loopback", 1, 45, "crash0,crash3,rolling,pause-short,pause-long,slow"),
    ("netns", 2, 40, "partition-short,partition-long,linkcut-short,linkcut-long,crash0,pause-long"),
]


class Notes:
    """SDK-level notes per device (breaks, resumes, losses), for the histories."""

    def __init__(self):
        self.by_device = collections.defaultdict(list)

    def add(self, device, t, text):
        self.by_device[device].append((t, text))

    def get(self, device, default):
        return self.by_device.get(device, default) if device else default

    def get_user(self, user):
        if not user:
            return []
        out = []
        for d, items in self.by_device.items():
            if d.split("/")[0] == user:
                out += [(t, f"{d} {x}") for t, x in items]
        return out


class Env:
    """What the parts of one run share."""

    def __init__(self, opts, mode, seed, cluster, ns):
        self.opts = opts
        self.mode = mode
        self.seed = seed
        self.cluster = cluster
        self.p, self.pg, self.a, self.ag = ns.p, ns.pg, ns.a, ns.ag
        self.timeout = opts.presence_timeout
        self.model = Model(opts.presence_timeout)
        self.stats = collections.Counter()
        self.stopped = threading.Event()    # no more operations, no more faults
        self.finished = threading.Event()   # device threads end
        self.aborted = threading.Event()    # Ctrl-C / error: cut every wait short
        self.faults = None
        self.channels = [(f"ch-{i}", 1 if i < max(1, opts.channels - 2) else 2) for i in range(opts.channels)]
        self.user_ids = [f"u{i:02d}" for i in range(opts.clients)]
        self.clients = []
        self.devices = []
        self.resume_attempts = []
        self.losses = []
        self.watch_answers = collections.defaultdict(list)
        self.attachments = {}               # sid -> [(t, node index)] every stream it had
        self.session_notes = Notes()
        self.errors = []
        self.final_convergence = None
        self.repair = None
        self.ghost_samples = 0
        self.machine = {}
        self._sampler_chans = {}
        self.verbose = opts.verbose
        self.lock = threading.Lock()

    def log(self, msg, always=False):
        line = f"[{now():7.2f}s] {msg}"
        if self.verbose or always:
            print(line, flush=True)
        with open(os.path.join(self.cluster.workdir, "chaos.log"), "a") as f:
            f.write(line + "\n")

    def harness_error(self, msg):
        self.errors.append(msg)
        self.log(f"HARNESS ERROR: {msg}", always=True)

    def sampler_channel(self, node):
        ch = self._sampler_chans.get(node.index)
        if ch is None:
            ch = self._sampler_chans[node.index] = grpc.insecure_channel(
                node.client_address, options=[("grpc.use_local_subchannel_pool", 1)])
        return ch

    # ---- what the clients report

    def note_break(self, dev, node, code, moved):
        self.stats["breaks"] += 1
        why = "moved away (calls failed there)" if moved else f"stream broke ({code.name if code else 'ended'})"
        self.session_notes.add(dev.name, now(), f"s={(dev.sid or '-')[:8]} on node-{node}: {why}")

    def record_resume_attempt(self, dev, sid, node, t0, t1, outcome, code, origin):
        r = {"device": dev.name, "user": dev.user.uid, "sid": sid, "node": f"node-{node}", "t0": t0, "t1": t1,
             "outcome": outcome, "code": code.name if code else None, "origin": origin, "broken_at": dev.broken_at}
        with self.lock:
            self.resume_attempts.append(r)
        text = f"resume s={(sid or '-')[:8]} on node-{node}: {outcome}" + (f" ({r['code']})" if r["code"] else "") + f" after {t1 - t0:.2f}s"
        self.session_notes.add(dev.name, t0, text)

    def record_loss(self, dev, sid, origin, t, reason):
        with self.lock:
            self.losses.append({"device": dev.name, "user": dev.user.uid, "sid": sid, "origin": origin, "t": t, "reason": reason})
        self.session_notes.add(dev.name, t, f"session s={(sid or '-')[:8]} lost: {reason}")

    def call_finished(self, rec):
        self.stats["calls"] += 1

    def watch_done(self, dev, sid, rec, add, remove):
        statuses = {e.user_id: e.status for e in rec.response.statuses} if rec.response is not None else {}
        self.watch_answers[sid].append((rec.t1, sid, statuses))


# ------------------------------------------------------------------------------------------------
# cleanup on every exit path

_CLUSTERS = []


def _cleanup():
    while _CLUSTERS:
        c = _CLUSTERS.pop()
        try:
            c.teardown()
        except Exception as e:   # keep going: remove as much as possible
            print(f"chaos: cleanup: {e!r}", file=sys.stderr)


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_cleanup():
    atexit.register(_cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


# ------------------------------------------------------------------------------------------------


class ClusterDidNotForm(Exception):
    pass


def form_cluster(env, cluster, admin):
    """Starts the nodes one at a time (as a StatefulSet does), each once the previous ones see each
    other: a node that starts when no seed runs yet serves alone until one answers."""
    for k, node in enumerate(cluster.nodes, start=1):
        cluster.start(node)
        if not node.wait_listening(15.0):
            raise RuntimeError(f"{node.node_id} did not start:\n{node.log_tail()}")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            v = admin.view(node)
            if v is not None and len(v[0]) >= k:
                break
            time.sleep(0.05)


def wait_all_connected(env, bound):
    deadline = time.monotonic() + bound
    for dev in env.devices:
        while dev.sid is not None and dev.state != "connected" and time.monotonic() < deadline:
            time.sleep(0.1)
    return [d.name for d in env.devices if d.sid is not None and d.state != "connected"]


def run_once(opts, ns, mode, seed, seconds, kinds):
    """One run: returns (summary dict, violations list)."""
    clock.reset()
    workdir = tempfile.mkdtemp(prefix=f"presenced-chaos-{mode}-")
    use_proxy = not opts.no_proxy
    cluster = Cluster(opts.nodes, mode, opts.bin, workdir, opts.presence_timeout, opts.rf, use_proxy=use_proxy, seed=seed)
    _CLUSTERS.append(cluster)
    env = Env(opts, mode, seed, cluster, ns)
    checker = Checker(env)
    out = print
    out(f"chaos: {mode}, seed {seed}, {opts.nodes} nodes, faults for {seconds:.0f}s: {','.join(kinds)}; logs in {workdir}", flush=True)
    load = MachineLoad(lambda: [n.proc.pid for n in cluster.nodes if n.running()] +
                       ([cluster.proxy.proc.pid] if cluster.proxy else []))
    load.begin()
    try:
        cluster.setup()
        admin = Admin(env)
        form_cluster(env, cluster, admin)
        conv, views = admin.measure(cluster.nodes, now(), wait=30.0, abort=env.aborted)
        if conv is None:
            # not a fault of ours: the nodes, started one by one, did not become one cluster
            checker.add(Violation(6, "the cluster did not form: started one by one, the nodes did not become one "
                                     "membership within 30 s (run aborted)", [f"views: {format_views(views)}"], t=now()))
            env.log(f"the cluster did not form within 30 s: {format_views(views)}", always=True)
            raise ClusterDidNotForm()
        env.log(f"cluster formed ({round(conv, 2)}s)", always=True)

        # the clients: users u00.., every third with two devices, devices spread over the nodes
        for i, uid in enumerate(env.user_ids):
            c = UserClient(env, uid, 2 if i % 3 == 0 else 1)
            env.clients.append(c)
            env.devices.extend(c.devices)
        for k, dev in enumerate(env.devices):
            dev.preferred = cluster.nodes[k % opts.nodes].index
        for c in env.clients:
            c.start()
        env.faults = Faults(env, kinds, opts.presence_timeout, gap=opts.fault_every)
        t_open = time.monotonic()
        while any(d.sid is None for d in env.devices) and time.monotonic() - t_open < 30:
            time.sleep(0.1)
        sampler = GhostSampler(env, checker)
        sampler.start()
        env.aborted.wait(3.0)   # warm-up under load, no faults
        t_faults = now()
        until = t_faults + seconds
        env.log(f"faults from {t_faults:.1f}s to {until:.1f}s", always=True)
        fault_thread = threading.Thread(target=env.faults.run, args=(until,), name="faults", daemon=True)
        fault_thread.start()
        last_progress = now()
        while fault_thread.is_alive():
            fault_thread.join(1.0)
            if now() - last_progress >= 15:
                last_progress = now()
                out(f"  [{now():6.1f}s] faults so far {len(env.faults.history)}, calls {env.stats['calls']}, "
                    f"stream breaks {env.stats['breaks']}, sessions lost {len(env.losses)}", flush=True)
            if now() > until + 90:
                env.harness_error("the fault thread did not finish in time")
                env.aborted.set()
                break
        for f in env.faults.history:
            out(f"  fault {f.describe()}", flush=True)

        # ---- the quiet period
        env.stopped.set()
        t_quiet = now()
        cluster.heal_everything()
        rejoined = env.faults.end_all()
        for c in env.clients:
            c.thread.join(timeout=max(1.0, 45 - (now() - t_quiet)))
            if c.thread.is_alive():
                env.harness_error(f"worker {c.uid} did not stop within 45 s")
        unconnected = wait_all_connected(env, env.timeout + 12)
        if unconnected:
            env.log(f"devices without a stream at the end: {', '.join(unconnected)}", always=True)
        conv, views = admin.measure(cluster.live(), now(), abort=env.aborted)
        for f in rejoined:
            f.convergence = conv
        env.final_convergence = {"seconds": None if conv is None else round(conv, 3), "views": None if conv is not None and conv <= 3 else format_views(views)}
        final_conv = (conv, format_views(views), now())
        # settle (presence timeout + 5 s), measuring when every node's listings first match the model
        settle_start = now()
        settle = opts.presence_timeout + 5.0
        first_match = {}
        while now() - settle_start < settle and not env.aborted.is_set():
            t = now()
            expected = {ch: env.model.listing(ch) for ch in env.channels}
            for node in cluster.live():
                got = checker.quick_listing(node, env.channels)
                if got is not None and all(
                        {u: s for u, s in got[ch].items() if not env.model.tainted(u, ch)} ==
                        {u: s for u, s in expected[ch].items() if not env.model.tainted(u, ch)} for ch in env.channels):
                    first_match.setdefault(node.node_id, round(t - t_quiet, 2))
                else:
                    first_match.pop(node.node_id, None)
            env.aborted.wait(1.0)
        env.repair = {"nodes_matching_model_since_s": first_match,
                      "all_nodes_match": len(first_match) == len(cluster.live()),
                      "quiet_to_all_matching_s": max(first_match.values()) if len(first_match) == len(cluster.live()) and first_match else None}
        t_check = now()
        env.log("checking every node", always=True)
        reads = {node.node_id: checker.read_node(node, env.user_ids + ["never-1", "never-2"], env.channels) for node in cluster.live()}
        checker.check_nodes(reads, env.user_ids + ["never-1", "never-2"], env.channels, t_check)
        checker.check_events(env.devices, env.channels, t_check)
        checker.check_watches(env.devices, env.watch_answers, t_check)
        checker.check_resumes(env.resume_attempts, env.losses, env.timeout)
        checker.check_convergence(env.faults.history, final_conv)
        checker.check_calls(env.model.calls, env.faults.history if env.faults else ())
        checker.check_exits(cluster.nodes)
        env.ghost_samples = sampler.samples
        checker.attach_histories(EventIndex(env.devices), env.faults.history, env.devices)
    except KeyboardInterrupt:
        env.aborted.set()
        raise
    except ClusterDidNotForm:
        env.aborted.set()
    except Exception:
        env.aborted.set()
        env.harness_error(traceback.format_exc())
    finally:
        load.finish()
        env.machine = load.summary()
        env.stopped.set()
        env.finished.set()
        env.aborted.set()
        for dev in env.devices:
            if dev.call is not None:
                dev.call.cancel()
        for dev in env.devices:
            if dev.thread is not None:
                dev.thread.join(timeout=3)
            dev.close_channels()
        for ch in env._sampler_chans.values():
            ch.close()
        if env.faults:
            env.faults.admin.close()
        try:
            admin.close()
        except NameError:
            pass
        cluster.teardown()
        if cluster in _CLUSTERS:
            _CLUSTERS.remove(cluster)
        if opts.keep_logs:
            dest = os.path.join(opts.keep_logs, f"{mode}-seed{seed}")
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(workdir, dest)
            out(f"logs kept in {dest}")
        shutil.rmtree(workdir, ignore_errors=True)

    extra = {"mode": mode, "seed": seed, "nodes": opts.nodes, "rf": opts.rf, "presence_timeout": opts.presence_timeout,
             "seconds": seconds, "faults_selected": kinds, "users": len(env.clients), "devices": len(env.devices),
             "binary": opts.bin, "proxy": use_proxy, "invariants_checked": opts.invariants}
    checker.violations = [v for v in checker.violations if v.inv in opts.invariants]
    if env.faults:
        summary = report.summarize(env, checker, env.faults, extra)
    else:   # the run stopped before any fault (the cluster did not form, or a harness error)
        summary = {"run": extra, "harness_errors": env.errors,
                   "violations": {"total": len(checker.violations),
                                  "by_invariant": {str(k): sum(1 for v in checker.violations if v.inv == k) for k in INVARIANTS}}}
    report.print_violations(checker, lambda s: print(s))
    if env.faults:
        report.print_summary(summary, lambda s: print(s))
    sys.stdout.flush()
    return summary, checker.violations, env.errors


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="Cluster/chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--mode", choices=["loopback", "netns"], default="loopback")
    ap.add_argument("--clients", type=int, default=24, help="users (every third has two devices)")
    ap.add_argument("--channels", type=int, default=6)
    ap.add_argument("--rf", type=int, default=2, help="--replication-factor of the nodes")
    ap.add_argument("--presence-timeout", type=float, default=4.0)
    ap.add_argument("--fault-every", default="6-9", help="seconds between fault starts, MIN-MAX")
    ap.add_argument("--faults", default=",".join(DEFAULT_KINDS),
                    help="comma-separated kinds (" + ", ".join(ALL_KINDS) + "), or 'none'")
    ap.add_argument("--invariants", default="1-8", help="which to check, e.g. 1-8 or 1,3,5")
    ap.add_argument("--bin", default=os.path.join(ROOT, ".build", "release", "presenced"))
    ap.add_argument("--json", help="write the summary and every violation (with histories) here")
    ap.add_argument("--keep-logs", help="copy node, proxy and harness logs into this folder")
    ap.add_argument("--no-proxy", action="store_true", help="no proxy on the peer links (no 'slow' faults)")
    ap.add_argument("--ci", action="store_true", help="the short fixed-seed run for CI: loopback, then netns")
    ap.add_argument("--verbose", action="store_true")
    opts = ap.parse_args(argv)
    lo, _, hi = opts.fault_every.partition("-")
    opts.fault_every = (float(lo), float(hi or lo))
    invs = set()
    for part in opts.invariants.split(","):
        a, _, b = part.partition("-")
        invs.update(range(int(a), int(b or a) + 1))
    opts.invariants = sorted(i for i in invs if i in INVARIANTS)
    if opts.seconds is None:
        opts.seconds = (opts.minutes or 3.0) * 60.0
    return opts


def select_kinds(spec, mode, proxy):
    if spec in ("none", ""):
        return []
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    for k in kinds:
        if k not in ALL_KINDS:
            raise SystemExit(f"chaos: unknown fault kind {k} (known: {', '.join(ALL_KINDS)})")
    dropped = [k for k in kinds if (mode == "loopback" and k in NETNS_ONLY) or (k == "slow" and not proxy)]
    if dropped:
        print(f"chaos: {mode} mode{'' if proxy else ' without proxy'} cannot inject {', '.join(dropped)}: skipped")
    return [k for k in kinds if k not in dropped]


def main(argv):
    opts = parse_args(argv)
    if not os.access(opts.bin, os.X_OK):
        raise SystemExit(f"chaos: no presenced binary at {opts.bin} (swift build -c release, or --bin PATH)")
    install_cleanup()
    ns = protos.load()
    runs = []
    if opts.ci:
        for mode, seed, seconds, faults in CI_RUNS:
            if mode == "netns" and not can_use_netns():
                # (RELIABILITY.md, "Checks that must not look away": as root, netns runs or fails)
                if os.geteuid() == 0:
                    raise SystemExit("chaos --ci: running as root, but network namespaces cannot be made (`ip netns add` failed)")
                print("chaos --ci: network namespaces unavailable (needs root): netns part skipped")
                continue
            runs.append((mode, seed, seconds, select_kinds(faults, mode, not opts.no_proxy)))
    else:
        if opts.mode == "netns" and not can_use_netns():
            raise SystemExit("chaos: netns mode needs root and `ip netns`")
        runs.append((opts.mode, opts.seed, opts.seconds, select_kinds(opts.faults, opts.mode, not opts.no_proxy)))
    results = []
    total = 0
    errors = 0
    try:
        for mode, seed, seconds, kinds in runs:
            summary, violations, errs = run_once(opts, ns, mode, seed, seconds, kinds)
            results.append({"summary": summary, "violations": [v.to_json() for v in violations]})
            total += len(violations)
            errors += len(errs)
    except KeyboardInterrupt:
        print("\nchaos: interrupted; cleaning up", file=sys.stderr)
        _cleanup()
        return 130
    finally:
        if opts.json and results:
            with open(opts.json, "w") as f:
                json.dump(results if len(results) > 1 else results[0], f, indent=1)
    if len(results) > 1:
        print("\n======== all runs: " + "; ".join(
            f"{r['summary']['run']['mode']} seed {r['summary']['run']['seed']}: {r['summary'].get('violations', {}).get('total', '?')} violations"
            for r in results))
    if errors:
        print(f"chaos: {errors} harness error(s)")
        return 2
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
