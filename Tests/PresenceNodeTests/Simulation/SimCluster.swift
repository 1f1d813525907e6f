import ClusterCore
import EventLoop
import GRPCTransport
import PresenceCore
@testable import PresenceNode
import PresenceWire
import Synchronization

/// One process of a node (`NodeCore` on the simulation's seams) and its client port (the real
/// `PresenceService` handlers). A restart is a new `SimNode` with the same id and address.
/// `@unchecked Sendable`: used from the driver's thread only (see `SimWorld`).
final class SimNode: @unchecked Sendable {
    let id: String
    let address: String
    let boot: UInt64
    let loop: EventLoop
    let core: NodeCore
    /// What the client port serves (OpenSession, Join, ...), as `Node` registers it.
    let clientServices: ServiceRegistry
    /// What a kill -9 breaks at once: the client calls and streams in flight here.
    private var killHooks: [Int: () -> Void] = [:]
    private var nextHook = 0
    private(set) var killed = false

    init(world: SimWorld, network: SimNetwork, id: String, seeds: [String], presenceTimeout: Double, replicationFactor: Int) {
        self.id = id
        let address = "\(id).sim:7401"
        self.address = address
        loop = world.makeLoop(id)
        // (as a process's boot is drawn: from the wall clock, so a restart's is later)
        boot = Topology.newBoot(wallMilliseconds: SimClock(world: world, loop: loop).wallMilliseconds(), random: world.rng.next())
        var settings = EngineSettings(nodeID: id, presenceTimeout: presenceTimeout, maxInstantEvents: 50, presenceInterval: 0.2)
        settings.shards = 4
        let seams = NodeCore.Seams(loops: [loop], transport: SimTransport(network: network, from: address, loop: loop),
                                   clock: SimClock(world: world, loop: loop), placement: TaskPlacement(preferred: loop), peerAuth: nil)
        core = NodeCore(settings: settings, replicationFactor: replicationFactor, peerAddress: address, clientAddress: "\(id).sim:7400",
                        seeds: seeds.filter { $0 != address }.compactMap { HostPort(parsing: $0) }, boot: boot,
                        seams: seams, logger: world.keepsTrace ? Logger(level: .debug, format: .text) { [world] in world.detail("\(id): \($0)") }
                                                                : Logger(level: .error, format: .text) { _ in })
        var registry = ServiceRegistry()
        PresenceService(engine: core.engine, verifier: nil).register(in: &registry)
        clientServices = registry
        network.nodes[address] = (core.peerServices, loop)
        let core = self.core
        loop.execute { core.start(peerAddress: address, clientAddress: "\(id).sim:7400") }
    }

    /// Runs `body` if the node is killed before `cancel` is called with the returned token.
    func onKill(_ body: @escaping () -> Void) -> Int {
        nextHook += 1
        killHooks[nextHook] = body
        return nextHook
    }

    func cancelOnKill(_ token: Int) { killHooks[token] = nil }

    func markKilled() -> [() -> Void] {
        killed = true
        defer { killHooks = [:] }
        return killHooks.sorted { $0.key < $1.key }.map(\.value)
    }
}

/// The simulated cluster: node ids, the running process of each, and the faults of
/// RELIABILITY.md's fault model as operations on them (kill, restart, SIGTERM, pause, partition,
/// one-link cut, bad link). Clients reach a node's client port unless it is down, paused or cut
/// off (a partition cuts a node off from its clients too, as in `Cluster/chaos --mode netns`).
/// `@unchecked Sendable`: used from the driver's thread only (see `SimWorld`).
final class SimCluster: @unchecked Sendable {
    let world: SimWorld
    let network: SimNetwork
    /// Where model clients run: a loop of its own, which outlives any node.
    let clients: EventLoop
    let presenceTimeout: Double
    let replicationFactor: Int
    let ids: [String]
    /// The running process of each node id (absent: down).
    private(set) var running: [String: SimNode] = [:]
    private(set) var paused: Set<String> = []
    /// Told when clients stop reaching a node (paused, cut off): their keepalives start then.
    var onUnreachable: ((String) -> Void)?
    /// Nodes to kill the moment they answer a gateway's membership change (`crashAtAnswer`): the
    /// answer is on its way, what the node had not sent yet is lost with it.
    private var armedToCrash: Set<String> = []

    init(world: SimWorld, size: Int, presenceTimeout: Double, replicationFactor: Int) {
        self.world = world
        network = SimNetwork(world: world)
        clients = world.makeLoop("clients")
        self.presenceTimeout = presenceTimeout
        self.replicationFactor = replicationFactor
        ids = (1...size).map { "n\($0)" }
        for id in ids { start(id) }
        network.answered = { [unowned self] address in
            guard let id = ids.first(where: { self.address(of: $0) == address }), armedToCrash.remove(id) != nil else { return }
            world.log("\(id) answered: crash now")
            kill(id)
        }
    }

