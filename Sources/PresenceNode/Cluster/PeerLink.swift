import ClusterCore
import EventLoop
import GRPCTransport
import PresenceCore
import PresenceWire
import Synchronization

/// Presence traffic between nodes over the peer link: calls to a key's owner or a user's home
/// (request/response), and one ordered push queue per destination node for everything that flows
/// one way (deliveries to gateways, replica updates, handoffs, anti-entropy announces). A queue
/// has at most one Push in flight and sends whatever accumulated meanwhile as the next batch, so a
/// gateway receives an owner's events in the order the owner computed them, batched under load.
public final class PeerLink: Sendable {
    /// This node's process (read at each push: it is settled before the node serves).
    private let myself: @Sendable () -> NodeInstance
    public var me: NodeInstance { myself() }
    /// The peer address of a live member; nil when the node is not (or no longer) a live member.
    private let addressOf: @Sendable (String) -> String?
    /// The seams: how peers are reached, time, and where the senders run.
    private let transport: PeerTransport
    private let clock: EngineClock
    private let placement: TaskPlacement
    private let queues = Mutex<[NodeInstance: PushQueue]>([:])
    let timings: ClusterTimings
    /// Told when pushes to a node were lost (shed from an overfull queue, given up after failing,
    /// or dropped with a queue to a process that left): its followers need fresh SNAPSHOTs, and,
    /// when copies were among them (`copies`), the keys it is a replica of need whole copies again.
    private let lossObserver = ObserverSlot<(String, Bool)>()

    /// Items per Push at most; a batch also stops growing past `maxBatchBytes`.
    static let maxBatchItems = 2_000
    static let maxBatchBytes = 2 << 20

    /// Live members other than this node and `node`, through which a push to `node` may be relayed.
    private let relays: @Sendable (String) -> [String]

