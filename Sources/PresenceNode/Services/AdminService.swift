import ClusterCore
import GRPCTransport
import PresenceCore
import PresenceWire

/// `presence.admin.v1.Admin`: the members this node knows and who owns what on its ring.
public struct AdminService: Sendable {
    let membership: Membership
    let engine: PresenceEngine
    /// Requests and bytes the peer server received.
    let peerTraffic: @Sendable () -> (requests: Int, bytes: Int)
    /// Whether this registry is the client port's (else the peer port's).
    let onClientPort: Bool
    /// Whether the node runs in token mode.
    let tokenMode: Bool

    /// Who may call Admin (members, peer addresses, ownership: what an attacker maps a cluster
    /// with): on the peer port, a peer (signed with the cluster secret when there is one); on the
    /// client port, a caller signing with the cluster secret — or anyone only in open mode with no
    /// secret, a cluster on a developer's machine. (Signatures are checked by the servers before
    /// the request is decoded: `Membership.refuse`, installed for Admin on the client port.)
    func authorize(_ ctx: ServerContext) throws {
        if onClientPort && !membership.hasClusterSecret && tokenMode {
            throw GRPCStatus(.permissionDenied, "ADMIN_NOT_HERE: in token mode Admin answers on the peer port, or with the cluster credential (--cluster-secret-file)")
        }
    }

    public func register(in registry: inout ServiceRegistry) {
        let membership = self.membership
        let engine = self.engine
        let peerTraffic = self.peerTraffic
        let service = self
        registry.unary(AdminMethods.members) { _, ctx in
            try service.authorize(ctx)
            let traffic = peerTraffic()
            let counts = await engine.channelCounts()
            return AdminMembersResponse(members: membership.members.map { u in
                AdminMember(nodeID: u.id, peerAddress: u.address, clientAddress: membership.clientAddress(of: u.id),
                            status: membership.wire(u).status, incarnation: u.incarnation, isSelf: u.id == membership.nodeID, boot: u.boot)
            }, peerRequestsReceived: UInt64(traffic.requests), peerBytesReceived: UInt64(traffic.bytes),
               channelsOwned: UInt64(counts.owned), channelCopies: UInt64(counts.copies))
        }
        registry.unary(AdminMethods.ring) { req, ctx in
            try service.authorize(ctx)
            let ring = membership.ring
            var resp = AdminRingResponse(ringMembers: ring.members)
            if !req.channelName.isEmpty {
                let type = ChannelType(rawValue: req.channelType == 0 ? 1 : req.channelType)
                resp.channelOwners = ring.owners(of: ChannelKey(name: req.channelName, type: type), count: membership.topology.replicationFactor)
            }
            if !req.userID.isEmpty { resp.userHome = ring.home(ofUser: req.userID) ?? "" }
            return resp
        }
    }
}
