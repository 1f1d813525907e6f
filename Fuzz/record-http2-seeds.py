"""Records what a stock grpcio client sends to presenced, as seeds for the http2 fuzz target.

    .venv/bin/python Fuzz/record-http2-seeds.py .build/debug/presenced

Starts a node, puts a recording TCP proxy in front of it, makes a few kinds of call through the
proxy (one connection each) and writes the client's bytes to Fuzz/corpus/http2/<name>, behind the
target's control byte (0xFE: no preface added, the bytes arrive in pieces of 8 KiB)."""
import os
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "Tests", "interop"))
from conftest import Node  # noqa: E402  (generates the Python stubs)

import grpc  # noqa: E402
import health_pb2 as h  # noqa: E402
import health_pb2_grpc as hg  # noqa: E402
import presence_pb2 as p  # noqa: E402
import presence_pb2_grpc as pg  # noqa: E402


def recording_proxy(target_port):
    """A one-connection-at-a-time proxy; returns (port, list of recorded client byte strings)."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    recorded = []

    def pump(src, dst, keep):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                if keep is not None:
                    keep.append(b)
                dst.sendall(b)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve():
        while True:
            try:
                c, _ = lst.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", target_port))
            chunks = []
            recorded.append(chunks)
            threading.Thread(target=pump, args=(c, up, chunks), daemon=True).start()
            threading.Thread(target=pump, args=(up, c, None), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return lst.getsockname()[1], recorded


def main():
    os.environ.setdefault("PRESENCED_BIN", sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".build", "debug", "presenced"))
    node = Node(node_id="seeds")
    port, recorded = recording_proxy(node.port)
    MSG = p.CHANNEL_TYPE_MESSAGE
    calls = {
        "health-check": lambda ch: hg.HealthStub(ch).Check(h.HealthCheckRequest(), timeout=5),
        "unknown-method": lambda ch: ch.unary_unary("/nope.Service/Nothing")(b"\x0a\x01x", timeout=5),
        "get-online-users": lambda ch: pg.PresenceStub(ch).GetOnlineUsers(
            p.GetOnlineUsersRequest(channel_name="lobby", channel_type=MSG, include_state=True), timeout=5,
            metadata=[("authorization", "Bearer x"), ("x-custom", "v" * 200)]),
        "open-session-join-setstate": None,
    }
    names = []
    for name, call in calls.items():
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        try:
            if call:
                try:
                    call(ch)
                except grpc.RpcError:
                    pass
            else:
                stub = pg.PresenceStub(ch)
                stream = stub.OpenSession(p.OpenSessionRequest(user_id="alice"), timeout=5)
                sid = next(stream).opened.session_id
                stub.Join(p.JoinRequest(session_id=sid, channel_name="lobby", channel_type=MSG, with_presence=True), timeout=5)
                stub.SetState(p.SetStateRequest(session_id=sid, channel_name="lobby", channel_type=MSG,
                                                items=[p.StateItem(key="mic", value="on")]), timeout=5)
                stream.cancel()
        finally:
            ch.close()
        names.append(name)
        time.sleep(0.3)   # (let the proxy see the connection end before the next one)
    out = os.path.join(ROOT, "Fuzz", "corpus", "http2")
    os.makedirs(out, exist_ok=True)
    for name, chunks in zip(names, recorded):
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"\xfe" + b"".join(chunks))
        print(name, sum(map(len, chunks)), "bytes")
    node.stop()


if __name__ == "__main__":
    main()
