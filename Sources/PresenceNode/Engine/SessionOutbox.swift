import GRPCTransport
import Metrics
import PresenceCore
import PresenceWire
import Synchronization

/// Why a session's event stream ended.
public enum StreamEnd: Sendable, Equatable {
    /// CloseSession.
    case closed
    /// Another stream resumed the session.
    case replaced
    /// The client read too slowly and events would have been lost; it may resume (and gets fresh snapshots).
    case slowConsumer
    /// The node is shutting down.
    case shutdown
    /// The client went away (the stream broke or was cancelled).
    case broken
}

/// Where a session's events go: its live stream, or a bounded buffer while it is disconnected
/// (waiting to resume). Channels and watchers hold the outbox, which lives as long as the session,
/// so a resumed session keeps receiving without anyone re-registering it.
public final class SessionOutbox: Sendable {
    public let sessionID: SessionID
    public let userID: String
    /// Bytes buffered at most while no stream is attached.
    public static let maxBufferedBytes = 1 << 20

    private struct State {
        var writer: ServerStreamWriter? = nil
        var generation: UInt64 = 0
        var buffered: [[UInt8]] = []
        var bufferedBytes = 0
        var lostEvents = false
        var endWaiter: Suspended<StreamEnd, Never>? = nil
        var pendingEnd: StreamEnd? = nil
        var statuses = StatusOrder()
    }
    private let state = Mutex(State())
    private let counters: DeliveryCounters

    public init(sessionID: SessionID, userID: String, counters: DeliveryCounters = DeliveryCounters()) {
        self.sessionID = sessionID
        self.userID = userID
        self.counters = counters
    }

    /// Queues one framed SessionEvent. Never waits. `status`: a status event of that user, read
    /// at that version of its home record: not queued if the session was given a later one
    /// (`StatusOrder`).
    public func push(_ framed: [UInt8], status: (user: String, version: UInt64)? = nil) {
        // (counted as queued once on a stream; buffered ones when the resume flushes them)
        let (tooSlow, queued, dropped) = state.withLock { s -> (Bool, Int, Int) in
            if let status, !s.statuses.admits(status.user, version: status.version) { return (false, 0, 0) }
            if let w = s.writer {
                if w.trySend(framed: framed) { return (false, 1, 0) }
                s.lostEvents = true
                return (true, 0, 1)
            }
            if s.lostEvents { return (false, 0, 1) }
            if s.bufferedBytes + framed.count > Self.maxBufferedBytes {
                s.lostEvents = true
                let n = s.buffered.count + 1
                s.buffered = []
                s.bufferedBytes = 0
                return (false, 0, n)
            }
            s.buffered.append(framed)
            s.bufferedBytes += framed.count
            return (false, 0, 0)
        }
        if queued > 0 { counters.queued.add(queued) }
        if dropped > 0 { counters.dropped.add(dropped) }
        if tooSlow {
            counters.slowConsumers.add()
            end(.slowConsumer)
        }
    }

    /// Attaches a new stream (after its `opened` message was sent): flushes what was buffered.
    /// Returns true when events were lost meanwhile (the caller then sends fresh snapshots).
    public func attach(_ writer: ServerStreamWriter, generation: UInt64) -> Bool {
        let (previous, lost) = state.withLock { s -> (Suspended<StreamEnd, Never>?, Bool) in
            let previous = s.endWaiter
            s.endWaiter = nil
            s.pendingEnd = nil
            s.writer = writer
            s.generation = generation
            var lost = s.lostEvents
            var flushed = 0
            for b in s.buffered {
                if writer.trySend(framed: b) { flushed += 1 } else { lost = true }
            }
            counters.queued.add(flushed)
            counters.dropped.add(s.buffered.count - flushed)
            s.buffered = []
            s.bufferedBytes = 0
            s.lostEvents = false
            return (previous, lost)
        }
        previous?.continuation.resume(returning: .replaced)
        return lost
    }

    /// Drops what was buffered for the session while it was disconnected here: it lived at
    /// another gateway meanwhile (its client saw those events there, or fresher ones), and the
    /// announces of its return bring a SNAPSHOT of every channel. Flushed to the new stream,
    /// they came after events of the same channels with higher sequences.
    public func dropBuffered() {
        state.withLock { s in
            s.buffered = []
            s.bufferedBytes = 0
        }
    }

