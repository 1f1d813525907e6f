"""Cluster control: the presenced processes, the network they sit on (loopback ports or network
namespaces on a bridge), and the peer-link proxies. Every wait here is bounded, and `teardown`
removes whatever was created (processes, namespaces, links, the bridge, the proxy process)."""
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time

from clock import now

HERE = os.path.dirname(os.path.abspath(__file__))

# Names for netns mode, chosen so that they cannot collide with Cluster/netns (pr-*, 10.77.0.0/24),
# which Tests/interop/test_netns.py uses; each may be overridden from the environment.
NETNS_PREFIX = os.environ.get("CHAOS_NETNS_PREFIX", "pc-n")
VETH_PREFIX = os.environ.get("CHAOS_VETH_PREFIX", "pc-v")
BRIDGE = os.environ.get("CHAOS_BRIDGE", "pc-br0")
SUBNET = os.environ.get("CHAOS_SUBNET", "10.78.0")   # a /24: node i is .i, its proxy .100+i, the bridge .254


_LOCAL_RANGE = None
_GIVEN = set()     # ports already handed out in this run


def free_port():
    """A port nothing listens on, below the kernel's ephemeral range: a node keeps its ports
    across restarts, and a port from that range could meanwhile become the source port of some
    outgoing connection (then the restart fails with 'Address already in use')."""
    global _LOCAL_RANGE
    if _LOCAL_RANGE is None:
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                _LOCAL_RANGE = tuple(int(x) for x in f.read().split())
        except (OSError, ValueError):
            _LOCAL_RANGE = (32768, 60999)
    low, high = _LOCAL_RANGE
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, low) if low > 20100 else rng.randrange(high + 1, 65535)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                _GIVEN.add(port)
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ip(*args, check=True):
    """Runs `ip ARGS` (bounded); returns the completed process."""
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def can_use_netns():
    if os.geteuid() != 0:
        return False
    probe = f"{NETNS_PREFIX}probe"
    if ip("netns", "add", probe, check=False).returncode != 0:
        return False
    ip("netns", "del", probe, check=False)
    return True


