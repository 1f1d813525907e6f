/// How a gateway retries a call whose owner (a channel's owner or a user's home) is moving, refuses
/// for now, or cannot be reached (ARCHITECTURE.md, "Routing"; RELIABILITY.md, invariant 7): where
/// each attempt goes, how long it may take, how long to pause between attempts, and when to stop
/// and answer UNAVAILABLE so the client can retry or move to another node.
///
/// The bound: a call to another node is answered within `window + minimumAttempt` (and a pause's
/// oversleep), so an SDK that tries a node twice still has time left of invariant 7's 5 s to move
/// to another. (A call this node answers as the owner may also wait up to the replication wait for
/// its copies.) A node cut off from the cluster (no probe answered for a while) gives up at its
/// first failure: no attempt it makes can succeed, and its clients do better moving to a node
/// that can reach the others.
///
/// A plain value: failures and clock readings in, the next attempt (or the answer) out.
public struct RoutingWindow: Sendable {
    /// The timing of the window (nanoseconds).
    public struct Settings: Sendable, Equatable {
        /// How long after the call's start a new attempt may begin.
        public var window: UInt64
        /// The first attempt goes straight to the owner and gets this long (after it, the owner
        /// counts as unreachable if it did not answer, and attempts alternate through relays).
        public var firstAttempt: UInt64
        /// An attempt never gets longer than one call to another node may take.
        public var callTimeout: UInt64
        /// The last attempt gets at least this long, even with less left of the window: so much
        /// may an answer come after the window.
        public var minimumAttempt: UInt64
        /// The pause after the first failure; it doubles after each further one, up to `maximumPause`.
        public var firstPause: UInt64 = 10_000_000
        public var maximumPause: UInt64 = 200_000_000

        public init(window: UInt64, firstAttempt: UInt64, callTimeout: UInt64, minimumAttempt: UInt64) {
            self.window = window
            self.firstAttempt = firstAttempt
            self.callTimeout = callTimeout
            self.minimumAttempt = minimumAttempt
        }

        /// The latest a call is answered after it started: its last attempt begins before the
        /// window closes and gets what is left of it, or `minimumAttempt` when that is more.
        public var answerBound: UInt64 { window + minimumAttempt }
    }

    /// One attempt: its number (0 first), whether it goes through another member (which forwards
    /// it once) instead of straight to the owner, and how long it may take.
    public struct Attempt: Sendable, Equatable {
        public let number: Int
        public let throughRelay: Bool
        public let timeout: UInt64

        public init(number: Int, throughRelay: Bool, timeout: UInt64) {
            self.number = number
            self.throughRelay = throughRelay
            self.timeout = timeout
        }
    }

    /// What a gateway does after an attempt failed as unavailable.
    public enum Next: Sendable, Equatable {
        /// Pause this long, then make this attempt.
        case retry(after: UInt64, Attempt)
        /// Stop: answer the call UNAVAILABLE.
        case answer
    }

    public let settings: Settings
    /// The clock reading after which no attempt begins.
    private let deadline: UInt64
    private var pause: UInt64
    private var number = 0
    private var unreachable = false

    /// A call that starts at `now`.
    public init(_ settings: Settings, now: UInt64) {
        self.settings = settings
        let (end, overflow) = now.addingReportingOverflow(settings.window)
        deadline = overflow ? .max : end
        pause = settings.firstPause
    }

    /// The first attempt: straight to the owner, for `firstAttempt`.
    public var first: Attempt { Attempt(number: 0, throughRelay: false, timeout: min(settings.firstAttempt, settings.callTimeout)) }

    /// The attempt made last failed as unavailable at `now`. `ownerUnreachable`: the owner (or the
    /// relay) did not answer at all, as opposed to refusing; `cutOff`: this node has not heard from
    /// the cluster for longer than its lease, so none of its attempts can succeed.
    public mutating func failed(ownerUnreachable: Bool, cutOff: Bool, now: UInt64) -> Next {
        if cutOff { return .answer }
        let (resume, overflow) = now.addingReportingOverflow(pause)
        guard !overflow, resume < deadline else { return .answer }
        let wait = pause
        pause = pause > settings.maximumPause / 2 ? settings.maximumPause : pause * 2
        number += 1
        unreachable = unreachable || ownerUnreachable
        // (every other attempt goes through a relay once the owner could not be reached: a link may
        // be cut while both ends live)
        let left = deadline - resume
        let timeout = min(settings.callTimeout, max(settings.minimumAttempt, left))
        return .retry(after: wait, Attempt(number: number, throughRelay: unreachable && number % 2 == 1, timeout: timeout))
    }
}
