"""The WebSocket API (WEB.md, /v1/ws) against a real presenced: JSON calls and events, a WebSocket client
and a gRPC client in one channel seeing each other's events in the same order, resume after a dropped
socket, token mode, and refusals (bad open, bad JSON, unknown method). Every wait is bounded."""
import json
import time

import pytest
import websocket

from conftest import Node
from test_presence import Session
from test_hostile import token, token_node  # noqa: F401 (a fixture)

import presence_pb2 as p
import presence_pb2_grpc as pg

MSG = "CHANNEL_TYPE_MESSAGE"


class WS:
    """A WebSocket client of the JSON API: calls by id, events in a list."""

    def __init__(self, node, timeout=5):
        self.sock = websocket.create_connection(f"ws://127.0.0.1:{node.http_port}/v1/ws", timeout=timeout)
        self.events = []
        self.next_id = 0

    def send(self, obj):
        self.sock.send(json.dumps(obj))

    def recv(self):
        return json.loads(self.sock.recv())

    def open(self, **fields):
        self.send({"open": fields})
        first = self.recv()
        if "error" in first:
            return first
        self.session_id = first["event"]["opened"]["sessionId"]
        return first["event"]["opened"]

    def call(self, method, **request):
        self.next_id += 1
        me = self.next_id
        self.send({"id": me, "method": method, "request": request})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = self.recv()
            if m.get("id") == me:
                if "error" in m:
                    raise CallError(m["error"])
                return m["response"]
            self.events.append(m["event"])
        raise AssertionError(f"no answer to {method}")

    def next_presence(self, timeout=5):
        deadline = time.monotonic() + timeout
        while True:
            if self.events:
                e = self.events.pop(0)
                if "presence" in e:
                    return e["presence"]
                continue
            assert time.monotonic() < deadline, "no presence event"
            m = self.recv()
            if "event" in m:
                self.events.append(m["event"])

    def close_code(self, timeout=5):
        """The code of the server's close frame (reading past whatever comes before it)."""
        self.sock.settimeout(timeout)
        while True:
            frame = self.sock.recv_frame()   # (raw: no automatic close reply, the server may be gone)
            if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
                return int.from_bytes(frame.data[:2], "big") if len(frame.data) >= 2 else None

    def drop(self):
        self.sock.shutdown()


class CallError(Exception):
    def __init__(self, error):
        super().__init__(f"{error['code']}: {error['message']}")
        self.code = error["code"]
        self.message = error["message"]


def test_a_websocket_and_a_grpc_client_see_each_other_in_the_same_order(node):
    ws = WS(node)
    opened = ws.open(userId="web-ann")
    assert opened["nodeId"] == node.node_id
    ws.call("Join", channelName="lobby", channelType=MSG, withPresence=True)
    assert ws.next_presence()["type"] == "PRESENCE_EVENT_TYPE_SNAPSHOT"
    stub = pg.PresenceStub(node.channel)
    g = Session(stub, "grpc-bob")
    stub.Join(p.JoinRequest(session_id=g.id, channel_name="lobby", channel_type=p.CHANNEL_TYPE_MESSAGE, with_presence=True), timeout=5)
    assert g.next_presence().type == p.PRESENCE_EVENT_TYPE_SNAPSHOT
    joined = ws.next_presence()
    assert joined["type"] == "PRESENCE_EVENT_TYPE_REMOTE_JOIN" and joined["publisher"] == "grpc-bob"
    # state set over WebSocket reaches gRPC, and the other way round, with the owner's sequence
    ws.call("SetState", channelName="lobby", channelType=MSG, items=[{"key": "mic", "value": "on"}])
    e = g.next_presence()
    assert e.type == p.PRESENCE_EVENT_TYPE_REMOTE_STATE_CHANGED and e.publisher == "web-ann" and e.states[0].value == "on"
    stub.SetState(p.SetStateRequest(session_id=g.id, channel_name="lobby", channel_type=p.CHANNEL_TYPE_MESSAGE,
                                    items=[p.StateItem(key="typing", value="yes")]), timeout=5)
    w = ws.next_presence()
    assert w["type"] == "PRESENCE_EVENT_TYPE_REMOTE_STATE_CHANGED" and w["publisher"] == "grpc-bob"
    assert int(w["sequence"]) > int(joined["sequence"])
    listing = ws.call("GetOnlineUsers", channelName="lobby", channelType=MSG, includeState=True)
    assert {u["userId"] for u in listing["users"]} == {"web-ann", "grpc-bob"}
    # leaving over WebSocket: gRPC sees REMOTE_LEAVE
    ws.call("Leave", channelName="lobby", channelType=MSG)
    left = g.next_presence()
    assert left.type == p.PRESENCE_EVENT_TYPE_REMOTE_LEAVE and left.publisher == "web-ann"
    ws.call("CloseSession")
    assert ws.close_code() == 1000
    g.cancel()


