import ClusterCore
import GRPCTransport
@testable import PresenceNode
import PresenceCore
import PresenceWire
import Testing

/// The gateway's side of fan-out (`Subscriptions`), as a value fed events in the order a slow
/// link may deliver them.
@Suite struct SubscriptionsTests {
    let key = ChannelKey(name: "room", type: .message)
    let owner = NodeInstance("n3", boot: 1)

    /// A SNAPSHOT from before the session's leave of a channel, delivered late (after the session
    /// joined again), starts no subscription: neither it nor the events of the time the session
    /// was away reach the client; the SNAPSHOT of the new join does, and what follows it.
    @Test func aSnapshotFromBeforeALeaveArrivingLateStartsNoSubscription() {
        let subs = Subscriptions(shards: 4)
        let id = SessionID(raw: 7)
        let outbox = SessionOutbox(sessionID: id, userID: "u15")
        let writer = ServerStreamWriter(coalescing: false, scheduleDrain: {})
        _ = outbox.attach(writer, generation: 1)
        let frame: [UInt8] = [0, 0, 0, 0, 1, 0]
        subs.left(key, id, atSequence: 538, now: 0)
        #expect(subs.snapshot(key, id, outbox, from: owner, sequence: 533, framed: frame, now: 1) == nil)
        _ = subs.deliver(key, except: nil, from: owner, sequence: 544, framed: frame, now: 2)
        #expect(writer.takePending().isEmpty)
        _ = subs.snapshot(key, id, outbox, from: owner, sequence: 547, framed: frame, now: 3)
        _ = subs.deliver(key, except: nil, from: owner, sequence: 548, framed: frame, now: 4)
        #expect(writer.takePending().count == 2)
        // (a leave whose answer comes after such a SNAPSHOT started a subscription undoes it)
        let other = SessionID(raw: 8)
        _ = subs.snapshot(key, other, outbox, from: owner, sequence: 540, framed: frame, now: 5)
        subs.left(key, other, atSequence: 549, now: 6)
        _ = subs.deliver(key, except: nil, from: owner, sequence: 550, framed: frame, now: 7)
        #expect(writer.takePending().count == 2)  // (the second session's SNAPSHOT of 540, and the first's event 550)
    }

    /// Leave floors are bounded per shard: past `maxFloors`, the expired ones go, and when all are
    /// still fresh, all of them; a floor that ran out is forgotten when it is next read.
    @Test func leaveFloorsStayWithinTheirBound() {
        let subs = Subscriptions(shards: 1)
        for i in 0..<Subscriptions.maxFloors { subs.left(key, SessionID(raw: UInt64(i + 1)), atSequence: 10, now: 0) }
        #expect(subs.floorsKept == Subscriptions.maxFloors)
        subs.left(key, SessionID(raw: 1), atSequence: 11, now: 1)   // (the same session again: no more kept)
        #expect(subs.floorsKept == Subscriptions.maxFloors)
        subs.left(key, SessionID(raw: 90_000), atSequence: 10, now: 2)
        #expect(subs.floorsKept == 0, "all fresh past the bound: forgotten at once")
        // expired ones go first, the fresh ones stay
        for i in 0..<Subscriptions.maxFloors { subs.left(key, SessionID(raw: UInt64(i + 1)), atSequence: 10, now: 3) }
        let later = Subscriptions.floorMemory + 10
        subs.left(key, SessionID(raw: 90_001), atSequence: 10, now: later)
        #expect(subs.floorsKept == 1)
    }

