import ClusterCore
import PresenceCore
import Testing

/// A key whose owner dies is served by its next replica from the copies its replicas hold
/// (ARCHITECTURE.md, "Failover"). The new owner may hold nothing: restarted after the dead owner
/// last reached it, it lost its copy. The other live replicas send theirs.
@Suite struct KeyspaceFailoverTests {
    typealias Home = HomeRecord<NodeInstance>
    let gateway = NodeInstance("g", boot: 7)
    let before = HashRing(members: ["a", "b", "c", "d"], boots: ["a": 1, "b": 2, "c": 1, "d": 1])

    /// A user whose home is `a`, with `b` then `c` as its replicas.
    var user: String {
        (0..<10_000).map { "u\($0)" }.first { before.homes(ofUser: $0, count: 3) == ["a", "b", "c"] }!
    }

    func replica(_ me: String, holding record: Home?) -> Keyspace<Home> {
        var space = Keyspace<Home>(me: me, replicationFactor: 3, presenceTimeout: 5_000_000_000, ring: before) { Home(userID: $0) }
        if let record { _ = space.received(HomeCopy(record: record, handoff: false), from: "a", now: 1, wall: 1_000) }
        return space
    }

    var record: Home {
        var r = Home(userID: user)
        r.startLineage(now: 1_000)
        _ = r.sessionOpened(session: SessionID(raw: 42), sink: gateway, version: 1, initial: .away)
        return r
    }

