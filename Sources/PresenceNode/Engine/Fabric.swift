import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire
import Synchronization

/// This node's sessions: the gateway shards (by session id) and who follows which channel.
final class LocalGateway: Sendable {
    /// Sessions held here, over every shard.
    var sessionCount: Int { shards.reduce(0) { $0 + $1.count } }
    var sessionCountsByLiveness: (connected: Int, disconnected: Int) {
        shards.reduce((0, 0)) { sum, s in
            let c = s.countsByLiveness
            return (sum.0 + c.connected, sum.1 + c.disconnected)
        }
    }
    let shards: [GatewayShard]
    let subscriptions = Subscriptions()
    private let clock: EngineClock
    /// Where requests for fresh SNAPSHOTs go (the engine routes them to the channels' owners).
    private let resnapshotHandler = ObserverSlot<[Subscriptions.Resnapshot]>()

    /// Debug logging (nil unless the node logs at debug).
    let trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)?

    /// What the sessions' outboxes did with events, one set of counters per shard (a count shared
    /// by every loop would bounce between cores on each delivery), summed when read.
    private let shardDeliveries: [DeliveryCounters]
    var deliveries: (queued: Int, dropped: Int, slowConsumers: Int) {
        shardDeliveries.reduce((0, 0, 0)) { ($0.0 + $1.queued.count, $0.1 + $1.dropped.count, $0.2 + $1.slowConsumers.count) }
    }

    init(shards: Int, resumeWindow: UInt64, clock: EngineClock, movedMemory: UInt64,
         trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)? = nil) {
        self.clock = clock
        self.trace = trace
        let counters = (0..<max(1, shards)).map { _ in DeliveryCounters() }
        shardDeliveries = counters
        self.shards = counters.map { GatewayShard(resumeWindow: resumeWindow, clock: clock, movedMemory: movedMemory, counters: $0) }
    }

    func shard(_ id: SessionID) -> GatewayShard { shards[Int(id.raw % UInt64(shards.count))] }

    func onResnapshot(_ handler: @escaping @Sendable ([Subscriptions.Resnapshot]) -> Void) {
        resnapshotHandler.set(handler)
    }

    private func ask(_ asks: [Subscriptions.Resnapshot]) {
        guard !asks.isEmpty else { return }
        resnapshotHandler(asks)
    }

    /// Hands a delivery that `from` pushed to this node's sessions.
    func deliver(_ d: ClusterDelivery, from: NodeInstance) {
        if d.toSessions.isEmpty {
            guard let key = try? Validate.channel(d.channelName, d.channelType) else { return }
            deliver(key, except: d.exceptSession.isEmpty ? nil : SessionID(text: d.exceptSession), from: from, sequence: d.sequence, framed: d.framed)
            return
        }
        let key = d.snapshot ? try? Validate.channel(d.channelName, d.channelType) : nil
        // (read once for all its sessions; a status event's sequence is the version of its user's
        // record it was read at, 0 from a peer that does not number them)
        let status = key == nil ? EventEncoding.statusEvent(d.framed).map { StatusNews(event: $0, version: d.sequence) } : nil
        for text in d.toSessions {
            guard let id = SessionID(text: text) else { continue }
            if let key {
                snapshot(key, id, from: from, sequence: d.sequence, framed: d.framed)
            } else {
                shard(id).deliverStatus(id, framed: d.framed, status: status)
            }
        }
    }

    /// A channel event for every local subscriber of `key` except `except`.
    func deliver(_ key: ChannelKey, except: SessionID?, from: NodeInstance, sequence: UInt64, framed: [UInt8]) {
        ask(subscriptions.deliver(key, except: except, from: from, sequence: sequence, framed: framed, now: clock.monotonicNanoseconds()))
    }

    /// A SNAPSHOT of `key` for `id`: it starts the session's subscription here, unless the session
    /// left the channel (or stopped following it) meanwhile.
    func snapshot(_ key: ChannelKey, _ id: SessionID, from: NodeInstance, sequence: UInt64, framed: [UInt8]) {
        guard let outbox = shard(id).follows(id, channel: key) else { return }
        if let a = subscriptions.snapshot(key, id, outbox, from: from, sequence: sequence, framed: framed, now: clock.monotonicNanoseconds()) {
            ask([a])
        }
    }

    /// A status event (`status`, as framed) for exactly these sessions.
    func deliver(status framed: [UInt8], to sessions: [SessionID], status: StatusNews?) {
        for id in sessions { shard(id).deliverStatus(id, framed: framed, status: status) }
    }

    /// The session's client resumed it on `to`: it stops being this gateway's, silently; its stream
    /// here (if any) ends as resumed elsewhere.
    func movedAway(_ id: SessionID, to: NodeInstance?, version: UInt64, why: String) {
        guard let (s, outbox) = shard(id).movedAway(id, to: to, version: version) else { return }
        trace?("session moved away", ["session": id.description, "to": to.map { "\($0)" } ?? "?", "version": String(version),
                                      "had": String(s.version), "why": why])
        for key in s.channels.keys { subscriptions.unsubscribe(key, id) }
        outbox?.end(.replaced)
    }
}