    /// Debug-level log lines: a push attempt that failed, a batch dropped (nil: none).
    private let trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)?

    public init(me: @escaping @Sendable () -> NodeInstance, timings: ClusterTimings = ClusterTimings(),
                relays: @escaping @Sendable (String) -> [String] = { _ in [] },
                trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)? = nil,
                transport: PeerTransport, clock: EngineClock = SystemClock(), placement: TaskPlacement = .pool,
                addressOf: @escaping @Sendable (String) -> String?) {
        self.myself = me
        self.transport = transport
        self.clock = clock
        self.placement = placement
        self.trace = trace
        self.relays = relays
        self.timings = timings
        self.addressOf = addressOf
    }

    /// Whether pushes to `node` can go out now (it is a live member); else they are dropped.
    public func canReach(_ node: String) -> Bool { addressOf(node) != nil }

    public func onLoss(_ observer: @escaping @Sendable (String, Bool) -> Void) {
        lossObserver.set { observer($0.0, $0.1) }
    }

    private func lost(_ node: String, copies: Bool = false) {
        lossObserver((node, copies))
    }

    /// What went to each peer since the start (for metrics): items queued, deliveries shed from an
    /// overfull queue, and batches given up on after failing.
    public struct PeerCounts: Sendable, Equatable {
        public var queued = 0
        public var shed = 0
        public var failedBatches = 0
    }
    private let counts = Mutex<[String: PeerCounts]>([:])
    /// Counts by peer, with each peer's queue now (items and bytes waiting to be sent).
    public func peerStats() -> [(peer: String, counts: PeerCounts, queuedItems: Int, queuedBytes: Int)] {
        let depths = queues.withLock { qs in qs.map { ($0.key.id, $0.value.depth) } }
        var waiting: [String: (Int, Int)] = [:]
        for (peer, d) in depths { waiting[peer, default: (0, 0)].0 += d.items; waiting[peer, default: (0, 0)].1 += d.bytes }
        let c = counts.withLock { $0 }
        return Set(c.keys).union(waiting.keys).sorted().map { p in
            (p, c[p] ?? PeerCounts(), waiting[p]?.0 ?? 0, waiting[p]?.1 ?? 0)
        }
    }

    // MARK: Calls

    public func channel(_ node: String, _ call: ClusterChannelCall, timeout: UInt64? = nil) async throws(PresenceError) -> ClusterChannelResult {
        let r = try await unary(node, PeerPresenceMethods.channel, call, timeout: timeout)
        if let e = r.error { throw PresenceError(wire: e) }
        return r
    }

    public func home(_ node: String, _ call: ClusterHomeCall, timeout: UInt64? = nil) async throws(PresenceError) -> ClusterHomeResult {
        let r = try await unary(node, PeerPresenceMethods.home, call, timeout: timeout)
        if let e = r.error { throw PresenceError(wire: e) }
        return r
    }

    /// Which of `sessions` the gateway `node` still holds; nil when it could not be asked.
    /// Any other call to a peer; failures are the node or the link failing (UNAVAILABLE).
    func unary<Req: ProtoMessage, Resp: ProtoMessage>(_ node: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                      timeout: UInt64? = nil) async throws(PresenceError) -> Resp {
        guard let address = addressOf(node) else {
            throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "node \(node) is not a live member; retry")
        }
        do {
            return try await transport.unary(address, method, request, timeout: timeout ?? timings.peerCallTimeout)
        } catch {
            // (answers come back as results; a failed call is the node or the link failing)
            throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "node \(node) did not answer: \(error)")
        }
    }

    // MARK: Pushes

    /// The loop the senders of the queue to `node` start on (nil until one looked it up), the
    /// loop of the connection to `node`, and how many senders started by looking it up.
    func senderLoops(to node: String) -> (sender: EventLoop?, connection: EventLoop?, lookups: Int) {
        let q = queues.withLock { $0.first { $0.key.id == node }?.value }
        return (q?.senderLoop, addressOf(node).flatMap(transport.preferredLoop(of:)), q?.lookups.load(ordering: .relaxed) ?? 0)
    }

    /// Something queued for a node: `waitSent` resumes once the node acknowledged it.
    public struct Ticket: Sendable {
        let queue: PushQueue
        let sequence: UInt64
    }

    /// Queues something for `node`'s process, after everything queued for it before. Never waits.
    @discardableResult
    public func push(to node: NodeInstance, bytes: Int = 64, _ add: (inout ClusterPushBatch) -> Void) -> Ticket {
        let q = queues.withLock { qs in
            if let q = qs[node] { return q }
            let q = PushQueue(node: node, maxBytes: timings.pushQueueBytes, clock: clock, placement: placement)
            qs[node] = q
            return q
        }
        let (sequence, start, shed) = q.enqueue(bytes: bytes, add)
        counts.withLock { c in
            c[node.id, default: PeerCounts()].queued += 1
            c[node.id, default: PeerCounts()].shed += shed
        }
        if shed > 0 { lost(node.id) }
        if start { startSending(q) }
        return Ticket(queue: q, sequence: sequence)
    }

    /// Waits until the nodes acknowledged what the tickets stand for, or gave up on it (the node
    /// died or left), or `timeout` ns passed. Whether every node acknowledged it.
    @discardableResult
    public func waitSent(_ tickets: [Ticket], timeout: UInt64) async -> Bool {
        let deadline = clock.monotonicNanoseconds() + timeout
        var all = true
        for t in tickets {
            if !(await t.queue.waitAcked(t.sequence, deadline: deadline)) { all = false }
        }
        return all
    }

    /// Waits (up to `timeout` ns) until everything queued so far for every node was sent.
    public func drain(timeout: UInt64) async {
        let all = queues.withLock { Array($0.values) }
        let deadline = clock.monotonicNanoseconds() + timeout
        for q in all { await q.waitAcked(q.lastQueued, deadline: deadline) }
    }

    /// Forgets the queues of processes that are not on `ring` any more (they died, left or were
    /// replaced by a restart): what was queued for them is dropped.
    public func forgetAllBut(_ ring: HashRing) {
        let gone = queues.withLock { qs -> [PushQueue] in
            let out = qs.filter { !ring.isLive($0.key.id, boot: $0.key.boot) }
            for k in out.keys { qs[k] = nil }
            return Array(out.values)
        }
        for q in gone where q.clear() { lost(q.node.id) }
    }

    /// Passes on a batch another node could not deliver directly (`relay_to`), and returns once the
    /// destination acknowledged it; throws when it could not be delivered either.
    public func relay(_ batch: ClusterPushBatch) async throws {
        guard let address = addressOf(batch.relayTo) else { throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "not a live member") }
        var b = batch
        b.relayTo = ""
        // (within the sender's attempt, which allowed about 64 bytes an item, so that it hears
        // of a failure here before it gives the attempt up)
        let attempt = timings.pushAttemptTimeout(bytes: batch.itemCount * 64)
        _ = try await transport.unary(address, PeerPresenceMethods.push, b, timeout: attempt - min(attempt / 2, timings.answerMargin))
    }

    private func startSending(_ q: PushQueue) {
        // (on the loop of the destination's connection: each batch is sent and its answer taken
        // without a thread hop. Looked up once, by a task, not by the caller: `push` may be
        // called under the membership's lock, which `addressOf` takes — found by Cluster/chaos,
        // netns seed 56. The sender notes the loop with the queue as it sends, and later senders start
        // on it straight away: a sender started on the global pool first cost a wake-up of a
        // pool thread and a hop to the loop each time a queue went from idle to busy, which
        // under load is about once per write)
        if let loop = q.senderLoop {
            Task(executorPreference: loop) { [self] in await send(q) }
            return
        }
        q.lookups.add(1, ordering: .relaxed)
        placement.start { [self] in
            if let loop = addressOf(q.node.id).flatMap(transport.preferredLoop(of:)) {
                await withTaskExecutorPreference(loop) { await send(q) }
            } else {
                await send(q)
            }
        }
    }

    private func send(_ q: PushQueue) async {
        while true {
            guard let (batch, last, bytes) = q.take(me: me) else { break }
            var attempt = 0
            var delivered = false
            while true {
                guard addressOf(q.node.id) != nil else {  // not a live member: drop
                    trace?("push dropped: not a live member", ["to": q.node.id, "done": batch.handoffDone ? "yes" : "no"])
                    break
                }
                // every other attempt after the first goes through another member (the direct
                // link may be cut while both ends are alive); each is given the time its bytes
                // need, so a cut link or a lost message costs less than the replication wait
                let relay = attempt % 2 == 1 ? clock.pick(relays(q.node.id)) : nil
                var sent = batch
                if relay != nil { sent.relayTo = q.node.id }
                do {
                    guard let address = addressOf(relay ?? q.node.id) else { throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "gone") }
                    // (noted for the next senders; a new one when the node's client was replaced,
                    // after the node was declared dead and came back)
                    if relay == nil, let loop = transport.preferredLoop(of: address), loop !== q.senderLoop { q.senderLoop = loop }
                    let timeout = timings.pushAttemptTimeout(bytes: bytes)
                    _ = try await transport.unary(address, PeerPresenceMethods.push, sent, timeout: timeout)
                    delivered = true
                    break
                } catch {
                    trace?("push attempt failed", ["to": q.node.id, "via": relay ?? "-", "attempt": String(attempt),
                                                   "done": batch.handoffDone ? "yes" : "no", "error": "\(error)"])
                    attempt += 1
                    if attempt >= timings.pushAttempts || q.isCleared { break }
                    await clock.sleep(nanoseconds: timings.pushRetryPause)
                }
            }
            if !delivered && (!batch.deliveries.isEmpty || !batch.channels.isEmpty || !batch.users.isEmpty) {
                counts.withLock { $0[q.node.id, default: PeerCounts()].failedBatches += 1 }
                lost(q.node.id, copies: !batch.channels.isEmpty || !batch.users.isEmpty)
            }
            q.acked(through: last)
        }
    }
}

