// A deterministic simulation of the channel keyspaces (`Keyspace<ChannelMachine<NodeInstance>>`,
// replication factor 2, 3–5 nodes) and their gateways (`SessionTable`, `FeedPosition`), driven by
// model clients, with a fake clock and a simulated network (KeyspaceSimulation.swift). It checks
// RELIABILITY.md's invariants 1 (nothing acknowledged is lost), 2 (no ghosts), 3 (no flaps),
// 4 (no lost session), 5 (ordered feeds that add up to the listing) and 8 (stale actors are
// harmless) under seeded random faults, and in targeted scenarios.
//
// What the checks catch: each mutation below was made alone in the cores, the tests run, and the
// mutation reverted (✗ = caught, by the tests named; "random" = the four seeded suites).
//
//   ✗ no SNAPSHOT on takeover (ChannelMachine.tookOver returns [])
//       anOwnerCrashes
//   ✗ replicas not updated (Keyspace.replicate returns [])
//       anOwnerCrashes, aLeaveANewOwnerNeverHeardOf…, aShortPartitionHeals, aNodeLeavesGracefully…,
//       aNodeRestartsFasterThanDetection, aRestartedNodeServes…, aShedQueue…, aPausedGateways…,
//       aSessionMovesWhileItsOldGatewayIsCutOff, random (all four), and a findings test
//   ✗ departures ignored in ChannelMachine.merge
//       aShortPartitionHeals
//   ✗ epochs not checked (ChannelMachine.supersedingVersion always nil)
//       aSessionMovesWhileItsOldGatewayIsCutOff, aSessionResumedAcrossAPartition…, random (all four)
//   ✗ anti-entropy not removing suspects (ChannelMachine's reconcile names none)
//       aLeaveANewOwnerNeverHeardOfIsRepairedByAntiEntropy
//   ✗ handoff gate bypassed (HandoffGate.mayServe always true)
//       aRestartedNodeServesItsChannelsOnlyOnceTheyAreHandedToIt, staleGatewaysChangeNothing,
//       HandoffGateTests
//   ✗ sessions of gone gateways never time out (Keyspace.sweep)
//       aGatewayCrashes, random (all four)
//   ✗ lost pushes not made up for (Keyspace.restart(followersAt:) does nothing)
//       aShedQueueGivesItsFollowersAFreshSnapshot
//   ✗ each fix of KeyspaceSimulationFindingsTests reverted: its own test there, and
//       (1) random: three suites; (3) aPausedGateways…, random: feeds; (4) random: feeds;
//       (7) aSessionResumedAcrossAPartition…, random (all four); (8) aNodeRestartsFasterThanDetection;
//       (9) random: three suites; (10) random: feeds; (2), (5), (6): their own test only
//   – not caught: FeedPosition passing another owner's events (the takeover SNAPSHOTs and the
//       sequence check leave nothing for it to break here); replicas taking copies of an older
//       lineage (Keyspace.received's term check: with two copies, a stale owner's copies reach
//       the new owner, which merges them, rather than a replica)
//
// Findings of the simulation in the cores (each fixed, with a regression test in
// KeyspaceSimulationFindingsTests.swift) and what it found outside them (PresenceNode, left as
// it is) are listed in KeyspaceSimulationFindingsTests.swift.

import ClusterCore
import Foundation
import PresenceCore
import PresenceWire
import Testing

/// Runs the simulation of random scenarios, and shared scenario helpers.
enum SimRuns {
    /// A random scenario: `clients` clients on `nodes` nodes, `faults` random faults (one at a time,
    /// each followed by 8 s), then quiet: what failed, and what was done.
    static func random(seed: UInt64, nodes: Int = 4, clients: Int? = nil, faults: Int = 3,
                       config: (inout SimConfig) -> Void = { _ in }, tune: (inout KeyspaceSim) -> Void = { _ in },
                       afterFault: (inout KeyspaceSim) -> Void = { _ in }) -> (sim: KeyspaceSim, log: [String], problems: [String]) {
        var cfg = SimConfig(nodes: nodes)
        config(&cfg)
        var sim = KeyspaceSim(cfg, seed: seed)
        tune(&sim)
        sim.startClients(clients ?? nodes * 4)
        sim.run(for: 3 * simSecond)
        var log: [String] = []
        for _ in 0..<faults {
            log.append("t=\(Double(sim.now) / 1e9)s " + sim.randomFault())
            sim.run(for: 4 * simSecond)
            afterFault(&sim)
            sim.run(for: 4 * simSecond)
        }
        sim.quiesce()
        let problems = sim.convergenceProblems().filter { !$0.hasPrefix(KeyspaceSim.knownPrefix) }
        return (sim, log, problems)
    }

    /// The failures of a run, for an expectation's message.
    static func report(_ r: (sim: KeyspaceSim, log: [String], problems: [String]), _ what: String) -> String {
        "\(what), faults \(r.log), \(r.sim.stats)\n" + (r.problems.prefix(12) + r.sim.violations.prefix(12)).joined(separator: "\n")
    }

    /// A channel whose owner (first) and replica are `owners` on the initial ring.
    static func channel(_ sim: KeyspaceSim, owners: [String], skip: Int = 0) -> ChannelKey {
        let ring = sim.procs["n1"]!.space.ring
        var found = 0
        for i in 0..<100_000 {
            let key = ChannelKey(name: "s\(i)", type: .message)
            if Array(ring.owners(of: key, count: owners.count)) == owners {
                if found == skip { return key }
                found += 1
            }
        }
        fatalError("no channel owned by \(owners)")
    }

