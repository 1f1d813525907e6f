import ClusterCore
import EventLoop
import PresenceCore
import Synchronization

/// What routing needs to know, shared by every actor of the node: this node's id, the ring of
/// alive members (owner first, then replicas), the replication factor, and whether a key this node
/// owns may be served yet (`HandoffGate`). Updated by the membership shell on every ring change.
public final class Topology: Sendable {
    public let me: String
    /// Nodes holding each channel's (and user home's) state, owner included.
    public let replicationFactor: Int
    private struct State {
        var ring: HashRing {
            didSet { fingerprint = ring.fingerprint }
        }
        var fingerprint: UInt64
        var alive: Set<String>
        var gate: HandoffGate
        /// False until this node has joined its seeds (it owns nothing it could answer for).
        var ready: Bool
        /// False between a ring change and the end of the engine's handoff and takeover for it:
        /// the shards may not hold yet what the new ring says this node owns.
        var settled = true
    }
    private let state: Mutex<State>
    private let readyObserver = Mutex<(@Sendable () -> Void)?>(nil)

    public init(me: String, replicationFactor: Int, handoffLimit: UInt64 = 3_000_000_000, ready: Bool = true) {
        self.me = me
        self.replicationFactor = max(1, replicationFactor)
        let ring = HashRing(members: [me])
        state = Mutex(State(ring: ring, fingerprint: ring.fingerprint, alive: [me], gate: HandoffGate(me: me, limit: handoffLimit), ready: ready))
    }

    public var ring: HashRing { state.withLock { $0.ring } }
    public var alive: Set<String> { state.withLock { $0.alive } }
    public var isReady: Bool { state.withLock { $0.ready } }
    public var isAlone: Bool { state.withLock { $0.ring.members.count == 1 } }

    public func owner(of key: ChannelKey) -> String { state.withLock { $0.ring.owner(of: key) } ?? me }
    public func owners(of key: ChannelKey) -> [String] { state.withLock { $0.ring.owners(of: key, count: replicationFactor) } }
    public func home(of user: String) -> String { state.withLock { $0.ring.home(ofUser: user) } ?? me }
    public func homes(of user: String) -> [String] { state.withLock { $0.ring.homes(ofUser: user, count: replicationFactor) } }

    /// A key's owner and the fingerprint of the ring that says so (sent along, for the owner to check).
    public func route(_ key: ChannelKey) -> (String, UInt64) {
        state.withLock { ($0.ring.owner(of: key) ?? me, $0.fingerprint) }
    }

    /// A user's home and the ring's fingerprint.
    public func route(user: String) -> (String, UInt64) {
        state.withLock { ($0.ring.home(ofUser: user) ?? me, $0.fingerprint) }
    }

    /// Why a call routed by the ring with `fingerprint` may not be answered here: the rings differ
    /// (membership is still converging), or nil.
    public func ringMismatch(_ fingerprint: UInt64) -> String? {
        guard fingerprint != 0 else { return nil }
        return state.withLock { s in
            s.fingerprint == fingerprint ? nil : "RING_MISMATCH: this node's view of the cluster differs from the caller's; retry"
        }
    }

    /// Why this node may not answer for a key it owns right now, or nil when it may.
    public func notServing(keyHash: @autoclosure () -> UInt64) -> String? {
        state.withLock { s in
            if s.ready && s.settled && s.ring.members.count == 1 { return nil }
            if !s.ready { return "NOT_READY: this node has not joined the cluster yet" }
            if !s.settled { return "RING_CHANGING: ownership is moving; retry" }
            if !s.gate.mayServe(keyHash: keyHash(), now: MonotonicClock.now()) {
                return "HANDOFF_IN_PROGRESS: this key is moving to this node; retry"
            }
            return nil
        }
    }

    /// Installs a new ring; returns the one it replaces (nil when nothing changed).
    public func update(ring new: HashRing, alive: Set<String>) -> HashRing? {
        state.withLock { s in
            s.alive = alive
            guard new != s.ring else { return nil }
            let old = s.ring
            s.ring = new
            s.settled = false
            s.gate.ringChanged(from: s.ready ? old : new.removing(me), to: new, alive: alive, now: MonotonicClock.now())
            return old
        }
    }

    /// The engine has carried out the change to the ring with this fingerprint.
    public func settled(_ fingerprint: UInt64) {
        state.withLock { s in if s.ring.fingerprint == fingerprint { s.settled = true } }
    }

    public func markReady() {
        let observer = state.withLock { s -> (@Sendable () -> Void)? in
            guard !s.ready else { return nil }
            s.ready = true
            return readyObserver.withLock { $0 }
        }
        observer?()
    }

    /// Runs `observer` once this node becomes ready (at once if it is).
    public func onReady(_ observer: @escaping @Sendable () -> Void) {
        readyObserver.withLock { $0 = observer }
        if isReady { observer() }
    }

    public func handoffDone(from node: String, fingerprint: UInt64) {
        state.withLock { $0.gate.handoffDone(from: node, fingerprint: fingerprint) }
    }
}