def test_a_dropped_socket_resumes_its_session_and_misses_nothing(node):
    ws = WS(node)
    ws.open(userId="web-cy")
    sid = ws.session_id
    ws.call("Join", channelName="room", channelType=MSG, withPresence=True)
    ws.next_presence()
    ws.drop()   # no CloseSession: a broken stream, the session may resume
    stub = pg.PresenceStub(node.channel)
    g = Session(stub, "grpc-dee")
    stub.Join(p.JoinRequest(session_id=g.id, channel_name="room", channel_type=p.CHANNEL_TYPE_MESSAGE, with_presence=True), timeout=5)
    # the dropped socket's user is still there (its session may resume)
    assert {u.user_id for u in g.next_presence().snapshot} == {"grpc-dee", "web-cy"}
    again = WS(node)
    opened = again.open(userId="web-cy", resumeSessionId=sid)
    assert opened["sessionId"] == sid and opened["resumed"] is True
    # the join that happened while the socket was gone arrives
    e = again.next_presence()
    assert e["publisher"] == "grpc-dee" or e["type"] == "PRESENCE_EVENT_TYPE_SNAPSHOT"
    # the other user never saw web-cy leave
    g.quiet(0.3)
    again.call("CloseSession")
    g.cancel()


def test_refusals_are_clear_and_keep_the_socket_when_they_can(node):
    ws = WS(node)
    ws.send({"id": 1, "method": "Join"})   # before open: refused, closed with 4400
    err = ws.recv()
    assert err["error"]["code"] == "INVALID_ARGUMENT" and "OPEN_FIRST" in err["error"]["message"]
    assert ws.close_code() == 4400
    # the client never answers the close frame: the server drops the connection anyway (5 s)
    ws.sock.sock.settimeout(10)
    started = time.monotonic()
    assert ws.sock.sock.recv(1) == b"" and time.monotonic() - started < 9
    ws = WS(node)
    refused = ws.open(userId="not a valid id!")
    assert refused["error"]["code"] == "INVALID_ARGUMENT"
    assert ws.close_code() == 4400
    ws = WS(node)
    ws.open(userId="eve")
    ws.sock.send("{nope")
    assert ws.recv()["error"]["code"] == "INVALID_ARGUMENT"
    with pytest.raises(CallError) as e:
        ws.call("Frobnicate")
    assert e.value.code == "UNIMPLEMENTED"
    with pytest.raises(CallError) as e:
        ws.call("Join", channelName="", channelType=MSG)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.message.startswith("INVALID_CHANNEL_NAME")
    with pytest.raises(CallError) as e:
        ws.call("Join", channelName="x", channelType="CHANNEL_TYPE_NOPE")
    assert e.value.code == "INVALID_ARGUMENT" and "MALFORMED_REQUEST" in e.value.message
    # the socket still works after all that
    ws.call("Join", channelName="fine", channelType=MSG)
    # a binary message is not this API: closed with 1003
    ws.sock.send_binary(b"\x00\x01")
    assert ws.close_code() == 1003


def test_a_message_over_the_size_limit_closes_with_1009(node):
    ws = WS(node)
    ws.open(userId="big")
    ws.sock.send(json.dumps({"id": 1, "method": "Join", "request": {"channelName": "x" * 70_000}}))
    assert ws.close_code() == 1009


def test_token_mode(token_node):
    n = token_node
    ws = WS(n)
    refused = ws.open(userId="ann", token="forged")
    assert refused["error"]["code"] == "UNAUTHENTICATED"
    assert ws.close_code() == 4001
    ws = WS(n)
    ws.open(userId="ann", token=token("ann"))
    ws.call("Join", channelName="lobby", channelType=MSG, withPresence=True)
    # another user's session: refused (the socket's token is ann's)
    stub = pg.PresenceStub(n.channel)
    g = Session(stub, "bob", token=token("bob"))
    with pytest.raises(CallError) as e:
        ws.call("Leave", sessionId=g.id, channelName="lobby", channelType=MSG)
    assert e.value.code == "PERMISSION_DENIED"
    ws.call("CloseSession")
    g.cancel()


