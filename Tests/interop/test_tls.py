"""TLS on the client port and mutual TLS on the peer link, against real presenced processes, with
grpcio's SSL credentials and Python's ssl module. Every certificate is made here with `openssl`."""
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time

import grpc
import pytest

from conftest import Node, free_port, presenced_binary
from test_cluster import alive_everywhere, listing, members, wait_until
from test_presence import Session

import admin_pb2 as a
import admin_pb2_grpc as ag
import health_pb2 as h
import health_pb2_grpc as hg
import presence_pb2 as p
import presence_pb2_grpc as pg

MSG = p.CHANNEL_TYPE_MESSAGE


class CA:
    """A certificate authority in a directory: `issue` makes a key and a certificate signed by it."""

    def __init__(self, directory, name):
        self.dir = directory
        self.name = name
        self.key = os.path.join(directory, f"{name}.key")
        self.cert = os.path.join(directory, f"{name}.pem")
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", self.key, "-out", self.cert, "-days", "2", "-subj", f"/CN={name}")

    def issue(self, cn, sans=("DNS:localhost", "IP:127.0.0.1"), client=True):
        key = os.path.join(self.dir, f"{cn}.key")
        csr = os.path.join(self.dir, f"{cn}.csr")
        cert = os.path.join(self.dir, f"{cn}.pem")
        ext = os.path.join(self.dir, f"{cn}.ext")
        usage = "serverAuth,clientAuth" if client else "serverAuth"
        with open(ext, "w") as f:
            f.write(f"subjectAltName={','.join(sans)}\nextendedKeyUsage={usage}\n")
        run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={cn}")
        run("openssl", "x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-CAcreateserial",
            "-out", cert, "-days", "2", "-extfile", ext)
        return cert, key