    /// A quiet simulation for a scripted scenario: no random client activity.
    static func scripted(nodes: Int = 4, seed: UInt64, config: (inout SimConfig) -> Void = { _ in }) -> KeyspaceSim {
        var cfg = SimConfig(nodes: nodes)
        config(&cfg)
        var sim = KeyspaceSim(cfg, seed: seed)
        sim.clientsActive = false
        sim.record = true
        return sim
    }

    /// A state item.
    static func item(_ k: String, _ v: String) -> StateItem { StateItem(key: k, value: v) }

    /// Every gateway a client left since the last call (still up, and not the client's gateway
    /// again) makes late requests for it, of its older epoch: sets bogus state, leaves a
    /// channel, joins another. Returns how many gateways did.
    static func injectStaleRequests(_ sim: inout KeyspaceSim, since: UInt64 = 8 * simSecond) -> Int {
        var injected = 0
        for (node, user, at) in sim.leftBehind where at + since >= sim.now && sim.isCurrent(node) && sim.clients[user]?.gateway != node {
            guard let c = sim.clients[user], c.endedAt == nil, let key = c.channels.keys.sorted().first else { continue }
            sim.injectStale(at: node.id, user, .setState(key, [item("k0", "stale")]))
            sim.injectStale(at: node.id, user, .leave(key))
            sim.injectStale(at: node.id, user, .join(ChannelKey(name: "c0", type: .message), withPresence: true))
            injected += 1
        }
        return injected
    }
}

// MARK: - Random faults

@Suite struct KeyspaceRandomSimulationTests {
    /// Invariants 1, 2 and 4: whatever the faults (crash and restart fast or slow or never,
    /// pause, partition, one cut link, graceful leave and rejoin), once they stop and a few
    /// anti-entropy rounds ran, every owner lists exactly what the live gateways hold, which is
    /// what the clients were acknowledged; replicas hold the same; sessions of gateways that died
    /// are gone within the presence timeout + 1.5 s (counted from when their owners could see the
    /// gateway go). Violations of 3, 5 and 8 seen on the way fail too.
    @Test(arguments: [(UInt64(1), 4), (2, 4), (3, 4), (4, 4), (5, 3), (6, 3), (7, 5), (8, 5)])
    func afterRandomFaultsEveryOwnerListsWhatTheGatewaysHold(seed: UInt64, nodes: Int) {
        let r = SimRuns.random(seed: seed, nodes: nodes, faults: 3)
        #expect(r.problems.isEmpty && r.sim.violations.isEmpty, "\(SimRuns.report(r, "seed \(seed), \(nodes) nodes"))")
        #expect(r.sim.stats.moves > 0 && r.sim.stats.ringChanges > 0)
    }

    /// Invariant 3: no REMOTE_LEAVE or REMOTE_TIMEOUT (after the feed filter) for a user whose
    /// session never ended — its gateway stayed alive (paused or cut off for less than the
    /// timeout), or its client resumed it elsewhere within the timeout. Faults are the ones
    /// that must not make any: pauses, partitions and crashes whose clients resume, moves.
    @Test(arguments: [11, 12, 13, 14, 15, 16] as [UInt64])
    func usersWhoseSessionsLiveNeverFlap(seed: UInt64) {
        var faults: [String] = []
        let r = SimRuns.random(seed: seed, nodes: 4, faults: 4, tune: { sim in
            sim.mix = [0.30, 0.10, 0.30, 0.08, 0.0, 0.0, 0.22]  // many moves, no session ends
        }, afterFault: { sim in faults.append("\(sim.stats.flapsJudged)") })
        #expect(r.problems.isEmpty && r.sim.violations.isEmpty, "\(SimRuns.report(r, "seed \(seed)"))")
        #expect(r.sim.stats.flapsJudged > 0, "no leave or timeout was judged at all")
    }

    /// Invariant 5: per session and channel, what passes the feed filter has strictly increasing
    /// sequences, and a subscriber that applies SNAPSHOT + events ends with exactly the owner's
    /// listing — on a bad network: more jitter, deliveries shed from small queues, cut links.
    @Test(arguments: [21, 22, 23, 24, 25, 26] as [UInt64])
    func feedsAreOrderedAndAddUpToTheListing(seed: UInt64) {
        let r = SimRuns.random(seed: seed, nodes: 4, faults: 4, config: { cfg in
            cfg.jitter = 30 * simMs
            cfg.heldDeliveryLimit = 3
        }, tune: { sim in
            sim.mix = [0.30, 0.12, 0.40, 0.10, 0.02, 0.01, 0.05]  // mostly state changes: many events
        })
        #expect(r.problems.isEmpty && r.sim.violations.isEmpty, "\(SimRuns.report(r, "seed \(seed)"))")
        #expect(r.sim.stats.snapshotsPassed > 0 && r.sim.stats.passed > 500)
    }