    /// Arms a crash of `id` at its next answer to a peer's call.
    func armCrashAtAnswer(_ id: String) { armedToCrash.insert(id) }

    /// Disarms it; whether it was still armed (the node answered nothing meanwhile).
    func disarmCrashAtAnswer(_ id: String) -> Bool { armedToCrash.remove(id) != nil }

    func address(of id: String) -> String { "\(id).sim:7401" }
    func node(_ id: String) -> SimNode? { running[id] }
    var live: [SimNode] { ids.compactMap { running[$0] } }

    /// Whether a client can reach `id`'s client port now.
    func clientReachable(_ id: String) -> Bool {
        running[id] != nil && !paused.contains(id) && !network.isolated.contains(address(of: id))
    }

    /// Starts a process for `id` (a fresh boot), joining through every other node's address.
    func start(_ id: String) {
        precondition(running[id] == nil, "\(id) is running")
        world.log("start \(id)")
        running[id] = SimNode(world: world, network: network, id: id, seeds: ids.map { address(of: $0) },
                              presenceTimeout: presenceTimeout, replicationFactor: replicationFactor)
    }

    /// kill -9: the process's loop never runs again, nothing reaches it, its clients' connections reset.
    func kill(_ id: String) {
        guard let node = running.removeValue(forKey: id) else { return }
        world.log("kill \(id)")
        world.remove(node.loop)
        paused.remove(id)
        if network.nodes[node.address]?.loop === node.loop { network.nodes[node.address] = nil }
        network.killed(node.address)
        for hook in node.markKilled() { hook() }
    }

    /// SIGTERM: the node's own graceful stop (`NodeCore.shutdown`), then the process exits; a node
    /// that has not finished within 12 s is killed (and `false` is returned).
    func terminate(_ id: String) -> Bool {
        guard let node = running[id] else { return true }
        world.log("terminate \(id)")
        let done = OneShot<Void>()
        node.loop.execute { Task(executorPreference: node.loop) { await node.core.shutdown(); done.complete(()) } }
        var finished = false
        for _ in 0..<120 {
            world.run(for: 100_000_000)
            if done.isComplete { finished = true; break }
        }
        kill(id)
        return finished
    }

    func pause(_ id: String) {
        guard let node = running[id] else { return }
        world.log("pause \(id)")
        paused.insert(id)
        world.pause(node.loop)
        onUnreachable?(id)
    }

    func unpause(_ id: String) {
        guard let node = running[id], paused.remove(id) != nil else { return }
        world.log("continue \(id)")
        world.unpause(node.loop)
    }

    func isolate(_ id: String, _ on: Bool) {
        world.log("\(on ? "isolate" : "heal") \(id)")
        if on { network.isolated.insert(address(of: id)) } else { network.isolated.remove(address(of: id)); network.healed() }
        if on { onUnreachable?(id) }
    }

    /// Cuts `id` off from every other node (or heals it); its clients still reach it (a split
    /// that leaves a node on its clients' side).
    func isolateFromPeers(_ id: String, _ on: Bool) {
        world.log("\(on ? "isolate from peers" : "heal from peers") \(id)")
        if on { network.isolatedFromPeers.insert(address(of: id)) } else { network.isolatedFromPeers.remove(address(of: id)); network.healed() }
    }

    func cut(_ a: String, _ b: String, _ on: Bool) {
        world.log("\(on ? "cut" : "heal") \(a)<->\(b)")
        let link = [address(of: a), address(of: b)].sorted()
        if on { network.cutLinks.insert(link) } else { network.cutLinks.remove(link); network.healed() }
    }

    func slow(_ id: String, _ on: Bool) {
        world.log("\(on ? "slow" : "fast") \(id)")
        if on { network.slow.insert(address(of: id)) } else { network.slow.remove(address(of: id)) }
    }

    /// Each running, unpaused node's ring (members with their boots).
    func views() -> [String: [String]] {
        var out: [String: [String]] = [:]
        for n in live where !paused.contains(n.id) {
            let ring = n.core.topology.ring
            out[n.id] = ring.members.map { "\($0)@\(ring.boot(of: $0))" }
        }
        return out
    }

    /// True when every running, unpaused node sees exactly the running nodes, with their boots.
    func converged() -> Bool {
        let expected = live.map { "\($0.id)@\($0.core.topology.boot)" }.sorted()
        return views().values.allSatisfy { $0.sorted() == expected }
    }
}
