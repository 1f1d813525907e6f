"""The invariant checks of RELIABILITY.md, and the history printed with each violation.

Rules, where the contract leaves a choice (each is also in the README):
- Invariant 1/2/8 (after the quiet period, on every live node): a user or state key the model has
  and a node lacks is a lost acknowledgement (1); a user listed although all its sessions ended is a
  ghost (2); a user listed in a channel its live sessions left, or a state key the node has and the
  model does not, is a stale effect undone or resurrected (8); a wrong value is 1. Keys the model
  cannot know (an operation without a definite answer) are skipped and counted.
- Invariant 2 is also sampled during the run: a user without a session for longer than
  presence timeout + 1.5 s must have no channels and read OFFLINE on a reachable node.
- Invariant 3: a REMOTE_LEAVE / REMOTE_TIMEOUT (or an INTERVAL naming the user as left or timed
  out) at server time t is a flap when the model has the user *certainly* in the channel over
  [t - 0.5 s, t + 0.5 s]: joined (acknowledged) before, and no leave, close or lost session
  of it started before. A SNAPSHOT that omits such a user counts too.
- Invariant 4: a resume refused (or answered with a new session) less than the presence timeout
  after the stream stopped working (the start of the fault that broke it, else when the client
  saw it break), or no node answering a resume within the timeout.
- Invariant 5: per session and channel subscription (Join with presence .. Leave/close), the first
  event is a SNAPSHOT, every later event has a higher sequence than every one before (a SNAPSHOT may
  repeat the last), and applying SNAPSHOT + events at the end gives the model's listing (the
  session's own user's state is not compared: a session does not get the events its own calls
  cause). The last status a watcher received for each watched user must be the user's status.
- Invariant 6: after each fault ends, every live node reports the same alive members and ring
  (all live nodes) within 3 s.
- Invariant 7: a call with a non-retryable error, or without a definite answer within 5 s.
- Invariant 8 also covers events: a REMOTE_JOIN / REMOTE_STATE_CHANGED for a user *certainly out*
  of the channel (no session could have been in it within ±0.5 s, nor lingering within the ghost
  bound after a session end), or a SNAPSHOT listing such a user."""
import random
import threading
import time

import grpc

from clock import from_wall_ms, now
from model import INF, STATUS_NAMES, chan_label, short

INVARIANTS = {
    1: "nothing acknowledged is lost",
    2: "no ghosts",
    3: "no flaps",
    4: "no lost session",
    5: "ordered, gap-free events",
    6: "one membership view",
    7: "availability",
    8: "stale actors are harmless",
}
EV = {0: "UNSPECIFIED", 1: "SNAPSHOT", 2: "INTERVAL", 3: "REMOTE_JOIN", 4: "REMOTE_LEAVE", 5: "REMOTE_TIMEOUT",
      6: "REMOTE_STATE_CHANGED"}
MARGIN = 0.5
# After a cut from the others heals, the node's sessions reach their homes again within an
# anti-entropy round and a probe period.
HEAL_ROUND = 1.5
ANSWER_BOUND = 5.0


class Violation:
    def __init__(self, inv, title, lines=(), user=None, channel=None, t=None, subscriber=None):
        self.inv = inv
        self.title = title
        self.lines = list(lines)
        self.user = user
        self.channel = channel
        self.t = t
        self.subscriber = subscriber
        self.history = []

    def to_json(self):
        return {"invariant": self.inv, "title": self.title, "details": self.lines, "user": self.user,
                "channel": chan_label(self.channel) if self.channel else None,
                "t": None if self.t is None else round(self.t, 3), "history": self.history}


def states_of(items):
    return {s.key: s.value for s in items}


def fmt_state(st):
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(st.items())) + "}"


class EventIndex:
    """Every presence event every session received, by the (user, channel) it concerns, for the
    histories: one line per event (type and sequence), however many subscribers received it."""

    def __init__(self, devices):
        groups = {}   # (user, ch, type, seq, ts) -> [first receipt, [(device, node)], text]
        for dev in devices:
            for t, sid, node, kind, ev in dev.events:
                if kind != "presence":
                    continue
                ch = (ev.channel_name, ev.channel_type)
                ts = from_wall_ms(ev.timestamp_ms)
                if ev.type in (3, 4, 5, 6):
                    extra = f" {fmt_state(states_of(ev.states))}" if ev.type == 6 else ""
                    items = [(ev.publisher, f"{EV[ev.type]} seq={ev.sequence}{extra}")]
                elif ev.type == 2:
                    iv = ev.interval
                    items = [(u, f"INTERVAL seq={ev.sequence}: {what}")
                             for what, ids in (("joined", iv.join_user_ids), ("left", iv.leave_user_ids), ("timed out", iv.timeout_user_ids))
                             for u in ids]
                else:
                    continue
                for user, text in items:
                    g = groups.setdefault((user, ch, text, round(ts, 3)), [t, [], ts])
                    g[0] = min(g[0], t)
                    g[1].append((dev.name, node))
        self.by_key = {}
        for (user, ch, text, _), (t, seen, ts) in groups.items():
            names = sorted({d for d, _ in seen})
            nodes = sorted({n for _, n in seen})
            who = ", ".join(names[:4]) + (f" +{len(names) - 4}" if len(names) > 4 else "")
            self.by_key.setdefault((user, ch), []).append(
                (t, f"{text} (server {ts:.2f}s) seen by {who} via {','.join(f'node-{n}' for n in nodes)}"))

    def get(self, user, ch):
        return self.by_key.get((user, ch), [])


