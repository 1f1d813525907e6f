"""The model of what every client was acknowledged (RELIABILITY.md, "Invariants").

The model changes only on definite successful answers (and on session ends the client saw). Each
user's operations are serialized by its client (one in flight at a time), so for one user the model
is exact; the cluster is only compared with it once it is quiet.

Besides the current state, the model keeps per (user, channel) *spans*: one per session's stay in
the channel, with the times that bound it on both sides:

    join_start <= (server applies the join) <= join_ack  ...  end_start <= (server applies the end) <= end_ack

so the user was *certainly* in the channel over [join_ack, end_start] and *possibly* in it over
[join_start, end_ack]. The flap check (invariant 3) and the stale-join check (invariant 8) use them.

When an operation gets no definite answer (the client gave up, or its session was lost while the
call was in flight) the model cannot know whether it took effect: the (user, channel) it concerns is
*tainted* until a later definite operation settles it, and the checks skip it (the count is reported).
"""
import threading

from clock import fmt

INF = float("inf")

STATUS_NAMES = {0: "UNKNOWN", 1: "ONLINE", 2: "AWAY", 3: "BUSY", 4: "OFFLINE"}


def chan_label(key):
    name, ctype = key
    return f"{name}/{'MSG' if ctype == 1 else 'STREAM'}"


class Call:
    """One SDK call as the client saw it: every attempt, the final outcome, the time it took."""

    __slots__ = ("id", "user", "device", "sid", "method", "summary", "channel", "t0", "t1", "attempts",
                 "outcome", "code", "detail", "nodes", "errors", "notes", "args", "response")

    def __init__(self, cid, user, device, sid, method, summary, channel, t0):
        self.id = cid
        self.user = user
        self.device = device
        self.sid = sid
        self.method = method
        self.summary = summary
        self.channel = channel
        self.t0 = t0
        self.t1 = None
        self.attempts = 0
        self.outcome = None      # ok | error | gave-up | session-lost
        self.code = ""
        self.detail = ""
        self.nodes = []          # node of each attempt
        self.errors = []         # (t, node, code, detail) of each failed attempt
        self.notes = []
        self.args = {}
        self.response = None

    @property
    def duration(self):
        return (self.t1 if self.t1 is not None else self.t0) - self.t0

    def describe(self):
        nodes = ",".join(dict.fromkeys(self.nodes)) or "-"
        out = f"{self.device} s={short(self.sid)} {self.method} {self.summary} -> {self.outcome}"
        if self.code:
            out += f" {self.code}"
        out += f" ({self.attempts} attempt{'s' if self.attempts != 1 else ''}, {self.duration:.2f}s, {nodes})"
        if self.errors:
            out += " retried: " + ", ".join(f"{c}@{n}" for _, n, c, _ in self.errors[:4])
            if len(self.errors) > 4:
                out += f" +{len(self.errors) - 4}"
        if self.detail and self.outcome != "ok":
            out += f" [{self.detail[:120]}]"
        return out


def short(sid):
    return (sid or "-")[:8]


class Span:
    __slots__ = ("sid", "join_start", "join_ack", "end_start", "end_ack", "end_kind")

    def __init__(self, sid, join_start):
        self.sid = sid
        self.join_start = join_start
        self.join_ack = None
        self.end_start = None
        self.end_ack = None
        self.end_kind = None      # leave | closed | lost

    def certain(self):
        if self.join_ack is None:
            return None
        return (self.join_ack, self.end_start if self.end_start is not None else INF)

    def possible(self):
        if self.end_start is not None and self.end_ack is None:
            return (self.join_start, INF)
        return (self.join_start, self.end_ack if self.end_ack is not None else INF)


class Session:
    def __init__(self, sid, user, device, opened_t):
        self.sid = sid
        self.user = user
        self.device = device
        self.opened_t = opened_t
        self.ended_t = None
        self.end = None           # closed | lost
        self.channels = {}        # channel key -> with_presence
        self.watching = set()


class User:
    def __init__(self, uid):
        self.uid = uid
        self.ever_opened = False
        self.chosen = 1            # the status the user chose (SetStatus / initial_status)
        self.status_uncertain = False
        self.live = set()          # sids opened and not ended
        self.state = {}            # channel key -> {key: value}
        self.last_end = None       # when the user's last session ended (no session since)
        self.calls_started = 0     # every call of the user (the ghost sampler checks none overlapped)
        self.in_flight = 0
        self.session_activity = 0  # bumped whenever a session of this user opens or ends


