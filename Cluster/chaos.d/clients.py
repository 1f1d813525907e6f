"""Model clients that behave as a real SDK does (RELIABILITY.md, "The fault model"):

- each *device* holds one session: an OpenSession stream read on its own thread, every event
  timestamped and logged;
- on a broken stream the device resumes the same session (`resume_session_id`) on another node,
  with a short backoff, trying nodes until one answers;
- a call that fails with UNAVAILABLE or DEADLINE_EXCEEDED (per-attempt deadline 2.5 s) is retried on
  the same node once, then the session moves to another node (resume there) and the call is retried,
  until it gets a definite answer (success or a non-retryable error) or, after 30 s, the client gives up;
- if a resume is refused (or answered with a new session) the device recovers as an SDK would: it
  sets its status again, re-joins its channels, restores its state and watches again.

Each *user* (one or two devices) runs one worker thread that performs its operations one at a time,
so the model of that user is exact. Every call is recorded (start, end, attempts, outcome)."""
import random
import threading
import time

import grpc

from clock import now
from model import STATUS_NAMES, chan_label

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
ATTEMPT_DEADLINE = 2.5     # seconds per attempt
OPEN_DEADLINE = 2.5        # seconds to wait for `opened` on a new stream (a resume may look up the home)
CALL_CAP = 30.0            # give up on a call after this long (recorded as a violation)
KEYS = [f"k{i}" for i in range(6)]

CHANNEL_OPTIONS = [
    # each device has its own connections, as separate devices do
    ("grpc.use_local_subchannel_pool", 1),
    # a paused or cut-off node is noticed by keepalive (an SDK's only way without app-level pings)
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1500),
    ("grpc.http2.ping_timeout_ms", 1500),   # (grpc-core 1.66 times keepalive pings out with this one)
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # a restarted node is reachable again quickly
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class StreamLog:
    """Everything one session received, in arrival order: (t, sid, node, SessionEvent)."""

    def __init__(self):
        self.items = []