def port_open(host, port, timeout=0.2):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class Node:
    """One presenced process, identified by its index (1..N) and `node-<i>` across restarts."""

    def __init__(self, index, client, peer_listen, advertise, log_path, netns=None):
        self.index = index
        self.node_id = f"node-{index}"
        self.client = client              # (host, port) clients connect to
        self.peer_listen = peer_listen    # (host, port) the process binds for peers
        self.advertise = advertise        # (host, port) other nodes use (the proxy, if any)
        self.log_path = log_path
        self.netns = netns
        self.proc = None
        self.paused = False
        self.starts = 0
        # RELIABILITY.md, "Checks that must not look away": a process that ends without the
        # harness ending it, or that does not exit 0 within the grace of a SIGTERM, is a violation
        self.ended_by_harness = False
        self.exit_problems = []

    @property
    def client_address(self):
        return f"{self.client[0]}:{self.client[1]}"

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, binary, seeds, flags):
        assert not self.running(), f"{self.node_id} already runs"
        self.starts += 1
        self.ended_by_harness = False
        cmd = [binary, "--node-id", self.node_id,
               "--listen", f"{self.client[0]}:{self.client[1]}",
               "--peer-listen", f"{self.peer_listen[0]}:{self.peer_listen[1]}",
               "--peer-advertise", f"{self.advertise[0]}:{self.advertise[1]}",
               "--http-listen", f"{self.client[0]}:0",
               "--seeds", ",".join(seeds), *flags]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]   # ip execs the binary: same pid
        with open(self.log_path, "a") as log:
            log.write(f"=== chaos: start #{self.starts} of {self.node_id} at t={now():.3f}s: {' '.join(cmd)}\n")
            log.flush()
            # a session of its own: a Ctrl-C at the terminal reaches the harness, which then cleans up
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.paused = False

    def wait_listening(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                return False
            if port_open(*self.client):
                return True
            time.sleep(0.05)
        return False

    def signal(self, sig):
        if self.running():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def unexpected_exit(self):
        """Why the process ended on its own (None while it runs or when the harness ended it)."""
        if self.proc is None or self.ended_by_harness or self.proc.poll() is None:
            return None
        return f"{self.node_id} (start #{self.starts}) exited on its own with rc={self.proc.returncode}"

    def kill9(self):
        if self.running():
            self.ended_by_harness = True
            self.signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.paused = False

    def terminate(self, timeout=12.0):
        """SIGTERM (graceful leave) and a bounded wait; kill -9 if it does not exit in time.
        Returns (seconds it took, exit code, whether it had to be killed)."""
        if not self.running():
            return 0.0, None, False
        if self.paused:
            self.resume()
        t = time.monotonic()
        self.ended_by_harness = True
        self.signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
            if rc != 0:
                self.exit_problems.append(f"{self.node_id} (start #{self.starts}) exited with rc={rc} after SIGTERM")
            return time.monotonic() - t, rc, False
        except subprocess.TimeoutExpired:
            self.kill9()
            self.exit_problems.append(f"{self.node_id} (start #{self.starts}) did not exit within {timeout:.0f} s of SIGTERM")
            return time.monotonic() - t, None, True

    def pause(self):
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.signal(signal.SIGCONT)
        self.paused = False

    def log_tail(self, chars=4000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""


class ProxyControl:
    """The proxy process (proxy.py): one listener per node in front of its peer port."""

    def __init__(self, proxies, sources, seed, log_path):
        config = json.dumps({"proxies": proxies, "sources": sources, "seed": seed})
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "proxy.py"), config],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, bufsize=1, start_new_session=True)
        line = self._answer(10)
        if not line.startswith("ok started"):
            raise RuntimeError(f"the proxy did not start: {line!r}")

    def _answer(self, timeout):
        import select
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return ""
        return self.proc.stdout.readline()

    def command(self, line):
        if self.proc.poll() is not None:
            raise RuntimeError("the proxy process died")
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._answer(5).strip()

    def slow(self, index, on):
        return self.command(f"slow {index} {'on' if on else 'off'}")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait(timeout=3)
        self.log.close()


