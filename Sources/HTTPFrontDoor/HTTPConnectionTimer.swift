/// The timeouts of one HTTP/1.1 connection, as a plain state machine: what happened and a clock
/// reading in, the next deadline and what to do at it out (like `KeepaliveStateMachine`).
/// - A new connection must deliver its first whole request within `handshake`.
/// - A request that has started must be whole within `request` (no trickling a head forever).
/// - Between requests of a kept-alive connection, it may stay silent for `idle`.
/// - While the server answers, no deadline runs (the answer's own work is bounded elsewhere).
public struct HTTPConnectionTimer: Sendable, Equatable {
    public struct Timeouts: Sendable, Equatable {
        public var handshake: UInt64 = 10_000_000_000
        public var request: UInt64 = 30_000_000_000
        public var idle: UInt64 = 60_000_000_000
        public init() {}
    }

    public enum Phase: Sendable, Equatable {
        /// Accepted, no whole request yet.
        case firstRequest
        /// Part of a request has arrived.
        case readingRequest
        /// A whole request is being answered.
        case answering
        /// Answered; waiting for the next request.
        case idle
    }

    /// What to do when the deadline passes.
    public enum Expiry: Sendable, Equatable {
        /// Answer 408 Request Timeout, then close (part of a request is in).
        case requestTimeout
        /// Close without a word (nothing was asked).
        case close
    }

    public let timeouts: Timeouts
    public private(set) var phase = Phase.firstRequest
    /// Monotonic ns; nil while answering.
    public private(set) var deadline: UInt64?

    public init(timeouts: Timeouts, now: UInt64) {
        self.timeouts = timeouts
        deadline = now &+ timeouts.handshake
    }

    /// Bytes of a request arrived (not yet a whole one).
    public mutating func bytesArrived(now: UInt64) {
        switch phase {
        case .firstRequest:
            phase = .readingRequest   // (still by the handshake's deadline)
        case .idle:
            phase = .readingRequest
            deadline = now &+ timeouts.request
        case .readingRequest, .answering:
            break
        }
    }

    /// A whole request arrived: its answer is being made.
    public mutating func requestComplete() {
        phase = .answering
        deadline = nil
    }

    /// The answer went out and the connection stays open.
    public mutating func answered(now: UInt64) {
        phase = .idle
        deadline = now &+ timeouts.idle
    }

    /// What the deadline means, if it has passed at `now`.
    public func expired(now: UInt64) -> Expiry? {
        guard let deadline, now >= deadline else { return nil }
        switch phase {
        case .readingRequest: return .requestTimeout
        case .firstRequest, .idle, .answering: return .close
        }
    }
}