class Device:
    """One device of a user: one session at a time, its stream, its resume logic."""

    def __init__(self, env, user, index):
        self.env = env
        self.user = user
        self.index = index
        self.name = f"{user.uid}/d{index}"
        self.rng = random.Random(f"{env.seed}-{self.name}")
        self.cond = threading.Condition()
        self.state = "closed"       # closed | connected | broken | opening
        self.sid = None
        self.node = None            # node index of the current stream
        self.gen = 0                # bumped on every new stream
        self.call = None
        self.closing = False
        self.close_in_doubt = None  # (sid, t0) of a CloseSession whose answer was lost
        self.close_t0 = None        # when the CloseSession in progress was sent
        self.closed_by_resume = None  # the sid a refused resume showed closed (by a close in doubt)
        self.move_from = None       # node the worker asked to move away from
        self.broken_at = None
        self.recovery = None        # what to restore after a lost session (done by the worker)
        self.closed_at = 0.0
        self.reopen_at = 0.0
        self.events = []            # (t, sid, node, kind, payload) of every received event
        self.sessions = []          # every sid this device held, in order
        self.channels = {}          # the SDK's own view: channel -> with_presence
        self.watching = set()
        self.chans = {}             # node index -> grpc channel
        self.thread = None
        self.preferred = None

    # ---- plumbing

    def stub(self, node_index):
        ch = self.chans.get(node_index)
        if ch is None:
            node = self.env.cluster.nodes[node_index - 1]
            ch = self.chans[node_index] = grpc.insecure_channel(node.client_address, options=CHANNEL_OPTIONS)
        return self.env.pg.PresenceStub(ch)

    def close_channels(self):
        for ch in self.chans.values():
            ch.close()
        self.chans.clear()

    def node_id(self, index=None):
        index = self.node if index is None else index
        return f"node-{index}" if index else "-"

    def _open_stream(self, node_index, resume_sid, initial_status):
        """OpenSession on a node; waits (bounded) for `opened`. Returns (call, opened) or raises RpcError."""
        p = self.env.p
        req = p.OpenSessionRequest(user_id=self.user.uid, resume_session_id=resume_sid or "",
                                   initial_status=initial_status or 0)
        call = self.stub(node_index).OpenSession(req)
        timer = threading.Timer(OPEN_DEADLINE, call.cancel)
        timer.daemon = True
        timer.start()
        try:
            first = next(call)
        except StopIteration:
            raise StreamEnded()
        finally:
            timer.cancel()
        if first.WhichOneof("event") != "opened":
            call.cancel()
            raise StreamEnded()
        return call, first.opened

    def _install(self, call, sid, node_index):
        """Makes a new stream current (the device thread reads it)."""
        with self.cond:
            old = self.call
            self.call = call
            self.sid = sid
            self.node = node_index
            self.gen += 1
            self.state = "connected"
            self.move_from = None
            if not self.sessions or self.sessions[-1] != sid:
                self.sessions.append(sid)
            self.env.attachments.setdefault(sid, []).append((now(), node_index))
            self.cond.notify_all()
        if old is not None and old is not call:
            old.cancel()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=f"dev-{self.name}", daemon=True)
            self.thread.start()

    def wait_connected(self, timeout, stop_if_closed=False):
        """Waits until the device has a connected stream; returns (sid, node, gen) or None.
        `stop_if_closed`: None at once when the stream ended as closed (a CloseSession's retry
        waits for no stream that will never come back)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.state != "connected":
                left = deadline - time.monotonic()
                if left <= 0 or self.env.stopped.is_set() and self.state == "closed":
                    return None
                if stop_if_closed and self.state == "closed":
                    return None
                self.cond.wait(min(left, 0.5))
            return self.sid, self.node, self.gen

    def wait_changed(self, gen, timeout):
        """True if the stream of generation `gen` broke or was replaced within `timeout`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.gen == gen and self.state == "connected":
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.2))
            return True

    def request_move(self, node_index):
        """The worker gave up on this node for now: drop the stream; the device thread resumes elsewhere."""
        with self.cond:
            if self.node != node_index or self.state != "connected":
                return
            self.move_from = node_index
            call = self.call
        self.env.stats["moves"] += 1
        call.cancel()

    # ---- the device thread: read the stream, resume when it breaks

    def _run(self):
        while not self.env.finished.is_set():
            with self.cond:
                while self.state not in ("connected", "broken") and not self.env.finished.is_set():
                    self.cond.wait(0.5)
                if self.env.finished.is_set():
                    return
                state, call, gen, sid, node = self.state, self.call, self.gen, self.sid, self.node
            if state == "connected":
                code = self._read(call, gen, sid, node)
                if self.env.finished.is_set():
                    return
                with self.cond:
                    if self.gen != gen:
                        continue               # replaced meanwhile (a move or a new session)
                    if self.closing and code == grpc.StatusCode.OK:
                        self.state = "closed"  # CloseSession ended it
                        self.cond.notify_all()
                        continue
                    self.state = "broken"
                    self.broken_at = now()
                    moved = self.move_from is not None
                    self.cond.notify_all()
                self.env.note_break(self, node, code, moved)
            else:
                self._resume()

    def _read(self, call, gen, sid, node):
        pages = {}   # a SNAPSHOT in pages (snapshot_continues), per channel, until its last page
        try:
            for ev in call:
                t = now()
                kind = ev.WhichOneof("event")
                with self.cond:
                    if self.gen != gen:
                        break          # a superseded stream: an SDK no longer listens to it
                if kind == "presence" and ev.presence.type == 1 and (ev.presence.snapshot_continues or ev.presence.channel_name in pages):
                    # as an SDK does: the view is taken when the last page arrives
                    held = pages.get(ev.presence.channel_name)
                    if held is None or held.sequence != ev.presence.sequence:
                        held = pages[ev.presence.channel_name] = type(ev.presence)()
                        held.CopyFrom(ev.presence)
                        del held.snapshot[:]
                    held.snapshot.extend(ev.presence.snapshot)
                    if ev.presence.snapshot_continues:
                        continue
                    del pages[ev.presence.channel_name]
                    held.snapshot_continues = False
                    self.events.append((t, sid, node, "presence", held))
                elif kind == "presence":
                    self.events.append((t, sid, node, "presence", ev.presence))
                elif kind == "status":
                    self.events.append((t, sid, node, "status", ev.status))
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    def _resume(self):
        """Resumes the session on some node (bounded); a refusal means the session was lost."""
        with self.cond:
            sid, failed, broken_at = self.sid, self.node, self.broken_at
        env = self.env
        origin = env.faults.break_origin(failed, broken_at) if env.faults else broken_at
        others = [n.index for n in env.cluster.nodes if n.index != failed]
        self.rng.shuffle(others)
        # the other nodes first (in a random order), the one that failed last (it may be back already)
        order = others + ([failed] if failed else [])
        backoff = 0.05
        give_up = broken_at + env.timeout + 10
        rounds = 0
        while not env.finished.is_set():
            rounds += 1
            for node in order:
                if env.finished.is_set() or now() > give_up:
                    break
                t = now()
                try:
                    call, opened = self._open_stream(node, sid, 0)
                except (grpc.RpcError, StreamEnded) as e:
                    code = e.code() if isinstance(e, grpc.RpcError) else None
                    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                        with self.cond:
                            doubt = self.close_in_doubt if self.close_in_doubt and self.close_in_doubt[0] == sid else \
                                ((sid, self.close_t0) if self.closing and self.close_t0 is not None else None)
                        if doubt is not None:
                            # a CloseSession sent with no answer yet (its node died) took effect:
                            # as an SDK does, the close is done, not the session lost
                            env.record_resume_attempt(self, sid, node, t, now(), "closed-meanwhile", code, origin)
                            self._closed_in_doubt(sid, doubt[1], code, node)
                            return
                        env.record_resume_attempt(self, sid, node, t, now(), "failed", code, origin)
                        self._lost(sid, origin, f"resume refused with {code.name} by node-{node}", None, None)
                        return
                    env.record_resume_attempt(self, sid, node, t, now(), "failed", code, origin)
                    continue
                    continue
                if opened.resumed and opened.session_id == sid:
                    env.record_resume_attempt(self, sid, node, t, now(), "resumed", None, origin)
                    self._install(call, sid, node)
                    return
                # answered with a new session: the old one is gone
                env.record_resume_attempt(self, sid, node, t, now(), "new-session", None, origin)
                self._lost(sid, origin, f"resume answered with a new session by node-{node}", call, (opened.session_id, node, t))
                return
            if now() > give_up:
                break
            time.sleep(backoff + self.rng.uniform(0, backoff))
            backoff = min(0.5, backoff * 2)
        if env.finished.is_set():
            return
        # no node answered for longer than the presence timeout: the session is gone
        self._lost(sid, origin, "no node answered a resume in time", None, None)

    def _closed_in_doubt(self, sid, t0, code, node):
        """The session's CloseSession got no answer, and a resume says it is gone: it was closed."""
        env = self.env

        class Window:   # the close happened between the call's start and this refusal
            pass
        w = Window()
        w.t0, w.t1 = t0, now()
        env.model.closed(w, sid)
        env.session_notes.add(self.name, now(), f"s={sid[:8]}: resume refused ({code.name}) by node-{node} after a "
                                                f"CloseSession whose answer was lost: the close took effect")
        with self.cond:
            self.close_in_doubt = None
            self.closed_by_resume = sid
            stale = None
            if self.sid == sid:
                self.state = "closed"
                self.sid = None
                self.closed_at = now()
                self.reopen_at = self.closed_at + self.rng.uniform(4.0, 10.0)
                self.gen += 1
                stale, self.call = self.call, None
                self.cond.notify_all()
        if stale is not None:
            stale.cancel()
        self.channels = {}
        self.watching = set()

    def vanished(self, sid, origin, reason):
        """The worker found the session unknown to its gateway although its stream was up."""
        with self.cond:
            if self.sid != sid:
                return
        self._lost(sid, origin, reason, None, None)

    def _lost(self, sid, origin, reason, call, fresh):
        """The session ended without our consent. The worker restores what it can (as an SDK would)."""
        env = self.env
        t = now()
        with env.model.lock:
            channels = env.model.session_channels(sid)
            u = env.model.users[self.user.uid]
            restore = {}
            for ch in channels:
                others = [x for x in u.live if x != sid and ch in env.model.sessions[x].channels]
                if not others and u.state.get(ch):
                    restore[ch] = dict(u.state[ch])
            watching = set(env.model.sessions[sid].watching) if sid in env.model.sessions else set()
            env.model.lost(sid, origin, t, reason)
            if fresh:
                new_sid, node, t0 = fresh
                env.model.opened(self.user.uid, self.name, new_sid, t0, t, 0)
        env.record_loss(self, sid, origin, t, reason)
        with self.cond:
            self.channels = {}
            self.watching = set()
            self.recovery = {"channels": channels, "state": restore, "watching": watching, "since": t}
            stale = None
            if fresh:
                self.state = "opening"
            else:
                self.state = "closed"   # the worker opens a fresh session
                self.sid = None
                self.gen += 1           # whatever stream is left belongs to the lost session
                stale, self.call = self.call, None
                self.cond.notify_all()
        if stale is not None:
            stale.cancel()
        if fresh:
            self._install(call, fresh[0], fresh[1])


