"""Hostile clients (issue 9), with stock grpcio and raw sockets, against a real presenced process:
each attack gets a clear refusal and changes nothing, and the ones about resources stay bounded in
the node's memory."""
import base64
import hashlib
import hmac
import json
import os
import socket
import struct
import tempfile
import time

import grpc
import pytest

from conftest import Node

import presence_pb2 as p
import presence_pb2_grpc as pg

MSG = p.CHANNEL_TYPE_MESSAGE
SECRET = b"hostile-test-secret"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token(uid, exp=None):
    payload = b64(json.dumps({"uid": uid, "exp": exp or int(time.time()) + 300}).encode())
    return payload + "." + b64(hmac.new(SECRET, payload.encode(), hashlib.sha256).digest())


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.fixture
def token_node():
    d = tempfile.mkdtemp()
    path = os.path.join(d, "secret")
    with open(path, "wb") as f:
        f.write(SECRET)
    n = Node("--auth-secret-file", path, "--presence-timeout", "1")
    yield n
    n.finish()


def open_session(stub, user):
    stream = stub.OpenSession(p.OpenSessionRequest(user_id=user, token=token(user)))
    first = next(stream)
    assert first.WhichOneof("event") == "opened"
    return stream, first.opened.session_id


def auth(user):
    return [("authorization", "Bearer " + token(user))]


def test_resume_cannot_steal_a_session_and_reads_need_a_token(token_node):
    st = pg.PresenceStub(token_node.channel)
    alice_stream, alice = open_session(st, "alice")
    st.Join(p.JoinRequest(session_id=alice, channel_name="room", channel_type=MSG), timeout=5, metadata=auth("alice"))
    # bob resumes alice's session id with his own valid token: refused, nothing changes
    with pytest.raises(grpc.RpcError) as e:
        next(st.OpenSession(p.OpenSessionRequest(user_id="bob", token=token("bob"), resume_session_id=alice)))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    st.SetState(p.SetStateRequest(session_id=alice, channel_name="room", channel_type=MSG,
                                  items=[p.StateItem(key="mic", value="on")]), timeout=5, metadata=auth("alice"))
    # no token: no answer, reads included (they would tell who is online, defeating OFFLINE)
    for call in [lambda: st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="room", channel_type=MSG), timeout=5),
                 lambda: st.GetUserStatuses(p.GetUserStatusesRequest(user_ids=["alice"]), timeout=5),
                 lambda: st.GetUserChannels(p.GetUserChannelsRequest(user_id="alice"), timeout=5),
                 lambda: st.Leave(p.LeaveRequest(session_id=alice, channel_name="room", channel_type=MSG), timeout=5)]:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # bob's token reads, but cannot act on alice's session
    users = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="room", channel_type=MSG), timeout=5, metadata=auth("bob"))
    assert [u.user_id for u in users.users] == ["alice"]
    with pytest.raises(grpc.RpcError) as e:
        st.Leave(p.LeaveRequest(session_id=alice, channel_name="room", channel_type=MSG), timeout=5, metadata=auth("bob"))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # alice closes: she is gone, no ghost
    st.CloseSession(p.CloseSessionRequest(session_id=alice), timeout=5, metadata=auth("alice"))
    alice_stream.cancel()
    users = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="room", channel_type=MSG), timeout=5, metadata=auth("bob"))
    assert list(users.users) == []


def test_cancelled_opens_leave_no_one_online(token_node):
    st = pg.PresenceStub(token_node.channel)
    users = [f"c{i}" for i in range(60)]
    calls = [st.OpenSession(p.OpenSessionRequest(user_id=u, token=token(u))) for u in users]
    for c in calls:
        c.cancel()
    deadline = time.time() + 10
    while time.time() < deadline:
        statuses = st.GetUserStatuses(p.GetUserStatusesRequest(user_ids=users), timeout=5, metadata=auth("probe")).statuses
        if all(s.status != p.USER_STATUS_ONLINE for s in statuses):
            break
        time.sleep(0.1)
    online = [s.user_id for s in statuses if s.status == p.USER_STATUS_ONLINE]
    assert online == [], online


def frame(type_, flags, stream, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, type_, flags, stream) + payload


def literal(name, value):
    return bytes([0, len(name)]) + name + bytes([len(value)]) + value


def test_a_client_that_does_not_read_cannot_pin_memory(node):
    """SETTINGS_INITIAL_WINDOW_SIZE = 0 and many GetOnlineUsers of a full page: the server may not
    queue every answer whole. RSS stays bounded (the connection is cut off past its budget)."""
    st = pg.PresenceStub(node.channel)
    streams = []
    for i in range(100):   # a channel with a full page of users with state
        s = st.OpenSession(p.OpenSessionRequest(user_id=f"u{i}"))
        sid = next(s).opened.session_id
        st.SetState(p.SetStateRequest(session_id=sid, channel_name="big", channel_type=MSG,
                                      items=[p.StateItem(key=f"k{k}", value="v" * 1000) for k in range(32)]), timeout=5)
        st.Join(p.JoinRequest(session_id=sid, channel_name="big", channel_type=MSG), timeout=5)
        streams.append(s)
    before = rss_kib(node.proc.pid)
    request = p.GetOnlineUsersRequest(channel_name="big", channel_type=MSG, include_state=True).SerializeToString()
    framed = b"\x00" + struct.pack(">I", len(request)) + request
    block = (literal(b":method", b"POST") + literal(b":scheme", b"http") + literal(b":path", b"/presence.v1.Presence/GetOnlineUsers")
             + literal(b":authority", b"x") + literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers"))
    sock = socket.create_connection(("127.0.0.1", node.port))
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, struct.pack(">HI", 4, 0)))
    closed = False
    try:
        for i in range(400):  # ~3.3 MB of answers each, never read: 1.3 GB if all were queued
            sock.sendall(frame(1, 4, 2 * i + 1, block) + frame(0, 1, 2 * i + 1, framed))
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
        closed = True
    except ConnectionResetError:
        closed = True   # (closed with our unread requests still in its buffer: a reset)
    except socket.timeout:
        pass
    sock.close()
    grown_mib = (rss_kib(node.proc.pid) - before) / 1024
    print(f"RSS grew by {grown_mib:.0f} MiB while a client that does not read sent 400 requests")
    assert closed, "the server kept a connection that does not read"
    assert grown_mib < 200, f"RSS grew by {grown_mib:.0f} MiB"
    # others are served as before
    assert st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="big", channel_type=MSG), timeout=5).total_occupancy == 100
    for s in streams:
        s.cancel()
