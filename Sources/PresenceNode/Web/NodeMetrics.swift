import GRPCTransport
import Metrics

/// The metrics a node serves on `/metrics` (WEB.md, "Metrics"), all named `presenced_...`.
/// Calls are counted as they end (the gRPC servers' call observer); everything else is read from
/// the state and counters the node keeps anyway, when Prometheus scrapes.
public final class NodeMetrics: Sendable {
    public let registry = MetricsRegistry()
    public static let prefix = "presenced_"
    private let calls: CounterFamily
    private let latency: HistogramFamily
    private let wsCalls: CounterFamily
    private let wsLatency: HistogramFamily

    /// Latency buckets, seconds: 100 µs to 10 s.
    static let latencyBuckets: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

    public init() {
        let p = Self.prefix
        calls = registry.counter(p + "grpc_calls_total", "Client gRPC calls that ended, by method and status code", labels: ["method", "code"], hideZero: true)
        latency = registry.histogram(p + "grpc_call_duration_seconds", "Time from a client call's headers to its end (streams: their whole life), by method",
                                     labels: ["method"], buckets: Self.latencyBuckets, hideZero: true)
        wsCalls = registry.counter(p + "websocket_calls_total", "WebSocket API calls answered, by method and status code", labels: ["method", "code"], hideZero: true)
        wsLatency = registry.histogram(p + "websocket_call_duration_seconds", "Time from a WebSocket call's message to its answer, by method",
                                       labels: ["method"], buckets: Self.latencyBuckets, hideZero: true)
    }

    /// One method's counters by status code and its latency histogram, made up front: the
    /// observer of a call is a dictionary read and a few atomic adds, no lock.
    private struct MethodMetrics: Sendable {
        let byCode: [Counter]
        let latency: Histogram
    }

    private static func table(_ calls: CounterFamily, _ latency: HistogramFamily, paths: [String]) -> [String: MethodMetrics] {
        var table: [String: MethodMetrics] = [:]
        for path in Set(paths).union(["unknown"]) {
            let method = path.hasPrefix("/") ? String(path.dropFirst()) : path
            table[path] = MethodMetrics(byCode: GRPCStatus.Code.allCases.map { calls.with(method, $0.name) }, latency: latency.with(method))
        }
        return table
    }

    private static func record(_ m: MethodMetrics, _ code: GRPCStatus.Code, _ ns: UInt64) {
        if code.rawValue < m.byCode.count { m.byCode[code.rawValue].add() }
        m.latency.observe(nanoseconds: ns)
    }

    private static func observer(_ calls: CounterFamily, _ latency: HistogramFamily, paths: [String]) -> @Sendable (String, GRPCStatus.Code, UInt64) -> Void {
        let fixed = table(calls, latency, paths: paths)
        let unknown = fixed["unknown"]!
        return { path, code, ns in record(fixed[path] ?? unknown, code, ns) }
    }

    /// For `ServerConfiguration.callObserver` of the client port, whose methods are `paths`: each
    /// method's observer holds its counters (any other path counts as "unknown").
    public func callObserver(paths: [String]) -> @Sendable (String) -> @Sendable (GRPCStatus.Code, UInt64) -> Void {
        let fixed = Self.table(calls, latency, paths: paths)
        let unknown = fixed["unknown"]!
        return { path in
            let m = fixed[path] ?? unknown
            return { code, ns in Self.record(m, code, ns) }
        }
    }

    /// For the WebSocket API: a call answered (method path, code, time taken).
    public func webSocketCallObserver(paths: [String]) -> @Sendable (String, GRPCStatus.Code, UInt64) -> Void {
        Self.observer(wsCalls, wsLatency, paths: paths)
    }

