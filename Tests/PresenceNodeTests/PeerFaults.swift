import ClusterCore
import EventLoop
import GRPCTransport
import PresenceCore
@testable import PresenceClient
@testable import PresenceNode
import PresenceWire
import Synchronization

/// What a test does to one node's traffic to its peers, through the peer transport seam (`Node`'s
/// `peerTransport:` wraps production's transport in it): pushes to a peer held unanswered, as if
/// that node were slow (also those relayed to it through another member); channel and home calls
/// to a peer delayed, or never answered (a cut link). SWIM and anti-entropy pass untouched. A
/// held or delayed request keeps its timeout: past it, it fails as an unanswered one does.
final class PeerFaults: PeerTransport {
    private let inner: any PeerTransport
    private struct State {
        /// The node id at each peer address a fault was set for.
        var nodeAt: [String: String] = [:]
        /// Nodes whose pushes are held.
        var held: Set<String> = []
        /// Push attempts still to lose, by node id.
        var toLose: [String: Int] = [:]
        var callDelays: [String: UInt64] = [:]
        /// Peer addresses whose channel calls are carried out but never answered.
        var answersLost: Set<String> = []
        /// Peer addresses anti-entropy cannot reach.
        var antiEntropyBlocked: Set<String> = []

        /// The node a push is for: the one at `address`, or the one a relay passes it on to.
        func destination(_ address: String, _ request: some ProtoMessage) -> String {
            nodeAt[address] ?? (request as? ClusterPushBatch)?.relayTo ?? ""
        }
    }
    private let state = Mutex(State())
    /// How often a held push looks whether it was let go.
    private static let poll: UInt64 = 5_000_000

    init(_ inner: any PeerTransport) { self.inner = inner }

    /// Holds the pushes to node `id` (at peer address `address`), direct or relayed, until called
    /// again with `false`.
    func holdPushes(to id: String, at address: String, _ hold: Bool) {
        state.withLock { s in
            s.nodeAt[address] = id
            if hold { s.held.insert(id) } else { s.held.remove(id) }
        }
    }

    /// Loses the next `count` push attempts to node `id` (at `address`), direct or relayed: each
    /// goes unanswered for its whole timeout, as a message lost on a lossy link.
    func losePushes(to id: String, at address: String, count: Int) {
        state.withLock { s in
            s.nodeAt[address] = id
            s.toLose[id] = count
        }
    }

    /// Whether this push attempt is one to lose (and counts it).
    private func loses(_ address: String, _ request: some ProtoMessage) -> Bool {
        state.withLock { s in
            let id = s.destination(address, request)
            guard let left = s.toLose[id], left > 0 else { return false }
            s.toLose[id] = left - 1
            return true
        }
    }

    /// Delays the channel and home calls to `address` by `delay` ns (`.max`: never answered), or
    /// ends the delay with nil.
    func delayCalls(to address: String, by delay: UInt64?) {
        state.withLock { $0.callDelays[address] = delay }
    }

    /// The channel calls to `address` are carried out by the node there, but their answers are
    /// lost (each attempt fails as one nobody answered), until called again with `false`.
    func loseAnswers(from address: String, _ lose: Bool) {
        state.withLock { s in
            if lose { s.answersLost.insert(address) } else { s.answersLost.remove(address) }
        }
    }

    /// Anti-entropy's calls to `address` fail at once as unreachable (as over a cut link, while
    /// calls and pushes still go through other members), until called again with `false`.
    func blockAntiEntropy(to address: String, _ block: Bool) {
        state.withLock { s in
            if block { s.antiEntropyBlocked.insert(address) } else { s.antiEntropyBlocked.remove(address) }
        }
    }

    private func isHeld(_ address: String, _ request: some ProtoMessage) -> Bool {
        state.withLock { s in !s.held.isEmpty && s.held.contains(s.destination(address, request)) }
    }

    func unary<Req: ProtoMessage, Resp: ProtoMessage>(_ address: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                      timeout: UInt64) async throws -> Resp {
        let start = MonotonicClock.now()
        if [PeerPresenceMethods.digest.path, PeerPresenceMethods.exchange.path, PeerPresenceMethods.confirm.path].contains(method.path),
           state.withLock({ $0.antiEntropyBlocked.contains(address) }) {
            throw GRPCStatus(.unavailable, "anti-entropy blocked by the test")
        }
        if method.path == PeerPresenceMethods.push.path {
            if loses(address, request) {
                try await Task.sleep(nanoseconds: timeout)
                throw GRPCStatus(.deadlineExceeded, "lost by the test")
            }
            while isHeld(address, request) {
                guard MonotonicClock.now() - start < timeout else { throw GRPCStatus(.deadlineExceeded, "held by the test") }
                try await Task.sleep(nanoseconds: Self.poll)
            }
        } else if method.path == PeerPresenceMethods.channel.path || method.path == PeerPresenceMethods.home.path,
                  let delay = state.withLock({ $0.callDelays[address] }) {
            try await Task.sleep(nanoseconds: min(delay, timeout))
            if delay > timeout { throw GRPCStatus(.deadlineExceeded, "delayed by the test past its timeout") }
        }
        let left = timeout - min(timeout, MonotonicClock.now() - start)
        let answer = try await inner.unary(address, method, request, timeout: max(1, left))
        if method.path == PeerPresenceMethods.channel.path, state.withLock({ $0.answersLost.contains(address) }) {
            throw GRPCStatus(.deadlineExceeded, "answer lost by the test")
        }
        return answer
    }

    func preferredLoop(of address: String) -> EventLoop? { inner.preferredLoop(of: address) }
    func forget(_ address: String) { inner.forget(address) }
    func close() { inner.close() }
}

extension Node {
    /// Stops serving without leaving the cluster or draining anything: what others see of a
    /// crash (the process would just die).
    func crash() async {
        await core.halt()
        await httpServer?.shutdown(gracePeriod: 0)
        group.shutdown()
    }
}

extension ChannelShard {
    /// Drops a session from an owned channel as if this owner had lost it (a copy that missed
    /// it), with the events that makes: what anti-entropy repairs.
    func lose(_ session: SessionID, in key: ChannelKey) {
        var routed: [RoutedDelivery<NodeInstance>] = []
        _ = try? withOwned(key, create: false, now: wall) { m in
            guard let user = m.user(of: session) else { return }
            routed = m.routing { $0.leave(user: user, session: session, byGateway: false, now: wall) }
        }
        deliver(routed)
    }
}

extension ChannelShard {
    /// Where this node, as `key`'s owner, places `session` (nil: not owned here, or not there).
    func placement(of session: SessionID, in key: ChannelKey) -> NodeInstance? {
        space.owned[key]?.sink(of: session)
    }

    /// The state of `user` in this node's replica copy of `key` (nil: no copy, or not there).
    func copyState(of user: String, in key: ChannelKey) -> [StateItem]? {
        space.copies[key].flatMap { $0.state(of: user) }
    }
}

extension PresenceClient {
    /// Drops the connection as a network failure would.
    func dropConnection() { grpc.close() }
}

extension TestNode {
    /// This node's peer address as the cluster knows it, by `nodes[0]`'s membership.
    func peerAddress(of id: String) -> String? { node.core.membership.peerAddress(of: id) }
}
