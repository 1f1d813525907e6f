import PresenceCore
import PresenceWire

/// This node's sessions: the gateway shards (by session id) and who follows which channel.
final class LocalGateway: Sendable {
    let shards: [GatewayShard]
    let subscriptions = Subscriptions()

    init(shards: Int, resumeWindow: UInt64, clock: EngineClock) {
        self.shards = (0..<max(1, shards)).map { _ in GatewayShard(resumeWindow: resumeWindow, clock: clock) }
    }

    func shard(_ id: SessionID) -> GatewayShard { shards[Int(id.raw % UInt64(shards.count))] }

    /// Hands a delivery from a channel owner or a user home to this node's sessions.
    func deliver(_ d: ClusterDelivery) {
        if d.toSessions.isEmpty {
            guard let key = try? Validate.channel(d.channelName, d.channelType) else { return }
            deliver(key, except: d.exceptSession.isEmpty ? nil : SessionID(text: d.exceptSession), framed: d.framed)
            return
        }
        let key = d.snapshot ? try? Validate.channel(d.channelName, d.channelType) : nil
        for text in d.toSessions {
            guard let id = SessionID(text: text) else { continue }
            if let key {
                // a SNAPSHOT starts the session's subscription here, unless it left meanwhile
                guard let outbox = shard(id).follows(id, channel: key) else { continue }
                subscriptions.subscribe(key, id, outbox)
                outbox.push(d.framed)
            } else {
                shard(id).outbox(id)?.push(d.framed)
            }
        }
    }

    func deliver(_ key: ChannelKey, except: SessionID?, framed: [UInt8]) {
        subscriptions.deliver(key, except: except, framed: framed)
    }
}

/// How shard actors reach the rest of the cluster: routing (`Topology`), the peer link, and this
/// node's own gateway. Deliveries to this node skip the network.
final class Fabric: Sendable {
    let topology: Topology
    let link: PeerLink?
    let gateway: LocalGateway
    var me: String { topology.me }

    init(topology: Topology, link: PeerLink?, gateway: LocalGateway) {
        self.topology = topology
        self.link = link
        self.gateway = gateway
    }

    /// A channel event for every subscriber at `node`, except `except`.
    func deliver(to node: String, channel key: ChannelKey, except: SessionID?, framed: [UInt8]) {
        if node == me {
            gateway.deliver(key, except: except, framed: framed)
        } else {
            link?.push(to: node, bytes: framed.count + 48) {
                $0.deliveries.append(ClusterDelivery(channelName: key.name, channelType: key.type,
                                                     exceptSession: except?.description ?? "", framed: framed))
            }
        }
    }

    /// An event for exactly `sessions` at `node` (`snapshot`: a SNAPSHOT of `key`, which subscribes them).
    func deliver(to node: String, sessions: [SessionID], channel key: ChannelKey?, snapshot: Bool, framed: [UInt8]) {
        let d = ClusterDelivery(channelName: key?.name ?? "", channelType: key?.type ?? .unspecified,
                                toSessions: sessions.map(\.description), framed: framed, snapshot: snapshot)
        if node == me {
            gateway.deliver(d)
        } else {
            link?.push(to: node, bytes: framed.count + 24 * sessions.count) { $0.deliveries.append(d) }
        }
    }

    /// Whether no live gateway holds this session: its gateway is gone, or it is this node and this
    /// node does not know it (it is from before a restart).
    func isStray(_ session: SessionID, at gateway: String) -> Bool {
        gateway == me ? self.gateway.shard(session).outbox(session) == nil : !topology.alive.contains(gateway)
    }

    /// Asks each returning gateway which of these sessions it still holds; `holds` gets the answer.
    func askWhichLive(_ sessions: [String: Set<SessionID>], holds: @escaping @Sendable (Set<SessionID>, String) async -> Void) {
        guard let link else { return }
        for (gateway, ids) in sessions {
            Task {
                guard let live = await link.liveSessions(at: gateway, Array(ids)) else { return }
                await holds(live, gateway)
            }
        }
    }

    /// Sends a channel record (replication or handoff) to `node`; the ticket tells when it arrived.
    @discardableResult
    func send(_ record: ClusterChannelRecord, to node: String) -> PeerLink.Ticket? {
        guard node != me else { return nil }
        return link?.push(to: node, bytes: 96 * max(1, record.members.count)) { $0.channels.append(record) }
    }

    @discardableResult
    func send(_ record: ClusterUserRecord, to node: String) -> PeerLink.Ticket? {
        guard node != me else { return nil }
        return link?.push(to: node, bytes: 96 * max(1, record.sessions.count + 1)) { $0.users.append(record) }
    }
}
