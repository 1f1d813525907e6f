"""The presence API through a stock Python grpcio client: sessions, events, pagination, state, status."""
import base64
import hashlib
import hmac
import json
import os
import queue
import tempfile
import threading
import time

import grpc
import pytest

from conftest import Node

import presence_pb2 as p
import presence_pb2_grpc as pg

MSG = p.CHANNEL_TYPE_MESSAGE


class Session:
    """An OpenSession stream read on a thread; events land in a queue."""

    def __init__(self, stub, user, **kw):
        self.stream = stub.OpenSession(p.OpenSessionRequest(user_id=user, **kw))
        first = next(self.stream)
        assert first.WhichOneof("event") == "opened"
        self.id = first.opened.session_id
        self.resumed = first.opened.resumed
        self.node_id = first.opened.node_id
        self.events = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for e in self.stream:
                self.events.put(e)
        except grpc.RpcError as e:
            self.events.put(e)

    def next(self, timeout=5):
        e = self.events.get(timeout=timeout)
        if isinstance(e, grpc.RpcError):
            raise e
        return e

    def _next_of(self, kind, timeout):
        # (events of the other kind read past are kept: API.md promises no order between status
        # and presence events)
        held = self.__dict__.setdefault("held", {})
        if held.get(kind):
            return held[kind].pop(0)
        while True:
            e = self.next(timeout)
            got = e.WhichOneof("event")
            if got == kind:
                return getattr(e, kind)
            if got in ("presence", "status"):
                held.setdefault(got, []).append(getattr(e, got))

    def next_presence(self, timeout=5):
        return self._next_of("presence", timeout)

    def next_status(self, timeout=5):
        return self._next_of("status", timeout)

    def quiet(self, seconds=0.2):
        try:
            e = self.events.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected event: {e}")

    def cancel(self):
        self.stream.cancel()


@pytest.fixture
def short_node():
    n = Node("--presence-timeout", "0.5", "--max-instant-events", "3", "--presence-interval", "0.2")
    yield n
    n.finish()