    /// A subscription kept for an outbox the session no longer has (it moved away and came back,
    /// with a new one) goes on in the outbox the session has now: its next SNAPSHOT and the events
    /// after it reach the new stream, not the old one (simulation seed 2135); and where it stood
    /// stays, so a SNAPSHOT numbered below what the client saw through its old stream does not
    /// pass (simulation seeds 2026, 2653, 6800 and 9558, when the subscription started afresh).
    @Test func aSubscriptionKeptForAnOutboxTheSessionNoLongerHasGoesOnInItsNewOne() {
        let subs = Subscriptions(shards: 4)
        let id = SessionID(raw: 11)
        let old = SessionOutbox(sessionID: id, userID: "u5"), now = SessionOutbox(sessionID: id, userID: "u5")
        let oldWriter = ServerStreamWriter(coalescing: false, scheduleDrain: {})
        let newWriter = ServerStreamWriter(coalescing: false, scheduleDrain: {})
        _ = old.attach(oldWriter, generation: 1)
        _ = now.attach(newWriter, generation: 1)
        let frame: [UInt8] = [0, 0, 0, 0, 1, 0]
        _ = subs.snapshot(key, id, old, from: owner, sequence: 100, framed: frame, now: 1)
        #expect(oldWriter.takePending().count == 1)
        let next = NodeInstance("n2", boot: 1)
        #expect(subs.snapshot(key, id, now, from: next, sequence: 90, framed: frame, now: 2)?.floor == 100)
        #expect(newWriter.takePending().isEmpty)
        #expect(subs.snapshot(key, id, now, from: next, sequence: 120, framed: frame, now: 3) == nil)
        _ = subs.deliver(key, except: nil, from: next, sequence: 121, framed: frame, now: 4)
        #expect(newWriter.takePending().count == 2)
        #expect(oldWriter.takePending().isEmpty)
    }

    /// A join undone at its gateway ends the subscription its SNAPSHOT started, and keeps where it
    /// stood as a floor: a late SNAPSHOT of that join (a repeated push) does not start the
    /// subscription again below what the client saw, and a session owed a fresh SNAPSHOT is owed
    /// one above it.
    @Test func aJoinUndoneEndsItsSubscriptionAndKeepsWhereItStood() {
        let subs = Subscriptions(shards: 4)
        let id = SessionID(raw: 12)
        let outbox = SessionOutbox(sessionID: id, userID: "u9")
        let writer = ServerStreamWriter(coalescing: false, scheduleDrain: {})
        _ = outbox.attach(writer, generation: 1)
        let frame: [UInt8] = [0, 0, 0, 0, 1, 0]
        _ = subs.snapshot(key, id, outbox, from: owner, sequence: 200, framed: frame, now: 1)
        _ = subs.deliver(key, except: nil, from: owner, sequence: 203, framed: frame, now: 2)
        #expect(writer.takePending().count == 2)
        subs.undone(key, id, now: 3)
        _ = subs.deliver(key, except: nil, from: owner, sequence: 204, framed: frame, now: 4)
        #expect(writer.takePending().isEmpty, "no subscription after the undo")
        subs.owe(key, id)
        #expect(subs.takeOwed(key, id) == 203)
        #expect(subs.snapshot(key, id, outbox, from: owner, sequence: 200, framed: frame, now: 5) == nil)
        _ = subs.deliver(key, except: nil, from: owner, sequence: 205, framed: frame, now: 6)
        #expect(writer.takePending().isEmpty, "the late SNAPSHOT started nothing")
        _ = subs.snapshot(key, id, outbox, from: owner, sequence: 206, framed: frame, now: 7)
        #expect(writer.takePending().count == 1)
    }

    /// A session whose join failed without a definite answer is owed a fresh SNAPSHOT once a join
    /// of that channel succeeds: once, numbered above what it has seen.
    @Test func aJoinWithoutADefiniteAnswerOwesTheSessionAFreshSnapshot() {
        let subs = Subscriptions(shards: 4)
        let id = SessionID(raw: 9)
        let outbox = SessionOutbox(sessionID: id, userID: "u25")
        #expect(subs.takeOwed(key, id) == nil)
        _ = subs.snapshot(key, id, outbox, from: owner, sequence: 346, framed: [0, 0, 0, 0, 0], now: 1)
        subs.owe(key, id)
        #expect(subs.takeOwed(key, id) == 346)
        #expect(subs.takeOwed(key, id) == nil)
    }
}
