/// Whether the loop that releases held-back keys runs (`RingCoordinator.releaseHeldBackSoon`), and
/// what it does after each look at the shards. A release asked for while the loop runs makes it
/// look once more before it ends: a key held back just after its last look would otherwise wait
/// for the next ring change.
struct ReleaseLoop: Sendable {
    private(set) var running = false
    private var asked = false

    enum Next: Equatable {
        /// Keys still wait for their gate: look again after the retry interval.
        case sleep
        /// Nothing waited, but a release was asked for during the look: look again now.
        case lookAgain
        /// Nothing waits: the loop ends.
        case stop
    }

    /// A release is asked for. True when no loop runs: the caller starts one.
    mutating func ask() -> Bool {
        asked = true
        defer { running = true }
        return !running
    }

    /// The loop starts a look at every shard.
    mutating func looking() {
        asked = false
    }

    /// The look ended; `waiting`: some key is still held back.
    mutating func looked(waiting: Bool) -> Next {
        if waiting { return .sleep }
        if asked { return .lookAgain }
        running = false
        return .stop
    }

    /// The loop was cancelled (the node stops).
    mutating func cancelled() {
        running = false
    }
}