class Model:
    def __init__(self, presence_timeout):
        self.timeout = presence_timeout
        self.lock = threading.RLock()
        self.users = {}
        self.sessions = {}
        self.spans = {}            # (user, channel) -> [Span]
        self.taint = {}            # (user, channel) -> (t, reason)
        self.taint_total = 0
        self.calls = []
        self.log = {}              # user -> [(t, channel or None, text)]
        self._ids = 0

    # ---- bookkeeping

    def user(self, uid):
        u = self.users.get(uid)
        if u is None:
            u = self.users[uid] = User(uid)
            self.log[uid] = []
        return u

    def new_call(self, user, device, sid, method, summary, channel, t0):
        with self.lock:
            self._ids += 1
            c = Call(self._ids, user, device, sid, method, summary, channel, t0)
            self.calls.append(c)
            u = self.user(user)
            u.calls_started += 1
            u.in_flight += 1
            return c

    def note(self, uid, t, channel, text):
        with self.lock:
            self.user(uid)
            self.log[uid].append((t, channel, text))

    def call_done(self, call):
        with self.lock:
            self.users[call.user].in_flight -= 1
        self.note(call.user, call.t0, call.channel, call.describe())

    def add_taint(self, uid, channel, t, reason):
        with self.lock:
            if (uid, channel) not in self.taint:
                self.taint_total += 1
            self.taint[(uid, channel)] = (t, reason)
            self.note(uid, t, channel, f"(model) {chan_label(channel) if channel else 'status'} indeterminate: {reason}")

    def clear_taint(self, uid, channel):
        self.taint.pop((uid, channel), None)

    def _spans(self, uid, channel):
        return self.spans.setdefault((uid, channel), [])

    def _open_span(self, uid, channel, sid):
        for s in reversed(self.spans.get((uid, channel), [])):
            if s.sid == sid and s.end_start is None:
                return s
        return None

    # ---- sessions

    def opened(self, uid, device, sid, t0, t1, initial_status):
        """A fresh session (OpenSession without resume, or a resume answered with a new session)."""
        with self.lock:
            u = self.user(uid)
            s = Session(sid, uid, device, t1)
            self.sessions[sid] = s
            had_live = bool(u.live)
            u.live.add(sid)
            u.ever_opened = True
            u.last_end = None
            u.session_activity += 1
            if initial_status:
                u.chosen = initial_status
                u.status_uncertain = False
            elif not had_live:
                # "unset means ONLINE, or the status the user already has": ambiguous until the
                # client sets its status again (its recovery does so first)
                u.status_uncertain = True
            self.note(uid, t0, None, f"{device} s={short(sid)} session opened"
                      + (f" initial_status={STATUS_NAMES[initial_status]}" if initial_status else ""))
            return s

    def _end_session(self, s, t_start, t_ack, how):
        u = self.users[s.user]
        s.ended_t = t_ack
        s.end = how
        u.live.discard(s.sid)
        u.session_activity += 1
        for ch in list(s.channels):
            span = self._open_span(s.user, ch, s.sid)
            if span:
                span.end_start, span.end_ack, span.end_kind = t_start, t_ack, how
            self._left(u, ch)
        s.channels.clear()
        if not u.live:
            u.last_end = t_ack

    def _left(self, u, ch):
        """After a session left `ch`: the user's state there goes when no session of it stays."""
        if not any(ch in self.sessions[x].channels for x in u.live):
            u.state.pop(ch, None)
            self.clear_taint(u.uid, ch)

    def closed(self, call, sid):
        with self.lock:
            s = self.sessions.get(sid)
            if s and s.end is None:
                self._end_session(s, call.t0, call.t1, "closed")

    def lost(self, sid, t_origin, t_detect, reason):
        """A session its client could not resume (refused, or never reached a node in time). It
        ended on the server somewhere after `t_origin`; by the ghost rule, at the latest
        presence timeout + 1.5 s after its end."""
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None:
                return
            self.note(s.user, t_detect, None, f"{s.device} s={short(sid)} session LOST ({reason}); broke at {fmt(t_origin)}")
            self._end_session(s, t_origin, t_detect, "lost")

    def session_channels(self, sid):
        with self.lock:
            s = self.sessions.get(sid)
            return dict(s.channels) if s else {}

    # ---- channel operations

    def join_started(self, sid, ch, t0):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None:
                return
            if self._open_span(s.user, ch, sid) is None:
                self._spans(s.user, ch).append(Span(sid, t0))

    def join_done(self, call, sid, ch, with_presence, ok):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None:
                return
            span = self._open_span(s.user, ch, sid)
            if ok:
                if span and span.join_ack is None:
                    span.join_ack = call.t1
                s.channels[ch] = with_presence
                if (s.user, ch) in self.taint and self._only_membership_taint(s.user, ch):
                    self.clear_taint(s.user, ch)
            elif call.outcome == "error" and span and span.join_ack is None:
                # refused: the join did not happen (if an earlier attempt did, it is a stale effect)
                span.end_start, span.end_ack = call.t0, call.t1
                span.join_ack = None
            elif span and span.join_ack is None:
                span.end_start = call.t1   # possibly in from join_start on, end unknown (end_ack None)
                self.add_taint(s.user, ch, call.t1, f"Join without a definite answer ({call.outcome})")

    def _only_membership_taint(self, uid, ch):
        t = self.taint.get((uid, ch))
        return t is not None and t[1].startswith(("Join", "Leave"))

    def leave_started(self, sid, ch, t0):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None:
                return
            span = self._open_span(s.user, ch, sid)
            if span:
                span.end_start = t0

    def leave_done(self, call, sid, ch, ok):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None:
                return
            span = None
            for sp in reversed(self.spans.get((s.user, ch), [])):
                if sp.sid == sid:
                    span = sp
                    break
            if ok:
                if span:
                    span.end_ack = call.t1
                s.channels.pop(ch, None)
                self._left(self.users[s.user], ch)
            elif call.outcome == "error":
                if span and span.end_ack is None:
                    span.end_start = None    # refused: still in
            else:
                self.add_taint(s.user, ch, call.t1, f"Leave without a definite answer ({call.outcome})")

    def set_state(self, call, sid, ch, items):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None:
                return
            if ch not in s.channels:
                return
            self.users[s.user].state.setdefault(ch, {}).update(items)

    def remove_state(self, call, sid, ch, keys):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None or ch not in s.channels:
                return
            st = self.users[s.user].state.setdefault(ch, {})
            if keys:
                for k in keys:
                    st.pop(k, None)
            else:
                st.clear()
                t = self.taint.get((s.user, ch))
                if t and t[1].startswith(("SetState", "RemoveState")):
                    self.clear_taint(s.user, ch)

    def state_unknown(self, call, sid, ch):
        with self.lock:
            s = self.sessions.get(sid)
            if s is not None:
                self.add_taint(s.user, ch, call.t1 or call.t0, f"{call.method} without a definite answer ({call.outcome})")

    def set_status(self, call, uid, status):
        with self.lock:
            u = self.user(uid)
            u.chosen = status
            u.status_uncertain = False

    def status_unknown(self, uid, t, reason):
        with self.lock:
            u = self.user(uid)
            u.status_uncertain = True
            self.note(uid, t, None, f"(model) status indeterminate: {reason}")

    def watch(self, call, sid, add, remove):
        with self.lock:
            s = self.sessions.get(sid)
            if s is None or s.end is not None:
                return
            s.watching.difference_update(remove)
            s.watching.update(add)

    # ---- what the cluster should say now

    def in_channel(self, uid, ch):
        u = self.users.get(uid)
        return bool(u) and any(ch in self.sessions[x].channels for x in u.live)

    def listing(self, ch):
        """{user: state} for every user the model has in the channel."""
        with self.lock:
            out = {}
            for uid, u in self.users.items():
                if any(ch in self.sessions[x].channels for x in u.live):
                    out[uid] = dict(u.state.get(ch, {}))
            return out

    def user_channels(self, uid):
        with self.lock:
            u = self.users.get(uid)
            if not u:
                return set()
            return {ch for x in u.live for ch in self.sessions[x].channels}

    def visible_status(self, uid):
        with self.lock:
            u = self.users.get(uid)
            if u is None or not u.ever_opened:
                return 0
            if not u.live:
                return 4
            return u.chosen

    def tainted(self, uid, ch):
        return (uid, ch) in self.taint

    # ---- intervals for the event checks

    def certainly_in(self, uid, ch, a, b):
        """True when some session of the user was certainly in the channel over all of [a, b]."""
        with self.lock:
            ivs = sorted(filter(None, (s.certain() for s in self.spans.get((uid, ch), []))))
        # merge overlapping intervals of the user's sessions (continuous user-level presence)
        cur = None
        for lo, hi in ivs:
            if cur and lo <= cur[1]:
                cur[1] = max(cur[1], hi)
            else:
                if cur and cur[0] <= a and cur[1] >= b:
                    return True
                cur = [lo, hi]
        return bool(cur) and cur[0] <= a and cur[1] >= b

    def sessions_certain_during(self, uid, ch, a, b):
        """Sessions of the user certainly in the channel at some point of [a, b]."""
        with self.lock:
            out = []
            for s in self.spans.get((uid, ch), []):
                c = s.certain()
                if c and c[0] <= b and c[1] >= a:
                    out.append(s.sid)
            return out

    def certainly_out(self, uid, ch, a, b):
        """True when no session of the user could have been in the channel at any time in [a, b]."""
        with self.lock:
            u = self.users.get(uid)
            if u is None:
                return True
            for s in self.spans.get((uid, ch), []):
                lo, hi = s.possible()
                if s.end_kind in ("closed", "lost") and hi != INF:
                    hi += self.timeout + 1.5   # an ended session may linger up to the ghost bound (invariant 2)
                if lo <= b and hi >= a:
                    return False
            return (uid, ch) not in self.taint

    def continuous_since(self, uid, ch, t):
        """The start of the user's certain, continuous stay in the channel that covers time t."""
        with self.lock:
            ivs = sorted(filter(None, (s.certain() for s in self.spans.get((uid, ch), []))))
        cur = None
        for lo, hi in ivs:
            if cur and lo <= cur[1]:
                cur[1] = max(cur[1], hi)
            else:
                if cur and cur[0] <= t <= cur[1]:
                    return cur
                cur = [lo, hi]
        if cur and cur[0] <= t <= cur[1]:
            return cur
        return None
