/// Where one session stands in one channel's events, at its gateway (RELIABILITY.md, invariant 5):
/// which owner's events it follows (the one whose SNAPSHOT it got last) and the last sequence it
/// was given. A plain value: the gateway asks it, for each event an owner pushes, whether to pass
/// it on. Only events in order from the owner it follows pass; a SNAPSHOT from anyone passes if it
/// is above what the session saw; anything else is dropped, and when that may leave the session
/// behind (events from another owner, a SNAPSHOT that is not above), it asks for a fresh SNAPSHOT
/// numbered above `last`.
public struct FeedPosition<Source: Equatable & Sendable>: Sendable, Equatable {
    public private(set) var source: Source?
    public private(set) var last: UInt64
    /// When a fresh SNAPSHOT was last asked for (monotonic ns), while none has come.
    public private(set) var askedAt: UInt64?

    public init(source: Source? = nil, last: UInt64 = 0) {
        self.source = source
        self.last = last
    }

    public enum Decision: Equatable, Sendable {
        case deliver
        case drop
        /// Drop it, and ask the channel's owner for a SNAPSHOT numbered above `floor`.
        case resnapshot(floor: UInt64)
    }

    /// How long a request for a SNAPSHOT may go unanswered before it is made again.
    public static var askAgainAfter: UInt64 { 2_000_000_000 }

    /// Decides about an event numbered `sequence` from `from`, and moves the position when it passes.
    /// (Pre-specialised for the gateway's sources: it runs once per subscriber per event, and
    /// generic code called across modules looks its witnesses and metadata up on every call.)
    @_specialize(exported: true, where Source == NodeInstance)
    public mutating func decide(from: Source, sequence: UInt64, snapshot: Bool, now: UInt64) -> Decision {
        if snapshot {
            if sequence > last || source == nil {
                source = from
                last = max(last, sequence)
                askedAt = nil
                return .deliver
            }
            return ask(now: now)
        }
        guard let source else { return .drop }
        if source == from {
            guard sequence > last else { return .drop }  // a duplicate, or older than a SNAPSHOT it got
            last = sequence
            return .deliver
        }
        // another owner's events: the channel moved and this session may have missed some
        return ask(now: now)
    }

    private mutating func ask(now: UInt64) -> Decision {
        if let at = askedAt, now < at &+ Self.askAgainAfter { return .drop }
        askedAt = now
        return .resnapshot(floor: last)
    }
}