def test_a_socket_that_does_not_read_is_cut_off_with_1008_and_its_resume_gets_a_snapshot(node):
    ws = WS(node)   # it will not read: the kernel's buffers fill, then the server's bounds
    ws.open(userId="slow")
    sid = ws.session_id
    ws.call("Join", channelName="flood", channelType=MSG, withPresence=True)
    stub = pg.PresenceStub(node.channel)
    pub = Session(stub, "publisher")
    stub.Join(p.JoinRequest(session_id=pub.id, channel_name="flood", channel_type=p.CHANNEL_TYPE_MESSAGE), timeout=5)
    big = [p.StateItem(key=f"k{i}", value="x" * 1000) for i in range(32)]
    # ~33 KB per event; the socket's budget, the writer's bound and the kernel buffers fill up
    deadline = time.monotonic() + 30
    cut = False
    rounds = 0
    while time.monotonic() < deadline and not cut:
        for i in range(20):
            big[0].value = f"{rounds}-{i}".ljust(1000, "x")
            stub.SetState(p.SetStateRequest(session_id=pub.id, channel_name="flood", channel_type=p.CHANNEL_TYPE_MESSAGE, items=big), timeout=5)
        rounds += 1
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
            cut = any(line.startswith("presenced_slow_consumers_total ") and float(line.split()[1]) >= 1
                      for line in r.read().decode().splitlines())
    assert cut, "the slow socket was never cut off"
    # the session may resume at once, and starts from a fresh SNAPSHOT of the channel
    again = WS(node)
    opened = again.open(userId="slow", resumeSessionId=sid)
    assert opened.get("resumed") is True, opened
    e = again.next_presence()
    assert e["type"] == "PRESENCE_EVENT_TYPE_SNAPSHOT" and e["channelName"] == "flood"
    again.call("CloseSession")
    pub.cancel()
    # and the old socket, read to its end, was closed with 1008
    assert raw_close_code(ws.sock.sock) == 1008


def raw_close_code(sock, timeout=20):
    """The close code at the end of a server's frames, read in large chunks straight off the socket."""
    sock.settimeout(timeout)
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # frames from the server are unmasked: opcode, 7-bit length (126: 16-bit, 127: 64-bit follows)
        while len(buf) >= 2:
            op, n, head = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, head = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, head = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < head + n:
                break
            if op == 8:
                return int.from_bytes(buf[head:head + 2], "big")
            buf = buf[head + n:]
        chunk = sock.recv(1 << 20)
        if not chunk:
            return None
        buf += chunk
    return None


def frames(*parts):
    """Masked client frames (opcode, payload) back to back, for one write."""
    return b"".join(websocket.ABNF.create_frame(payload, opcode).format() for opcode, payload in parts)


def test_several_frames_in_one_write_that_each_get_an_answer_or_a_close(node):
    # the answer to the first is written from inside wslay's read of the second: nothing may break
    ws = WS(node)
    ws.sock.sock.sendall(frames((websocket.ABNF.OPCODE_TEXT, "x"), (websocket.ABNF.OPCODE_TEXT, "{}"),
                                (websocket.ABNF.OPCODE_TEXT, "[1"), (websocket.ABNF.OPCODE_TEXT, '{"open": 5}')))
    first = ws.recv()
    assert first["error"]["code"] == "INVALID_ARGUMENT"
    assert ws.close_code() == 4400
    ws = WS(node)
    ws.open(userId="frames")
    ws.sock.sock.sendall(frames((websocket.ABNF.OPCODE_TEXT, "{bad"), (websocket.ABNF.OPCODE_TEXT, json.dumps({"id": 1, "method": "Nope"})),
                                (websocket.ABNF.OPCODE_BINARY, b"\x01"), (websocket.ABNF.OPCODE_TEXT, "{}")))
    got = [ws.recv(), ws.recv()]
    assert got[0]["error"]["code"] == "INVALID_ARGUMENT" and got[1]["error"]["code"] == "UNIMPLEMENTED"
    assert ws.close_code() == 1003
    # the node is fine
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/healthz", timeout=5) as r:
        assert r.status == 200


def test_websocket_calls_are_counted_in_the_metrics(node):
    ws = WS(node)
    ws.open(userId="counted")
    ws.call("Join", channelName="m", channelType=MSG)
    with pytest.raises(CallError):
        ws.call("Join", channelName="", channelType=MSG)
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'presenced_websocket_calls_total{method="presence.v1.Presence/Join",code="OK"} 1' in text
    assert 'presenced_websocket_calls_total{method="presence.v1.Presence/Join",code="INVALID_ARGUMENT"} 1' in text
    assert 'presenced_connections{port="websocket"} 1' in text
    ws.call("CloseSession")


def test_a_socket_that_never_opens_a_session_is_closed(node):
    ws = WS(node, timeout=15)
    started = time.monotonic()
    err = ws.recv()   # nothing sent: the open deadline (10 s) passes
    assert err["error"]["code"] == "DEADLINE_EXCEEDED" and "OPEN_TIMEOUT" in err["error"]["message"]
    assert ws.close_code(timeout=5) == 4408
    assert 9 < time.monotonic() - started < 14