/// One destination's queue of pushes: batches in order, each closed once it is big enough.
/// Items are numbered; `acked(through:)` releases whoever waits for an item to have been sent.
final class PushQueue: Sendable {
    let node: NodeInstance
    let maxBytes: Int
    private struct State {
        var batches: [ClusterPushBatch] = []
        /// The sequence number of the last item of each batch.
        var lastOfBatch: [UInt64] = []
        /// Items and bytes in the last (open) batch.
        var items = 0
        var bytes = 0
        var queued = 0
        /// Bytes queued in all batches, and of each batch.
        var queuedBytes = 0
        var batchBytes: [Int] = []
        var cleared = false
        var sequence: UInt64 = 0
        var acked: UInt64 = 0
        var waiters: [(sequence: UInt64, deadline: UInt64, continuation: CheckedContinuation<Void, Never>)] = []
        var watchdog = false
        var sending = false
    }
    private let state = Mutex(State())
    private let loop = Mutex<EventLoop?>(nil)
    /// Senders started on the global pool to look the loop up (for tests).
    let lookups = Atomic<Int>(0)

    private let clock: EngineClock
    private let placement: TaskPlacement

    init(node: NodeInstance, maxBytes: Int, clock: EngineClock, placement: TaskPlacement) {
        self.node = node
        self.maxBytes = maxBytes
        self.clock = clock
        self.placement = placement
    }

