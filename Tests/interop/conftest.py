"""Fixtures for the interop suite: stock Python grpcio against a real presenced process."""
import os
import socket
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GEN = tempfile.mkdtemp(prefix="presenced-pygen-")


def _generate_stubs():
    from grpc_tools import protoc
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for proto in ("presence.proto", "health.proto", "cluster.proto", "admin.proto", "reflection.proto"):
        rc = protoc.main(["protoc", f"-I{os.path.join(ROOT, 'Protos')}", f"-I{well_known}",
                          f"--python_out={GEN}", f"--grpc_python_out={GEN}", proto])
        assert rc == 0, f"protoc failed for {proto}"
    sys.path.insert(0, GEN)


_generate_stubs()


def presenced_binary():
    path = os.environ.get("PRESENCED_BIN") or os.path.join(ROOT, ".build", "debug", "presenced")
    assert os.path.exists(path), f"build presenced first ({path} is missing)"
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A presenced process on loopback ports, stopped at the end of the test."""

    def __init__(self, *args, env=None, node_id="interop-1", port=None, peer_port=None, tls_ca=None, http_port=None):
        self.port = port or free_port()
        self.peer_port = peer_port or free_port()
        self.http_port = http_port or free_port()
        self.node_id = node_id
        self.killed = False
        self.log = tempfile.NamedTemporaryFile(prefix=f"presenced-{node_id}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [presenced_binary(), "--node-id", node_id, "--listen", f"127.0.0.1:{self.port}",
             "--peer-listen", f"127.0.0.1:{self.peer_port}", "--http-listen", f"127.0.0.1:{self.http_port}", *args],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.address = f"127.0.0.1:{self.port}"
        if tls_ca:
            # TLS on the client port: the certificate names localhost (and 127.0.0.1)
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self.channel = grpc.secure_channel(f"localhost:{self.port}", creds)
        else:
            self.channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=20)
        except grpc.FutureTimeoutError:
            self.stop()
            raise AssertionError("presenced did not start: " + self.output())

    def output(self):
        with open(self.log.name) as f:
            return f.read()

    def stop(self, sig=15, timeout=10):
        """Signals the node, waits; kills it if it does not exit in time. Returns its exit status
        (0 after a clean shutdown; -9 when it had to be killed)."""
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self):
        """A crash on purpose (SIGKILL): `finish` does not count it against the node."""
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def finish(self):
        """Stops the node and fails unless it shut down cleanly on SIGTERM: a node that crashed
        during the test, or hung on shutdown, fails it (unless the test killed it on purpose)."""
        rc = self.stop()
        if not self.killed:
            assert rc == 0, f"{self.node_id} exited with status {rc}:\n" + self.output()[-3000:]


@pytest.fixture
def node():
    n = Node()
    yield n
    n.finish()


# A skipped test proves nothing: where the whole suite can run (as root: network namespaces, every
# package installable), or when PRESENCED_FORBID_SKIPS is set (CI), a skip is a failure.
FORBID_SKIPS = os.geteuid() == 0 or bool(os.environ.get("PRESENCED_FORBID_SKIPS"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if FORBID_SKIPS and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped where skips are not allowed (root, or PRESENCED_FORBID_SKIPS): {reason}"