    /// Invariant 8: gateways left behind by clients that resumed elsewhere (during pauses and
    /// partitions) keep speaking for them: their anti-entropy, their session timeouts, and late
    /// calls of older epochs (setting bogus state, leaving, joining) — none of it changes what
    /// the owners list (invariant 1 at the end), nor makes a flap or a ghost on the way.
    @Test(arguments: [31, 32, 33, 34, 35, 36] as [UInt64])
    func staleGatewaysChangeNothing(seed: UInt64) {
        var injected = 0
        let r = SimRuns.random(seed: seed, nodes: 4, faults: 4, tune: { sim in
            sim.mix = [0.30, 0.10, 0.30, 0.08, 0.0, 0.0, 0.22]
        }, afterFault: { sim in injected += SimRuns.injectStaleRequests(&sim) })
        #expect(r.problems.isEmpty && r.sim.violations.isEmpty, "\(SimRuns.report(r, "seed \(seed)"))")
        #expect(injected > 0)
    }
}

// MARK: - Targeted scenarios

@Suite struct KeyspaceScenarioSimulationTests {
    typealias R = SimRuns

    /// The listing of `key` as the owner `owner` holds it.
    static func listed(_ sim: KeyspaceSim, _ owner: String, _ key: ChannelKey) -> [String: [StateItem]] {
        var out: [String: [StateItem]] = [:]
        for u in sim.procs[owner]!.space[owned: key]?.page(after: nil, limit: 1_000, includeState: true).users ?? [] { out[u.userID] = u.states }
        return out
    }

