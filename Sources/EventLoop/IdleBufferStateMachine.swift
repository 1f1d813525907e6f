/// Decides when a connection gives its outbound buffer's pages back to the kernel: once nothing has
/// been sent for `quietPeriod`. A connection sending steadily keeps them (giving them back would
/// only make the next frame fault them in again); one that sits quiet — an idle client, or a
/// session's stream waiting for events — keeps none of them resident.
///
/// At most one timer is armed at a time, and only when something was sent since the last release,
/// so a busy connection costs one timer per quiet period, not one per frame.
/// Pure: the caller feeds it clock readings and carries out what it returns.
public struct IdleBufferStateMachine: Sendable {
    public let quietPeriod: UInt64
    private var lastSentAt: UInt64 = 0
    private var holdsPages = false
    private var timerArmed = false

    public init(quietPeriod: UInt64) {
        self.quietPeriod = quietPeriod
    }

    /// Bytes were sent (so the buffer's pages are resident again). Returns when to arm the timer,
    /// or nil when one is already armed.
    public mutating func sent(now: UInt64) -> UInt64? {
        lastSentAt = now
        holdsPages = true
        if timerArmed { return nil }
        timerArmed = true
        return now &+ quietPeriod
    }

    /// What the timer armed for `sent`'s deadline should do.
    public enum Decision: Equatable, Sendable {
        /// Nothing to give back (already given back, or nothing sent since).
        case none
        /// Give the pages back now.
        case release
        /// Something was sent since the timer was armed: arm it again for this deadline.
        case rearm(at: UInt64)
    }

    public mutating func timerFired(now: UInt64) -> Decision {
        timerArmed = false
        guard holdsPages else { return .none }
        let due = lastSentAt &+ quietPeriod
        if now >= due {
            holdsPages = false
            return .release
        }
        timerArmed = true
        return .rearm(at: due)
    }

    /// The caller could not release when told (the connection still had bytes to send): the pages
    /// count as held, and the next `sent` arms the timer again.
    public mutating func releaseDeferred() {
        holdsPages = true
    }
}
