import EventLoop
import PresenceWire
import Synchronization

/// The messages of a server-streaming call, as they arrive. Shared between the connection's loop
/// (which delivers) and the task that reads; flow-control credit goes back to the server as the
/// reader takes messages, so a slow reader slows the server instead of filling memory.
final class ResponseStreamState: Sendable {
    private struct State {
        var messages: [[UInt8]] = []
        var head = 0
        /// DATA bytes received and not yet given back as window.
        var wireBytesHeld = 0
        /// Wire bytes of the messages still queued (payload + 5-byte header each).
        var queuedBytes = 0
        var status: GRPCStatus? = nil
        var waiter: CheckedContinuation<[UInt8]?, Error>? = nil
        var batchWaiter: CheckedContinuation<[[UInt8]]?, Error>? = nil
        var unconsumed = 0
    }
    private let state = Mutex(State())
    /// Called with bytes the reader has taken, to give them back as window (on the loop).
    let consume: @Sendable (Int) -> Void
    let cancelCall: @Sendable () -> Void
    private static let consumeBatch = 32 * 1024

    init(consume: @escaping @Sendable (Int) -> Void, cancelCall: @escaping @Sendable () -> Void) {
        self.consume = consume
        self.cancelCall = cancelCall
    }

    /// Messages arrived and not yet read, and whether the call has ended (tests wait on it).
    var queued: (messages: Int, ended: Bool) { state.withLock { ($0.messages.count - $0.head, $0.status != nil) } }

    /// Loop side: messages decoded from `wireBytes` bytes of DATA.
    func deliver(_ messages: [[UInt8]], wireBytes: Int) {
        var handoff: (CheckedContinuation<[UInt8]?, Error>, [UInt8])? = nil
        var batchHandoff: (CheckedContinuation<[[UInt8]]?, Error>, [[UInt8]])? = nil
        state.withLock { s in
            s.wireBytesHeld += wireBytes
            for m in messages { s.queuedBytes += m.count + 5 }
            s.messages.append(contentsOf: messages)
            if let w = s.waiter, s.head < s.messages.count {
                s.waiter = nil
                handoff = (w, Self.pop(&s))
            } else if let w = s.batchWaiter, s.head < s.messages.count {
                s.batchWaiter = nil
                batchHandoff = (w, Self.popAll(&s))
            }
        }
        if let (w, m) = handoff { w.resume(returning: m) }
        if let (w, b) = batchHandoff { w.resume(returning: b) }
        // Bytes of a partial message are credited at once: a message larger than the window
        // must still get through (the message size limit bounds it).
        creditTaken()
    }

    /// Loop side: the call is over.
    func finish(_ status: GRPCStatus) {
        let (w, bw) = state.withLock { s -> (CheckedContinuation<[UInt8]?, Error>?, CheckedContinuation<[[UInt8]]?, Error>?) in
            if s.status == nil { s.status = status }
            defer {
                s.waiter = nil
                s.batchWaiter = nil
            }
            return (s.waiter, s.batchWaiter)
        }
        if let w { if status.code == .ok { w.resume(returning: nil) } else { w.resume(throwing: status) } }
        if let bw { if status.code == .ok { bw.resume(returning: nil) } else { bw.resume(throwing: status) } }
    }

    /// Gives flow-control credit back when enough was read, or when nothing is left buffered.
    private func creditTaken() {
        let give = state.withLock { s -> Int in
            // bytes of messages still queued stay held; the rest goes back to the server
            let credit = s.wireBytesHeld - s.queuedBytes
            if credit >= Self.consumeBatch || (s.queuedBytes == 0 && credit > 0) {
                s.wireBytesHeld -= credit
                return credit
            }
            return 0
        }
        if give > 0 { consume(give) }
    }

    private static func pop(_ s: inout State) -> [UInt8] {
        let m = s.messages[s.head]
        s.messages[s.head] = []
        s.head += 1
        s.queuedBytes -= m.count + 5
        if s.head == s.messages.count {
            s.messages.removeAll(keepingCapacity: true)
            s.head = 0
        }
        return m
    }

    private static func popAll(_ s: inout State) -> [[UInt8]] {
        let batch = Array(s.messages[s.head...])
        s.messages.removeAll(keepingCapacity: true)
        s.head = 0
        s.queuedBytes = 0
        return batch
    }

    /// Reader side: every message that has arrived (waiting for at least one); nil at a clean end.
    func nextBatch() async throws -> [[UInt8]]? {
        try await take(Self.popAll) { s, c in s.batchWaiter = c }
    }

    /// Reader side: the next message, nil at a clean end, throws the status otherwise.
    func next() async throws -> [UInt8]? {
        try await take(Self.pop) { s, c in s.waiter = c }
    }

    /// Takes what `pick` takes from the queue, waiting (parked by `park`) while it is empty;
    /// nil at a clean end, the status otherwise. Credits the window for what was taken.
    private func take<T: Sendable>(_ pick: (inout State) -> T,
                                   park: (inout State, CheckedContinuation<T?, Error>) -> Void) async throws -> T? {
        let ready = try state.withLock { s -> T?? in
            if s.head < s.messages.count { return .some(pick(&s)) }
            if let status = s.status {
                if status.code == .ok { return .some(nil) }
                throw status
            }
            return .none
        }
        let value: T?
        if let ready {
            value = ready
        } else {
            value = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (c: CheckedContinuation<T?, Error>) in
                    let outcome = state.withLock { s -> Result<T?, Error>? in
                        if s.head < s.messages.count { return .success(pick(&s)) }
                        if let status = s.status {
                            return status.code == .ok ? .success(nil) : .failure(status)
                        }
                        park(&s, c)
                        return nil
                    }
                    if let outcome { c.resume(with: outcome) }
                }
            } onCancel: {
                cancelCall()
            }
        }
        if value != nil { creditTaken() }
        return value
    }
}

/// The responses of a server-streaming call. Iterate it; the loop ends at the server's OK and
/// throws `GRPCStatus` for any other ending. `cancel()` ends the call early.
public struct ServerStreamingCall<Response: ProtoMessage>: AsyncSequence, Sendable {
    public typealias Element = Response
    let state: ResponseStreamState

    public struct AsyncIterator: AsyncIteratorProtocol {
        let state: ResponseStreamState
        public mutating func next() async throws -> Response? {
            guard let bytes = try await state.next() else { return nil }
            do {
                return try Response(serializedBytes: bytes)
            } catch {
                state.cancelCall()
                throw GRPCStatus(.internal, "MALFORMED_RESPONSE: \(error)")
            }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(state: state) }

    /// Cancels the call (RST_STREAM); iteration then ends with CANCELLED.
    public func cancel() { state.cancelCall() }
}

/// The undecoded responses of a server-streaming call (protobuf bytes of each message).
public struct RawServerStreamingCall: AsyncSequence, Sendable {
    public typealias Element = [UInt8]
    let state: ResponseStreamState

    public struct AsyncIterator: AsyncIteratorProtocol {
        let state: ResponseStreamState
        public mutating func next() async throws -> [UInt8]? { try await state.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(state: state) }
    public func cancel() { state.cancelCall() }

    /// Every message that has arrived since the last call (at least one; nil at the end): for readers
    /// that keep up with many messages, one wake-up per batch instead of one per message.
    public func nextBatch() async throws -> [[UInt8]]? { try await state.nextBatch() }
    /// Messages arrived and not yet read, and whether the call has ended.
    var queued: (messages: Int, ended: Bool) { state.queued }
}
