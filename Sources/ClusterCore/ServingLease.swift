/// Whether this node has heard from the cluster recently enough to answer from its own view
/// (RELIABILITY.md, "paused processes"). A process frozen (SIGSTOP, a paused VM, a long GC-like
/// stall) longer than the others take to declare it dead comes back believing it still owns its
/// keys, while the others have already taken them over: the calls queued in its sockets must not
/// be answered from that stale view. Each answered probe proves the node was alive and connected
/// at that moment; `duration` after the last one, the lease runs out until the next answer.
/// A plain value: answered probes and clock readings in, answers out.
public struct ServingLease: Sendable, Equatable {
    /// How long one answered probe lets the node serve (0: always; a single node needs no lease).
    public let duration: UInt64
    private var lastHeard: UInt64?

    public init(duration: UInt64) {
        self.duration = duration
    }

    /// A member answered a probe this node sent at or before `now`.
    public mutating func heard(at now: UInt64) {
        if let last = lastHeard, last >= now { return }
        lastHeard = now
    }

    /// The node serves with other members from `now` on (it became ready with them, or they
    /// joined it): the lease counts from here if no probe was answered yet, so a node cut off
    /// before its first answer is not taken for one still joining for ever (found in CI: a node
    /// partitioned just after its join answer served its stale view, and retried every call for
    /// the whole routing window).
    public mutating func began(at now: UInt64) {
        if lastHeard == nil { lastHeard = now }
    }

    /// Whether the node may serve at `now`. Before the first answer the node has nothing to lose
    /// (it is joining, and the handoff gate and readiness decide); a clock reading earlier than the
    /// last answer (readings from different threads) counts as within the lease.
    public func holds(now: UInt64) -> Bool {
        guard duration > 0, let last = lastHeard else { return true }
        return now <= last || now - last <= duration
    }

    /// Whether no probe was answered for longer than `span` at `now`: false before the first
    /// answer, and for a clock reading earlier than the last answer.
    public func silent(for span: UInt64, now: UInt64) -> Bool {
        guard let last = lastHeard else { return false }
        return now > last && now - last > span
    }
}
