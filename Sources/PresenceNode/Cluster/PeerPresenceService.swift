import GRPCTransport
import PresenceWire

/// `presence.cluster.v1.PeerPresence` on the peer port: calls routed to this node as a channel
/// owner or user home, and pushes (deliveries, replicas, handoffs, announces). Every call must
/// carry the cluster secret when the node has one.
struct PeerPresenceService {
    let engine: PresenceEngine
    let membership: Membership

    func register(in registry: inout ServiceRegistry) {
        let engine = self.engine
        let membership = self.membership
        registry.unary(PeerPresenceMethods.channel) { req, ctx in
            try membership.authorize(ctx)
            return await engine.peerChannel(req)
        }
        registry.unary(PeerPresenceMethods.home) { req, ctx in
            try membership.authorize(ctx)
            return await engine.peerHome(req)
        }
        registry.unary(PeerPresenceMethods.checkSessions) { req, ctx in
            try membership.authorize(ctx)
            guard req.sessionIDs.count <= PresenceEngine.maxSessionCheck else {
                throw GRPCStatus(.resourceExhausted, "TOO_MANY_SESSIONS: at most \(PresenceEngine.maxSessionCheck) per call")
            }
            return engine.peerCheckSessions(req)
        }
        registry.unary(PeerPresenceMethods.push) { req, ctx in
            // (no membership check: after a partition a node's announces may arrive before this
            // node believes it alive again, and they are what keeps its sessions from timing out)
            try membership.authorize(ctx)
            await engine.peerPush(req)
            return ClusterPushAck()
        }
    }
}
