// The replicated keyspace's rules (`Keyspace`, `ChannelMachine`, `HomeRecord`, `SessionTable`) as
// plain values: copies, merges, departures, ring changes, timeouts and handoffs, each tested with
// inputs and clock readings only. Distributed behaviour on the real nodes is the deterministic
// simulation's (`Tests/PresenceNodeTests/Simulation`).

import ClusterCore
import PresenceCore
import PresenceWire
import Testing

@Suite struct KeyspaceRuleTests {
    typealias Machine = ChannelMachine<NodeInstance>
    let key = ChannelKey(name: "room", type: .message)
    let s = SessionID(raw: 7)
    let a = NodeInstance("a", boot: 1), b = NodeInstance("b", boot: 1), g = NodeInstance("g", boot: 1)
    let second: UInt64 = 1_000_000_000

    /// A session version.
    func v(_ epoch: UInt64, _ counter: UInt64) -> UInt64 { SessionVersion.make(epoch: epoch, counter: counter) }
    /// A state item.
    func item(_ k: String, _ value: String) -> StateItem { StateItem(key: k, value: value) }

    /// A channel keyspace of node `me` on `ring`, with a 5 s presence timeout.
    func space(_ me: String, _ ring: HashRing, copies: Int = 1) -> Keyspace<Machine> {
        Keyspace(me: me, replicationFactor: copies, presenceTimeout: 5 * second, ring: ring) { Machine(key: $0, maxInstantEvents: 100) }
    }

    /// A key `owner` owns on `ring`.
    func key(ownedBy owner: String, on ring: HashRing) -> ChannelKey {
        (0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first { ring.owner(ofHash: StableHash.of($0)) == owner }!
    }

    /// The SNAPSHOTs among a keyspace's effects.
    func snapshots(in effects: [Keyspace<Machine>.Effect]) -> [RoutedDelivery<NodeInstance>] {
        effects.flatMap { e -> [RoutedDelivery<NodeInstance>] in
            if case .deliver(let ds) = e { return ds.filter(\.isSnapshot) }
            return []
        }
    }

    /// A key held by `first` on `a` (owner, replica) and by `then` on `b`.
    func key(replicatedBy first: [String], on a: HashRing, thenBy then: [String], on b: HashRing) -> ChannelKey? {
        (0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first {
            a.owners(of: $0, count: 2) == first && b.owners(of: $0, count: 2) == then
        }
    }

    /// A session's departure is recorded as of its own version, not "not held anywhere": a later epoch of it is still taken.
    @Test func aSessionGoneFromOneGatewayIsNotRefusedAtTheNext() {
        var m = Machine(key: key, maxInstantEvents: 100)
        _ = m.join(user: "u", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1)
        _ = m.removeGone(s, at: a, version: .max, now: 2)  // a: "not here at all" (it moved on)
        #expect(m.leftAfter(s, v(1, 5)))  // a's delayed word of that epoch stays out
        #expect(m.supersedingVersion(of: s, v(2, 0)) == nil)
        let o = m.announce(user: "u", session: s, withPresence: false, sink: b, version: v(2, 0), now: 3)
        #expect(o.superseded == nil && m.contains(user: "u", session: s))
        #expect(m.supersedingVersion(of: s, v(1, 5)) != nil)
    }

    /// A timeout removes the session even when it makes no event for anyone (nobody there follows presence).
    @Test func aTimeoutThatMakesNoEventStillRemovesTheSession() {
        let ring = HashRing(members: ["a", "g"], boots: ["a": 1, "g": 1])
        let key = key(ownedBy: "a", on: ring)
        var ks = space("a", ring)
        _ = try? ks.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u", session: s, withPresence: false, sink: g, version: v(1, 1), now: 1_000)
        }
        _ = ks.ringChanged(to: HashRing(members: ["a"], boots: ["a": 1]), now: 0, wall: 1_000)
        #expect(ks.orphanKeys == [key])
        _ = ks.sweep(now: 5 * second + 1, wall: 7_000)
        #expect(ks[owned: key]?.contains(user: "u") != true)
        #expect(ks.orphanKeys.isEmpty)
    }

    /// Followers at a process thought gone that comes back (paused, cut off) get a fresh SNAPSHOT: events sent meanwhile were skipped.
    @Test func followersAtAProcessThatComesBackGetAFreshSnapshot() {
        let ring = HashRing(members: ["a", "g"], boots: ["a": 1, "g": 1])
        let key = key(ownedBy: "a", on: ring)
        var ks = space("a", ring)
        _ = try? ks.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        }
        _ = ks.ringChanged(to: HashRing(members: ["a"], boots: ["a": 1]), now: 1, wall: 2_000)  // g thought gone
        let back = ks.ringChanged(to: ring, now: 2 * second, wall: 4_000)  // the same process is back
        let snapshots = self.snapshots(in: back)
        #expect(snapshots.map(\.sink) == [g] && snapshots.first?.sessions == [s])
    }

