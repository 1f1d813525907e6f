import GRPCTransport
import PresenceWire

/// `presence.cluster.v1.PeerPresence` on the peer port: calls routed to this node as a channel
/// owner or user home, pushes (deliveries, copies, handoffs, moved sessions), and anti-entropy.
/// Every call must carry the cluster secret when the node has one.
struct PeerPresenceService {
    let engine: PresenceEngine
    let membership: Membership

    func register(in registry: inout ServiceRegistry) {
        let inbound = engine.inbound
        let membership = self.membership
        registry.unaryStaged(PeerPresenceMethods.channel) { req, ctx in
            inbound.channel(req, answerBy: ctx.deadline)
        }
        registry.unary(PeerPresenceMethods.home) { req, ctx in
            return await inbound.home(req, answerBy: ctx.deadline)
        }
        registry.unary(PeerPresenceMethods.push) { req, ctx in
            // (no membership check: after a partition a node's pushes may arrive before this
            // node believes it alive again; versions decide what they may change)
            if !req.relayTo.isEmpty && req.relayTo != membership.nodeID {
                // a batch for another node whose sender cannot reach it directly
                try await inbound.relay(req)
            } else {
                await inbound.push(req)
            }
            return ClusterPushAck()
        }
        registry.unary(PeerPresenceMethods.digest) { req, ctx in
            return await inbound.digest(req)
        }
        registry.unary(PeerPresenceMethods.exchange) { req, ctx in
            return await inbound.exchange(req)
        }
        registry.unary(PeerPresenceMethods.confirm) { req, ctx in
            await inbound.confirm(req)
            return ClusterConfirmResponse()
        }
    }
}