    /// The loop this queue's senders run on, once looked up (the destination's connection's
    /// loop when it was; if that connection is later replaced, a sender on this loop is still
    /// correct, one hop further from it).
    var senderLoop: EventLoop? {
        get { loop.withLock { $0 } }
        set { loop.withLock { $0 = newValue } }
    }

    var isCleared: Bool { state.withLock { $0.cleared } }

    /// Items and bytes waiting to be sent.
    var depth: (items: Int, bytes: Int) { state.withLock { ($0.queued, $0.queuedBytes) } }

    /// Adds to the open batch (after everything queued before). Returns the item's sequence
    /// number, true when a sender must start, and how many deliveries were shed to make room
    /// (the destination is too slow or unreachable; its followers must start afresh).
    func enqueue(bytes: Int, _ add: (inout ClusterPushBatch) -> Void) -> (UInt64, Bool, Int) {
        state.withLock { s in
            var shed = 0
            // over the byte limit: the oldest whole batch of deliveries goes (copies and the rest stay)
            while s.queuedBytes + bytes > maxBytes, s.batches.count > 1, let i = s.batches.indices.first(where: { !s.batches[$0].deliveries.isEmpty && $0 < s.batches.count - 1 }) {
                let n = s.batches[i].deliveries.count
                s.batches[i].deliveries = []
                s.queued -= n
                s.queuedBytes -= s.batchBytes[i]
                s.batchBytes[i] = 0
                shed += n
            }
            if s.batches.isEmpty || s.items >= PeerLink.maxBatchItems || s.bytes >= PeerLink.maxBatchBytes || s.batches[s.batches.count - 1].handoffDone {
                s.batches.append(ClusterPushBatch())
                s.lastOfBatch.append(0)
                s.batchBytes.append(0)
                s.items = 0
                s.bytes = 0
            }
            add(&s.batches[s.batches.count - 1])
            s.sequence += 1
            s.lastOfBatch[s.lastOfBatch.count - 1] = s.sequence
            s.items += 1
            s.bytes += bytes
            s.queued += 1
            s.queuedBytes += bytes
            s.batchBytes[s.batchBytes.count - 1] += bytes
            if s.sending { return (s.sequence, false, shed) }
            s.sending = true
            return (s.sequence, true, shed)
        }
    }

    /// The next batch to send and its last item, or nil (and the sender stops) when nothing is pending.
    /// The next batch, the sequence number of its last item, and its size in bytes (as estimated
    /// when its items were queued).
    func take(me: NodeInstance) -> (ClusterPushBatch, UInt64, Int)? {
        state.withLock { s in
            guard !s.batches.isEmpty else {
                s.sending = false
                return nil
            }
            var batch = s.batches.removeFirst()
            let last = s.lastOfBatch.removeFirst()
            let bytes = s.batchBytes.removeFirst()
            if s.batches.isEmpty {
                s.items = 0
                s.bytes = 0
                s.queued = 0
                s.queuedBytes = 0
            } else {
                s.queued -= batch.itemCount
                s.queuedBytes -= bytes
            }
            batch.fromNodeID = me.id
            batch.fromBoot = me.boot
            batch.toBoot = node.boot
            return (batch, last, bytes)
        }
    }

