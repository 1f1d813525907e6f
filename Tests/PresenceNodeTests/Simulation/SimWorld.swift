import ClusterCore
import EventLoop
import GRPCTransport
import PresenceCore
@testable import PresenceNode
import PresenceWire
import Synchronization
import Testing

/// The deterministic simulation's world (RELIABILITY.md, "The real node in a deterministic
/// simulation"): virtual time, and every node's loops stepped one at a time on the calling thread
/// in an order drawn from the seed. Real `NodeCore`s run on it through their seams: stepped loops
/// (executor), `SimClock` (clock), `SimTransport` (peer transport).
/// `@unchecked Sendable`: the world is used from the driver's thread only — the nodes' code runs
/// in `run`, on that thread, and reaches the world only from there.
final class SimWorld: @unchecked Sendable {
    /// Virtual monotonic time, read by every node's clock and loops.
    final class VirtualTime: Sendable {
        let ns = Atomic<UInt64>(1_000_000_000)
        var now: UInt64 { ns.load(ordering: .relaxed) }
    }
    private let time = VirtualTime()
    var now: UInt64 { time.now }
    var rng: SplitMix64
    private(set) var loops: [EventLoop] = []
    /// A hash of the whole history (which loop ran at what time), printed and compared by seed.
    private(set) var traceHash: UInt64 = 0xcbf2_9ce4_8422_2325
    private(set) var steps = 0
    /// Loops that are not stepped (their node is paused, SIGSTOP): their work and timers wait.
    private var paused: Set<ObjectIdentifier> = []
    /// The readable trace (messages, faults, client calls), kept when asked for (a replay).
    private(set) var traceLines: [String] = []
    let keepsTrace: Bool

    init(seed: UInt64, keepsTrace: Bool = false) {
        rng = SplitMix64(seed: seed)
        self.keepsTrace = keepsTrace
    }

    func pause(_ loop: EventLoop) { paused.insert(ObjectIdentifier(loop)) }
    func unpause(_ loop: EventLoop) { paused.remove(ObjectIdentifier(loop)) }
    func isPaused(_ loop: EventLoop) -> Bool { paused.contains(ObjectIdentifier(loop)) }

    /// A line kept only when the trace is asked for (not hashed: a traced run has the same hash).
    func detail(_ line: @autoclosure () -> String) {
        guard keepsTrace && traceLines.count < 200_000 else { return }
        traceLines.append(String(format: "%9.4f ", Double(now) / 1e9 - 1) + line())
    }

    /// One line of the history: hashed always, kept when the trace is asked for.
    func log(_ line: @autoclosure () -> String) {
        let text = line()
        note(text)
        if keepsTrace && traceLines.count < 200_000 {
            traceLines.append(String(format: "%9.4f ", Double(now) / 1e9 - 1) + text)
        }
    }

    func makeLoop(_ name: String) -> EventLoop {
        let loop = EventLoop.stepped(name: name, clock: { [time] in time.now })
        loops.append(loop)
        return loop
    }

    /// A loop that never runs again (its node was killed).
    func remove(_ loop: EventLoop) { loops.removeAll { $0 === loop } }

    func random(below n: UInt64) -> UInt64 { rng.next() % max(1, n) }

    private func note(_ text: String) {
        for b in text.utf8 { traceHash = (traceHash ^ UInt64(b)) &* 0x100_0000_01b3 }
        traceHash = (traceHash ^ now) &* 0x100_0000_01b3
    }

    /// Runs everything due for `duration` ns of virtual time: a ready loop drawn by the seed, one
    /// step at a time; when none is ready, time jumps to the earliest timer. False (and an issue
    /// recorded) when `maxSteps` steps did not reach the end: work that takes no virtual time
    /// keeps coming, a loop no real node would get out of either.
    @discardableResult
    func run(for duration: UInt64, maxSteps: Int = 20_000_000, recordsIssue: Bool = true) -> Bool {
        let end = now + duration
        for _ in 0..<maxSteps {
            let ready = loops.filter { $0.hasWorkNow && !paused.contains(ObjectIdentifier($0)) }
            if !ready.isEmpty {
                let loop = ready[Int(random(below: UInt64(ready.count)))]
                note(loop.name)
                steps += 1
                loop.step()
                continue
            }
            guard let next = loops.filter({ !paused.contains(ObjectIdentifier($0)) }).compactMap(\.nextTimerDeadline).min(),
                  next <= end else {
                time.ns.store(end, ordering: .relaxed)
                return true
            }
            time.ns.store(max(now, next), ordering: .relaxed)
        }
        if recordsIssue { Issue.record("the simulation ran \(maxSteps) steps without reaching its end (at \(Double(now) / 1e9 - 1) s)") }
        return false
    }
}