def run(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="presenced-tls-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def tls_handshake(port, ca, alpn=("h2",), cert=None, key=None):
    """A raw TLS handshake with the port: the protocol ALPN chose and the server's certificate subject."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(list(alpn))
    if cert:
        ctx.load_cert_chain(cert, key)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            # (TLS 1.3: a refused client certificate shows up on the first read, not the handshake)
            s.settimeout(5)
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            first = s.recv(9)
            subject = dict(x[0] for x in s.getpeercert()["subject"])
            return s.selected_alpn_protocol(), subject["commonName"], first


def test_client_port_speaks_grpc_over_tls_with_alpn_h2_and_refuses_cleartext(pki):
    ca = CA(pki, "client-ca")
    cert, key = ca.issue("node-a")
    n = Node("--tls-cert-file", cert, "--tls-key-file", key, node_id="tls-1", tls_ca=ca.cert)
    try:
        health = hg.HealthStub(n.channel).Check(h.HealthCheckRequest(), timeout=5)
        assert health.status == h.HealthCheckResponse.SERVING
        stub = pg.PresenceStub(n.channel)
        alice = Session(stub, "alice")
        stub.Join(p.JoinRequest(session_id=alice.id, channel_name="room", channel_type=MSG, with_presence=True), timeout=5)
        stub.SetState(p.SetStateRequest(session_id=alice.id, channel_name="room", channel_type=MSG,
                                        items=[p.StateItem(key="mic", value="on")]), timeout=5)
        assert listing(n, "room") == {"alice": {"mic": "on"}}
        # ALPN: h2 is chosen; a client offering only HTTP/1.1 is refused in the handshake
        proto, subject, first = tls_handshake(n.port, ca.cert)
        assert proto == "h2" and subject == "node-a" and len(first) == 9 and first[3] == 4   # the server's SETTINGS
        with pytest.raises(ssl.SSLError):
            tls_handshake(n.port, ca.cert, alpn=("http/1.1",))
        # cleartext h2c on a TLS port gets nowhere, and the node is unharmed
        plain = grpc.insecure_channel(n.address)
        with pytest.raises(grpc.RpcError) as e:
            hg.HealthStub(plain).Check(h.HealthCheckRequest(), timeout=3)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        plain.close()
        # a client that does not trust the node's CA is refused by grpcio itself
        other = CA(pki, "other-ca")
        with open(other.cert, "rb") as f:
            wrong = grpc.secure_channel(f"localhost:{n.port}", grpc.ssl_channel_credentials(root_certificates=f.read()))
        with pytest.raises(grpc.RpcError):
            hg.HealthStub(wrong).Check(h.HealthCheckRequest(), timeout=3)
        wrong.close()
        assert hg.HealthStub(n.channel).Check(h.HealthCheckRequest(), timeout=5).status == h.HealthCheckResponse.SERVING
        # the Swift side (presencectl, on the client library's transport) over TLS: the node's
        # certificate must chain to the CA given and name the host
        ctl = os.path.join(os.path.dirname(presenced_binary()), "presencectl")
        ok = subprocess.run([ctl, "--server", f"localhost:{n.port}", "--tls-ca-file", ca.cert, "who", "room"],
                            capture_output=True, text=True, timeout=20)
        assert ok.returncode == 0 and "alice" in ok.stdout, ok.stdout + ok.stderr
        for bad in (["--tls-ca-file", other.cert], []):   # another CA; cleartext to a TLS port
            r = subprocess.run([ctl, "--server", f"localhost:{n.port}", *bad, "who", "room"], capture_output=True, text=True, timeout=30)
            assert r.returncode != 0, r.stdout
    finally:
        assert n.stop() == 0, n.output()


def test_sighup_reloads_the_certificate_for_new_connections_and_keeps_a_bad_one_out(pki):
    ca = CA(pki, "reload-ca")
    first_cert, first_key = ca.issue("first")
    second_cert, second_key = ca.issue("second")
    live_cert, live_key = os.path.join(pki, "live.pem"), os.path.join(pki, "live.key")
    shutil.copy(first_cert, live_cert)
    shutil.copy(first_key, live_key)
    n = Node("--tls-cert-file", live_cert, "--tls-key-file", live_key, node_id="tls-reload", tls_ca=ca.cert)
    try:
        assert tls_handshake(n.port, ca.cert)[1] == "first"
        stub = pg.PresenceStub(n.channel)
        alice = Session(stub, "alice")   # a stream open across the reload
        shutil.copy(second_cert, live_cert)
        shutil.copy(second_key, live_key)
        n.proc.send_signal(1)   # SIGHUP
        wait_until("the new certificate", lambda: tls_handshake(n.port, ca.cert)[1] == "second", 10)
        # the connection made before the reload still works, and so does the session on it
        stub.Join(p.JoinRequest(session_id=alice.id, channel_name="r", channel_type=MSG, with_presence=True), timeout=5)
        assert "alice" in listing(n, "r")
        # a key that does not match its certificate: the reload fails, the node keeps serving with the old one
        shutil.copy(first_key, live_key)
        n.proc.send_signal(1)
        wait_until("the failed reload logged", lambda: "certificate reload failed" in n.output(), 10)
        assert tls_handshake(n.port, ca.cert)[1] == "second"
        assert n.proc.poll() is None
    finally:
        assert n.stop() == 0, n.output()


class MTLSCluster:
    """Nodes whose peer link is mutual TLS with certificates from one cluster CA."""

    def __init__(self, ca, size):
        self.ca = ca
        self.ports = [(free_port(), free_port()) for _ in range(size)]
        self.nodes = []
        for i in range(size):
            self.nodes.append(self.start(i, *ca.issue(f"node-{i}")))

    def start(self, i, cert, key, ca_file=None, node_id=None, ports=None):
        seeds = ",".join(f"127.0.0.1:{pp}" for j, (_, pp) in enumerate(self.ports) if j != i)
        cp, pp = ports or self.ports[i]
        return Node("--seeds", seeds, "--peer-tls-ca-file", ca_file or self.ca.cert, "--peer-tls-cert-file", cert,
                    "--peer-tls-key-file", key, "--presence-timeout", "2", node_id=node_id or f"node-{i}", port=cp, peer_port=pp)

    def stop(self):
        return [n.stop() for n in self.nodes]


def test_peer_link_with_mutual_tls_forms_a_cluster_and_serves_across_nodes(pki):
    ca = CA(pki, "cluster-ca")
    c = MTLSCluster(ca, 3)
    try:
        wait_until("three members alive everywhere", lambda: alive_everywhere(c.nodes), 20)
        stub = pg.PresenceStub(c.nodes[0].channel)
        bob = Session(stub, "bob")
        for ch in ("a", "b", "c", "d"):
            stub.Join(p.JoinRequest(session_id=bob.id, channel_name=ch, channel_type=MSG, with_presence=True), timeout=5)
        for n in c.nodes:
            for ch in ("a", "b", "c", "d"):
                assert "bob" in listing(n, ch), (n.node_id, ch)
        # the peer port asks for a certificate from the cluster CA
        proto, subject, _ = tls_handshake(c.ports[0][1], ca.cert, cert=os.path.join(pki, "node-1.pem"), key=os.path.join(pki, "node-1.key"))
        assert proto == "h2" and subject == "node-0"
    finally:
        assert c.stop() == [0, 0, 0]


def test_peer_link_with_mutual_tls_refuses_nodes_and_clients_without_a_cluster_certificate(pki):
    ca = CA(pki, "cluster-ca2")
    c = MTLSCluster(ca, 2)
    rogue_ca = CA(pki, "rogue-ca")
    rogue = None
    try:
        wait_until("two members alive", lambda: alive_everywhere(c.nodes), 20)
        # a client with no certificate, or one from another CA, gets no HTTP/2 from the peer port
        for cert, key in ((None, None), rogue_ca.issue("rogue-client")):
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                _, _, first = tls_handshake(c.ports[0][1], ca.cert, cert=cert, key=key)
                if not first:
                    raise ConnectionError("closed")
        # cleartext gRPC to the peer port: nothing
        plain = grpc.insecure_channel(f"127.0.0.1:{c.ports[0][1]}")
        with pytest.raises(grpc.RpcError):
            ag.AdminStub(plain).Members(a.MembersRequest(), timeout=3)
        plain.close()
        # a node with a certificate from another CA (trusting the cluster's) never becomes a member
        cert, key = rogue_ca.issue("rogue-node")
        rogue = c.start(2, cert, key, node_id="rogue", ports=(free_port(), free_port()))
        deadline = time.monotonic() + 4   # well past the 0.2 s join of a good node
        while time.monotonic() < deadline:
            for n in c.nodes:
                assert "rogue" not in members(n)
            time.sleep(0.2)
        assert alive_everywhere(c.nodes)
        # ...while a good node started the same way joins
        good = c.start(2, *ca.issue("node-2"), node_id="node-2", ports=(free_port(), free_port()))
        c.nodes.append(good)
        wait_until("the good third node alive everywhere", lambda: alive_everywhere(c.nodes), 20)
    finally:
        if rogue:
            rogue.stop()
        assert all(rc == 0 for rc in c.stop())