class Cluster:
    """N nodes on loopback (`mode="loopback"`) or in network namespaces (`mode="netns"`)."""

    def __init__(self, n, mode, binary, workdir, presence_timeout, rf, use_proxy=True, seed=0, extra_flags=()):
        self.n = n
        self.mode = mode
        self.binary = binary
        self.workdir = workdir
        self.use_proxy = use_proxy
        # CHAOS_NODE_FLAGS adds flags to every node (e.g. "--log-level debug" to follow one key)
        self.flags = ["--presence-timeout", str(presence_timeout), "--replication-factor", str(rf), *extra_flags,
                      *shlex.split(os.environ.get("CHAOS_NODE_FLAGS", ""))]
        self.seed = seed
        self.proxy = None
        self.created_netns = False
        self.cuts = set()          # (a, b) link cuts in force
        self.partitioned = set()   # nodes whose link is down
        self.nodes = []
        for i in range(1, n + 1):
            log = os.path.join(workdir, f"node-{i}.log")
            if mode == "loopback":
                client = ("127.0.0.1", free_port())
                peer = ("127.0.0.1", free_port())
                adv = ("127.0.0.1", free_port()) if use_proxy else peer
                self.nodes.append(Node(i, client, peer, adv, log))
            else:
                addr = f"{SUBNET}.{i}"
                adv = (f"{SUBNET}.{100 + i}", 7401) if use_proxy else (addr, 7401)
                self.nodes.append(Node(i, (addr, 7400), (addr, 7401), adv, log, netns=f"{NETNS_PREFIX}{i}"))

    # ---- set-up and tear-down

    def setup(self):
        if self.mode == "netns":
            self.remove_namespaces()   # leftovers of an interrupted run (our own names only)
            self.created_netns = True
            ip("link", "add", BRIDGE, "type", "bridge")
            ip("addr", "add", f"{SUBNET}.254/24", "dev", BRIDGE)
            ip("link", "set", BRIDGE, "up")
            for node in self.nodes:
                i = node.index
                ns, veth = node.netns, f"{VETH_PREFIX}{i}"
                ip("netns", "add", ns)
                ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("link", "set", veth, "master", BRIDGE, "up")
                ip("-n", ns, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
                if self.use_proxy:
                    ip("addr", "add", f"{SUBNET}.{100 + i}/24", "dev", BRIDGE)
        if self.use_proxy:
            proxies = [{"node": nd.index, "listen": list(nd.advertise), "upstream": list(nd.peer_listen)} for nd in self.nodes]
            sources = {f"{SUBNET}.{nd.index}": nd.index for nd in self.nodes} if self.mode == "netns" else {}
            self.proxy = ProxyControl(proxies, sources, self.seed, os.path.join(self.workdir, "proxy.log"))

    def seeds_for(self, node):
        return [f"{o.advertise[0]}:{o.advertise[1]}" for o in self.nodes if o is not node]

    def start(self, node):
        node.start(self.binary, self.seeds_for(node), self.flags)

    def live(self):
        """Nodes whose process runs and is not stopped."""
        return [nd for nd in self.nodes if nd.running() and not nd.paused]

    def reachable(self):
        """Live nodes that the others (and the clients) can reach."""
        return [nd for nd in self.live() if nd.index not in self.partitioned]

    def teardown(self):
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.signal(signal.SIGCONT)
                node.signal(signal.SIGKILL)
                try:
                    node.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        if self.proxy:
            self.proxy.close()
            self.proxy = None
        if self.mode == "netns" and self.created_netns:
            self.remove_namespaces()
            self.created_netns = False

    def remove_namespaces(self):
        listed = ip("netns", "list", check=False).stdout.split("\n")
        for line in listed:
            name = line.split(" ")[0].strip()
            if name.startswith(NETNS_PREFIX) and name[len(NETNS_PREFIX):].isdigit():
                for pid in ip("netns", "pids", name, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                ip("netns", "del", name, check=False)
        links = ip("-o", "link", "show", check=False).stdout.split("\n")
        for line in links:
            parts = line.split(": ")
            if len(parts) > 1:
                name = parts[1].split("@")[0]
                if name.startswith(VETH_PREFIX) and name[len(VETH_PREFIX):].isdigit():
                    ip("link", "del", name, check=False)
        ip("link", "del", BRIDGE, check=False)

    # ---- network faults (netns mode)

    def partition(self, node, cut):
        """Cuts the node off everything (its link goes down) or heals it."""
        ip("link", "set", f"{VETH_PREFIX}{node.index}", "down" if cut else "up")
        (self.partitioned.add if cut else self.partitioned.discard)(node.index)

    def linkcut(self, a, b, cut):
        """Cuts (or restores) the link between two nodes only, with blackhole routes on both sides,
        for the node's address and for its proxy's."""
        verb = "add" if cut else "del"
        for x, y in ((a, b), (b, a)):
            targets = {f"{SUBNET}.{y.index}", y.advertise[0]}
            for t in sorted(targets):
                ip("-n", x.netns, "route", verb, "blackhole", f"{t}/32", check=cut)
        (self.cuts.add if cut else self.cuts.discard)((a.index, b.index))

    def slow(self, node, on):
        if self.proxy:
            self.proxy.slow(node.index, on)

    def heal_everything(self):
        """Ends any network fault and resumes any paused node (before the final checks)."""
        for node in self.nodes:
            if node.paused:
                node.resume()
        for i in sorted(self.partitioned):
            self.partition(self.nodes[i - 1], False)
        for a, b in sorted(self.cuts):
            self.linkcut(self.nodes[a - 1], self.nodes[b - 1], False)
        if self.proxy:
            for node in self.nodes:
                self.proxy.slow(node.index, False)