/// A one-time answer that several parties race to give (the answer, its timeout).
final class OneShot<Value: Sendable>: Sendable {
    private let state = Mutex<(waiter: CheckedContinuation<Value, Never>?, value: Value?)>((nil, nil))

    func complete(_ value: Value) {
        let waiter = state.withLock { s -> CheckedContinuation<Value, Never>? in
            guard s.value == nil else { return nil }
            s.value = value
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume(returning: value)
    }

    var isComplete: Bool { state.withLock { $0.value != nil } }

    var value: Value {
        get async {
            await withCheckedContinuation { c in
                let ready = state.withLock { s -> Value? in
                    if let v = s.value { return v }
                    s.waiter = c
                    return nil
                }
                if let ready { c.resume(returning: ready) }
            }
        }
    }
}

extension EventLoop {
    /// Runs `body` on this loop `nanoseconds` from now (from any thread; nothing if the loop is gone).
    func after(_ nanoseconds: UInt64, _ body: @escaping @Sendable () -> Void) {
        execute { [self] in scheduleTimer(after: nanoseconds, body) }
    }
}

/// Virtual time for one node: its sleeps are timers on its own loop (they stop with the node).
struct SimClock: EngineClock {
    let world: SimWorld
    let loop: EventLoop

    func monotonicNanoseconds() -> UInt64 { world.now }
    func randomBits() -> UInt64 { world.rng.next() }
    func wallMilliseconds() -> Int64 { 1_800_000_000_000 + Int64(world.now / 1_000_000) }
    func sleep(nanoseconds: UInt64) async {
        let woken = OneShot<Void>()
        let loop = self.loop
        await withTaskCancellationHandler {
            loop.after(nanoseconds) { woken.complete(()) }
            await woken.value
        } onCancel: {
            woken.complete(())
        }
    }
}

/// The in-memory network: each request is delivered to the peer services of the node at its
/// address after a delay drawn from the seed, and its answer comes back the same way; a node
/// that is down or cut off answers nothing (the caller's timeout fires). A request sent over a
/// cut link is not lost but held, as TCP keeps resending it: it arrives late, after the heal
/// (`healed`). A node on a bad link (`slow`) gets 50 ms ± 20 ms per message, loses 5% of them
/// and receives 2% twice.
/// `@unchecked Sendable`: used from the driver's thread only (see `SimWorld`).
final class SimNetwork: @unchecked Sendable {
    let world: SimWorld
    var nodes: [String: (services: ServiceRegistry, loop: EventLoop)] = [:]
    /// Addresses cut off from every other node (a partition), and single links cut.
    var isolated: Set<String> = []
    var cutLinks: Set<[String]> = []
    /// Addresses cut off from every other node while their clients still reach them.
    var isolatedFromPeers: Set<String> = []
    /// Addresses on a bad link (delay, loss, duplication).
    var slow: Set<String> = []
    /// Sees each request as it is sent (from, to, method path, protobuf bytes): a focused test's
    /// window on what nodes tell each other.
    var observe: ((String, String, String, [UInt8]) -> Void)?
    /// Hears each address that has just answered a channel membership change (a join, a leave or
    /// a resume's announce), before the answer leaves: where a crash "right after the answer"
    /// strikes. (A lost state change is restored by anti-entropy from its gateway and shows
    /// nowhere; a lost membership change shows as a SNAPSHOT without the user, or with a ghost.)
    var answered: ((String) -> Void)?
    /// The calls each node's handlers are working on (peer calls, and client calls but streams),
    /// by token: what a node never answers (a task parked for good) is left here.
    private(set) var working: [Int: (address: String, what: String, since: UInt64)] = [:]
    private var nextWork = 0
    private(set) var requests = 0
    private(set) var lost = 0
    /// Requests a process sent at the very instant it was killed (`unsent`).
    private(set) var unsentAtKill = 0
    /// The requests sent at the current instant, by sender. A process killed at the instant it
    /// sent them had not written them out yet (its event loop writes what a turn queued when the
    /// turn ends, and nghttp2 buffers before the socket), so they die with it, whichever order
    /// the node queued them in; what it answered (the answer is on its way) still arrives.
    private var sentNow: (at: UInt64, flags: [String: [Box<Bool>]]) = (0, [:])
    private(set) var duplicated = 0