    /// Crash of a channel's owner: its replica takes over with everything that was acknowledged
    /// (no anti-entropy needed), and every subscriber gets a SNAPSHOT from it — also those that
    /// missed the owner's last events (they were still queued when it died).
    @Test func anOwnerCrashes() {
        var sim = R.scripted(seed: 41) { $0.crashLossWindow = 0 }
        sim.antiEntropy = false
        let key = R.channel(sim, owners: ["n4", "n3"])
        let a = sim.spawnClient(at: "n1"), b = sim.spawnClient(at: "n2"), c = sim.spawnClient(at: "n3")
        sim.run(for: 100 * simMs)
        for u in [a, b, c] { sim.request(u, .join(key, withPresence: true)) }
        sim.run(for: 300 * simMs)
        sim.request(a, .setState(key, [R.item("mood", "calm")]))
        sim.run(for: 300 * simMs)
        // the owner's events to n1 and n2 wait on their links; c's change is acknowledged (its
        // replica has it), then the owner dies with those events
        sim.cutLink("n4", "n1", for: 30 * simSecond)
        sim.cutLink("n4", "n2", for: 30 * simSecond)
        sim.request(c, .setState(key, [R.item("mood", "busy")]))
        sim.run(for: 50 * simMs)
        #expect(sim.clients[c]!.op == nil, "c's change was not acknowledged")
        let crashed = sim.now
        sim.crash("n4", resume: 0)
        sim.run(for: 2 * simSecond)
        #expect(sim.procs["n3"]!.space[owned: key] != nil, "the replica did not take over")
        #expect(Self.listed(sim, "n3", key) == [a: [R.item("mood", "calm")], b: [], c: [R.item("mood", "busy")]])
        let newOwner = sim.procs["n3"]!.instance
        for u in [a, b, c] {
            let s = sim.clients[u]!.session
            #expect(sim.passedLog.contains { $0.session == s && $0.at > crashed && $0.from == newOwner && $0.event.type == .snapshot },
                    "\(u) got no SNAPSHOT from the new owner")
            #expect(sim.feedLogs[SimFeedKey(session: s, key: key)]?.view?.keys.sorted() == [a, b, c].sorted())
        }
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        sim.antiEntropy = true
        sim.quiesce(for: 4 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// Crash of a gateway whose clients do not come back: each of its sessions times out exactly
    /// once for every subscriber, no earlier than the presence timeout after the crash, and no
    /// later than 1.5 s after that; then no owner lists them.
    @Test func aGatewayCrashes() {
        var sim = R.scripted(seed: 42)
        let k1 = R.channel(sim, owners: ["n1", "n3"]), k2 = R.channel(sim, owners: ["n3", "n4"])
        let gone = [sim.spawnClient(at: "n2"), sim.spawnClient(at: "n2")]
        let watchers = [sim.spawnClient(at: "n1"), sim.spawnClient(at: "n4")]
        sim.run(for: 100 * simMs)
        for u in gone + watchers {
            sim.request(u, .join(k1, withPresence: true))
            sim.run(for: 50 * simMs)
            sim.request(u, .join(k2, withPresence: true))
            sim.run(for: 50 * simMs)
        }
        sim.request(gone[0], .setState(k1, [R.item("x", "1")]))
        sim.run(for: simSecond)
        let crashed = sim.now
        sim.crash("n2", resume: 0)
        sim.run(for: 10 * simSecond)
        let timeout = sim.cfg.presenceTimeout
        for w in watchers {
            let s = sim.clients[w]!.session
            for key in [k1, k2] {
                for u in gone {
                    let seen = sim.passedLog.filter { $0.session == s && $0.key == key && $0.event.publisher == u && $0.at > crashed }
                    #expect(seen.map(\.event.type) == [.remoteTimeout], "\(w) saw \(seen.map(\.event.type)) for \(u) in \(key)")
                    if let t = seen.first?.at {
                        #expect(t >= crashed + timeout && t <= crashed + timeout + 1_500 * simMs, "at \(Double(t - crashed) / 1e9) s")
                    }
                }
            }
        }
        for key in [k1, k2] {
            let owner = key == k1 ? "n1" : "n3"
            #expect(Set(Self.listed(sim, owner, key).keys) == Set(watchers))
        }
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A session moves to another gateway while the one it left is cut off (and does not hear of
    /// the move): that gateway's later word — its anti-entropy, a late call of the older epoch,
    /// the leave it sends when the session times out there — loses: the user never flaps and
    /// keeps the state it set at its new gateway.
    @Test func aSessionMovesWhileItsOldGatewayIsCutOff() {
        var sim = R.scripted(seed: 43)
        sim.antiEntropy = false
        let key = R.channel(sim, owners: ["n1", "n4"])
        let u1 = sim.spawnClient(at: "n2"), u2 = sim.spawnClient(at: "n2"), w = sim.spawnClient(at: "n3")
        sim.run(for: 100 * simMs)
        for u in [u1, u2, w] {
            sim.request(u, .join(key, withPresence: true))
            sim.run(for: 100 * simMs)
        }
        sim.request(u1, .setState(key, [R.item("k", "old")]))
        sim.run(for: 500 * simMs)
        sim.partition(["n2"], for: 3 * simSecond, clientsMove: 0)
        sim.run(for: 1_500 * simMs)
        sim.move(u1, to: "n4")
        sim.move(u2, to: "n4")
        sim.run(for: 200 * simMs)
        sim.request(u1, .setState(key, [R.item("k", "new")]))
        sim.run(for: 3 * simSecond)  // healed, rings back together
        // n2 still holds both sessions (its word is of the older epoch): a late call for u1
        #expect(sim.procs["n2"]!.table[sim.clients[u1]!.session] != nil)
        sim.injectStale(at: "n2", u1, .setState(key, [R.item("k", "stale")]))
        sim.injectStale(at: "n2", u1, .leave(key))
        sim.run(for: 500 * simMs)
        // its anti-entropy (u1's old membership, u2's too)
        sim.antiEntropy = true
        sim.run(for: 2 * simSecond)
        // and u2's session times out at n2 (its client left it 6 s ago there): its leave loses too
        sim.run(for: 4 * simSecond)
        #expect(Self.listed(sim, "n1", key) == [u1: [R.item("k", "new")], u2: [], w: []])
        let placed = sim.procs["n1"]!.space[owned: key]!.allPlaces
        #expect(placed[sim.clients[u1]!.session]?.sink == sim.procs["n4"]!.instance)
        #expect(placed[sim.clients[u2]!.session]?.sink == sim.procs["n4"]!.instance)
        #expect(sim.procs["n2"]!.table[sim.clients[u1]!.session] == nil && sim.procs["n2"]!.table[sim.clients[u2]!.session] == nil)
        let ws = sim.clients[w]!.session
        #expect(!sim.passedLog.contains { $0.session == ws && [u1, u2].contains($0.event.publisher) && [.remoteLeave, .remoteTimeout].contains($0.event.type) })
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        sim.quiesce(for: 3 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// Graceful leave (a rolling restart): the leaving node hands every channel off before it
    /// goes; its clients resume elsewhere. Nothing acknowledged is lost and nobody flaps — with
    /// anti-entropy off, so the handoff alone must carry it. Back as a new process, it gets its
    /// channels by handoff again.
    @Test func aNodeLeavesGracefullyAndComesBack() {
        var sim = KeyspaceSim(SimConfig(nodes: 4), seed: 44)
        sim.startClients(16)
        sim.run(for: 5 * simSecond)
        sim.clientsActive = false
        sim.run(for: 2 * simSecond)
        sim.antiEntropy = false
        let before = sim.procs["n3"]!.space.owned.filter { !$0.value.isEmpty }.count
        #expect(before > 0)
        sim.leave("n3")
        sim.run(for: 3 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "after the leave: \(sim.convergenceProblems())")
        sim.restart("n3")
        sim.run(for: 2 * simSecond)
        #expect(sim.procs["n3"]!.space.owned.filter { !$0.value.isEmpty }.count > 0, "the new process got nothing")
        #expect(sim.convergenceProblems().isEmpty, "after the restart: \(sim.convergenceProblems())")
        #expect(sim.violations.isEmpty, "\(sim.violations)")
    }

    /// A node restarts faster than failure detection: survivors see its new boot and drop the old
    /// process at once (its sessions are orphans from then: those whose clients do not resume
    /// time out a presence timeout after the restart, not after a detection), and the new,
    /// empty process gets its channels by handoff.
    @Test func aNodeRestartsFasterThanDetection() {
        var sim = KeyspaceSim(SimConfig(nodes: 4), seed: 45)
        sim.record = true
        sim.startClients(16)
        sim.run(for: 4 * simSecond)
        let old = sim.procs["n2"]!.instance
        let abandoned = sim.clients.values.filter { $0.gateway == old && $0.endedAt == nil }.map(\.user)
        let crashed = sim.now
        sim.crash("n2", restartAfter: 200 * simMs, resume: 0.5)
        sim.run(for: 2 * simSecond)
        #expect(sim.procs["n2"]!.instance != old)
        for n in ["n1", "n3", "n4"] { #expect(sim.procs[n]!.space.ring.isLive("n2", boot: sim.procs["n2"]!.instance.boot)) }
        sim.run(for: 8 * simSecond)
        sim.quiesce()
        let gone = Set(abandoned.filter { sim.clients[$0]!.closedAt != nil })
        #expect(!gone.isEmpty)
        let timeouts = sim.passedLog.filter { gone.contains($0.event.publisher) && $0.event.type == .remoteTimeout }
        for t in timeouts {
            #expect(t.at >= crashed + sim.cfg.presenceTimeout && t.at <= crashed + sim.cfg.presenceTimeout + 700 * simMs,
                    "\(t.event.publisher) timed out \(Double(t.at - crashed) / 1e9) s after the crash")
        }
        #expect(sim.procs["n2"]!.space.owned.filter { !$0.value.isEmpty }.count > 0)
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A partition shorter than the timeout, then the heal: both sides kept going (a leave on
    /// one, a join and state changes on both), and their versions of the channel merge — with
    /// departures: the user who left does not come back, the one who joined is not lost, each
    /// user's later state wins; nobody flaps. Anti-entropy off: the merge alone must do it.
    @Test func aShortPartitionHeals() {
        var sim = R.scripted(seed: 46)
        sim.antiEntropy = false
        let key = R.channel(sim, owners: ["n1", "n2"])
        let leaver = sim.spawnClient(at: "n3"), joiner = sim.spawnClient(at: "n1"), near = sim.spawnClient(at: "n1")
        let far = sim.spawnClient(at: "n3"), w1 = sim.spawnClient(at: "n4"), w2 = sim.spawnClient(at: "n1")
        sim.run(for: 100 * simMs)
        for u in [leaver, near, far, w1, w2] {
            sim.request(u, .join(key, withPresence: true))
            sim.run(for: 100 * simMs)
        }
        sim.request(near, .setState(key, [R.item("s", "before")]))
        sim.request(far, .setState(key, [R.item("s", "before")]))
        sim.run(for: 500 * simMs)
        sim.partition(["n1"], for: 3 * simSecond, clientsMove: 0)
        sim.run(for: 1_500 * simMs)  // each side has a ring without the other: n2 took the channel over
        sim.request(leaver, .leave(key))
        sim.request(joiner, .join(key, withPresence: true))
        sim.request(near, .setState(key, [R.item("s", "near")]))
        sim.request(far, .setState(key, [R.item("s", "far")]))
        sim.run(for: 500 * simMs)
        for u in [leaver, joiner, near, far] { #expect(sim.clients[u]!.op == nil, "\(u)'s call was not acknowledged") }
        sim.run(for: 4 * simSecond)  // healed, merged
        let expected: [String: [StateItem]] = [joiner: [], near: [R.item("s", "near")], far: [R.item("s", "far")], w1: [], w2: []]
        #expect(Self.listed(sim, "n1", key) == expected)
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        for w in [w1, w2] {
            let view = sim.feedLogs[SimFeedKey(session: sim.clients[w]!.session, key: key)]?.view
            #expect(Set(view?.keys.map { $0 } ?? []) == Set(expected.keys), "\(w)'s view \(String(describing: view))")
        }
        sim.antiEntropy = true
        sim.quiesce(for: 3 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A replica cut off, with one gateway, from the owner and the members' gateway for longer
    /// than the presence timeout takes the channel over in its own view; the follower at that
    /// gateway follows it and sees the members time out. At the heal the replica hands the channel
    /// back: the follower must get the owner's SNAPSHOT and end with the owner's listing, and the
    /// follower at the owner's side keeps the members throughout. (Finding 18: the merge's
    /// SNAPSHOT for the follower was routed by the channel as it was before the merge, which had
    /// no place for it, and dropped; the follower kept the cut-off side's listing for good.)
    @Test func aFollowerOnTheCutOffSideGetsTheOwnersListingBackAfterTheHeal() {
        var sim = R.scripted(seed: 93)
        let key = R.channel(sim, owners: ["n2", "n1"])
        let members = [sim.spawnClient(at: "n3"), sim.spawnClient(at: "n3")]
        let watcher = sim.spawnClient(at: "n2"), farWatcher = sim.spawnClient(at: "n4")
        sim.run(for: 100 * simMs)
        for u in members + [watcher, farWatcher] {
            sim.request(u, .join(key, withPresence: true))
            sim.run(for: 100 * simMs)
        }
        sim.run(for: 500 * simMs)
        sim.partition(["n1", "n4"], for: 14 * simSecond, clientsMove: 0)
        sim.run(for: 18 * simSecond)  // n1 took the channel over, timed n3's sessions out; healed
        let view = sim.feedLogs[SimFeedKey(session: sim.clients[watcher]!.session, key: key)]?.view
        #expect(Set(members).isSubset(of: Set(view?.keys.map { $0 } ?? [])), "the watcher's view \(String(describing: view))")
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        sim.quiesce(for: 3 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A paused owner's late copies (the calls that waited in its socket, answered when it
    /// resumes, replicated to the node that took its channels over meanwhile) change nothing
    /// there: the later state set through the new owner stays, and the paused owner, back on
    /// the ring, takes the channel back with it.
    @Test func aPausedOwnersLateCopiesChangeNothing() {
        var sim = R.scripted(seed: 47)
        let key = R.channel(sim, owners: ["n2", "n3"])
        let u = sim.spawnClient(at: "n1"), w = sim.spawnClient(at: "n4")
        sim.run(for: 100 * simMs)
        sim.request(u, .join(key, withPresence: true))
        sim.request(w, .join(key, withPresence: true))
        sim.run(for: 300 * simMs)
        sim.pause("n2", for: 3 * simSecond, clientsMove: 0)
        sim.request(u, .setState(key, [R.item("k", "v1")]))  // waits in n2's socket; retried at n3
        sim.run(for: 2_300 * simMs)
        #expect(sim.clients[u]!.op == nil, "u's call was not answered by the new owner")
        sim.request(u, .setState(key, [R.item("k", "v2")]))
        sim.run(for: 4 * simSecond)  // n2 resumed, answered the late call, is back on the ring
        #expect(Self.listed(sim, "n2", key) == [u: [R.item("k", "v2")], w: []])
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        sim.quiesce(for: 3 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// An owner acknowledges a leave, but the replica copy carrying it waits on a cut link (the
    /// answer goes after the replication wait), and the owner dies: its replica takes the channel
    /// over with the session still in. Only anti-entropy can tell — the session's gateway does not
    /// hold it there — and it is gone within two rounds.
    @Test func aLeaveANewOwnerNeverHeardOfIsRepairedByAntiEntropy() {
        var sim = R.scripted(seed: 48) { $0.crashLossWindow = 0 }
        let key = R.channel(sim, owners: ["n4", "n3"])
        let u = sim.spawnClient(at: "n1"), w = sim.spawnClient(at: "n2")
        sim.run(for: 100 * simMs)
        sim.request(u, .join(key, withPresence: true))
        sim.request(w, .join(key, withPresence: true))
        sim.run(for: 500 * simMs)
        sim.cutLink("n4", "n3", for: 30 * simSecond)
        sim.request(u, .leave(key))
        sim.run(for: 1_200 * simMs)
        #expect(sim.clients[u]!.op == nil, "the leave was not acknowledged")
        sim.antiEntropy = false
        sim.crash("n4", resume: 0)
        sim.run(for: 1_500 * simMs)
        #expect(sim.procs["n3"]!.space[owned: key]?.contains(user: u) == true, "(the new owner did not miss the leave: nothing to repair)")
        sim.antiEntropy = true
        sim.run(for: 2_500 * simMs)
        #expect(Self.listed(sim, "n3", key) == [w: []])
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        sim.quiesce(for: 3 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A node restarted as a new process owns channels again, but their handoff is held up (the
    /// link from their previous owner is slow to come back): until it arrives, the new process
    /// must not serve them from an empty slate — a session joining meanwhile gets, as its first
    /// SNAPSHOT, every member the channel had.
    @Test func aRestartedNodeServesItsChannelsOnlyOnceTheyAreHandedToIt() {
        var sim = R.scripted(seed: 49)
        let key = R.channel(sim, owners: ["n2", "n3"])
        let members = [sim.spawnClient(at: "n1"), sim.spawnClient(at: "n3"), sim.spawnClient(at: "n4")]
        let late = sim.spawnClient(at: "n1")
        sim.run(for: 100 * simMs)
        for u in members { sim.request(u, .join(key, withPresence: false)) }
        sim.run(for: 500 * simMs)
        sim.crash("n2", resume: 0)
        sim.run(for: 2 * simSecond)  // n3 took the channel over
        sim.restart("n2")
        sim.cutLink("n3", "n2", for: 1_500 * simMs)  // its handoff to the new process waits
        sim.run(for: 300 * simMs)
        sim.request(late, .join(key, withPresence: true))
        sim.run(for: 4 * simSecond)
        let s = sim.clients[late]!.session
        let first = sim.passedLog.first { $0.session == s && $0.key == key && $0.event.type == .snapshot }
        #expect(Set(first?.event.snapshot.map(\.userID) ?? []) == Set(members + [late]), "first SNAPSHOT: \(first?.event.snapshot.map(\.userID) ?? [])")
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// Deliveries shed from a queue that grew while a gateway's link was down are lost: the owner
    /// restarts whoever follows there, so their SNAPSHOT + events still add up to the listing
    /// (the joins it missed included: nothing later makes up for those).
    @Test func aShedQueueGivesItsFollowersAFreshSnapshot() {
        var sim = R.scripted(seed: 50) { $0.heldDeliveryLimit = 2 }
        let key = R.channel(sim, owners: ["n2", "n3"])
        let watcher = sim.spawnClient(at: "n1")
        let joiners = (0..<6).map { i in sim.spawnClient(at: i % 2 == 0 ? "n3" : "n4") }
        sim.run(for: 100 * simMs)
        sim.request(watcher, .join(key, withPresence: true))
        sim.run(for: 500 * simMs)
        sim.cutLink("n2", "n1", for: 600 * simMs)  // no ring change: pushes wait, then are shed
        for u in joiners {
            sim.request(u, .join(key, withPresence: false))
            sim.run(for: 60 * simMs)
        }
        sim.run(for: 2 * simSecond)
        let view = sim.feedLogs[SimFeedKey(session: sim.clients[watcher]!.session, key: key)]?.view
        #expect(view.map { Set($0.keys) } == Set(joiners + [watcher]))
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A gateway paused past failure detection: owners skip its sessions' events meanwhile (it is
    /// off their ring), and when it is back its subscribers get a fresh SNAPSHOT — no gap.
    @Test func aPausedGatewaysSubscribersGetAFreshSnapshotWhenItIsBack() {
        var sim = R.scripted(seed: 53)
        let key = R.channel(sim, owners: ["n2", "n3"])
        let watcher = sim.spawnClient(at: "n1"), leaver = sim.spawnClient(at: "n4"), stayer = sim.spawnClient(at: "n3")
        sim.run(for: 100 * simMs)
        for u in [watcher, leaver, stayer] { sim.request(u, .join(key, withPresence: true)) }
        sim.run(for: 500 * simMs)
        sim.pause("n1", for: 2_500 * simMs, clientsMove: 0)
        sim.run(for: 1_500 * simMs)  // the others dropped n1
        sim.request(leaver, .leave(key))
        sim.request(stayer, .setState(key, [R.item("k", "v")]))
        sim.run(for: 3 * simSecond)  // n1 resumed, and is back on the ring
        let view = sim.feedLogs[SimFeedKey(session: sim.clients[watcher]!.session, key: key)]?.view
        #expect(view == [watcher: [], stayer: [R.item("k", "v")]])
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }

    /// A session that resumes across a partition, after following the lineage the other side
    /// started for its channel (numbered higher: it started later), sees no sequence go back.
    @Test func aSessionResumedAcrossAPartitionSeesNoOlderSequence() {
        var sim = R.scripted(seed: 21) { $0.wallSkew = 0 }
        let key = R.channel(sim, owners: ["n1", "n2"])
        let u = sim.spawnClient(at: "n4"), w = sim.spawnClient(at: "n3")
        sim.run(for: 200 * simMs)
        sim.request(u, .join(key, withPresence: true))
        sim.request(w, .join(key, withPresence: true))
        sim.run(for: 2 * simSecond)
        sim.partition(["n4"], for: 5 * simSecond, clientsMove: 0)
        sim.run(for: 2_500 * simMs)  // n4 owns the channel on its side now (its anti-entropy put u there)
        sim.request(w, .setState(key, [R.item("k", "1")]))
        sim.move(u, to: "n2")
        sim.run(for: 6 * simSecond)
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        sim.quiesce(for: 4 * simSecond)
        #expect(sim.convergenceProblems().isEmpty, "\(sim.convergenceProblems())")
    }
}

// MARK: - Two PresenceNode rules the simulation found missing, and now checks

@Suite struct KeyspaceSimulationGatewayRuleTests {
    typealias R = SimRuns

    /// A restarted node's anti-entropy exchanges must wait for its handoffs, like calls do
    /// (PeerInbound.exchange filters keys through the handoff gate): otherwise it builds a channel
    /// from one gateway's facts before its handoff arrives, its whole copy of that partial value
    /// replaces the complete copy of a replica that has not seen the restart yet, and what only
    /// the crashed gateway held (the state of a session that resumes elsewhere) is lost.
    @Test func aRestartedNodesExchangesWaitForItsHandoffs() {
        var sim = R.scripted(nodes: 3, seed: 51) { $0.gateExchanges = true }
        let key = R.channel(sim, owners: ["n3", "n2"])
        let u = sim.spawnClient(at: "n3"), g = sim.spawnClient(at: "n1")
        sim.run(for: 100 * simMs)
        sim.request(u, .join(key, withPresence: false))
        sim.request(g, .join(key, withPresence: false))
        sim.run(for: 300 * simMs)
        sim.request(u, .setState(key, [R.item("k", "acknowledged")]))
        sim.run(for: 300 * simMs)
        sim.antiEntropy = false
        sim.crash("n3", resume: 0)
        sim.run(for: 200 * simMs)
        // n1 learns of the new process at once and runs anti-entropy; n2 only 300 ms later
        sim.restart("n3", gossip: ["n1": 5 * simMs, "n2": 300 * simMs])
        sim.run(for: 20 * simMs)
        sim.antiEntropyNow("n1")
        sim.run(for: 50 * simMs)
        sim.move(u, to: "n1")
        sim.antiEntropy = true
        // (past the presence timeout: the crashed process's other sessions have timed out)
        sim.quiesce(for: 7 * simSecond)
        let problems = sim.convergenceProblems()
        #expect(problems.isEmpty, "\(problems)")
    }

    /// A gateway told its session was claimed elsewhere without being told where (an owner's
    /// SESSION_MOVED or anti-entropy verdict) leaves owners' placements of it alone: answering
    /// "not here" would make an owner the new gateway cannot reach yet (a cut link) drop the
    /// membership — REMOTE_LEAVE for a user who never left — until the new gateway put it back.
    @Test func aSessionSupersededElsewhereIsNotDroppedByAnOwnerItsNewGatewayCannotReach() {
        var sim = R.scripted(seed: 52)
        let k1 = R.channel(sim, owners: ["n1", "n2"]), k2 = R.channel(sim, owners: ["n2", "n4"])
        let u = sim.spawnClient(at: "n1"), w = sim.spawnClient(at: "n4")
        sim.run(for: 100 * simMs)
        sim.request(u, .join(k1, withPresence: true))
        sim.run(for: 100 * simMs)
        sim.request(u, .join(k2, withPresence: true))
        sim.request(w, .join(k1, withPresence: true))
        sim.run(for: 500 * simMs)
        sim.cutLink("n1", "n3", for: 4 * simSecond)
        sim.move(u, to: "n3")
        sim.run(for: 3 * simSecond)
        #expect(sim.violations.isEmpty, "\(sim.violations)")
        #expect(sim.knownGaps.isEmpty, "\(sim.knownGaps)")
    }

    /// A process still joining learns the members one at a time (each a ring change), while each
    /// of them, knowing the whole ring at once, hands off and says "done" for that ring, before
    /// the new process has reached it. Those "done"s were dropped at its first intermediate ring
    /// change, so it held its keys back for the whole handoff limit (3 s) once it got there.
    @Test func aJoiningNodeThatLearnsTheMembersOneByOneCountsTheDoneSentForTheWholeRing() {
        var sim = R.scripted(seed: 53)
        let key = R.channel(sim, owners: ["n4", "n1"])
        let u = sim.spawnClient(at: "n1")
        sim.run(for: 100 * simMs)
        sim.crash("n4", resume: 0)
        sim.run(for: 2 * simSecond)  // the others dropped it
        // n1 (its seed) is known at once, n2 and n3 a ring change each later; they learn of the
        // new process at once
        sim.restart("n4", gossip: ["n1": 5 * simMs, "n2": 5 * simMs, "n3": 5 * simMs],
                    learnsLate: ["n2": 100 * simMs, "n3": 200 * simMs])
        sim.run(for: 300 * simMs)
        #expect(sim.procs["n4"]!.gate.pending.isEmpty, "still waiting for \(sim.procs["n4"]!.gate.pending.sorted())")
        sim.request(u, .join(key, withPresence: false))
        sim.run(for: 500 * simMs)
        #expect(sim.clients[u]!.channels[key] != nil, "the join was not answered within 500 ms")
        #expect(sim.violations.isEmpty, "\(sim.violations)")
    }

    /// An owner whose replica is slow (its link cut, not dead) waits for it only as long as the
    /// gateway's attempt leaves: found by `ClusterTests`, a write through another node outwaited
    /// every attempt of its gateway (0.7 s, against the owner's 1 s replication wait) and its
    /// client got UNAVAILABLE, for a write the owner had made; here the client's call is retried
    /// until the link heals.
    @Test func aWriteThroughAnotherNodeWhileItsReplicaIsSlowIsAnsweredWithinTheGatewaysAttempt() {
        var sim = R.scripted(seed: 54) { $0.callTimeout = 700 * simMs }
        let key = R.channel(sim, owners: ["n2", "n3"])
        let u = sim.spawnClient(at: "n1")
        sim.run(for: 100 * simMs)
        sim.request(u, .join(key, withPresence: false))
        sim.run(for: 500 * simMs)
        #expect(sim.clients[u]!.op == nil && sim.clients[u]!.channels[key] != nil, "the join was not answered")
        sim.cutLink("n2", "n3", for: 4 * simSecond)
        sim.request(u, .setState(key, [R.item("mic", "on")]))
        sim.run(for: 1_500 * simMs)
        #expect(sim.clients[u]!.op == nil, "the write was not answered while its replica's link was cut")
        #expect(sim.clients[u]!.state[key] == StateItems([R.item("mic", "on")]), "\(String(describing: sim.clients[u]!.state[key]))")
        sim.run(for: 4 * simSecond)
        #expect(sim.violations.isEmpty, "\(sim.violations)")
    }
    /// Found by Cluster/chaos (netns seed 2, a 2 s partition of one node): back, the node refused
    /// its keys for the whole handoff limit (3 s; a Join took 5.15 s to answer). Its return from
    /// death forgot the "done"s that had arrived just before, and it asked the others about the
    /// ring it had then, not the one it moved to a moment later: the members that had said "done"
    /// for that ring already said nothing more. Now it asks the members it still waits for again,
    /// for its current ring, every `handoffAskAgain`.
    @Test func aNodeBackFromDeathAsksAgainForTheHandoffsWhoseDoneItForgot() {
        for askAgain in [UInt64(0), 300 * simMs] {
            var sim = R.scripted(seed: 55) { $0.handoffAskAgain = askAgain }
            let key = R.channel(sim, owners: ["n4", "n1"])
            let u = sim.spawnClient(at: "n1")
            sim.run(for: 100 * simMs)
            sim.pause("n4", for: 3 * simSecond, clientsMove: 0)
            sim.run(for: 3 * simSecond)
            // resumed: while cut off it had come to believe n1 dead (its view differs from the
            // others' for a moment); the others add it back and say "done" for the whole ring
            sim.see("n4", "n1", add: false)
            sim.run(for: 800 * simMs)
            #expect(sim.procs["n2"]!.space.ring.members.contains("n4"), "the others have not added n4 back yet")
            // only now does it hear that it was declared dead; then it sees n1 alive again
            sim.returnFromDeath("n4")
            sim.see("n4", "n1", add: true, after: 50 * simMs)
            sim.run(for: 100 * simMs)
            sim.request(u, .join(key, withPresence: false))
            sim.run(for: 900 * simMs)
            let answered = sim.clients[u]!.channels[key] != nil
            if askAgain == 0 {
                #expect(!answered, "without asking again the node should still refuse (the test no longer reproduces the finding)")
            } else {
                #expect(answered, "the join was not answered within 900 ms: n4 still waits for \(sim.procs["n4"]!.gate.pending.sorted())")
            }
            sim.run(for: 4 * simSecond)
            #expect(sim.clients[u]!.channels[key] != nil)
            #expect(sim.violations.isEmpty, "\(sim.violations)")
        }
    }
}