    @Test func aReplicaSendsItsCopyToTheNewOwnerWhenTheOwnerDied() throws {
        var c = replica("c", holding: record)
        let after = before.removing("a")
        let sent = c.ringChanged(to: after, now: 2, wall: 2_000).compactMap { effect -> (HomeCopy, String)? in
            if case .send(let copy, let to, _, _) = effect { return (copy, to) }
            return nil
        }
        #expect(after.home(ofUser: user) == "b")
        #expect(sent.count == 1 && sent.first?.1 == "b" && sent.first?.0.record.sessions.count == 1)

        // the new owner, restarted since and holding nothing, takes the user over from that copy
        var b = replica("b", holding: nil)
        _ = b.ringChanged(to: after, now: 2, wall: 2_000)
        #expect(!b.hasOwned(user))
        _ = b.received(try #require(sent.first?.0), from: "c", now: 3, wall: 3_000)
        let owned = try #require(b.owned[user])
        #expect(owned.sessions.keys.contains(SessionID(raw: 42)) && owned.chosen == .away)
    }

    /// The owner restarted (a new process, holding nothing) and the node that was to hand the key
    /// back to it died first: the replicas send it their copies on each of those deaths.
    @Test func aReplicaSendsItsCopyToARestartedOwnerWhenTheOneThatWasToHandItBackDied() {
        var c = replica("c", holding: record)
        let restarted = HashRing(members: ["a", "b", "c", "d"], boots: ["a": 9, "b": 2, "c": 1, "d": 1])
        func sentTo(_ effects: [Keyspace<Home>.Effect]) -> [String] {
            effects.compactMap { if case .send(_, let to, _, _) = $0 { return to } else { return nil } }
        }
        #expect(sentTo(c.ringChanged(to: restarted, now: 2, wall: 2_000)) == ["a"])  // its old process died
        #expect(sentTo(c.ringChanged(to: restarted.removing("b"), now: 3, wall: 3_000)) == ["a"])  // and then b
    }

    @Test func noCopyMovesWhileTheOwnerLivesOrHandsOff() {
        // the owner lives: its replicas keep their copies to themselves
        var c = replica("c", holding: record)
        let grown = HashRing(members: ["a", "b", "c", "d", "e"], boots: ["a": 1, "b": 2, "c": 1, "d": 1, "e": 1])
        let toOthers = c.ringChanged(to: grown, now: 2, wall: 2_000).filter {
            if case .send(_, let to, _, _) = $0 { return to != "c" }
            return false
        }
        #expect(toOthers.isEmpty)
    }

    @Test func aCopyTheDeadOwnerDidNotKeepUpToDateStaysHere() {
        // `d` holds a copy although it was none of the key's replicas (a relayed handoff, say):
        // the dead owner did not keep it up to date, and its older word must not be merged
        var d = Keyspace<Home>(me: "d", replicationFactor: 3, presenceTimeout: 5_000_000_000, ring: before) { Home(userID: $0) }
        _ = d.received(HomeCopy(record: record, handoff: false), from: "a", now: 1, wall: 1_000)
        let sent = d.ringChanged(to: before.removing("a"), now: 2, wall: 2_000).filter {
            if case .send = $0 { return true }
            return false
        }
        #expect(d.copies[user] != nil || d.retired[user] != nil)
        #expect(sent.isEmpty)
    }

    /// ARCHITECTURE.md, "Ring": a key's replicas are the next replication factor − 1 distinct
    /// nodes after its owner.
    @Test func aKeysReplicasAreTheNextNodesAfterItsOwner() {
        let space = Keyspace<Home>(me: "a", replicationFactor: 3, presenceTimeout: 5_000_000_000, ring: before) { Home(userID: $0) }
        #expect(space.replicas(of: user) == ["b", "c"])
    }

    /// RELIABILITY.md, invariant 5: a replica that takes a channel over (its owner died) gives
    /// every subscriber a fresh SNAPSHOT before any further event.
    @Test func aReplicaThatTakesAChannelOverSendsEverySubscriberASnapshot() throws {
        let ring = HashRing(members: ["a", "b", "c"], boots: ["a": 1, "b": 1, "c": 1])
        let key = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }
            .first { ring.owners(of: $0, count: 2) == ["a", "b"] })
        var owner = ChannelMachine<NodeInstance>(key: key, maxInstantEvents: 100)
        owner.startLineage(now: 1_000)
        _ = owner.join(user: "ann", session: SessionID(raw: 1), withPresence: true, sink: gateway, version: 1, now: 1_000)
        _ = owner.join(user: "bob", session: SessionID(raw: 2), withPresence: true, sink: gateway, version: 1, now: 1_000)
        var b = Keyspace<ChannelMachine<NodeInstance>>(me: "b", replicationFactor: 2, presenceTimeout: 5_000_000_000, ring: ring) {
            ChannelMachine(key: $0, maxInstantEvents: 100)
        }
        for c in owner.fullCopies(handoff: false) { _ = b.received(c, from: "a", now: 1, wall: 1_000) }
        let effects = b.ringChanged(to: ring.removing("a"), now: 2, wall: 2_000)
        let delivered = effects.flatMap { e -> [RoutedDelivery<NodeInstance>] in
            if case .deliver(let d) = e { return d }
            return []
        }
        #expect(b.hasOwned(key))
        #expect(!delivered.isEmpty && delivered.allSatisfy(\.isSnapshot) && Set(delivered.map(\.sink)) == [gateway])
    }
}

/// What a gateway answers an owner that places one of its sessions in a channel the gateway did
/// not mention (anti-entropy, RELIABILITY.md invariant 2): owners drop what no live gateway holds.
@Suite struct GatewayVerdictTests {
    @Test func aSessionHeldHereButNoLongerInTheChannelIsGoneAsOfItsVersion() throws {
        var table = SessionTable(resumeWindow: 1_000)
        let id = SessionID(raw: 7)
        let lobby = ChannelKey(name: "lobby", type: .message), other = ChannelKey(name: "other", type: .message)
        _ = table.open(user: "ann", resume: nil, newID: id, now: 0)
        _ = try table.joined(id, channel: lobby, withPresence: true)
        _ = try table.joined(id, channel: other, withPresence: true)
        _ = table.left(id, channel: lobby)
        let held = try #require(table[id])
        #expect(GatewayFacts.verdict(channel: other, user: nil, placedAt: 1, held: held, movedTo: nil) == .held)
        #expect(GatewayFacts.verdict(channel: lobby, user: nil, placedAt: 1, held: held, movedTo: nil) == .gone(version: held.version))
        // one this gateway does not hold at all is gone as of where the owner placed it
        #expect(GatewayFacts.verdict(channel: lobby, user: nil, placedAt: 3, held: nil, movedTo: nil) == .gone(version: 3))
    }
}