/// How shard actors reach the rest of the cluster: routing (`Topology`), the peer link, and this
/// node's own gateway. Deliveries to this node skip the network.
final class Fabric: Sendable {
    let topology: Topology
    let link: PeerLink?
    let gateway: LocalGateway
    /// Where the shards start their own tasks (sweeps, ticks).
    let placement: TaskPlacement
    let timings: ClusterTimings
    var me: String { topology.me }
    var instance: NodeInstance { topology.instance }

    /// Debug logging of ownership changes and SNAPSHOTs (nil unless the node logs at debug).
    let trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)?

    init(topology: Topology, link: PeerLink?, gateway: LocalGateway, placement: TaskPlacement = .pool, timings: ClusterTimings = ClusterTimings(),
         trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)? = nil) {
        self.topology = topology
        self.placement = placement
        self.timings = timings
        self.link = link
        self.gateway = gateway
        self.trace = trace
    }

    /// The process of `node` on the current ring (for pushes addressed to it).
    func instance(of node: String) -> NodeInstance {
        node == me ? instance : NodeInstance(node, boot: topology.ring.boot(of: node))
    }

    /// A channel event, encoded once (`framed`), for the sessions of one gateway process.
    func deliver(_ d: RoutedDelivery<NodeInstance>, channel key: ChannelKey, framed: [UInt8]) {
        if d.sink.id == me {
            guard d.sink.boot == instance.boot else { return }  // sessions of this node's previous process
            if d.sessions.isEmpty {
                gateway.deliver(key, except: d.except, from: instance, sequence: d.event.sequence, framed: framed)
            } else {
                for id in d.sessions { gateway.snapshot(key, id, from: instance, sequence: d.event.sequence, framed: framed) }
            }
            return
        }
        guard topology.ring.isLive(d.sink.id, boot: d.sink.boot) else { return }  // a gone process: nobody to tell
        let delivery = ClusterDelivery(channelName: key.name, channelType: key.type, exceptSession: d.except?.description ?? "",
                                       toSessions: d.sessions.map(\.description), framed: framed, snapshot: d.isSnapshot,
                                       sequence: d.event.sequence)
        link?.push(to: d.sink, bytes: framed.count + 48 + 24 * d.sessions.count) { $0.deliveries.append(delivery) }
    }

    /// A status change for its watchers, once per gateway process.
    func deliver(_ change: HomeRecord<NodeInstance>.StatusChange, at ms: Int64) {
        guard !change.watchers.isEmpty else { return }
        let framed = EventEncoding.framed(status: change.userID, change.status, at: ms)
        var bySink: [NodeInstance: [SessionID]] = [:]
        for (id, sink) in change.watchers { bySink[sink, default: []].append(id) }
        for (sink, ids) in bySink {
            if sink == instance {
                gateway.deliver(status: framed, to: ids, status: StatusNews(user: change.userID, status: change.status, version: change.version))
            } else if sink.id != me, topology.ring.isLive(sink.id, boot: sink.boot) {
                let d = ClusterDelivery(toSessions: ids.sorted().map(\.description), framed: framed, sequence: change.version)
                link?.push(to: sink, bytes: framed.count + 24 * ids.count) { $0.deliveries.append(d) }
            }
        }
    }

    /// Sends a channel copy (replication or handoff) to `node`; the ticket tells when it arrived.
    func send(_ copy: ChannelCopy<NodeInstance>, to node: String, gone: [NodeInstance: UInt64] = [:]) -> PeerLink.Ticket? {
        guard node != me, let link else { return nil }
        var record = ClusterChannelRecord(copy)
        record.gone = ClusterGoneGateway.list(gone)
        return link.push(to: instance(of: node), bytes: 96 * max(1, record.members.count)) { $0.channels.append(record) }
    }

    func send(_ copy: HomeCopy, to node: String, gone: [NodeInstance: UInt64] = [:]) -> PeerLink.Ticket? {
        guard node != me, let link else { return nil }
        var record = ClusterUserRecord(copy)
        record.gone = ClusterGoneGateway.list(gone)
        return link.push(to: instance(of: node), bytes: 96 * max(1, record.sessions.count + record.watchers.count + 1)) { $0.users.append(record) }
    }
}