    /// A replica copy dropped by a passing ring is kept a while, restored (asking the owner for a whole copy) or taken over from if the
    /// ring comes back.
    @Test func aReplicaWhoseRingPassesThroughAnotherKeepsItsCopyForWhenItComesBack() throws {
        let r0 = HashRing(members: ["o", "r", "x"], boots: ["o": 1, "r": 1, "x": 1])
        let r1 = r0.adding("y", boot: 1)   // y comes back first: for a moment it is the replica
        let key = try #require(self.key(replicatedBy: ["o", "r"], on: r0, thenBy: ["o", "y"], on: r1))
        var owner = Machine(key: key, maxInstantEvents: 100)
        _ = owner.join(user: "u", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        var replica = space("r", r0, copies: 2)
        for c in owner.fullCopies() { _ = replica.received(c, from: "o", now: 1, wall: 1_000) }
        #expect(replica.copies[key]?.contains(user: "u") == true)
        _ = replica.ringChanged(to: r1, now: 2, wall: 2_000)
        #expect(replica.copies[key] == nil)   // not a replica on this ring
        // the ring comes back (y is dropped again) while the owner's ring never changed: the owner
        // sends nothing, so the replica restores what it had and asks the owner for a whole copy
        let back = replica.ringChanged(to: r0, now: 3, wall: 3_000)
        #expect(replica.copies[key]?.contains(user: "u") == true)
        #expect(back.contains { if case .askForCopy(key, "o") = $0 { true } else { false } })
        // the owner crashes: the replica takes over with the session
        _ = replica.ringChanged(to: r0.removing("o"), now: 4, wall: 4_000)
        #expect(replica[owned: key]?.contains(user: "u") == true)
    }

    /// A copy dropped and never wanted back is forgotten after a while; one whose key this
    /// node comes to own meanwhile is taken over from.
    @Test func aDroppedCopyIsForgottenLaterOrTakenOverFrom() throws {
        let r0 = HashRing(members: ["o", "r", "x"], boots: ["o": 1, "r": 1, "x": 1])
        let r1 = r0.adding("y", boot: 1)
        let key = try #require(self.key(replicatedBy: ["o", "r"], on: r0, thenBy: ["o", "y"], on: r1))
        var owner = Machine(key: key, maxInstantEvents: 100)
        _ = owner.join(user: "u", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        var replica = space("r", r0, copies: 2)
        for c in owner.fullCopies() { _ = replica.received(c, from: "o", now: 1, wall: 1_000) }
        _ = replica.ringChanged(to: r1, now: 2, wall: 2_000)
        // the owner died meanwhile, and y went again: this node is the owner now
        let taken = replica.ringChanged(to: r0.removing("o"), now: 3, wall: 3_000)
        #expect(replica[owned: key]?.contains(user: "u") == true)
        #expect(taken.contains { if case .deliver(let ds) = $0 { ds.contains(where: \.isSnapshot) } else { false } })   // a fresh start
        var other = space("r", r0, copies: 2)
        for c in owner.fullCopies() { _ = other.received(c, from: "o", now: 1, wall: 1_000) }
        _ = other.ringChanged(to: r1, now: 2, wall: 2_000)
        _ = other.ringChanged(to: r1.adding("z", boot: 1), now: 3, wall: 2_000 + 6_000)   // a presence timeout later
        _ = other.ringChanged(to: r0, now: 4, wall: 2_000 + 6_001)
        #expect(other.copies[key] == nil)
    }

    /// A restored copy is not trusted for long: the owner's whole copy replaces it whatever
    /// lineage it held (it may come from the far side of a partition), and one the owner never
    /// confirms (it does not count this node as a replica) goes a presence timeout after its drop.
    @Test func aRestoredCopyTakesTheOwnersWholeCopyOrGoes() throws {
        let r0 = HashRing(members: ["o", "r", "x"], boots: ["o": 1, "r": 1, "x": 1])
        let r1 = r0.adding("y", boot: 1)
        let key = try #require(self.key(replicatedBy: ["o", "r"], on: r0, thenBy: ["o", "y"], on: r1))
        var far = Machine(key: key, maxInstantEvents: 100)   // a lineage numbered above the owner's
        far.startLineage(now: 9_000_000)
        _ = far.join(user: "stale", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        var owner = Machine(key: key, maxInstantEvents: 100)
        _ = owner.join(user: "u", session: SessionID(raw: 8), withPresence: true, sink: b, version: v(1, 1), now: 1_000)
        var replica = space("r", r0, copies: 2)
        for c in far.fullCopies() { _ = replica.received(c, from: "o", now: 1, wall: 1_000) }
        _ = replica.ringChanged(to: r1, now: 2, wall: 2_000)
        _ = replica.ringChanged(to: r0, now: 3, wall: 2_500)
        #expect(replica.unconfirmed[key] == 2_000)
        for c in owner.fullCopies() { _ = replica.received(c, from: "o", now: 4, wall: 3_000) }
        #expect(replica.copies[key]?.contains(user: "u") == true && replica.copies[key]?.contains(user: "stale") == false)
        #expect(replica.unconfirmed[key] == nil)
        // never confirmed: gone 5 s (the presence timeout) after the first drop
        var lonely = space("r", r0, copies: 2)
        for c in owner.fullCopies() { _ = lonely.received(c, from: "o", now: 1, wall: 1_000) }
        _ = lonely.ringChanged(to: r1, now: 2, wall: 2_000)
        _ = lonely.ringChanged(to: r0, now: 3, wall: 2_500)
        #expect(lonely.copies[key] != nil)
        _ = lonely.ringChanged(to: r0.adding("z", boot: 1).removing("z"), now: 4, wall: 7_000)
        #expect(lonely.copies[key] == nil && lonely.unconfirmed.isEmpty)
    }

    /// A key taken over from a dropped or unconfirmed copy answers no call and sends no SNAPSHOT until another node's version is merged
    /// or `staleHold` passes.
    @Test func aKeyTakenOverFromADroppedCopyIsNotServedUntilBroughtUpToDate() throws {
        let r0 = HashRing(members: ["o", "r", "x"], boots: ["o": 1, "r": 1, "x": 1])
        let r1 = r0.adding("y", boot: 1)
        let key = try #require(self.key(replicatedBy: ["o", "r"], on: r0, thenBy: ["o", "y"], on: r1))
        var owner = Machine(key: key, maxInstantEvents: 100)
        owner.startLineage(now: 1_000)
        _ = owner.join(user: "early", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        var ks = Keyspace<Machine>(me: "r", replicationFactor: 2, presenceTimeout: 5 * second, staleHold: second, ring: r0) {
            Machine(key: $0, maxInstantEvents: 100)
        }
        for c in owner.fullCopies() { _ = ks.received(c, from: "o", now: 1, wall: 1_000) }
        _ = ks.ringChanged(to: r1, now: 2, wall: 2_000)   // a passing replica: r drops its copy
        // the owner goes on: "late" joins, which r never hears of
        _ = owner.join(user: "late", session: SessionID(raw: 8), withPresence: true, sink: b, version: v(1, 1), now: 3_000)
        // r's ring loses the owner (stale gossip after a heal): r owns the key, from its dropped copy
        let t0 = 4 * second
        let taken = ks.ringChanged(to: r0.removing("o"), now: t0, wall: 4_000)
        #expect(ks[owned: key]?.contains(user: "early") == true && ks[owned: key]?.contains(user: "late") == false)
        #expect(snapshots(in: taken).isEmpty)   // no SNAPSHOT that leaves "late" out
        #expect(ks.isStale(key, now: t0 + 1) && ks.heldBack == [key])
        #expect(snapshots(in: ks.releaseHeldBack(now: t0 + second / 2, wall: 4_500, mayServe: { _ in true })).isEmpty)
        // the owner's version arrives (it hands the key over): merged, the hold ends, and the
        // fresh start shows everyone
        for c in owner.fullCopies(handoff: true) { _ = ks.received(c, from: "o", now: t0 + second / 2, wall: 4_500) }
        #expect(!ks.isStale(key, now: t0 + second / 2))
        let released = snapshots(in: ks.releaseHeldBack(now: t0 + second / 2 + 1, wall: 4_600, mayServe: { _ in true }))
        #expect(Set(released.map(\.sink)) == [a, b] && ks.heldBack.isEmpty)
        // without it, the hold ends after `staleHold` (gateways' anti-entropy has repaired it by then)
        var lone = Keyspace<Machine>(me: "r", replicationFactor: 2, presenceTimeout: 5 * second, staleHold: second, ring: r0) {
            Machine(key: $0, maxInstantEvents: 100)
        }
        for c in owner.fullCopies() { _ = lone.received(c, from: "o", now: 1, wall: 1_000) }
        _ = lone.ringChanged(to: r1, now: 2, wall: 2_000)
        _ = lone.ringChanged(to: r0.removing("o"), now: t0, wall: 4_000)
        #expect(snapshots(in: lone.releaseHeldBack(now: t0 + second - 1, wall: 4_999, mayServe: { _ in true })).isEmpty)
        #expect(!snapshots(in: lone.releaseHeldBack(now: t0 + second, wall: 5_000, mayServe: { _ in true })).isEmpty)
        #expect(!lone.isStale(key, now: t0 + second) && lone.staleUntil.isEmpty)
    }

    /// A replica skips a change or whole copy older than the one it holds, of the same lineage.
    @Test func aWholeCopyOlderThanTheOneHeldIsSkipped() {
        let ring = HashRing(members: ["o", "r"], boots: ["o": 1, "r": 1])
        let key = key(ownedBy: "o", on: ring)
        var owner = Machine(key: key, maxInstantEvents: 100)
        owner.startLineage(now: 1_000)
        _ = owner.join(user: "u", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        let before = owner.fullCopies()
        _ = owner.leave(user: "u", session: s, version: v(1, 2), now: 2_000)
        _ = owner.join(user: "w", session: SessionID(raw: 9), withPresence: true, sink: b, version: v(1, 1), now: 2_100)
        let after = owner.fullCopies()
        var replica = space("r", ring, copies: 2)
        for c in after { _ = replica.received(c, from: "o", now: 1, wall: 3_000) }
        for c in before { _ = replica.received(c, from: "o", now: 2, wall: 3_100) }   // late, relayed
        #expect(replica.copies[key]?.contains(user: "u") == false && replica.copies[key]?.contains(user: "w") == true)
    }

    /// Fresh starts of keys this node waits to be handed back are held until it may serve them.
    @Test func followersOfAKeyWaitingForItsHandoffGetTheirSnapshotOnlyOnceItMayServe() {
        let ring = HashRing(members: ["a", "g"], boots: ["a": 1, "g": 1])
        let key = key(ownedBy: "a", on: ring)
        var ks = space("a", ring)
        _ = try? ks.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        }
        #expect(ks.restart(followersAt: "g", now: 2, wall: 2_000, mayServe: { _ in false }).isEmpty)
        #expect(ks.heldBack == [key])
        #expect(ks.releaseHeldBack(now: 3, wall: 2_500, mayServe: { _ in false }).isEmpty && ks.heldBack == [key])
        #expect(snapshots(in: ks.releaseHeldBack(now: 4, wall: 3_000, mayServe: { _ in true })).map(\.sink) == [g])
        #expect(ks.heldBack.isEmpty)
    }

    /// A node back from a cut handed its stale version of a key to the new owner, which had nothing
    /// of it and still waited for the live holder's handoff. It started the key from the stale
    /// one and sent every follower a SNAPSHOT without the users the live holder had; their joins
    /// came with its handoff a moment later (simulation seed 184 with model clients that Watch).
    /// Started while the handoff gate refuses it, the key is held back; its fresh start comes
    /// once the gate opens, or when a call the gate lets through reaches it first.
    @Test func aKeyStartedByTheFirstOfSeveralHandoffsWaitsForTheGateBeforeItsSnapshots() {
        let ring = HashRing(members: ["n", "o"], boots: ["n": 1, "o": 1])
        let key = key(ownedBy: "n", on: ring)
        var stale = Machine(key: key, maxInstantEvents: 100), live = stale
        stale.startLineage(now: 1_000)
        _ = stale.join(user: "u", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        live = stale
        _ = live.join(user: "w", session: SessionID(raw: 9), withPresence: true, sink: b, version: v(1, 1), now: 2_000)
        var ks = space("n", ring)
        for c in stale.fullCopies(handoff: true) {
            #expect(snapshots(in: ks.received(c, from: "o", now: 1, wall: 3_000, mayServe: { _ in false })).isEmpty)
        }
        #expect(ks.owned[key] != nil && ks.heldBack == [key])
        for c in live.fullCopies(handoff: true) { _ = ks.received(c, from: "o", now: 2, wall: 3_100, mayServe: { _ in false }) }
        let released = snapshots(in: ks.releaseHeldBack(now: 3, wall: 3_200, mayServe: { _ in true }))
        #expect(Set(released.map(\.sink)) == [a, b] && released.allSatisfy { $0.event.snapshot.map(\.userID) == ["u", "w"] })
        #expect(ks.heldBack.isEmpty)
        // a call the gate lets through before the release loop's next look releases it first
        var early = space("n", ring)
        for c in stale.fullCopies(handoff: true) { _ = early.received(c, from: "o", now: 1, wall: 3_000, mayServe: { _ in false }) }
        #expect(snapshots(in: early.releaseHeldBack(key, wall: 3_100)).map(\.sink) == [a] && early.heldBack.isEmpty)
        #expect(early.releaseHeldBack(key, wall: 3_200).isEmpty)
        // with the gate open, the first handoff starts the key at once
        var open = space("n", ring)
        var started: [Keyspace<Machine>.Effect] = []
        for c in stale.fullCopies(handoff: true) { started += open.received(c, from: "o", now: 1, wall: 3_000) }
        #expect(snapshots(in: started).map(\.sink) == [a] && open.heldBack.isEmpty)
    }

    /// An owner whose serving lease ran out (cut off from the others) times nobody out: it cannot
    /// tell the gateway gone from its own cut. It looks again a `recheck` later, and once it holds
    /// the lease again every absence it counted runs at least `grace` more, time for the word it
    /// missed (a resume elsewhere) to reach it. An owner alone in a partition timed out a user
    /// whose session had resumed at another gateway meanwhile (simulation seed 2104 with model
    /// clients that roam).
    @Test func anOwnerCutOffFromTheOthersTimesNobodyOutUntilItHearsFromThemAgain() {
        let ring = HashRing(members: ["n", "g"], boots: ["n": 1, "g": 1]), alone = HashRing(members: ["n"], boots: ["n": 1])
        let key = key(ownedBy: "n", on: ring)
        var ks = space("n", ring)
        _ = try? ks.withOwned(key, create: true, now: 1_000) { m in
            m.startLineage(now: 1_000)
            _ = m.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        }
        _ = ks.ringChanged(to: alone, now: 10 * second, wall: 10_000)   // g gone from here at 10 s
        // due at 14 s, but the lease ran out: nothing, and the next look is a recheck later
        #expect(ks.sweep(now: 14 * second, wall: 14_000, holdsLease: false, recheck: second / 5, grace: 2 * second).isEmpty)
        #expect(ks.owned[key]?.contains(user: "u", session: s) == true)
        #expect(ks.nextOrphanDeadline == 14 * second + second / 5)
        // back with the lease at 15 s: the absence runs 2 s more
        _ = ks.sweep(now: 15 * second, wall: 15_000, holdsLease: true, recheck: second / 5, grace: 2 * second)
        #expect(ks.owned[key]?.contains(user: "u", session: s) == true)
        #expect(ks.nextOrphanDeadline == 17 * second)
        _ = ks.sweep(now: 17 * second, wall: 17_000, holdsLease: true, recheck: second / 5, grace: 2 * second)
        #expect(ks.owned[key]?.contains(user: "u", session: s) == false)
    }

    /// The other side of a partition, cut off from a gateway, timed its session out; the gateway
    /// crashed just before the heal, and the version with the timeout reached the owner less
    /// than a presence timeout after the crash. The owner applied it: the user left the channel
    /// while its client was still within the timeout to resume (simulation seed 385 with model
    /// clients that Watch). A timeout the other version decided counts only for a gateway this
    /// node has given up on too; else this node's own count of the absence times the session out.
    @Test func aTimeoutTheOtherVersionDecidedWaitsForThisNodesOwnCountOfTheGatewaysAbsence() {
        let ring = HashRing(members: ["n", "g"], boots: ["n": 1, "g": 1]), alone = HashRing(members: ["n"], boots: ["n": 1])
        let key = key(ownedBy: "n", on: ring)
        var mine = Machine(key: key, maxInstantEvents: 100)
        mine.startLineage(now: 1_000)
        _ = mine.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        var other = mine
        _ = other.timeOut(at: g, now: 2_000)
        func owner() -> Keyspace<Machine> {
            var ks = space("n", ring)
            _ = try? ks.withOwned(key, create: true, now: 1_000) { $0 = mine }
            _ = ks.ringChanged(to: alone, now: 10 * second, wall: 10_000)   // g gone from here at 10 s
            return ks
        }
        var ks = owner()
        for c in other.fullCopies(handoff: true) { _ = ks.received(c, from: "n", now: 11 * second, wall: 11_000) }
        #expect(ks.owned[key]?.contains(user: "u", session: s) == true)
        _ = ks.sweep(now: 15 * second - 1, wall: 14_999)
        #expect(ks.owned[key]?.contains(user: "u", session: s) == true)
        _ = ks.sweep(now: 15 * second, wall: 15_000)
        #expect(ks.owned[key]?.contains(user: "u", session: s) == false)
        // the sender's word that g has been gone a presence timeout already counts
        var told = owner()
        for c in other.fullCopies(handoff: true) { _ = told.received(c, from: "n", gone: [g: 5 * second], now: 11 * second, wall: 11_000) }
        #expect(told.owned[key]?.contains(user: "u", session: s) == false)
    }

    /// Followers at a process that comes back get a fresh start only from the keys this node keeps; a key it hands off is the new owner's
    /// to restart.
    @Test func aKeyHandedOffInTheRingChangeThatBringsItsFollowersBackSendsThemNoSnapshot() throws {
        let full = HashRing(members: ["a", "b", "g"], boots: ["a": 1, "b": 1, "g": 1])
        let alone = HashRing(members: ["a"], boots: ["a": 1])
        // b owns the key, a holds its copy; a follower and another member live at g
        let key = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first {
            full.owners(of: $0, count: 2) == ["b", "a"]
        })
        var owner = Machine(key: key, maxInstantEvents: 100)
        owner.startLineage(now: 1_000)
        _ = owner.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        _ = owner.join(user: "w", session: SessionID(raw: 9), withPresence: false, sink: g, version: v(1, 1), now: 1_000)
        var ks = space("a", full, copies: 2)
        for c in owner.fullCopies(handoff: false) { _ = ks.received(c, from: "b", now: 1, wall: 1_100) }
        #expect(ks.copies[key] != nil)
        // cut off: a takes the key over in its own view
        _ = ks.ringChanged(to: alone, now: 2 * second, wall: 3_000)
        #expect(ks.owned[key] != nil)
        // healed: the same change brings g back and hands the key back to b
        let healed = ks.ringChanged(to: full, now: 8 * second, wall: 9_000)
        #expect(ks.owned[key] == nil)
        let handedOff = healed.contains { effect in
            if case .send(let copy, let node, _, _) = effect { return node == "b" && copy.key == key && copy.handoff }
            return false
        }
        #expect(handedOff)
        let snapshots = self.snapshots(in: healed)
        #expect(snapshots.isEmpty)
    }

    /// Every change is made, then routed by the channel as it is after it (a merge's SNAPSHOTs and events reach the sessions and gateways
    /// the merge brought).
    @Test func aSessionAMergeBringsGetsItsSnapshotAndTheGatewaysNewInTheMergeGetItsEvents() {
        var owner = Machine(key: key, maxInstantEvents: 100)
        owner.startLineage(now: 1_000)
        let s1 = SessionID(raw: 1), s4 = SessionID(raw: 5)
        _ = owner.join(user: "u1", session: s1, withPresence: true, sink: b, version: v(1, 1), now: 1_000)
        _ = owner.join(user: "u4", session: s4, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        // the other side of a partition: it kept u4 (at g) and lost b's session; this side timed u4 out
        var other = owner
        other.startLineage(now: 2_000)
        _ = other.timeOut(at: b, now: 7_000)
        _ = owner.timeOut(at: g, now: 7_000)
        var routed: [RoutedDelivery<NodeInstance>] = []
        for c in other.fullCopies(handoff: true) {
            routed += owner.merge(c, keepsSessionsOf: { (_: NodeInstance) in true }, now: 16_000) as [RoutedDelivery<NodeInstance>]
        }
        #expect(owner.contains(user: "u4", session: s4))
        // u4's session gets the merged channel's SNAPSHOT at g, and its join reaches b and g
        #expect(routed.contains { $0.isSnapshot && $0.sink == g && $0.sessions == [s4] && $0.event.snapshot.map(\.userID) == ["u1", "u4"] })
        #expect(Set(routed.filter { $0.event.type == .remoteJoin }.map(\.sink)) == [b, g])
    }

    /// A timeout is routed by the channel after the leave: a gateway whose last follower
    /// timed out gets no event for it.
    @Test func aTimeoutIsRoutedByTheChannelAfterTheLeave() {
        var m = Machine(key: key, maxInstantEvents: 100)
        m.startLineage(now: 1_000)
        _ = m.join(user: "u1", session: SessionID(raw: 1), withPresence: true, sink: b, version: v(1, 1), now: 1_000)
        _ = m.join(user: "u4", session: SessionID(raw: 5), withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        let routed: [RoutedDelivery<NodeInstance>] = m.timeOut(at: g, now: 7_000)
        #expect(routed.map(\.sink) == [b] && routed.allSatisfy { $0.event.type == .remoteTimeout })
    }

    /// The same for followers at a process that comes back, while the handoff is awaited.
    @Test func followersAtAProcessThatComesBackWaitForTheHandoffToo() {
        let ring = HashRing(members: ["a", "g"], boots: ["a": 1, "g": 1])
        let key = key(ownedBy: "a", on: ring)
        var ks = space("a", ring)
        _ = try? ks.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        }
        _ = ks.ringChanged(to: HashRing(members: ["a"], boots: ["a": 1]), now: 1, wall: 2_000)  // g thought gone
        let back = ks.ringChanged(to: ring, now: 2 * second, wall: 4_000, mayServe: { _ in false })
        #expect(!back.contains { if case .deliver(let ds) = $0 { return ds.contains(where: \.isSnapshot) } else { return false } })
        #expect(ks.heldBack == [key])
    }

    /// The same for a key taken over from a copy while its handoff is awaited.
    @Test func aKeyTakenOverFromAStaleCopyWaitsForItsHandoffBeforeAnySnapshot() {
        let two = HashRing(members: ["a", "b"], boots: ["a": 1, "b": 1])
        let key = key(ownedBy: "b", on: two)
        var ks = space("a", two, copies: 2)
        // a holds b's key as a replica, with a follower at g
        var replica = Machine(key: key, maxInstantEvents: 100)
        _ = replica.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        _ = ks.received(replica.fullCopies(handoff: false)[0], from: "b", now: 1, wall: 1_000)
        #expect(ks.copies[key] != nil)
        let taken = ks.ringChanged(to: HashRing(members: ["a"], boots: ["a": 1]), now: 2, wall: 2_000, mayServe: { _ in false })
        #expect(snapshots(in: taken).isEmpty && ks.owned[key] != nil && ks.heldBack == [key])
        #expect(snapshots(in: ks.releaseHeldBack(now: 4, wall: 3_000, mayServe: { _ in true })).map(\.sink) == [g])
    }

    /// A session back at a gateway it left takes its channels from its home record, not from what this gateway held before.
    @Test func aSessionBackAtAGatewayItLeftTakesItsChannelsFromItsHome() throws {
        let k1 = ChannelKey(name: "one", type: .message), k2 = ChannelKey(name: "two", type: .message)
        let k3 = ChannelKey(name: "three", type: .message)
        var t = SessionTable(resumeWindow: 5 * second)
        _ = t.open(user: "u", resume: nil, newID: s, now: 0)
        _ = try t.joined(s, channel: k1, withPresence: true)
        // its client resumed it elsewhere (epoch 2: left k1, joined k2 there), then came back (epoch 3)
        _ = t.adopt(s, user: "u", version: v(3, 0), heldElsewhere: true, channels: [k2: false], watching: [])
        #expect(t[s]?.channels.keys.sorted() == [k2])
        #expect(t[s]?.channels[k2] == SessionTable.Membership(withPresence: false, joinVersion: v(3, 0)))
        // resumed where it is held (epoch 3, then 4; or, under a new home, 1028): what it holds here stays
        _ = try t.joined(s, channel: k3, withPresence: true)
        _ = t.adopt(s, user: "u", version: v(4, 0), heldElsewhere: false, channels: [k2: false], watching: [])
        #expect(t[s]?.channels.keys.sorted() == [k3, k2].sorted())
        _ = t.adopt(s, user: "u", version: v(1028, 0), heldElsewhere: false, channels: [k2: false], watching: [])
        #expect(t[s]?.channels.keys.sorted() == [k3, k2].sorted())
    }

    /// A user's fresh state after a leave and a re-join carries a version: a merge does not bring the state of before back.
    @Test func aUsersStateOfBeforeItsLeaveDoesNotComeBackWithAMerge() throws {
        var m = Machine(key: key, maxInstantEvents: 100)
        m.startLineage(now: 1_000)
        _ = m.join(user: "u", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1_000)
        _ = try m.setState(user: "u", session: s, items: [item("mood", "old")], now: 1_001)
        let before = m.fullCopies()[0]  // the other side of a partition kept this version
        _ = m.leave(user: "u", session: s, version: v(1, 2), now: 1_002)
        _ = m.join(user: "u", session: s, withPresence: false, sink: a, version: v(1, 3), now: 1_003)
        _ = m.merge(before, now: 1_004)
        #expect(m.state(of: "u") == [])
        // a state set later on the other side still wins
        var other = Machine(key: key, maxInstantEvents: 100)
        other.install(before)
        other.advanceSequence(to: m.sequence)
        _ = try other.setState(user: "u", session: s, items: [item("mood", "new")], now: 1_005)
        _ = m.merge(other.fullCopies()[0], now: 1_006)
        #expect(m.state(of: "u") == [item("mood", "new")])
    }

    /// A leave of a session this version does not hold is remembered: a merge of another version does not bring it back.
    @Test func aLeaveOfASessionThisVersionDoesNotHoldIsRemembered() {
        var mine = Machine(key: key, maxInstantEvents: 100)
        var theirs = Machine(key: key, maxInstantEvents: 100)
        _ = theirs.join(user: "u", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1)  // joined over there
        _ = mine.leave(user: "u", session: s, version: v(1, 2), now: 2)  // its gateway's leave reached this version
        _ = mine.merge(theirs.fullCopies()[0], now: 3)
        #expect(!mine.contains(user: "u"))
        // a later join of the session is not refused
        _ = mine.join(user: "u", session: s, withPresence: false, sink: a, version: v(1, 3), now: 4)
        #expect(mine.contains(user: "u", session: s))
    }

    /// A session's SNAPSHOT is numbered above any lineage started before (a resume from another gateway or epoch).
    @Test func aResumedSessionsSnapshotIsAboveAnyLineageStartedBefore() {
        var m = Machine(key: key, maxInstantEvents: 100)
        m.startLineage(now: 1_000)
        _ = m.join(user: "u", session: s, withPresence: true, sink: a, version: v(1, 1), now: 1_000)
        // meanwhile another owner (the other side of a partition) started a lineage at 40 s
        let otherSide = UInt64(40_000) << 22 + 5
        let moved = m.announce(user: "u", session: s, withPresence: true, sink: b, version: v(2, 0), now: 41_000)
        let snapshot = moved.deliveries.first { $0.event.type == .snapshot }
        #expect((snapshot?.event.sequence ?? 0) > otherSide)
        // resumed on the same gateway (a later epoch): a fresh SNAPSHOT too, above what it saw
        let resumed = m.announce(user: "u", session: s, withPresence: true, sink: b, version: v(3, 0), now: 42_000)
        #expect(resumed.deliveries.contains { $0.event.type == .snapshot && $0.event.sequence > UInt64(42_000) << 22 })
        // the same epoch announced again (anti-entropy): nothing
        #expect(m.announce(user: "u", session: s, withPresence: true, sink: b, version: v(3, 0), now: 43_000).deliveries.isEmpty)
    }

    /// A value that holds nobody keeps its departures for a while: a stale version merged later brings no one back.
    @Test func anEmptiedChannelRemembersWhoLeftForAWhile() {
        let ring = HashRing(members: ["a"], boots: ["a": 1])
        var ks = space("a", ring)
        _ = try? ks.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1_000)
        }
        let stale = ks[owned: key]!.fullCopies(handoff: true)[0]  // a version from before the leave
        _ = try? ks.withOwned(key, create: false, now: 2_000) { m in _ = m.leave(user: "u", session: s, version: v(1, 2), now: 2_000) }
        #expect(ks[owned: key]?.isEmpty == true)
        _ = ks.received(stale, now: 3, wall: 3_000)  // handed back later
        #expect(ks[owned: key]?.contains(user: "u") != true)
        // forgotten once its departures are
        _ = try? ks.withOwned(ChannelKey(name: "other", type: .message), create: false, now: 3_000 + Machine.departureMemory) { _ in }
        #expect(ks.owned[key] == nil)
    }

    /// A handoff that reaches a node that does not own the key goes on to the owner it knows.
    @Test func aHandoffThatReachesANonOwnerGoesOnToTheOwner() throws {
        let ring = HashRing(members: ["a", "b"], boots: ["a": 1, "b": 1])
        let key = key(ownedBy: "a", on: ring)
        var owner = space("a", ring, copies: 2), replica = space("b", ring, copies: 2)
        _ = try owner.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1_000)
        }
        _ = replica.received(owner[owned: key]!.fullCopies(handoff: false)[0], now: 1, wall: 1_000)
        // the version the other side of a partition kept, in a later lineage, handed to b (which
        // that side's partial ring made its owner)
        var otherSide = Machine(key: key, maxInstantEvents: 100)
        otherSide.startLineage(now: 9_000)
        _ = otherSide.join(user: "u2", session: SessionID(raw: 8), withPresence: false, sink: g, version: v(1, 1), now: 9_000)
        let passedOn = replica.received(otherSide.fullCopies(handoff: true)[0], now: 2, wall: 9_100)
        guard case .send(let copy, let to, _, _)? = passedOn.first else {
            Issue.record("the handoff went no further")
            return
        }
        #expect(to == "a" && !copy.handoff)
        // the owner merges it and brings its replicas up to date with the whole
        let out = owner.received(copy, now: 3, wall: 9_200)
        #expect(owner[owned: key]!.contains(user: "u1") && owner[owned: key]!.contains(user: "u2"))
        for case .send(let c, "b", _, _) in out { _ = replica.received(c, now: 4, wall: 9_300) }
        #expect(replica.copies[key]?.contains(user: "u1") == true && replica.copies[key]?.contains(user: "u2") == true)
        // and takes the owner's later changes again
        _ = try owner.withOwned(key, create: false, now: 9_400) { m in
            _ = m.join(user: "u3", session: SessionID(raw: 9), withPresence: false, sink: a, version: v(1, 1), now: 9_400)
        }
        for case .send(let c, "b", _, _) in owner.replicate(owner[owned: key]!.delta(users: ["u3"])) { _ = replica.received(c, now: 5, wall: 9_500) }
        #expect(replica.copies[key]?.contains(user: "u3") == true)
    }

    /// A handoff goes on to the owner whatever its lineage: one numbered below the copy this
    /// replica holds (the owner took over from a stale copy and started a later lineage) still
    /// carries changes the owner lacks. The replica keeps the owner's copy.
    @Test func aHandoffOfAnOlderLineageStillGoesOnToTheOwner() throws {
        let ring = HashRing(members: ["a", "b"], boots: ["a": 1, "b": 1])
        let key = key(ownedBy: "a", on: ring)
        var owner = space("a", ring, copies: 2), replica = space("b", ring, copies: 2)
        // the node that served the key while a was away, in a lineage it started before a's
        var otherSide = Machine(key: key, maxInstantEvents: 100)
        otherSide.startLineage(now: 1_000_000)
        _ = otherSide.join(user: "u2", session: SessionID(raw: 8), withPresence: false, sink: g, version: v(1, 1), now: 1_000_000)
        _ = try owner.withOwned(key, create: true, now: 2_000_000) { m in
            _ = m.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 2_000_000)
        }
        _ = replica.received(owner[owned: key]!.fullCopies(handoff: false)[0], now: 1, wall: 2_000_000)
        let handoff = otherSide.fullCopies(handoff: true)[0]
        #expect(handoff.term < replica.copies[key]!.term)
        let passedOn = replica.received(handoff, now: 2, wall: 2_000_100)
        guard case .send(let copy, "a", _, _)? = passedOn.first else {
            Issue.record("the handoff went no further: \(passedOn)")
            return
        }
        #expect(replica.copies[key]?.contains(user: "u2") == false)
        _ = owner.received(copy, now: 3, wall: 2_000_200)
        #expect(owner[owned: key]!.contains(user: "u1") && owner[owned: key]!.contains(user: "u2"))
    }