def sessions_in_state(node, state):
    """The node's `presenced_sessions{state=...}` gauge, read from /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'presenced_sessions{{state="{state}"}} '):
                return float(line.rsplit(" ", 1)[1])
    return None


def stub_of(node):
    return pg.PresenceStub(node.channel)


def test_session_events_end_to_end(short_node):
    st = stub_of(short_node)
    ann = Session(st, "ann")
    assert ann.node_id == "interop-1" and not ann.resumed
    st.Join(p.JoinRequest(session_id=ann.id, channel_name="lobby", channel_type=MSG, with_presence=True), timeout=5)
    snap = ann.next_presence()
    assert snap.type == p.PRESENCE_EVENT_TYPE_SNAPSHOT and [u.user_id for u in snap.snapshot] == ["ann"]
    tony = Session(st, "tony")
    st.SetState(p.SetStateRequest(session_id=tony.id, channel_name="lobby", channel_type=MSG,
                                  items=[p.StateItem(key="mic", value="on")]), timeout=5)
    st.Join(p.JoinRequest(session_id=tony.id, channel_name="lobby", channel_type=MSG), timeout=5)
    join = ann.next_presence()
    changed = ann.next_presence()
    assert join.type == p.PRESENCE_EVENT_TYPE_REMOTE_JOIN and join.publisher == "tony"
    assert changed.type == p.PRESENCE_EVENT_TYPE_REMOTE_STATE_CHANGED
    assert [(s.key, s.value) for s in changed.states] == [("mic", "on")]
    assert snap.sequence < join.sequence < changed.sequence
    assert abs(join.timestamp_ms - time.time() * 1000) < 5000
    st.RemoveState(p.RemoveStateRequest(session_id=tony.id, channel_name="lobby", channel_type=MSG), timeout=5)
    assert list(ann.next_presence().states) == []
    st.CloseSession(p.CloseSessionRequest(session_id=tony.id), timeout=5)
    leave = ann.next_presence()
    assert leave.type == p.PRESENCE_EVENT_TYPE_REMOTE_LEAVE and leave.publisher == "tony"
    ann.cancel()


def test_timeout_resume_and_status(short_node):
    st = stub_of(short_node)
    ann = Session(st, "ann")
    st.Join(p.JoinRequest(session_id=ann.id, channel_name="room", channel_type=MSG, with_presence=True), timeout=5)
    ann.next_presence()
    r = st.Watch(p.WatchRequest(session_id=ann.id, user_ids=["tony", "ghost"]), timeout=5)
    assert {(s.user_id, s.status) for s in r.statuses} == {("tony", p.USER_STATUS_UNKNOWN), ("ghost", p.USER_STATUS_UNKNOWN)}
    # tony: breaks its stream, resumes within the timeout: nobody notices
    tony = Session(st, "tony", initial_status=p.USER_STATUS_BUSY)
    assert ann.next_status().status == p.USER_STATUS_BUSY
    st.Join(p.JoinRequest(session_id=tony.id, channel_name="room", channel_type=MSG), timeout=5)
    assert ann.next_presence().type == p.PRESENCE_EVENT_TYPE_REMOTE_JOIN
    tony.cancel()
    # the node has seen the stream break (the session waits to be resumed) before tony comes back
    deadline = time.monotonic() + 5
    while sessions_in_state(short_node, "disconnected") != 1:
        assert time.monotonic() < deadline, "the node did not see tony's stream break"
        time.sleep(0.01)
    back = Session(st, "tony", resume_session_id=tony.id)
    assert back.resumed and back.id == tony.id
    ann.quiet(0.6)
    # ghost: breaks and does not come back: REMOTE_TIMEOUT after the presence timeout, then OFFLINE
    ghost = Session(st, "ghost")
    assert ann.next_status().status == p.USER_STATUS_ONLINE
    st.Join(p.JoinRequest(session_id=ghost.id, channel_name="room", channel_type=MSG), timeout=5)
    assert ann.next_presence().publisher == "ghost"
    t0 = time.time()
    ghost.cancel()
    timeout_event = ann.next_presence(timeout=3)
    assert timeout_event.type == p.PRESENCE_EVENT_TYPE_REMOTE_TIMEOUT and timeout_event.publisher == "ghost"
    assert 0.4 <= time.time() - t0 < 2.0
    assert ann.next_status().status == p.USER_STATUS_OFFLINE
    with pytest.raises(grpc.RpcError) as e:
        st.GetState(p.GetStateRequest(channel_name="room", channel_type=MSG, user_id="ghost"), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and e.value.details().startswith("PRESENCE_USER_NOT_EXIST")
    # status: set, invisible, and the rule for UNKNOWN
    st.SetStatus(p.SetStatusRequest(session_id=back.id, status=p.USER_STATUS_OFFLINE), timeout=5)
    assert ann.next_status().status == p.USER_STATUS_OFFLINE
    r = st.GetUserStatuses(p.GetUserStatusesRequest(user_ids=["tony", "ann", "nobody"]), timeout=5)
    assert [(s.user_id, s.status) for s in r.statuses] == [("tony", p.USER_STATUS_OFFLINE), ("ann", p.USER_STATUS_ONLINE), ("nobody", p.USER_STATUS_UNKNOWN)]
    with pytest.raises(grpc.RpcError) as e:
        st.SetStatus(p.SetStatusRequest(session_id=back.id, status=p.USER_STATUS_UNKNOWN), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    back.cancel()
    ann.cancel()


def test_pagination_while_users_churn(short_node):
    st = stub_of(short_node)
    sessions = []
    for i in range(0, 300, 2):
        s = Session(st, f"user{i:04d}")
        st.Join(p.JoinRequest(session_id=s.id, channel_name="big", channel_type=MSG), timeout=5)
        sessions.append(s)
    seen, page, rounds = [], "", 0
    online, churners = 150, []
    while True:
        r = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="big", channel_type=MSG, page=page), timeout=5)
        assert r.total_occupancy == online  # (every user online now, not the page's length)
        if r.next_page:
            assert len(r.users) == 100
        seen += [u.user_id for u in r.users]
        # churn between pages: someone joins, and someone who joined earlier leaves
        s = Session(st, f"user{rounds * 2 + 1:04d}")
        st.Join(p.JoinRequest(session_id=s.id, channel_name="big", channel_type=MSG), timeout=5)
        sessions.append(s)
        churners.append(s)
        online += 1
        if len(churners) > 1:
            gone = churners.pop(0)
            st.Leave(p.LeaveRequest(session_id=gone.id, channel_name="big", channel_type=MSG), timeout=5)
            online -= 1
        rounds += 1
        page = r.next_page
        if not page:
            break
    stayers = [f"user{i:04d}" for i in range(0, 300, 2)]
    assert [u for u in seen if u in stayers] == stayers
    assert len(set(seen)) == len(seen)
    from google.protobuf import wrappers_pb2
    count = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="big", channel_type=MSG,
                                                      include_user_id=wrappers_pb2.BoolValue(value=False)), timeout=5)
    assert count.total_occupancy == online == 150 + len(churners) and len(count.users) == 0
    with pytest.raises(grpc.RpcError) as e:
        st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="big", channel_type=MSG, page="not-a-bookmark"), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for s in sessions:
        s.cancel()


def test_include_flags_default_and_invalid_combination(short_node):
    from google.protobuf import wrappers_pb2
    st = stub_of(short_node)
    s = Session(st, "solo")
    st.SetState(p.SetStateRequest(session_id=s.id, channel_name="c", channel_type=MSG, items=[p.StateItem(key="k", value="v")]), timeout=5)
    st.Join(p.JoinRequest(session_id=s.id, channel_name="c", channel_type=MSG), timeout=5)
    default = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="c", channel_type=MSG), timeout=5)
    assert [u.user_id for u in default.users] == ["solo"] and list(default.users[0].states) == []
    with_state = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="c", channel_type=MSG, include_state=True), timeout=5)
    assert [(x.key, x.value) for x in with_state.users[0].states] == [("k", "v")]
    only_count = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="c", channel_type=MSG, include_user_id=wrappers_pb2.BoolValue(value=False)), timeout=5)
    assert only_count.total_occupancy == 1 and len(only_count.users) == 0
    with pytest.raises(grpc.RpcError) as e:
        st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="c", channel_type=MSG, include_state=True,
                                                  include_user_id=wrappers_pb2.BoolValue(value=False)), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    empty = st.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name="nobody-here", channel_type=MSG), timeout=5)
    assert empty.total_occupancy == 0
    chans = st.GetUserChannels(p.GetUserChannelsRequest(user_id="solo"), timeout=5)
    assert chans.total_channel == 1 and chans.channels[0].channel_name == "c"
    s.cancel()


def test_state_limits_and_validation(short_node):
    st = stub_of(short_node)
    s = Session(st, "limits")
    st.Join(p.JoinRequest(session_id=s.id, channel_name="c", channel_type=MSG), timeout=5)
    st.SetState(p.SetStateRequest(session_id=s.id, channel_name="c", channel_type=MSG,
                                  items=[p.StateItem(key=f"k{i}", value="v") for i in range(32)]), timeout=5)
    cases = [
        (p.SetStateRequest(session_id=s.id, channel_name="c", channel_type=MSG, items=[p.StateItem(key="k32", value="v")]),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "STATE_KEY_LIMIT"),
        (p.SetStateRequest(session_id=s.id, channel_name="c", channel_type=MSG, items=[p.StateItem(key="k0", value="x" * 1025)]),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_STATE_VALUE"),
        (p.SetStateRequest(session_id=s.id, channel_name="c", channel_type=MSG, items=[p.StateItem(key="", value="v")]),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_STATE_KEY"),
        (p.SetStateRequest(session_id=s.id, channel_name="bad/name", channel_type=MSG, items=[]),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CHANNEL_NAME"),
        (p.SetStateRequest(session_id=s.id, channel_name="c", channel_type=p.CHANNEL_TYPE_UNSPECIFIED, items=[]),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CHANNEL_TYPE"),
        (p.SetStateRequest(session_id="ffffffffffffffff", channel_name="c", channel_type=MSG, items=[]),
         grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"),
    ]
    for req, code, name in cases:
        with pytest.raises(grpc.RpcError) as e:
            st.SetState(req, timeout=5)
        assert e.value.code() == code and e.value.details().startswith(name), e.value.details()
    state = st.GetState(p.GetStateRequest(channel_name="c", channel_type=MSG, user_id="limits"), timeout=5).state
    assert len(state.states) == 32 and state.states[0].value == "v"
    assert [x.key for x in state.states] == sorted(x.key for x in state.states)
    s.cancel()


def test_interval_mode(short_node):
    st = stub_of(short_node)   # max-instant-events 3, interval 0.2 s
    w = Session(st, "w")
    st.Join(p.JoinRequest(session_id=w.id, channel_name="crowd", channel_type=MSG, with_presence=True), timeout=5)
    w.next_presence()
    others = []
    for u in ["a", "b", "c", "d"]:
        s = Session(st, u)
        st.Join(p.JoinRequest(session_id=s.id, channel_name="crowd", channel_type=MSG), timeout=5)
        others.append(s)
    # occupancy w, a, b (3, at the limit): real time; c and d take it above: their joins come only
    # in INTERVAL events, never as REMOTE_JOIN
    realtime, in_interval = [], set()
    deadline = time.time() + 3
    while time.time() < deadline and not {"c", "d"} <= in_interval:
        e = w.next_presence(timeout=3)
        if e.type == p.PRESENCE_EVENT_TYPE_INTERVAL:
            in_interval |= set(e.interval.join_user_ids)
        else:
            realtime.append((e.type, e.publisher))
    assert realtime == [(p.PRESENCE_EVENT_TYPE_REMOTE_JOIN, "a"), (p.PRESENCE_EVENT_TYPE_REMOTE_JOIN, "b")], realtime
    assert in_interval == {"c", "d"}
    for s in others:
        s.cancel()


def test_token_mode():
    secret = b"topsecret"
    d = tempfile.mkdtemp()
    path = os.path.join(d, "secret")
    with open(path, "wb") as f:
        f.write(secret + b"\n")

    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    def token(uid, exp, key=secret):
        payload = b64(json.dumps({"uid": uid, "exp": exp}).encode())
        mac = hmac.new(key, payload.encode(), hashlib.sha256).digest()
        return payload + "." + b64(mac)

    n = Node("--auth-secret-file", path)
    try:
        assert "OPEN MODE" not in n.output()
        st = stub_of(n)
        now = int(time.time())
        ok = Session(st, "ann", token=token("ann", now + 60))
        for bad in ["", token("ann", now - 10), token("bob", now + 60), token("ann", now + 60, key=b"other"), "x.y"]:
            with pytest.raises(grpc.RpcError) as e:
                Session(st, "ann", token=bad)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, bad
        # acting on ann's session with bob's credentials is refused
        with pytest.raises(grpc.RpcError) as e:
            st.Join(p.JoinRequest(session_id=ok.id, channel_name="c", channel_type=MSG), timeout=5,
                    metadata=[("authorization", "Bearer " + token("bob", now + 60))])
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        st.Join(p.JoinRequest(session_id=ok.id, channel_name="c", channel_type=MSG), timeout=5,
                metadata=[("authorization", "Bearer " + token("ann", now + 60))])
        ok.cancel()
    finally:
        n.finish()


def test_a_channel_too_big_for_one_message_is_joined_with_a_paged_snapshot(node):
    """130 users with full state (32 keys of 1000 bytes): ~4.3 MiB, over grpcio's default 4 MiB
    receive limit. A session joining with presence gets the SNAPSHOT in pages (same sequence, all
    but the last with snapshot_continues) that together list everyone, and then live events."""
    stub = pg.PresenceStub(node.channel)
    items = [p.StateItem(key=f"k{i:02d}", value="x" * 1000) for i in range(32)]
    holders = []
    for i in range(130):
        s = Session(stub, f"big-{i:03d}")
        stub.Join(p.JoinRequest(session_id=s.id, channel_name="huge", channel_type=MSG, with_presence=False), timeout=10)
        stub.SetState(p.SetStateRequest(session_id=s.id, channel_name="huge", channel_type=MSG, items=items), timeout=10)
        holders.append(s)
    viewer = Session(stub, "viewer")   # grpcio's default receive limit: 4 MiB per message
    stub.Join(p.JoinRequest(session_id=viewer.id, channel_name="huge", channel_type=MSG, with_presence=True), timeout=10)
    pages = []
    while True:
        e = viewer.next_presence(timeout=10)
        assert e.type == p.PRESENCE_EVENT_TYPE_SNAPSHOT, e.type
        pages.append(e)
        if not e.snapshot_continues:
            break
    assert len(pages) >= 4
    assert len({e.sequence for e in pages}) == 1
    users = [u.user_id for e in pages for u in e.snapshot]
    assert sorted(users) == sorted([f"big-{i:03d}" for i in range(130)] + ["viewer"]) and len(users) == 131
    assert all(len(u.states) == 32 for e in pages for u in e.snapshot if u.user_id != "viewer")
    # the stream goes on (131 users: interval mode): the leave comes in an INTERVAL after the pages
    stub.Leave(p.LeaveRequest(session_id=holders[0].id, channel_name="huge", channel_type=MSG), timeout=10)
    deadline = time.monotonic() + 10
    while True:
        e = viewer.next_presence(timeout=max(0.1, deadline - time.monotonic()))
        assert e.type == p.PRESENCE_EVENT_TYPE_INTERVAL and e.sequence > pages[0].sequence
        if "big-000" in e.interval.leave_user_ids:
            break