class Checker:
    def __init__(self, env):
        self.env = env
        self.model = env.model
        self.violations = []
        self.skipped = 0           # comparisons skipped on indeterminate keys
        self.counts = {"listings_compared": 0, "user_channel_lists_compared": 0, "statuses_compared": 0,
                       "get_state_compared": 0, "events_checked": 0, "subscriptions_checked": 0,
                       "final_views_compared": 0, "watch_views_compared": 0}

    def check_exits(self, nodes):
        """A node that exited on its own (a crash, a trap), or not cleanly after SIGTERM, is a
        violation (RELIABILITY.md, "Checks that must not look away"), not a node to leave out."""
        for node in nodes:
            problems = list(node.exit_problems)
            unexpected = node.unexpected_exit()
            if unexpected:
                problems.append(unexpected)
            for p in problems:
                self.add(Violation(7, p, [node.log_tail(1500)]))

    def add(self, v):
        self.violations.append(v)
        return v

    # ---- reading a node

    def read_node(self, node, users, channels, sample_absent=12):
        """Everything a node says (listings with state, user channels, statuses, GetState)."""
        env = self.env
        p = env.p
        ch_ = grpc.insecure_channel(node.client_address, options=[("grpc.use_local_subchannel_pool", 1)])
        stub = env.pg.PresenceStub(ch_)
        out = {"listing": {}, "occupancy": {}, "channels": {}, "status": {}, "state": {}, "errors": []}

        def rpc(method, req):
            last = None
            for attempt in range(4):
                try:
                    return getattr(stub, method)(req, timeout=3.0)
                except grpc.RpcError as e:
                    last = e
                    if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise
                    time.sleep(0.3)
            raise last

        try:
            for ch in channels:
                listing, page, pages = {}, "", 0
                while True:
                    pages += 1
                    r = rpc("GetOnlineUsers", p.GetOnlineUsersRequest(channel_name=ch[0], channel_type=ch[1],
                                                                         include_state=True, page=page))
                    for u in r.users:
                        listing[u.user_id] = states_of(u.states)
                    out["occupancy"][ch] = r.total_occupancy
                    page = r.next_page
                    if not page or pages > 50:
                        break
                out["listing"][ch] = listing
            for u in users:
                r = rpc("GetUserChannels", p.GetUserChannelsRequest(user_id=u))
                out["channels"][u] = {(c.channel_name, c.channel_type) for c in r.channels}
            r = rpc("GetUserStatuses", p.GetUserStatusesRequest(user_ids=list(users)))
            out["status"] = {s.user_id: s.status for s in r.statuses}
            rng = random.Random(node.index)
            absent = []
            for u in users:
                for ch in channels:
                    if self.model.in_channel(u, ch):
                        out["state"][(u, ch)] = self._get_state(rpc, p, u, ch)
                    else:
                        absent.append((u, ch))
            for u, ch in rng.sample(absent, min(sample_absent, len(absent))):
                out["state"][(u, ch)] = self._get_state(rpc, p, u, ch)
        except grpc.RpcError as e:
            out["errors"].append(f"{e.code().name}: {e.details()}")
        finally:
            ch_.close()
        return out

    @staticmethod
    def _get_state(rpc, p, u, ch):
        try:
            r = rpc("GetState", p.GetStateRequest(channel_name=ch[0], channel_type=ch[1], user_id=u))
            return states_of(r.state.states)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND and (e.details() or "").startswith("PRESENCE_USER_NOT_EXIST"):
                return None
            raise

    def quick_listing(self, node, channels):
        """Only the listings (for the repair-time measurement); None when the node does not answer."""
        env = self.env
        p = env.p
        ch_ = grpc.insecure_channel(node.client_address, options=[("grpc.use_local_subchannel_pool", 1)])
        stub = env.pg.PresenceStub(ch_)
        out = {}
        try:
            for ch in channels:
                listing, page = {}, ""
                for _ in range(50):
                    r = stub.GetOnlineUsers(p.GetOnlineUsersRequest(channel_name=ch[0], channel_type=ch[1],
                                                                    include_state=True, page=page), timeout=2.0)
                    for u in r.users:
                        listing[u.user_id] = states_of(u.states)
                    page = r.next_page
                    if not page:
                        break
                out[ch] = listing
            return out
        except grpc.RpcError:
            return None
        finally:
            ch_.close()

    # ---- invariants 1, 2, 8 on the quiet cluster

    def check_nodes(self, reads, users, channels, t):
        """`reads`: node id -> read_node() result."""
        m = self.model
        diffs = {}   # (inv, user, channel, what, expected, observed) -> [node ids]

        def diff(inv, user, ch, what, expected, observed, node):
            diffs.setdefault((inv, user, ch, what, expected, observed), []).append(node)

        expected_listing = {ch: m.listing(ch) for ch in channels}
        for nid, r in sorted(reads.items()):
            if r["errors"]:
                self.add(Violation(7, f"{nid} did not answer the read calls on the quiet cluster",
                                   [f"error: {e}" for e in r["errors"]], t=t))
            for ch, listing in r["listing"].items():
                self.counts["listings_compared"] += 1
                exp = expected_listing[ch]
                occ = r["occupancy"].get(ch)
                if occ is not None and occ != len(listing):
                    diff(1, None, ch, "total_occupancy", str(len(listing)), str(occ), nid)
                for u in sorted(set(exp) | set(listing)):
                    if m.tainted(u, ch):
                        self.skipped += 1
                        continue
                    if u in exp and u not in listing:
                        diff(1, u, ch, "listing", f"listed with {fmt_state(exp[u])}", "not listed", nid)
                    elif u in listing and u not in exp:
                        inv = 2 if not m.users.get(u) or not m.users[u].live else 8
                        diff(inv, u, ch, "listing", "not listed", f"listed with {fmt_state(listing[u])}", nid)
                    elif listing[u] != exp[u]:
                        extra = set(listing[u]) - set(exp[u])
                        inv = 8 if extra and all(listing[u].get(k) == v for k, v in exp[u].items()) else 1
                        diff(inv, u, ch, "state in listing", fmt_state(exp[u]), fmt_state(listing[u]), nid)
            for u, chans in r["channels"].items():
                self.counts["user_channel_lists_compared"] += 1
                exp = m.user_channels(u)
                for ch in sorted(exp ^ chans):
                    if m.tainted(u, ch):
                        self.skipped += 1
                        continue
                    if ch in exp:
                        diff(1, u, ch, "GetUserChannels", "includes it", "missing", nid)
                    else:
                        inv = 2 if not m.users.get(u) or not m.users[u].live else 8
                        diff(inv, u, ch, "GetUserChannels", "not included", "included", nid)
            for u, st in r["status"].items():
                self.counts["statuses_compared"] += 1
                mu = m.users.get(u)
                if mu is not None and mu.status_uncertain:
                    self.skipped += 1
                    continue
                exp = m.visible_status(u)
                if st != exp:
                    inv = 2 if exp == 4 and mu is not None and not mu.live else 1
                    diff(inv, u, None, "GetUserStatuses", STATUS_NAMES.get(exp), STATUS_NAMES.get(st, st), nid)
            for (u, ch), st in r["state"].items():
                self.counts["get_state_compared"] += 1
                if m.tainted(u, ch):
                    continue
                exp = expected_listing[ch].get(u)
                if st == exp:
                    continue
                if exp is None:
                    inv = 2 if not m.users.get(u) or not m.users[u].live else 8
                    diff(inv, u, ch, "GetState", "PRESENCE_USER_NOT_EXIST", fmt_state(st), nid)
                elif st is None:
                    diff(1, u, ch, "GetState", fmt_state(exp), "PRESENCE_USER_NOT_EXIST", nid)
                else:
                    extra = set(st) - set(exp)
                    inv = 8 if extra and all(st.get(k) == v for k, v in exp.items()) else 1
                    diff(inv, u, ch, "GetState", fmt_state(exp), fmt_state(st), nid)
        for (inv, u, ch, what, expected, observed), nodes in sorted(diffs.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]), kv[0][3])):
            where = f"{u} in {chan_label(ch)}" if u and ch else (u or chan_label(ch))
            self.add(Violation(inv, f"{what}: {where} on {','.join(nodes)}",
                               [f"expected (model): {expected}", f"observed: {observed}"], user=u, channel=ch, t=t))

    # ---- invariants 3, 5, 8 from the events every session received

    def periods(self, dev):
        """(sid, channel) -> [(start, end, uncertain)] subscription periods of the device's sessions,
        from its calls (Join with presence .. Leave / Join without presence / close / loss)."""
        m = self.model
        calls = sorted((c for c in m.calls if c.device == dev.name and c.sid), key=lambda c: c.t0)
        out = {}
        open_ = {}   # (sid, ch) -> (start, uncertain)
        for c in calls:
            if c.method == "Join":
                key = (c.sid, c.channel)
                wp = c.args.get("with_presence")
                if wp and key not in open_:
                    if c.outcome == "ok":
                        open_[key] = (c.t0, False)
                    elif c.outcome != "error":
                        open_[key] = (c.t0, True)
                elif not wp and key in open_ and c.outcome != "error":
                    start, unc = open_.pop(key)
                    out.setdefault(key, []).append((start, c.t0, unc or c.outcome != "ok"))
            elif c.method == "Leave":
                key = (c.sid, c.channel)
                if key in open_ and c.outcome != "error":
                    start, unc = open_.pop(key)
                    out.setdefault(key, []).append((start, c.t0, unc or c.outcome != "ok"))
            elif c.method == "CloseSession" and c.outcome == "ok":
                for key in [k for k in open_ if k[0] == c.sid]:
                    start, unc = open_.pop(key)
                    out.setdefault(key, []).append((start, c.t0, unc))
        for key, (start, unc) in open_.items():
            s = m.sessions.get(key[0])
            end = s.ended_t if s is not None and s.ended_t is not None else INF
            out.setdefault(key, []).append((start, end, unc))
        return out

    def check_events(self, devices, channels, final_t):
        flaps = {}      # (user, ch, type, seq) -> [subscriber names], t
        stale = {}
        for dev in devices:
            periods = self.periods(dev)
            per_period = {}
            for t, sid, node, kind, ev in dev.events:
                if kind != "presence":
                    continue
                ch = (ev.channel_name, ev.channel_type)
                ts = from_wall_ms(ev.timestamp_ms)
                self.counts["events_checked"] += 1
                # invariant 3 (flaps) and 8 (stale joins) do not depend on the period
                self._event_rules(dev, sid, node, t, ts, ev, ch, flaps, stale)
                for i, (start, end, unc) in enumerate(periods.get((sid, ch), [])):
                    # (an event made before this subscription began is a late one of the previous)
                    if start <= t < end and ts >= start - 0.05:
                        per_period.setdefault((sid, ch, i), []).append((t, node, ev))
                        break
            for (sid, ch), plist in periods.items():
                for i, (start, end, unc) in enumerate(plist):
                    evs = per_period.get((sid, ch, i), [])
                    self._check_period(dev, sid, ch, start, end, unc, evs, final_t)
        # one violation per spurious leave/timeout event (however many subscribers saw it); SNAPSHOTs
        # that omit a user are grouped per continuous stay of that user, stale ones per burst
        snap_groups = {}
        for (u, ch, typ, seq), (subs, t, ts, since) in sorted(flaps.items(), key=lambda kv: kv[1][1]):
            if typ == "SNAPSHOT without the user":
                snap_groups.setdefault((u, ch, since[0] if since else None), []).append((t, ts, seq, subs, since))
                continue
            what = EV.get(typ, typ) if isinstance(typ, int) else typ
            self.add(Violation(3, f"{what} for {u} in {chan_label(ch)} (seq {seq}) while {u} stayed in the channel",
                               [f"seen by {self._names(subs)} at {t:.2f}s (server time {ts:.2f}s)",
                                self._since(u, ch, since)], user=u, channel=ch, t=ts, subscriber=sorted(subs)[0]))
        for (u, ch, _), items in sorted(snap_groups.items(), key=lambda kv: kv[1][0][0]):
            t, ts, seq, subs, since = items[0]
            allsubs = set().union(*(x[3] for x in items))
            seqs = sorted({x[2] for x in items})
            self.add(Violation(3, f"{len(items)} SNAPSHOT(s) without {u} in {chan_label(ch)} (seq {seqs[0]}..{seqs[-1]}, "
                                  f"{items[0][1]:.2f}s..{items[-1][1]:.2f}s) while {u} stayed in the channel",
                               [f"first seen by {self._names(subs)} at {t:.2f}s (server time {ts:.2f}s); "
                                f"{len(allsubs)} subscriber(s) in all", self._since(u, ch, since)],
                               user=u, channel=ch, t=ts, subscriber=sorted(subs)[0]))
        bursts, open_bursts = [], {}
        for (u, ch, typ, seq), (subs, t, ts) in sorted(stale.items(), key=lambda kv: kv[1][1]):
            what = EV.get(typ, typ) if isinstance(typ, int) else typ
            last = open_bursts.get((u, ch, what))
            if last and ts - last[1][-1][1] < 10.0:
                last[1].append((t, ts, seq, subs))
            else:
                open_bursts[(u, ch, what)] = burst = ((u, ch, what), [(t, ts, seq, subs)])
                bursts.append(burst)
        for (u, ch, what), items in sorted(bursts, key=lambda b: b[1][0][0]):
            t, ts, seq, subs = items[0]
            seqs = sorted({x[2] for x in items})
            head = f"{what} for {u} in {chan_label(ch)} (seq {seq})" if len(items) == 1 else \
                f"{len(items)} x {what} for {u} in {chan_label(ch)} (seq {seqs[0]}..{seqs[-1]}, {items[0][1]:.2f}s..{items[-1][1]:.2f}s)"
            self.add(Violation(8, f"{head} while {u} was out of the channel",
                               [f"first seen by {self._names(subs)} at {t:.2f}s (server time {ts:.2f}s)",
                                f"model: no session of {u} was (or could linger) in {chan_label(ch)} around then"],
                               user=u, channel=ch, t=ts, subscriber=sorted(subs)[0]))

    @staticmethod
    def _names(subs):
        subs = sorted(subs)
        return ", ".join(subs[:6]) + (f" +{len(subs) - 6}" if len(subs) > 6 else "")

    @staticmethod
    def _since(u, ch, since):
        if not since:
            return f"model: {u} certainly in {chan_label(ch)} then"
        return (f"model: {u} certainly in {chan_label(ch)} from {since[0]:.2f}s to "
                + ("the end" if since[1] == INF else f"{since[1]:.2f}s"))

    def _event_rules(self, dev, sid, node, t, ts, ev, ch, flaps, stale):
        m = self.model
        a, b = ts - MARGIN, ts + MARGIN
        gone = []
        if ev.type in (4, 5):
            gone = [(ev.publisher, ev.type)]
        elif ev.type == 2:
            a = ts - 1.5   # an INTERVAL reports what happened during the last interval
            gone = [(u, "INTERVAL(leave)") for u in ev.interval.leave_user_ids] + \
                   [(u, "INTERVAL(timeout)") for u in ev.interval.timeout_user_ids]
        for u, typ in gone:
            if not m.tainted(u, ch) and m.certainly_in(u, ch, a, b) and not self.all_stalled(u, ch, a, b):
                rec = flaps.setdefault((u, ch, typ, ev.sequence), [set(), t, ts, m.continuous_since(u, ch, ts)])
                rec[0].add(dev.name)
        if ev.type == 1:
            listed = {x.user_id for x in ev.snapshot}
            for u in m.users:
                if u not in listed and not m.tainted(u, ch) and m.certainly_in(u, ch, a, b) and not self.all_stalled(u, ch, a, b):
                    rec = flaps.setdefault((u, ch, "SNAPSHOT without the user", ev.sequence), [set(), t, ts, m.continuous_since(u, ch, ts)])
                    rec[0].add(dev.name)
            for u in listed:
                if not m.tainted(u, ch) and m.certainly_out(u, ch, a, b):
                    rec = stale.setdefault((u, ch, "SNAPSHOT listing the user", ev.sequence), [set(), t, ts])
                    rec[0].add(dev.name)
        if ev.type in (3, 6):
            u = ev.publisher
            if not m.tainted(u, ch) and m.certainly_out(u, ch, a, b):
                rec = stale.setdefault((u, ch, ev.type, ev.sequence), [set(), t, ts])
                rec[0].add(dev.name)

    def attachment(self, sid, t):
        """The node the session's stream was attached to at time t (None: not yet), and when it
        next moved (INF: never)."""
        att = self.env.attachments.get(sid, [])
        node, t_next = None, INF
        for i, (ta, n) in enumerate(att):
            if ta <= t:
                node = n
                t_next = att[i + 1][0] if i + 1 < len(att) else INF
        return node, t_next

    def stalled(self, sid, t):
        """True when the session's stream, at time t, sat on a node that clients could not reach
        (paused, cut off) for at least the presence timeout without the client moving: the session
        was then effectively disconnected, and timing it out is legitimate."""
        node, t_next = self.attachment(sid, t)
        if node is None:
            return False
        for f in self.env.faults.history:
            if (node in f.client_nodes and f.kind.startswith(("pause", "partition")) or node in f.cut_off) and f.t_start <= t:
                end = min(f.t_end if f.t_end is not None else INF, t_next)
                if end - f.t_start >= self.env.timeout - MARGIN:
                    return True
        return False

    def cut_off_since(self, sid, t, after_heal=HEAL_ROUND):
        """When the cluster last heard of the session if its stream sat at time t on a node cut off
        from every other node (its clients still reaching it), or had until less than after_heal
        before: the start of that cut (just after the heal, the node answers NO_LEASE until a probe
        is answered, and its sessions reach their homes with the next anti-entropy round). None
        otherwise."""
        node, _ = self.attachment(sid, t)
        starts = [f.t_start for f in self.env.faults.history
                  if node in f.cut_off and f.t_start <= t <= (f.t_end if f.t_end is not None else INF) + after_heal]
        return min(starts) if starts else None

    def all_stalled(self, uid, ch, a, b):
        sids = self.model.sessions_certain_during(uid, ch, a, b)
        return bool(sids) and all(self.stalled(s, b) for s in sids)

    def _check_period(self, dev, sid, ch, start, end, uncertain, evs, final_t):
        m = self.model
        label = f"{dev.name} s={short(sid)} in {chan_label(ch)}"
        if not evs:
            return
        self.counts["subscriptions_checked"] += 1
        first_t, first_node, first = evs[0]
        if first.type != 1 and not uncertain:
            self.add(Violation(5, f"{label}: first event after joining with presence is {EV.get(first.type)} seq={first.sequence}, not SNAPSHOT",
                               [f"joined at {start:.2f}s; first event at {first_t:.2f}s via node-{first_node}"],
                               user=dev.user.uid, channel=ch, t=first_t, subscriber=dev.name))
        top = None
        last_node = first_node
        backwards = []
        for t, node, ev in evs:
            if top is not None:
                bad = ev.sequence < top if ev.type == 1 else ev.sequence <= top
                if bad:
                    moved = " after a move from node-%d to node-%d" % (last_node, node) if node != last_node else ""
                    backwards.append((t, node, ev, top, moved))
            top = ev.sequence if top is None else max(top, ev.sequence)
            last_node = node
        if backwards:
            # one violation per subscription, with its first few out-of-order events
            t, node, ev, prev, moved = backwards[0]
            self.add(Violation(5, f"{label}: {len(backwards)} event(s) out of sequence, first {EV.get(ev.type)} seq={ev.sequence} "
                                  f"after seq {prev}{moved}",
                               [f"{bt:.2f}s via node-{bn}: {EV.get(be.type)} seq={be.sequence} ({be.publisher or '-'}) after seq {bp}{bm}"
                                for bt, bn, be, bp, bm in backwards[:5]],
                               user=ev.publisher or dev.user.uid, channel=ch, t=t, subscriber=dev.name))
        # the final view of a subscription still open at the end
        if end != INF or uncertain:
            return
        s = m.sessions.get(sid)
        if s is None or s.end is not None or not s.channels.get(ch):
            return
        view = None
        anomalies = []
        for t, node, ev in evs:
            if ev.type == 1:
                view = {x.user_id: states_of(x.states) for x in ev.snapshot}
            elif view is None:
                continue
            elif ev.type == 3:
                view[ev.publisher] = {}
            elif ev.type in (4, 5):
                view.pop(ev.publisher, None)
            elif ev.type == 6:
                if ev.publisher not in view:
                    anomalies.append(f"{t:.2f}s REMOTE_STATE_CHANGED for {ev.publisher}, not in the view")
                view[ev.publisher] = states_of(ev.states)
            elif ev.type == 2:
                iv = ev.interval
                for u in iv.join_user_ids:
                    view[u] = {}
                for u in list(iv.leave_user_ids) + list(iv.timeout_user_ids):
                    view.pop(u, None)
                for us in iv.user_states:
                    view[us.user_id] = states_of(us.states)
        if view is None:
            return
        exp = m.listing(ch)
        me = dev.user.uid
        problems = []
        self.counts["final_views_compared"] += 1
        for u in sorted(set(exp) | set(view)):
            if m.tainted(u, ch):
                continue
            if u not in view:
                problems.append((u, f"{u} missing (model: {fmt_state(exp[u])})"))
            elif u not in exp:
                problems.append((u, f"{u} present with {fmt_state(view[u])} (model: not in the channel)"))
            elif u != me and view[u] != exp[u]:
                problems.append((u, f"{u} has {fmt_state(view[u])} (model: {fmt_state(exp[u])})"))
        if problems:
            self.add(Violation(5, f"{label}: SNAPSHOT + events do not end as the listing ({len(problems)} user(s) differ)",
                               [p for _, p in problems[:8]] + anomalies[:3],
                               user=problems[0][0], channel=ch, t=final_t, subscriber=dev.name))

    def check_watches(self, devices, watch_answers, final_t):
        """The last status each live session received for each user it watches (the Watch answer or
        a later status event) must be that user's visible status."""
        m = self.model
        for dev in devices:
            sid = dev.sid
            s = m.sessions.get(sid) if sid else None
            if s is None or s.end is not None:
                continue
            last = {}
            for t, asid, statuses in watch_answers.get(sid, []):
                for u, st in statuses.items():
                    if u not in last or last[u][0] <= t:
                        last[u] = (t, st, "Watch answer")
            for t, esid, node, kind, ev in dev.events:
                if kind == "status" and esid == sid:
                    if ev.user_id not in last or last[ev.user_id][0] <= t:
                        last[ev.user_id] = (t, ev.status, f"status event via node-{node}")
            for u in sorted(s.watching):
                mu = m.users.get(u)
                if mu is not None and mu.status_uncertain:
                    continue
                exp = m.visible_status(u)
                got = last.get(u)
                if got is None:
                    continue
                self.counts["watch_views_compared"] += 1
                if got[1] != exp:
                    self.add(Violation(5, f"{dev.name} s={short(sid)} watches {u}: last status received {STATUS_NAMES.get(got[1])}, "
                                          f"but {u} is {STATUS_NAMES.get(exp)}",
                                       [f"last received at {got[0]:.2f}s ({got[2]})"], user=u, t=final_t, subscriber=dev.name))

    # ---- invariants 4, 6, 7

    def check_resumes(self, attempts, losses, timeout):
        for r in attempts:
            if r["outcome"] in ("new-session", "failed") and (r["outcome"] == "new-session" or r["code"] in ("NOT_FOUND", "PERMISSION_DENIED")):
                # (a stream on a node cut off from the others: the cluster's last sign of the
                # session is the cut's start, whenever the client noticed)
                since = self.cut_off_since(r["sid"], r["origin"])
                window = r["t0"] - min(r["origin"], since if since is not None else INF)
                if window < timeout - 0.25:
                    how = "answered with a new session" if r["outcome"] == "new-session" else f"refused with {r['code']}"
                    self.add(Violation(4, f"{r['device']} s={short(r['sid'])}: resume on {r['node']} {how} "
                                          f"{window:.2f}s after the stream stopped working (timeout {timeout:g}s)",
                                       [f"stream stopped at {r['origin']:.2f}s; resume sent at {r['t0']:.2f}s"],
                                       user=r["user"], t=r["t0"], subscriber=r["device"]))
        for loss in losses:
            if loss["reason"].startswith("no node answered"):
                self.add(Violation(4, f"{loss['device']} s={short(loss['sid'])}: no node answered a resume within the presence timeout",
                                   [f"stream stopped at {loss['origin']:.2f}s; given up at {loss['t']:.2f}s"],
                                   user=loss["user"], t=loss["t"], subscriber=loss["device"]))

    def check_convergence(self, faults, final):
        for f in faults:
            if f.convergence is None or f.convergence > 3.0:
                took = "not within 10 s" if f.convergence is None else f"{f.convergence:.2f}s"
                self.add(Violation(6, f"after {f.label()} (ended {f.t_end:.2f}s) membership converged {took}",
                                   ([f"views: {f.views}"] if f.views else []) + f.trace_lines(), t=f.t_end))
        if final is not None and (final[0] is None or final[0] > 3.0):
            took = "not within 10 s" if final[0] is None else f"{final[0]:.2f}s"
            self.add(Violation(6, f"at the end, with every node back, membership converged {took}",
                               [f"views: {final[1]}"], t=final[2]))

    def check_calls(self, calls, faults=()):
        # Invariant 7's bound is 5 s during a single fault: a call whose first 5 s overlap the
        # windows of two faults (a fault's start to the membership's convergence after it ended)
        # may meet each, and is held to 5 s for each. The simulation's checker draws the same line.
        windows = [(f.t_start, (f.t_end if f.t_end is not None else float("inf")) + (f.convergence if f.convergence is not None else 10.0))
                   for f in faults]

        def bound_of(c):
            overlapped = sum(1 for a, b in windows if a < c.t0 + ANSWER_BOUND and b > c.t0)
            return ANSWER_BOUND * (2 if overlapped >= 2 else 1)

        for c in calls:
            def v(inv, title, extra=()):
                self.add(Violation(inv, title, [c.describe(), *extra], user=c.user, channel=c.channel, t=c.t0, subscriber=c.device))

            vanished = [n for n in c.notes if n.startswith("vanished")]
            if vanished:
                v(4, f"{c.device} s={short(c.sid)}: session unknown to its gateway while its stream was up", vanished)
            if c.outcome == "error":
                v(7, f"{c.method} failed with {c.code} (not retryable) for a valid call")
            elif c.outcome == "gave-up":
                v(7, f"{c.method} got no definite answer in {c.duration:.1f}s (client gave up)")
            elif any(n.startswith("not idempotent") for n in c.notes):
                v(7, f"{c.method} retried after a lost answer failed with NOT_FOUND (not idempotent)")
            elif c.outcome == "ok" and c.duration > bound_of(c):
                v(7, f"{c.method} took {c.duration:.2f}s to a definite answer "
                     f"(bound {bound_of(c):g}s{': two faults' if bound_of(c) > ANSWER_BOUND else ''})")

    # ---- histories

    def attach_histories(self, index, faults, devices, cap=30):
        m = self.model
        by_name = {d.name: d for d in devices}
        for v in self.violations:
            lines = []
            t = v.t if v.t is not None else now()
            lo, hi = t - 60.0, t + 10.0
            if v.user:
                for et, ch, text in m.log.get(v.user, []):
                    if lo <= et <= hi and (v.channel is None or ch is None or ch == v.channel):
                        lines.append((et, f"[{v.user}] {text}"))
                if v.channel is not None:
                    for et, text in index.get(v.user, v.channel):
                        if lo <= et <= hi:
                            lines.append((et, f"[events] {text}"))
            notes = self.env.session_notes.get_user(v.user)
            if v.subscriber and v.subscriber in by_name and v.subscriber.split("/")[0] != v.user:
                # the subscriber's own session life (opens, resumes, moves) explains what it saw
                sub_user = v.subscriber.split("/")[0]
                for et, ch, text in m.log.get(sub_user, []):
                    if lo <= et <= hi and ch is None and text.startswith(v.subscriber):
                        lines.append((et, f"[{sub_user}] {text}"))
                notes += [(t, f"{v.subscriber} {x}") for t, x in self.env.session_notes.get(v.subscriber, [])]
            for et, text in notes:
                if lo <= et <= hi:
                    lines.append((et, f"[sdk] {text}"))
            for f in faults:
                end = f.t_end if f.t_end is not None else hi
                if f.t_start <= hi and end >= lo:
                    lines.append((f.t_start, f"[fault] {f.describe()}"))
            lines.sort(key=lambda x: x[0])
            seen = set()
            uniq = []
            for et, text in lines:
                if (et, text) not in seen:
                    seen.add((et, text))
                    uniq.append((et, text))
            if len(uniq) > cap:
                # keep the model's operations and the faults first, then what is nearest the violation
                def rank(x):
                    core = x[1].startswith("[fault]") or (v.user and x[1].startswith(f"[{v.user}]"))
                    return (0 if core else 1, abs(x[0] - t))
                uniq.sort(key=rank)
                uniq = sorted(uniq[:cap], key=lambda x: x[0])
            v.history = [f"{et:8.2f}s  {text}" for et, text in uniq]