    /// A handoff that reached a node which did not own the key goes to the key's next owner when
    /// the ring moves the key: its sender has left, the owner it was passed on to may leave too,
    /// and the next owner may have started after it was sent. A plain replica copy does not (the
    /// previous owner hands off).
    @Test func aHandoffThatReachedANonOwnerGoesToTheKeysNextOwner() throws {
        let before = HashRing(members: ["b", "c"], boots: ["b": 1, "c": 1])
        let after = HashRing(members: ["b", "c", "d"], boots: ["b": 1, "c": 1, "d": 1])
        let key = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first {
            before.owner(ofHash: StableHash.of($0)) == "b" && after.owner(ofHash: StableHash.of($0)) == "d"
        })
        var handedTo = space("c", before, copies: 2), replica = space("c", before, copies: 2)
        // the version a leaving node handed to c (its ring, without itself, made c the owner)
        var leaving = Machine(key: key, maxInstantEvents: 100)
        _ = leaving.join(user: "u2", session: SessionID(raw: 8), withPresence: false, sink: g, version: v(1, 1), now: 1_000)
        let passedOn = handedTo.received(leaving.fullCopies(handoff: true)[0], now: 1, wall: 1_000)
        #expect(passedOn.contains { if case .send(_, "b", _, _) = $0 { return true } else { return false } })
        _ = replica.received(leaving.fullCopies(handoff: false)[0], now: 1, wall: 1_000)
        // d joins and owns the key now
        let out = handedTo.ringChanged(to: after, now: 2, wall: 2_000)
        let toD = out.compactMap { e -> Machine.Copy? in if case .send(let c, "d", _, _) = e { return c } else { return nil } }
        #expect(toD.count == 1 && toD.allSatisfy(\.handoff), "\(out)")
        var d = space("d", after, copies: 2)
        for c in toD { _ = d.received(c, now: 3, wall: 3_000) }
        #expect(d[owned: key]?.contains(user: "u2") == true)
        #expect(!replica.ringChanged(to: after, now: 2, wall: 2_000).contains { if case .send(_, "d", _, _) = $0 { return true } else { return false } })
    }

    /// A key this node handed off as its owner, keeping a copy, goes to the key's next owner too
    /// when the ring moves it again within a presence timeout (before this node says "done"): the
    /// first receiver may still be passing it on, while the next owner counts this node's "done".
    /// One handoff per move: none twice to the first receiver, none when the key stays put.
    @Test func aKeyHandedOffAndMovedAgainGoesToItsNextOwnerToo() throws {
        let r0 = HashRing(members: ["b", "f"], boots: ["b": 1, "f": 1])
        let r1 = HashRing(members: ["b", "c", "f"], boots: ["b": 1, "c": 1, "f": 1])
        let r2 = HashRing(members: ["b", "c", "d", "f"], boots: ["b": 1, "c": 1, "d": 1, "f": 1])
        let key = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first {
            r0.owner(ofHash: StableHash.of($0)) == "f" && r1.owners(ofHash: StableHash.of($0), count: 2) == ["c", "f"]
                && r2.owner(ofHash: StableHash.of($0)) == "d"
        })
        func sent(_ out: [Keyspace<Machine>.Effect], to node: String) -> [Machine.Copy] {
            out.compactMap { e -> Machine.Copy? in if case .send(let c, let n, _, _) = e, n == node { return c } else { return nil } }
        }
        var f = space("f", r0, copies: 2)
        _ = try f.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1_000)
        }
        let first = f.ringChanged(to: r1, now: 1, wall: 1_000)
        #expect(sent(first, to: "c").filter(\.handoff).count == 1, "\(first)")
        let second = f.ringChanged(to: r2, now: 2, wall: 2_000)
        let toD = sent(second, to: "d")
        #expect(toD.count == 1 && toD.allSatisfy(\.handoff), "\(second)")
        var d = space("d", r2, copies: 2)
        for c in toD { _ = d.received(c, now: 3, wall: 2_100) }
        #expect(d[owned: key]?.contains(user: "u1") == true)
        // a ring change that leaves the key where it is sends nothing more
        var g = space("f", r0, copies: 2)
        _ = try g.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1_000)
        }
        _ = g.ringChanged(to: r1, now: 1, wall: 1_000)
        let r1e = HashRing(members: ["b", "c", "f", "z"], boots: ["b": 1, "c": 1, "f": 1, "z": 1])
        if r1e.owner(ofHash: StableHash.of(key)) == "c" {
            #expect(g.ringChanged(to: r1e, now: 2, wall: 2_000).allSatisfy { if case .send(let c, _, _, _) = $0 { return !c.handoff } else { return true } })
        }
    }

    /// An owner that holds nothing of a key starts it from a whole copy only when the copy's
    /// sender is a member of its ring: a node its ring holds dead (the other side of a partition,
    /// back before the news of its return) hands off the copy it kept while the key went on
    /// changing without it, and served from it the owner's SNAPSHOTs would leave out members who
    /// stayed. From a member, the same copy starts the key.
    @Test func anOwnerDoesNotStartAKeyFromTheHandoffOfANodeItsRingHoldsDead() throws {
        let ring = HashRing(members: ["b", "o"], boots: ["b": 1, "o": 1])
        let xRing = HashRing(members: ["o", "x"], boots: ["o": 1, "x": 1])
        let k = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first {
            ring.owner(ofHash: StableHash.of($0)) == "o" && xRing.owner(ofHash: StableHash.of($0)) == "o"
        })
        var x = space("x", HashRing(members: ["x"], boots: ["x": 1]), copies: 2)
        _ = try x.withOwned(k, create: true, now: 1_000) { m in
            _ = m.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 1_000)
        }
        let handed = x.ringChanged(to: xRing, now: 1, wall: 1_000).compactMap { e -> Machine.Copy? in
            if case .send(let c, "o", _, _) = e, c.handoff { return c } else { return nil }
        }
        try #require(!handed.isEmpty)
        var fromDead = space("o", ring, copies: 2)
        for c in handed { _ = fromDead.received(c, from: "x", now: 2, wall: 1_100) }
        #expect(fromDead[owned: k] == nil)
        var fromMember = space("o", ring, copies: 2)
        for c in handed { _ = fromMember.received(c, from: "b", now: 2, wall: 1_100) }
        #expect(fromMember[owned: k]?.contains(user: "u1") == true)
    }

    /// A copy handed to a non-owner goes to the owner again when the owner asks for its handoffs
    /// (the push that passed it on may have been dropped), for a presence timeout after it came;
    /// a plain replica copy does not, nor to a member that does not own the key.
    @Test func aCopyHandedHereGoesToTheOwnerWhenItAsksForItsHandoffs() throws {
        let ring = HashRing(members: ["b", "c", "d"], boots: ["b": 1, "c": 1, "d": 1])
        let key = key(ownedBy: "b", on: ring)
        var c = space("c", ring, copies: 2)
        var leaving = Machine(key: key, maxInstantEvents: 100)
        _ = leaving.join(user: "u2", session: SessionID(raw: 8), withPresence: false, sink: g, version: v(1, 1), now: 1_000)
        _ = c.received(leaving.fullCopies(handoff: true)[0], now: 1, wall: 1_000)
        let again = c.handOn(to: "b", now: 2, wall: 2_000)
        let toB = again.compactMap { e -> Machine.Copy? in if case .send(let x, "b", _, _) = e { return x } else { return nil } }
        #expect(toB.count == 1 && toB.allSatisfy(\.handoff), "\(again)")
        var b = space("b", ring, copies: 2)
        for x in toB { _ = b.received(x, now: 3, wall: 2_100) }
        #expect(b[owned: key]?.contains(user: "u2") == true)
        #expect(c.handOn(to: "d", now: 2, wall: 2_000).isEmpty)
        #expect(c.handOn(to: "b", now: 3, wall: 1_000 + 5_000).isEmpty)
        var replica = space("c", ring, copies: 2)
        _ = replica.received(leaving.fullCopies(handoff: false)[0], now: 1, wall: 1_000)
        #expect(replica.handOn(to: "b", now: 2, wall: 2_000).isEmpty)
    }

    /// A copy handed to a non-owner goes to the owner before the owner's whole copy replaces it:
    /// an owner that started after the handoff was sent (restarted empty) would otherwise
    /// overwrite the only whole version with its own.
    @Test func aCopyHandedHereGoesToTheOwnerBeforeTheOwnersWholeCopyReplacesIt() throws {
        let ring = HashRing(members: ["b", "c"], boots: ["b": 1, "c": 1])
        let key = key(ownedBy: "b", on: ring)
        var c = space("c", ring, copies: 2)
        var leaving = Machine(key: key, maxInstantEvents: 100)
        _ = leaving.join(user: "u2", session: SessionID(raw: 8), withPresence: false, sink: g, version: v(1, 1), now: 1_000)
        _ = c.received(leaving.fullCopies(handoff: true)[0], now: 1, wall: 1_000)
        // b, restarted, serves the key from nothing in a later lineage
        var fresh = Machine(key: key, maxInstantEvents: 100)
        fresh.startLineage(now: 2_000)
        _ = fresh.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 2_000)
        let out = c.received(fresh.fullCopies(handoff: false)[0], from: "b", now: 2, wall: 2_000)
        let toB = out.compactMap { e -> Machine.Copy? in if case .send(let c, "b", _, _) = e { return c } else { return nil } }
        #expect(toB.count == 1 && toB.allSatisfy(\.handoff), "\(out)")
        var b = space("b", ring, copies: 2)
        _ = try b.withOwned(key, create: true, now: 2_000) { m in
            _ = m.join(user: "u1", session: s, withPresence: false, sink: a, version: v(1, 1), now: 2_000)
        }
        for x in toB { _ = b.received(x, now: 3, wall: 3_000) }
        #expect(b[owned: key]?.contains(user: "u1") == true && b[owned: key]?.contains(user: "u2") == true)
        #expect(c.copies[key]?.contains(user: "u1") == true)
    }

    /// Another node's word that a process has been gone since before it last came back (as this
    /// node saw it) is of that earlier absence: it counts for nothing, and a later absence is
    /// counted from its own start.
    @Test func aWordOfAnAbsenceFromBeforeAProcessCameBackCountsForNothing() throws {
        let withG = HashRing(members: ["a", "b", "e", "g"], boots: ["a": 1, "b": 1, "e": 1, "g": 1])
        let withoutG = withG.removing("g")
        let key = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first {
            withG.owner(ofHash: StableHash.of($0)) == "e" && withoutG.owner(ofHash: StableHash.of($0)) == "e"
        })
        var e = space("e", withG, copies: 2)
        _ = try e.withOwned(key, create: true, now: 1_000) { m in
            _ = m.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        }
        // g paused from 1 s to 2 s (gone, then back here); paused again at 6 s
        _ = e.ringChanged(to: withoutG, now: 1 * second + 500_000_000, wall: 1_500)
        _ = e.ringChanged(to: withG, now: 2 * second, wall: 2_000)
        _ = e.ringChanged(to: withoutG, now: 6 * second, wall: 6_000)
        // b never saw g come back: it says g has been gone 5 s (since 1 s)
        var other = Machine(key: key, maxInstantEvents: 100)
        _ = other.join(user: "u", session: s, withPresence: true, sink: g, version: v(1, 1), now: 1_000)
        _ = e.received(other.fullCopies(handoff: false)[0], from: "b", gone: [g: 5 * second], now: 6 * second + 1, wall: 6_001)
        _ = e.sweep(now: 6 * second + 2, wall: 6_002)
        #expect(e[owned: key]?.contains(user: "u", session: s) == true, "timed out by a word of the earlier absence")
        _ = e.sweep(now: 11 * second + 1, wall: 11_001)
        #expect(e[owned: key]?.contains(user: "u", session: s) != true)
    }

    /// A node back from death counts how long others' processes have been gone from its return, not from what it counted while cut off.
    @Test func aNodeBackFromDeathDoesNotTimeOutSessionsByWhatItCountedWhileCutOff() {
        let five = HashRing(members: ["a", "b", "c", "d", "e"], boots: ["a": 1, "b": 1, "c": 1, "d": 1, "e": 1])
        let key = key(ownedBy: "e", on: five)
        let atC = NodeInstance("c", boot: 1)
        var cutOff = space("e", five, copies: 2)
        // cut off at 0 s, e's view drops c (then it sees it is the minority and keeps that ring)
        _ = cutOff.ringChanged(to: five.removing("c"), now: 0, wall: 0)
        // at 6 s the partition heals; e learns it was declared dead
        cutOff.returnedFromDeath(now: 6 * second)
        // the owner that stood in for it meanwhile hands the key back: a session at c (a
        // client moved there while e was gone), c being alive all along
        var standIn = Machine(key: key, maxInstantEvents: 100)
        _ = standIn.join(user: "u", session: s, withPresence: true, sink: atC, version: v(2, 1), now: 5_000)
        _ = cutOff.received(standIn.fullCopies(handoff: true)[0], from: "b", now: 6 * second + 1, wall: 6_000)
        _ = cutOff.sweep(now: 6 * second + 2, wall: 6_001)
        #expect(cutOff[owned: key]?.contains(user: "u", session: s) == true, "the session was timed out on a stale count")
        // c is seen alive a moment later: the session stays for good
        _ = cutOff.ringChanged(to: five, now: 6 * second + 3, wall: 6_002)
        _ = cutOff.sweep(now: 20 * second, wall: 20_000)
        #expect(cutOff[owned: key]?.contains(user: "u", session: s) == true)
        // (had c really been gone, its sessions would still go, a presence timeout after the return)
        var other = space("e", five, copies: 2)
        _ = other.ringChanged(to: five.removing("c"), now: 0, wall: 0)
        other.returnedFromDeath(now: 6 * second)
        _ = other.received(standIn.fullCopies(handoff: true)[0], from: "b", now: 6 * second + 1, wall: 6_000)
        _ = other.sweep(now: 11 * second + 1, wall: 11_001)
        #expect(other[owned: key]?.contains(user: "u") != true)
    }

    /// Every change to a home record moves its counter up, so an older whole copy is seen as older.
    @Test func aReplicaSkipsAnOlderWholeHomeCopyThatArrivesLate() throws {
        typealias Record = HomeRecord<NodeInstance>
        let ring = HashRing(members: ["a", "b"], boots: ["a": 1, "b": 1])
        let user = (0..<10_000).lazy.map { "u\($0)" }.first { ring.home(ofUser: $0) == "a" }!
        var home = Keyspace<Record>(me: "a", replicationFactor: 2, presenceTimeout: 5 * second, ring: ring) { Record(userID: $0) }
        var replica = Keyspace<Record>(me: "b", replicationFactor: 2, presenceTimeout: 5 * second, ring: ring) { Record(userID: $0) }
        let d1 = SessionID(raw: 1), d0 = SessionID(raw: 2)
        _ = try home.withOwned(user, create: true, now: 1_000) { r in _ = r.sessionOpened(session: d1, sink: b, initial: .unknown) }
        let before = HomeCopy(record: home[owned: user]!, handoff: false)   // (delayed on the way)
        _ = try home.withOwned(user, create: false, now: 2_000) { r in _ = r.sessionOpened(session: d0, sink: a, initial: .unknown) }
        let after = HomeCopy(record: home[owned: user]!, handoff: false)
        _ = replica.received(after, from: "a", now: 1, wall: 2_001)
        _ = replica.received(before, from: "a", now: 2, wall: 2_002)
        #expect(replica.copies[user]?.sessions[d0] != nil, "the older copy replaced the newer one")
        // every kind of change orders the copies
        var r = Record(userID: user)
        var last = r.counterValue
        let steps: [(inout Record) -> Void] = [
            { _ = $0.sessionOpened(session: d1, sink: self.b, initial: .unknown) },
            { _ = $0.sessionJoined(session: d1, channel: self.key, withPresence: true) },
            { _ = $0.sessionLeft(session: d1, channel: self.key) },
            { _ = $0.sessionWatching(session: d1, watching: ["x"]) },
            { _ = $0.watch(by: d0, sink: self.a) },
            { $0.unwatch(by: d0) },
            { _ = $0.claim(session: d1, sink: self.a) },
            { _ = $0.setStatus(.away) },
            { _ = $0.sessionEnded(session: d1) },
        ]
        for (i, step) in steps.enumerated() {
            step(&r)
            #expect(r.counterValue > last, "change \(i) left the counter at \(last)")
            last = r.counterValue
        }
    }

    /// A session placed where it moved does not outrank its departure elsewhere in a merge (no ghost).
    @Test func aSessionPlacedWhereItMovedDoesNotOutrankItsDepartureElsewhere() {
        var stale = Machine(key: key, maxInstantEvents: 100), current = Machine(key: key, maxInstantEvents: 100)
        for m in [0, 1] {
            _ = m == 0 ? stale.join(user: "u", session: s, withPresence: false, sink: a, version: v(2, 1), now: 1)
                       : current.join(user: "u", session: s, withPresence: false, sink: a, version: v(2, 1), now: 1)
        }
        _ = current.leave(user: "u", session: s, version: v(2, 6), now: 2)  // it left, in one version
        // in the other (the other side of a partition), its old gateway says it moved on to b
        _ = stale.moved(s, from: a, to: b, version: v(3, 0), now: 3)
        #expect(stale.sink(of: s) == b)
        _ = current.merge(stale.fullCopies()[0], now: 4)
        #expect(!current.contains(user: "u"))
    }
}