    init(world: SimWorld) { self.world = world }

    /// One message's delay between `a` and `b`.
    func delay(_ a: String, _ b: String) -> UInt64 {
        if slow.contains(a) || slow.contains(b) { return 30_000_000 + world.random(below: 40_000_000) }
        return 200_000 + world.random(below: 1_800_000)
    }

    /// Whether one message between `a` and `b` is lost on a bad link.
    func loses(_ a: String, _ b: String) -> Bool {
        guard slow.contains(a) || slow.contains(b), world.random(below: 100) < 5 else { return false }
        lost += 1
        return true
    }

    func duplicates(_ a: String, _ b: String) -> Bool {
        guard slow.contains(a) || slow.contains(b), world.random(below: 100) < 2 else { return false }
        duplicated += 1
        return true
    }

    func began(_ address: String, _ what: String) -> Int {
        nextWork += 1
        working[nextWork] = (address, what, world.now)
        return nextWork
    }

    func ended(_ token: Int) { working[token] = nil }

    /// A process killed at `address`: its calls end with it, and what it sent at this instant is lost.
    func killed(_ address: String) {
        working = working.filter { $0.value.address != address }
        guard sentNow.at == world.now else { return }
        let flags = (sentNow.flags[address] ?? []).filter { !$0.value }
        for flag in flags { flag.value = true }
        unsentAtKill += flags.count
        if !flags.isEmpty { world.log("\(address): \(flags.count) request(s) sent at this instant die with it") }
    }

    /// A request leaving `from` now; set once `from` is killed at this same instant (`killed`).
    func unsent(from: String) -> Box<Bool> {
        if sentNow.at != world.now { sentNow = (world.now, [:]) }
        let flag = Box(false)
        sentNow.flags[from, default: []].append(flag)
        return flag
    }

    func reachable(_ a: String, _ b: String) -> Bool {
        !isolated.contains(a) && !isolated.contains(b) && !isolatedFromPeers.contains(a) && !isolatedFromPeers.contains(b)
            && !cutLinks.contains([a, b].sorted())
    }

    typealias Destination = (services: ServiceRegistry, loop: EventLoop)

    /// Where a request goes now: delivered, held on a cut link (`hold`), or lost.
    enum Route { case deliver(Destination), held, lost }

    func route(from: String, to address: String) -> Route {
        requests += 1
        guard reachable(from, address) else { return holdsOnCutLinks ? .held : .lost }
        guard !loses(from, address), let dest = nodes[address] else { return .lost }
        return .deliver(dest)
    }

    // MARK: requests held on a cut link

    /// How long TCP keeps resending a request over a cut link (blackholed, as `Cluster/chaos`
    /// cuts them): past the peer connection's own keepalive (2 s + 1 s) the kernel still resends
    /// what a closed socket had not delivered. A request held longer is counted lost.
    static let heldHorizon: UInt64 = 10_000_000_000
    /// Whether requests over a cut link are held (`SimScenario.Options.requestsArriveLate`).
    var holdsOnCutLinks = false
    /// A request held on a cut link: who sent it where and when, the process it went to, and
    /// how to send it once the link heals (to that process, after a delay).
    private typealias Held = (from: String, to: String, at: UInt64, loop: EventLoop, send: (Destination, UInt64) -> Void)
    private var held: [Held] = []
    private(set) var deliveredLate = 0

    /// Holds a request sent over a cut link: it arrives after the heal (`healed`), late.
    func hold(from: String, to address: String, _ send: @escaping (Destination, UInt64) -> Void) {
        guard let dest = nodes[address] else { return }
        held.append((from, address, world.now, dest.loop, send))
    }