class GhostSampler:
    """Invariant 2 during the run, cheaply: one user a tick whose sessions all ended more than
    presence timeout + 1.5 s ago must have no channels and read OFFLINE on a reachable node."""

    def __init__(self, env, checker, period=1.5):
        self.env = env
        self.checker = checker
        self.period = period
        self.rng = random.Random(f"ghosts-{env.seed}")
        self.reported = set()
        self.samples = 0
        self.thread = threading.Thread(target=self._run, name="ghosts", daemon=True)

    def start(self):
        self.thread.start()

    def _run(self):
        env = self.env
        m = env.model
        bound = env.timeout + 1.5
        while not env.stopped.wait(self.period):
            with m.lock:
                cands = [(u.uid, u.last_end, (u.session_activity, u.calls_started)) for u in m.users.values()
                         if not u.live and not u.in_flight and u.last_end is not None and now() - u.last_end > bound]
            if not cands:
                continue
            faults_now = env.faults.during(now(), now(), margin=0.0) if env.faults else []
            busy = {n for f in faults_now for n in f.nodes}
            nodes = [n for n in env.cluster.reachable() if n.node_id not in busy]
            if not nodes:
                continue
            uid, last_end, activity = self.rng.choice(cands)
            node = self.rng.choice(nodes)
            try:
                stub = env.pg.PresenceStub(env.sampler_channel(node))
                chans = stub.GetUserChannels(env.p.GetUserChannelsRequest(user_id=uid), timeout=1.0)
                st = stub.GetUserStatuses(env.p.GetUserStatusesRequest(user_ids=[uid]), timeout=1.0)
            except grpc.RpcError:
                continue
            self.samples += 1
            with m.lock:
                u = m.users[uid]
                unchanged = (u.session_activity, u.calls_started) == activity and not u.live and not u.in_flight
            status = st.statuses[0].status if st.statuses else None
            listed = [f"{c.channel_name}/{'MSG' if c.channel_type == 1 else 'STREAM'}" for c in chans.channels]
            if unchanged and (listed or status != 4) and (uid, last_end) not in self.reported:
                self.reported.add((uid, last_end))
                t = now()
                what = f"still in {len(listed)} channel(s)" if listed else f"reads {STATUS_NAMES.get(status, status)}, not OFFLINE,"
                self.checker.add(Violation(2, f"ghost: {uid} {what} on {node.node_id} {t - last_end:.1f}s after its last session ended",
                                           [f"GetUserChannels: {', '.join(listed) or '(none)'}; status {STATUS_NAMES.get(status, status)} "
                                            f"(expected no channels, OFFLINE within {bound:.1f}s)"], user=uid, t=t))
