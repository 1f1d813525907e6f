"""Helpers shared by the benchmark scripts."""
import contextlib
import os
import socket
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
REL = os.path.join(ROOT, ".build", "release")
PEERS = os.path.abspath(os.path.join(ROOT, "..", "shared", "bench", "peers"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, what):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{what} did not start")


def start_node(*extra, binary=None):
    """A release presenced (or `binary`) on free loopback ports; returns (process, client port)."""
    port = free_port()
    p = subprocess.Popen([binary or os.path.join(REL, "presenced"), "--node-id", "bench", "--listen", f"127.0.0.1:{port}",
                          "--peer-listen", f"127.0.0.1:{free_port()}", "--http-listen", "127.0.0.1:0", "--log-level", "error", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, p, "presenced")
    return p, port


@contextlib.contextmanager
def running_node(*extra):
    """`start_node` for a `with` block: (process, client port), stopped at the end."""
    p, port = start_node(*extra)
    try:
        yield p, port
    finally:
        p.terminate()
        p.wait()