    /// A link healed: each request held on a link that works again arrives at TCP's first resend
    /// after the heal (0.2 s after it was sent, then 0.4 s, 0.8 s, ... later), if the process it
    /// was sent to still runs and it was sent within `heldHorizon`.
    func healed() {
        let now = world.now
        var still: [Held] = []
        for h in held {
            guard reachable(h.from, h.to) else { still.append(h); continue }
            guard let dest = nodes[h.to], dest.loop === h.loop, now - h.at <= Self.heldHorizon else { continue }
            var rto: UInt64 = 200_000_000
            var resend = h.at + rto
            while resend < now { rto *= 2; resend += rto }
            deliveredLate += 1
            world.log("\(h.from) -> \(h.to): a request held since \(String(format: "%.4f", Double(h.at) / 1e9 - 1)) arrives late")
            h.send(dest, resend - now + 200_000)
        }
        held = still
    }
}

struct SimTransport: PeerTransport {
    let network: SimNetwork
    let from: String
    let loop: EventLoop

    func unary<Req: ProtoMessage, Resp: ProtoMessage>(_ address: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                      timeout: UInt64) async throws -> Resp {
        let answer = OneShot<Result<[UInt8], GRPCStatus>>()
        let (network, from, loop) = (self.network, self.from, self.loop)
        loop.after(timeout) { answer.complete(.failure(GRPCStatus(.deadlineExceeded, "no answer from \(address)"))) }
        network.world.log("\(from) -> \(address) \(method.path)" + ((request as? ClusterChannelCall).map { " \($0.op) \($0.channelName) \($0.session?.sessionID.prefix(6) ?? "") gw=\($0.session?.gateway ?? "") v=\($0.session?.version ?? 0)" } ?? ""))
        network.observe?(from, address, method.path, request.serializedBytes())
        // (a request held on a cut link arrives late with a fresh deadline: gRPC's timeout header
        // is relative, read where it arrives)
        let send = { (dest: SimNetwork.Destination, late: UInt64?) in
            guard let handler = dest.services.methods[method.path]?.asyncUnary else { return }
            let bytes = request.serializedBytes()
            let deadline = network.world.now + (late ?? 0) + timeout
            let copies = network.duplicates(from, address) ? 2 : 1
            let unsent = network.unsent(from: from)
            for _ in 0..<copies {
                let there = late ?? network.delay(from, address)
                dest.loop.after(there) {
                    guard !unsent.value else { return }
                    Task(executorPreference: dest.loop) {
                        let work = network.began(address, "\(method.path) from \(from)")
                        let result: Result<[UInt8], GRPCStatus>
                        do {
                            result = .success(try await handler(bytes, ServerContext(path: method.path, deadline: deadline, metadata: [])))
                        } catch {
                            result = .failure(error as? GRPCStatus ?? GRPCStatus(.internal, "\(error)"))
                        }
                        network.ended(work)
                        if case .success = result, let op = (request as? ClusterChannelCall)?.op, op == .join || op == .leave || op == .announce {
                            network.answered?(address)
                        }
                        guard network.reachable(from, address), !network.loses(address, from) else { return }
                        loop.after(network.delay(address, from)) {
                            if case .failure(let s) = result { network.world.detail("\(from) <- \(address) \(method.path) \(s.code) \(s.message)") }
                            answer.complete(result)
                        }
                    }
                }
            }
        }
        switch network.route(from: from, to: address) {
        case .deliver(let dest): send(dest, nil)
        case .held: network.hold(from: from, to: address) { dest, after in send(dest, after) }
        case .lost: break
        }
        // (handlers answer with a gRPC-framed message: a 5-byte header, then the protobuf bytes)
        let framed = try await answer.value.get()
        let resp = try Resp(serializedBytes: Array(framed.dropFirst(5)))
        if network.world.keepsTrace { network.world.detail("\(from) <- \(address) \(method.path) \(String(describing: resp).prefix(300))") }
        return resp
    }

    func preferredLoop(of address: String) -> EventLoop? { loop }
    func forget(_ address: String) {}
    func close() {}
}
