"""Writes seeds for the peer fuzz target: valid and edge-case peer requests for every peer method,
behind the byte that picks the method (the target sorts the methods by path).

    .venv/bin/python Fuzz/make-peer-seeds.py
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "Tests", "interop"))
import conftest  # noqa: E402,F401  (generates the Python stubs)

import cluster_pb2 as c  # noqa: E402
import presence_pb2 as p  # noqa: E402

MAX = 2**64 - 1
MSG = p.CHANNEL_TYPE_MESSAGE
M = "/presence.cluster.v1.Membership/"
P = "/presence.cluster.v1.PeerPresence/"
PATHS = sorted([M + "Ping", M + "IndirectPing", M + "Join", P + "Channel", P + "Home", P + "Push", P + "Digest", P + "Exchange", P + "Confirm"])


def member(node, status=c.MEMBER_STATUS_ALIVE, inc=0, boot=1):
    return c.MemberUpdate(node_id=node, address="127.0.0.1:1", status=status, incarnation=inc, boot=boot)


def session(sid="s1", user="alice", gw="fuzz-1", version=1):
    return c.SessionRef(session_id=sid, user_id=user, gateway=gw, with_presence=True, gateway_boot=1, version=version)


seeds = {
    "Ping": [
        c.PingRequest(from_node_id="n2", from_address="127.0.0.1:1", sequence=1, gossip=[member("n2"), member("fuzz-1", c.MEMBER_STATUS_DEAD, MAX)], from_boot=1),
        c.PingRequest(from_node_id="n3", from_address="x", sequence=MAX, gossip=[member("n4", c.MEMBER_STATUS_SUSPECT, MAX - 1, MAX)], from_boot=MAX),
    ],
    "IndirectPing": [c.IndirectPingRequest(from_node_id="n2", from_address="127.0.0.1:1", target_node_id="n3", target_address="127.0.0.1:2", sequence=7, gossip=[member("n3")])],
    "Join": [c.JoinRequest(member=member("n5", inc=MAX, boot=MAX))],
    "Channel": [
        c.ChannelCall(channel_name="lobby", channel_type=MSG, op=op, hops=h, session=session(), items=[p.StateItem(key="k", value="v")],
                      keys=["k"], user_id="alice", include_state=True, ring_fingerprint=fp, floor=fl, state_version=sv)
        for op, h, fp, fl, sv in [(c.CHANNEL_OP_JOIN, 0, 0, 0, 0), (c.CHANNEL_OP_SET_STATE, 2**32 - 1, MAX, MAX, MAX),
                                  (c.CHANNEL_OP_LIST, 0, 0, 0, 0), (c.CHANNEL_OP_ANNOUNCE, 1, 0, 0, 1), (c.CHANNEL_OP_LEAVE, 0, 0, 0, 0)]
    ],
    "Home": [
        c.HomeCall(user_ids=["alice"], op=op, hops=h, session=session(), status=p.USER_STATUS_AWAY,
                   channel=c.SessionChannel(channel_name="lobby", channel_type=MSG, with_presence=True), watching=["bob"], ring_fingerprint=0)
        for op, h in [(c.HOME_OP_SESSION_OPENED, 0), (c.HOME_OP_SET_STATUS, 0), (c.HOME_OP_WATCH, 2**32 - 1), (c.HOME_OP_CLAIM_SESSION, 0), (c.HOME_OP_STATUSES, 0)]
    ],
    "Push": [
        c.PushBatch(from_node_id="n2", from_boot=1, to_boot=0, handoff_done=True, handoff_request=MAX,
                    deliveries=[c.Delivery(channel_name="lobby", channel_type=MSG, to_sessions=["s1"], framed=b"\x00\x00\x00\x00\x02\x08\x01", snapshot=True, sequence=MAX)],
                    channels=[c.ChannelRecord(channel_name="lobby", channel_type=MSG, sequence=MAX, full=True, handoff=True, term=MAX,
                                              members=[c.MemberRecord(user_id="alice", sessions=[session(version=MAX)], state=[p.StateItem(key="k", value="v")], state_version=MAX)],
                                              departed=[c.Departure(session_id="s0", user_id="bob", version=MAX, at_ms=-(2**63))],
                                              gone=[c.GoneGateway(node_id="n9", boot=MAX, gone_ms=MAX)])],
                    users=[c.UserRecord(user_id="alice", chosen=p.USER_STATUS_BUSY, ever_opened=True, term=MAX, chosen_version=MAX, counter=MAX,
                                        sessions=[c.HomeSession(session_id="s1", gateway="n2", gateway_boot=MAX, version=MAX, watching=["bob"],
                                                                channels=[c.SessionChannel(channel_name="lobby", channel_type=MSG)])])],
                    moved=[c.SessionMoved(session_id="s1", gateway="n2", gateway_boot=1, version=MAX)],
                    copy_requests=[c.SessionChannel(channel_name="lobby", channel_type=MSG)], home_copy_requests=["alice"], relay_to="n3"),
    ],
    "Digest": [c.DigestRequest(from_node_id="n2", from_boot=1, ring_fingerprint=MAX, channel_counts=[2**32 - 1] * 64, channel_sums=[MAX] * 64,
                               home_counts=[1] * 3, home_sums=[MAX])],
    "Exchange": [c.ExchangeRequest(from_node_id="n2", from_boot=1, channel_buckets=[0, 63, 2**32 - 1], home_buckets=[2**32 - 1],
                                   channel_facts=[c.ChannelFact(channel_name="lobby", channel_type=MSG, session=session(version=MAX), state_version=MAX)],
                                   home_facts=[c.HomeFact(user_id="alice", session=c.HomeSession(session_id="s1", gateway="n2", version=MAX), watcher=True)])],
    "Confirm": [c.ConfirmRequest(from_node_id="n2", from_boot=1, gone=[c.KeySession(channel_name="lobby", channel_type=MSG, user_id="alice", session_id="s1", version=MAX, gateway="n2", gateway_boot=MAX)])],
}

out = os.path.join(ROOT, "Fuzz", "corpus", "peer")
os.makedirs(out, exist_ok=True)
for name, messages in seeds.items():
    index = next(i for i, path in enumerate(PATHS) if path.endswith("/" + name))
    for k, m in enumerate(messages):
        with open(os.path.join(out, f"{name.lower()}-{k}"), "wb") as f:
            f.write(bytes([index]) + m.SerializeToString())
print(len(os.listdir(out)), "seeds in", out)