    /// The stream of `generation` is gone: buffer until the session resumes or ends.
    public func detach(generation: UInt64) {
        state.withLock { s in
            if s.generation == generation { s.writer = nil }
        }
    }

    /// Whether a status of `user` at `version` is not older than one the session was given.
    public func mayGiveStatus(of user: String, version: UInt64) -> Bool {
        state.withLock { !$0.statuses.isOlder(user, version: version) }
    }

    /// The session was given `user`'s status at `version` other than by an event (a Watch answer).
    public func noteStatusGiven(_ user: String, version: UInt64) {
        state.withLock { $0.statuses.noteGiven(user, version: version) }
    }

    /// Events buffered for the session's next stream.
    public var bufferedEvents: Int { state.withLock { $0.buffered.count } }

    /// Whether a stream is attached (its handler has not let go of this outbox yet).
    public var hasStream: Bool { state.withLock { $0.writer != nil } }

    /// Ends the attached stream's wait (CloseSession, shutdown, slow consumer).
    public func end(_ reason: StreamEnd) {
        let waiter = state.withLock { s -> Suspended<StreamEnd, Never>? in
            guard let w = s.endWaiter else {
                s.pendingEnd = reason
                return nil
            }
            s.endWaiter = nil
            return w
        }
        waiter?.continuation.resume(returning: reason)
    }

    /// Waits until the stream should end; `.broken` when the waiting task is cancelled.
    public func waitForEnd() async -> StreamEnd {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<StreamEnd, Never>) in
                let now = state.withLock { s -> StreamEnd? in
                    if let e = s.pendingEnd {
                        s.pendingEnd = nil
                        return e
                    }
                    s.endWaiter = Suspended(c)
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        } onCancel: {
            end(.broken)
        }
    }
}

/// Encodes an event once for every recipient.
enum EventEncoding {
    /// The event as framed SessionEvent bytes. A SNAPSHOT larger than `maxPageBytes` becomes
    /// several messages back to back (pages: the same sequence, some users each, all but the last
    /// marked `snapshot_continues`), so a channel of any size can be joined by a client that
    /// accepts 4 MiB messages. The pages travel together, as one delivery.
    static func framed(_ event: PresenceEvent, maxPageBytes: Int = Limits.maxSnapshotPageBytes) -> [UInt8] {
        let whole = MessageFraming.framed(SessionEvent(event: .presence(event)))
        guard event.type == .snapshot, whole.count > maxPageBytes, event.snapshot.count > 1 else { return whole }
        var out: [UInt8] = []
        out.reserveCapacity(whole.count + 256)
        var page = event
        page.snapshot = []
        let overhead = MessageFraming.framed(SessionEvent(event: .presence(page))).count + 16  // (+ the flag, field headers)
        var users: [UserState] = []
        var bytes = overhead
        func flush(last: Bool) {
            page.snapshot = users
            page.snapshotContinues = !last
            out.append(contentsOf: MessageFraming.framed(SessionEvent(event: .presence(page))))
            users = []
            bytes = overhead
        }
        for u in event.snapshot {
            let size = u.serializedBytes().count + 6   // (its tag and length)
            if !users.isEmpty && bytes + size > maxPageBytes { flush(last: false) }
            users.append(u)
            bytes += size
        }
        flush(last: true)
        return out
    }

    /// The status event a framed SessionEvent is (nil: another event, or not one).
    static func statusEvent(_ framed: [UInt8]) -> UserStatusEvent? {
        guard framed.count > 5,
              let event = try? framed.withUnsafeBytes({ try SessionEvent(serializedBytes: UnsafeRawBufferPointer(rebasing: $0[5...])) }),
              case .status(let s)? = event.event else { return nil }
        return s
    }

    static func framed(status userID: String, _ status: UserStatus, at ms: Int64) -> [UInt8] {
        MessageFraming.framed(SessionEvent(event: .status(UserStatusEvent(userID: userID, status: status, timestampMs: ms))))
    }
}

/// What the outboxes of one node did with events (for metrics): queued to a stream or to a
/// resume buffer, or dropped (a slow stream cut off, a full buffer; the client gets SNAPSHOTs).
public final class DeliveryCounters: Sendable {
    public let queued = Counter()
    public let dropped = Counter()
    public let slowConsumers = Counter()
    public init() {}
}