    /// Everything up to `sequence` was sent (or given up on).
    func acked(through sequence: UInt64) {
        let ready = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.acked = max(s.acked, sequence)
            let done = s.waiters.filter { $0.sequence <= s.acked }.map(\.continuation)
            s.waiters.removeAll { $0.sequence <= s.acked }
            return done
        }
        for c in ready { c.resume() }
    }

    /// Waits until the destination acknowledged `sequence`, or it was given up on, or the
    /// deadline passed. Whether it was acknowledged.
    @discardableResult
    func waitAcked(_ sequence: UInt64, deadline: UInt64) async -> Bool {
        guard clock.monotonicNanoseconds() < deadline else { return state.withLock { $0.acked >= sequence } }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let (waiting, startWatchdog) = state.withLock { s -> (Bool, Bool) in
                guard s.acked < sequence else { return (false, false) }
                s.waiters.append((sequence, deadline, c))
                if s.watchdog { return (true, false) }
                s.watchdog = true
                return (true, true)
            }
            if !waiting { c.resume() }
            if startWatchdog { watch() }
        }
        return state.withLock { $0.acked >= sequence }
    }

    /// Releases waiters whose deadline passed (the destination is stuck) while any wait: at the
    /// earliest deadline, or every 50 ms when that is later (a waiter added meanwhile with an
    /// earlier deadline is released up to 50 ms late: `ClusterTimings.answerMargin` allows for it).
    private func watch() {
        placement.start { [self] in
            var pause: UInt64 = 50_000_000
            while true {
                await clock.sleep(nanoseconds: pause)
                let now = clock.monotonicNanoseconds()
                let (expired, next) = state.withLock { s -> ([CheckedContinuation<Void, Never>], UInt64?) in
                    let e = s.waiters.filter { $0.deadline <= now }.map(\.continuation)
                    s.waiters.removeAll { $0.deadline <= now }
                    if s.waiters.isEmpty { s.watchdog = false }
                    return (e, s.waiters.map(\.deadline).min())
                }
                for c in expired { c.resume() }
                guard let next else { return }
                pause = min(50_000_000, max(1_000_000, next &- now))
            }
        }
    }

    /// The sequence number of the last item queued.
    var lastQueued: UInt64 { state.withLock { $0.sequence } }

    /// Drops everything queued; true when deliveries were among it.
    func clear() -> Bool {
        let (waiters, hadDeliveries) = state.withLock { s -> ([CheckedContinuation<Void, Never>], Bool) in
            let had = s.batches.contains { !$0.deliveries.isEmpty }
            s.batches = []
            s.lastOfBatch = []
            s.batchBytes = []
            s.items = 0
            s.bytes = 0
            s.queued = 0
            s.queuedBytes = 0
            s.cleared = true
            s.acked = s.sequence
            defer { s.waiters = [] }
            return (s.waiters.map(\.continuation), had)
        }
        for c in waiters { c.resume() }
        return hadDeliveries
    }
}

extension ClusterPushBatch {
    var itemCount: Int {
        deliveries.count + channels.count + users.count + moved.count + copyRequests.count + homeCopyRequests.count + (handoffDone ? 1 : 0)
    }
}

extension PresenceError {
    init(wire e: ClusterCallError) {
        let kind: Kind
        switch e.kind {
        case 1: kind = .invalidArgument
        case 2: kind = .notFound
        case 3: kind = .permissionDenied
        case 4: kind = .unauthenticated
        case 5: kind = .resourceExhausted
        case 7: kind = .failedPrecondition
        default: kind = .unavailable
        }
        self.init(kind, e.code.isEmpty ? "PEER_ERROR" : e.code, e.detail, supersededBy: e.supersededBy)
    }

    var wire: ClusterCallError {
        let k: UInt32
        switch kind {
        case .invalidArgument: k = 1
        case .notFound: k = 2
        case .permissionDenied: k = 3
        case .unauthenticated: k = 4
        case .resourceExhausted: k = 5
        case .unavailable: k = 6
        case .failedPrecondition: k = 7
        }
        return ClusterCallError(kind: k, code: name, detail: detail, supersededBy: supersededBy)
    }
}