class StreamEnded(Exception):
    def code(self):
        return None


class UserClient:
    """One user: one or two devices and a worker thread doing random operations, one at a time."""

    def __init__(self, env, uid, devices):
        self.env = env
        self.uid = uid
        self.rng = random.Random(f"{env.seed}-{uid}")
        self.devices = [Device(env, self, i) for i in range(devices)]
        self.chosen = self.rng.choice([1, 1, 1, 2, 3])
        self.thread = threading.Thread(target=self._run, name=f"user-{uid}", daemon=True)

    # ---- calls with SDK retries

    def call(self, dev, method, summary, channel, build, args=None, session_call=True):
        """Performs one session call with retries. Returns the Call record (outcome set)."""
        env = self.env
        m = env.model
        sid0 = dev.sid
        rec = m.new_call(self.uid, dev.name, sid0, method, summary, channel, now())
        rec.args = args or {}
        if rec.method == "Join":
            m.join_started(sid0, channel, rec.t0)
        elif rec.method == "Leave":
            m.leave_started(sid0, channel, rec.t0)
        same_node_failures = 0
        last_node = None
        if sid0 is None:
            rec.outcome = "session-lost"   # the session ended (lost) just before the call
        while rec.outcome is None:
            left = CALL_CAP - (now() - rec.t0)
            if left <= 0:
                rec.outcome = "gave-up"
                break
            # (a CloseSession whose first attempt got no answer, its node having died, must not
            # wait for the stream the close itself ended: seeds 80, 86 and 89 answered it 5.13 s late)
            got = dev.wait_connected(min(left, 5.0), stop_if_closed=(method == "CloseSession"))
            if dev.sid != sid0:
                rec.outcome = "session-lost"
                break
            if got is None:
                if method == "CloseSession" and dev.state == "closed" and dev.closing:
                    rec.outcome, rec.code = "ok", ""
                    rec.notes.append("stream ended as closed")
                    break
                continue
            sid, node, gen = got
            if node != last_node:
                same_node_failures = 0
                last_node = node
            rec.attempts += 1
            rec.nodes.append(f"node-{node}")
            try:
                rec.response = getattr(dev.stub(node), method)(build(sid), timeout=ATTEMPT_DEADLINE)
                rec.outcome = "ok"
                break
            except grpc.RpcError as e:
                code = e.code()
                detail = e.details() or ""
                rec.errors.append((now(), f"node-{node}", code.name, detail))
                if code in RETRYABLE:
                    if dev.gen != gen:
                        continue                 # the stream moved meanwhile: retry where it is now
                    same_node_failures += 1
                    if same_node_failures >= 2:
                        dev.request_move(node)   # "retry, then move"
                        dev.wait_changed(gen, 3.0)
                        same_node_failures = 0
                    else:
                        time.sleep(0.1)
                    continue
                if code == grpc.StatusCode.NOT_FOUND and session_call:
                    # the session's node may have died and come back (the call raced the stream's
                    # break): an SDK waits for its resume and tries again
                    if dev.wait_changed(gen, 1.0):
                        rec.notes.append("NOT_FOUND while the stream broke: retried after the resume")
                        env.stats["notfound_after_break"] += 1
                        continue
                    if method == "CloseSession":
                        # the session is gone either way: an SDK takes it as closed (the model too)
                        rec.outcome = "ok"
                        if len(rec.errors) > 1:
                            # an earlier attempt without an answer closed it; the retry must not fail
                            rec.notes.append("not idempotent: the retried CloseSession answered NOT_FOUND")
                        else:
                            rec.notes.append("vanished: CloseSession of a connected session answered NOT_FOUND")
                        break
                rec.outcome = "error"
                rec.code = code.name
                rec.detail = detail
                if code == grpc.StatusCode.NOT_FOUND and session_call and detail.startswith("SESSION_NOT_FOUND"):
                    # the gateway no longer knows a session whose stream is up: an SDK drops it and
                    # opens a new one (its recovery); the model ends it here
                    rec.notes.append(f"vanished: node-{node} answered SESSION_NOT_FOUND with the stream up")
                    dev.vanished(sid, rec.t0, f"node-{node} answered {method} with SESSION_NOT_FOUND")
                break
        rec.t1 = now()
        m.call_done(rec)
        env.call_finished(rec)
        return rec

    # ---- operations (each applies its outcome to the model)

    def open_device(self, dev, initial_status):
        """A fresh session on the device's preferred node (then the others, until one answers)."""
        env = self.env
        rec = env.model.new_call(self.uid, dev.name, None, "OpenSession",
                                 f"initial_status={STATUS_NAMES.get(initial_status, '-')}", None, now())
        nodes = [n.index for n in env.cluster.nodes]
        start = nodes.index(dev.preferred) if dev.preferred in nodes else 0
        order = nodes[start:] + nodes[:start]
        while rec.outcome is None:
            if now() - rec.t0 > CALL_CAP:
                rec.outcome = "gave-up"
                break
            for node in order:
                rec.attempts += 1
                rec.nodes.append(f"node-{node}")
                try:
                    call, opened = dev._open_stream(node, "", initial_status)
                except (grpc.RpcError, StreamEnded) as e:
                    code = e.code() if isinstance(e, grpc.RpcError) else None
                    rec.errors.append((now(), f"node-{node}", code.name if code else "ENDED", ""))
                    if code is not None and code not in RETRYABLE and code != grpc.StatusCode.CANCELLED:
                        rec.outcome, rec.code = "error", code.name
                        break
                    continue
                rec.t1 = now()
                rec.sid = opened.session_id
                rec.outcome = "ok"
                env.model.opened(self.uid, dev.name, opened.session_id, rec.t0, rec.t1, initial_status)
                with dev.cond:
                    dev.closing = False
                    dev.channels = {}
                    dev.watching = set()
                dev._install(call, opened.session_id, node)
                break
            if rec.outcome is None:
                time.sleep(0.2)
        rec.t1 = rec.t1 or now()
        env.model.call_done(rec)
        env.call_finished(rec)
        return rec.outcome == "ok"

    def join(self, dev, ch, with_presence):
        p = self.env.p
        name, ctype = ch
        sid = dev.sid
        env = self.env
        rec = self.call(dev, "Join", f"{chan_label(ch)} presence={int(with_presence)}", ch,
                        lambda s: p.JoinRequest(session_id=s, channel_name=name, channel_type=ctype, with_presence=with_presence),
                        args={"with_presence": with_presence})
        ok = rec.outcome == "ok"
        env.model.join_done(rec, sid, ch, with_presence, ok)
        if ok:
            dev.channels[ch] = with_presence
        return rec

    def leave(self, dev, ch):
        p = self.env.p
        name, ctype = ch
        sid = dev.sid
        rec = self.call(dev, "Leave", chan_label(ch), ch,
                        lambda s: p.LeaveRequest(session_id=s, channel_name=name, channel_type=ctype))
        ok = rec.outcome == "ok"
        self.env.model.leave_done(rec, sid, ch, ok)
        if ok:
            dev.channels.pop(ch, None)
        return rec

    def set_state(self, dev, ch, items):
        p = self.env.p
        name, ctype = ch
        sid = dev.sid
        rec = self.call(dev, "SetState", f"{chan_label(ch)} {' '.join(f'{k}={v}' for k, v in sorted(items.items()))}", ch,
                        lambda s: p.SetStateRequest(session_id=s, channel_name=name, channel_type=ctype,
                                                    items=[p.StateItem(key=k, value=v) for k, v in sorted(items.items())]))
        if rec.outcome == "ok":
            self.env.model.set_state(rec, sid, ch, items)
        elif rec.outcome != "error" or rec.errors:
            self.env.model.state_unknown(rec, sid, ch)
        return rec

    def remove_state(self, dev, ch, keys):
        p = self.env.p
        name, ctype = ch
        sid = dev.sid
        rec = self.call(dev, "RemoveState", f"{chan_label(ch)} keys={','.join(keys) or '(all)'}", ch,
                        lambda s: p.RemoveStateRequest(session_id=s, channel_name=name, channel_type=ctype, keys=keys))
        if rec.outcome == "ok":
            self.env.model.remove_state(rec, sid, ch, keys)
        elif rec.outcome != "error" or rec.errors:
            self.env.model.state_unknown(rec, sid, ch)
        return rec

    def set_status(self, dev, status):
        p = self.env.p
        rec = self.call(dev, "SetStatus", STATUS_NAMES[status], None,
                        lambda s: p.SetStatusRequest(session_id=s, status=status))
        if rec.outcome == "ok":
            self.chosen = status
            self.env.model.set_status(rec, self.uid, status)
        else:
            self.env.model.status_unknown(self.uid, now(), f"SetStatus {rec.outcome}")
        return rec

    def watch(self, dev, add, remove):
        p = self.env.p
        sid = dev.sid
        rec = self.call(dev, "Watch", f"+{','.join(add) or '-'} -{','.join(remove) or '-'}", None,
                        lambda s: p.WatchRequest(session_id=s, user_ids=add, unwatch_user_ids=remove),
                        args={"add": list(add), "remove": list(remove)})
        if rec.outcome == "ok":
            self.env.model.watch(rec, sid, add, remove)
            dev.watching.difference_update(remove)
            dev.watching.update(add)
            self.env.watch_done(dev, sid, rec, add, remove)
        return rec

    def close_device(self, dev):
        p = self.env.p
        sid = dev.sid
        with dev.cond:
            dev.closing = True
            dev.close_t0 = now()
        rec = self.call(dev, "CloseSession", "", None, lambda s: p.CloseSessionRequest(session_id=s))
        if rec.outcome == "session-lost" and dev.closed_by_resume == sid:
            # its answer was lost with its node; the resume found it closed (done above)
            rec.outcome, rec.code = "ok", ""
            rec.notes.append("closed: the answer was lost with its node, and a resume found the session gone")
            with dev.cond:
                dev.closing = False
                dev.close_t0 = None
            return rec
        if rec.outcome == "ok":
            self.env.model.closed(rec, sid)
            with dev.cond:
                if dev.sid == sid:
                    dev.state = "closed"
                    dev.sid = None
                    dev.closed_at = now()
                    dev.reopen_at = dev.closed_at + self.rng.uniform(4.0, 10.0)
                    call = dev.call
                    dev.call = None
                    dev.gen += 1
                    dev.cond.notify_all()
                else:
                    call = None
            if call is not None:
                call.cancel()
            dev.channels = {}
            dev.watching = set()
        else:
            with dev.cond:
                dev.closing = False
                if rec.outcome != "error" or rec.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"):
                    # no definite answer: the close may have been carried out before its node died
                    dev.close_in_doubt = (sid, dev.close_t0)
                dev.close_t0 = None
        return rec

    # ---- the worker

    def start(self):
        self.thread.start()

    def _run(self):
        env = self.env
        try:
            # open every device first (spread over the nodes), then act at random
            for dev in self.devices:
                self.open_device(dev, self.chosen if not env.model.users.get(self.uid) or not env.model.users[self.uid].live else 0)
            while not env.stopped.is_set():
                if env.stopped.wait(self.rng.uniform(0.4, 1.6)):
                    break
                self.step()
            # quiet phase: finish any recovery so the model is exact again
            for dev in self.devices:
                if dev.recovery is not None and not env.finished.is_set():
                    self.recover(dev)
        except Exception as e:   # a bug in the harness must not pass silently
            env.harness_error(f"worker {self.uid}: {e!r}")
            raise

    def step(self):
        env = self.env
        for dev in self.devices:
            if dev.recovery is not None:
                self.recover(dev)
                return
        dev = self.rng.choice(self.devices)
        if dev.sid is None:
            # a closed device stays away a while (4-10 s): long enough for the ghost sampler to look
            if now() > dev.reopen_at:
                u = env.model.users.get(self.uid)
                initial = self.chosen if not (u and u.live) else 0
                self.open_device(dev, initial)
            return
        ops = [("join", 24), ("leave", 14), ("set", 24), ("remove", 10), ("status", 5), ("watch", 7),
               ("toggle", 4), ("close", 2)]
        op = self.rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        chans = env.channels
        joined = list(dev.channels)
        if op == "join" or (op in ("leave", "set", "remove", "toggle") and not joined):
            free = [c for c in chans if c not in dev.channels]
            if not free:
                op = "leave"
            else:
                self.join(dev, self.rng.choice(free), self.rng.random() < 0.6)
                return
        if op == "leave":
            self.leave(dev, self.rng.choice(joined))
        elif op == "set":
            ch = self.rng.choice(joined)
            n = self.rng.choice([1, 1, 2])
            items = {k: f"v{self.rng.randrange(1000)}" for k in self.rng.sample(KEYS, n)}
            self.set_state(dev, ch, items)
        elif op == "remove":
            ch = self.rng.choice(joined)
            keys = [] if self.rng.random() < 0.3 else self.rng.sample(KEYS, self.rng.choice([1, 2]))
            self.remove_state(dev, ch, keys)
        elif op == "status":
            self.set_status(dev, self.rng.choice([1, 2, 3, 4]))
        elif op == "watch":
            others = [u for u in env.user_ids if u != self.uid]
            add = self.rng.sample(others, self.rng.choice([1, 2, 3]))
            remove = self.rng.sample(sorted(dev.watching), min(len(dev.watching), self.rng.choice([0, 1])))
            add = [u for u in add if u not in remove]
            self.watch(dev, add, remove)
        elif op == "toggle":
            ch = self.rng.choice(joined)
            self.join(dev, ch, not dev.channels[ch])
        elif op == "close":
            self.close_device(dev)

    def recover(self, dev):
        """After a lost session: open (if needed), set the status, re-join, restore state, re-watch."""
        env = self.env
        rec = dev.recovery
        if dev.sid is None:
            u = env.model.users.get(self.uid)
            initial = self.chosen if not (u and u.live) else 0
            if not self.open_device(dev, initial):
                return
        dev.recovery = None
        u = env.model.users.get(self.uid)
        if u is not None and u.status_uncertain:
            self.set_status(dev, self.chosen)
        for ch, wp in sorted(rec["channels"].items()):
            if dev.sid is None:
                return
            self.join(dev, ch, wp)
            items = rec["state"].get(ch)
            if items:
                self.set_state(dev, ch, items)
        if rec["watching"] and dev.sid is not None:
            self.watch(dev, sorted(rec["watching"]), [])