    /// Registers what is read at scrape time.
    func register(engine: PresenceEngine, membership: Membership, link: PeerLink,
                  connections: @escaping @Sendable () -> [(port: String, count: Int)],
                  peerTraffic: @escaping @Sendable () -> (requests: Int, bytes: Int)) {
        let p = Self.prefix
        let r = registry
        let nodeID = engine.settings.nodeID
        r.computed(p + "node_info", "This node: its id (the value is always 1)", labels: ["node_id"]) { [Sample([nodeID], 1)] }
        r.computed(p + "connections", "Open connections, by kind (grpc: clients; peer: other nodes; http: plain HTTP/1.1 on the front door; websocket)", labels: ["port"]) {
            connections().map { Sample([$0.port], Double($0.count)) }
        }
        r.computed(p + "sessions", "Sessions this node is the gateway of, by state (connected: a live stream; disconnected: waiting to resume)", labels: ["state"]) {
            let c = engine.sessionCountsByLiveness()
            return [Sample(["connected"], Double(c.connected)), Sample(["disconnected"], Double(c.disconnected))]
        }
        r.computed(p + "channels", "Channels held, by role (owner, or replica copy)", labels: ["role"]) {
            let c = await engine.channelCounts()
            return [Sample(["owner"], Double(c.owned)), Sample(["replica"], Double(c.copies))]
        }
        r.computed(p + "memberships", "Users present in the channels this node owns, summed over them") {
            [Sample([], Double(await engine.membershipCount()))]
        }
        r.computed(p + "user_homes", "User homes held, by role (owner, or replica copy)", labels: ["role"]) {
            let c = await engine.homeCounts()
            return [Sample(["owner"], Double(c.owned)), Sample(["replica"], Double(c.copies))]
        }
        r.computed(p + "events_queued_total", "Events queued to a session's stream (buffered ones once the resume flushes them)", kind: .counter) {
            [Sample([], Double(engine.deliveries.queued))]
        }
        r.computed(p + "events_dropped_total", "Events dropped for slow or long-gone readers (they get fresh SNAPSHOTs instead)", kind: .counter) {
            [Sample([], Double(engine.deliveries.dropped))]
        }
        r.computed(p + "slow_consumers_total", "Event streams cut off because their client read too slowly", kind: .counter) {
            [Sample([], Double(engine.deliveries.slowConsumers))]
        }
        r.computed(p + "members", "Cluster members this node knows, by SWIM status", labels: ["status"]) {
            var by: [String: Int] = ["alive": 0, "suspect": 0, "dead": 0, "left": 0]
            for m in membership.members { by["\(m.status)", default: 0] += 1 }
            return by.sorted { $0.key < $1.key }.map { Sample([$0.key], Double($0.value)) }
        }
        let swim = membership.counters
        r.computed(p + "swim_suspicions_total", "Times a member was suspected", kind: .counter) { [Sample([], Double(swim.suspicions.count))] }
        r.computed(p + "swim_deaths_total", "Times a member was declared dead", kind: .counter) { [Sample([], Double(swim.deaths.count))] }
        r.computed(p + "swim_refutations_total", "Times this node refuted a suspicion or death of itself", kind: .counter) { [Sample([], Double(swim.refutations.count))] }
        r.computed(p + "ring_changes_total", "Changes of the hash ring this node carried out", kind: .counter) { [Sample([], Double(swim.ringChanges.count))] }
        r.computed(p + "anti_entropy_rounds_total", "Anti-entropy rounds this node ran as a gateway", kind: .counter) {
            [Sample([], Double(engine.antiEntropyCounts.rounds))]
        }
        r.computed(p + "anti_entropy_repairs_total", "Differences anti-entropy found and repaired", kind: .counter) {
            [Sample([], Double(engine.antiEntropyCounts.repairs))]
        }
        r.computed(p + "peer_requests_received_total", "Requests received on the peer port", kind: .counter) { [Sample([], Double(peerTraffic().requests))] }
        r.computed(p + "peer_bytes_received_total", "Bytes received on the peer port", kind: .counter) { [Sample([], Double(peerTraffic().bytes))] }
        r.computed(p + "peer_push_items_total", "Items queued for each peer (deliveries, copies, announces)", kind: .counter, labels: ["peer"]) {
            link.peerStats().map { Sample([$0.peer], Double($0.counts.queued)) }
        }
        r.computed(p + "peer_shed_items_total", "Deliveries shed from an overfull queue to each peer (its followers get SNAPSHOTs)", kind: .counter, labels: ["peer"]) {
            link.peerStats().map { Sample([$0.peer], Double($0.counts.shed)) }
        }
        r.computed(p + "peer_failed_batches_total", "Push batches to each peer given up on after every attempt failed", kind: .counter, labels: ["peer"]) {
            link.peerStats().map { Sample([$0.peer], Double($0.counts.failedBatches)) }
        }
        r.computed(p + "peer_queue_items", "Items waiting to be sent to each peer", labels: ["peer"]) {
            link.peerStats().map { Sample([$0.peer], Double($0.queuedItems)) }
        }
        r.computed(p + "peer_queue_bytes", "Bytes waiting to be sent to each peer", labels: ["peer"]) {
            link.peerStats().map { Sample([$0.peer], Double($0.queuedBytes)) }
        }
        ProcessMetrics.register(in: r, prefix: p)
    }
}
