@testable import ClusterCore
import PresenceCore
import PresenceWire
import Testing

/// The digests anti-entropy compares (RELIABILITY.md, "Anti-entropy"): a bucket differs when its
/// facts differ, in number or in content, and only then.
@Suite struct FactDigestTests {
    @Test func bucketsDifferWhenTheirFactsDifferInNumberOrContent() {
        let key: UInt64 = 0x1234_5678_9abc_def0
        var a = FactDigest(), b = FactDigest()
        a.add(keyHash: key, fact: 7)
        b.add(keyHash: key, fact: 7)
        #expect(a.mismatches(b).isEmpty)
        // the same number of facts, one of them another (a later version, another epoch)
        var c = FactDigest()
        c.add(keyHash: key, fact: 8)
        #expect(a.mismatches(c) == [FactDigest.bucket(key)])
        // a fact more
        b.add(keyHash: key, fact: 9)
        #expect(a.mismatches(b) == [FactDigest.bucket(key)])
        // facts of another bucket leave this one alone
        var d = a
        d.add(keyHash: ~key, fact: 1)
        #expect(a.mismatches(d) == [FactDigest.bucket(~key)])
    }

    @Test func theOrderFactsAreAddedInDoesNotMatter() {
        var a = FactDigest(), b = FactDigest()
        let facts: [(UInt64, UInt64)] = [(1 << 60, 1), (2 << 58, 2), (3, 3), (1 << 60, 4)]
        for (k, f) in facts { a.add(keyHash: k, fact: f) }
        for (k, f) in facts.reversed() { b.add(keyHash: k, fact: f) }
        #expect(a == b)
    }
    /// A home fact hashes a session's channels and watched users as their sorted text, as every
    /// release has (nodes of two releases in one cluster must agree on it during a rolling
    /// upgrade); it is computed without making the text.
    @Test func aSessionsHomeFactHashesTheTextOfItsChannelsAndWatchedUsers() {
        let me = NodeInstance("g", boot: 1)
        let id = SessionID(hi: 3, lo: 9)
        let sessions: [HomeRecord<NodeInstance>.Session] = [
            .init(sink: me, version: 5),
            .init(sink: me, version: 5, channels: [ChannelKey(name: "lobby", type: .message): true]),
            .init(sink: me, version: 6, channels: [ChannelKey(name: "lobby", type: .message): false], watching: ["bob"]),
            .init(sink: me, version: 7, channels: [ChannelKey(name: "b", type: .stream): true, ChannelKey(name: "a", type: .message): false,
                                                   ChannelKey(name: "a", type: .stream): true],
                  watching: ["zoe", "al", "mo"]),
        ]
        var seen = Set<UInt64>()
        for r in sessions {
            let channels = r.channels.keys.sorted().map { "\($0)\(r.channels[$0]! ? "+" : "")" }.joined(separator: ",")
            let text = FactDigest.hash(1, id.digest, r.version, StableHash.of(channels), StableHash.of(r.watching.sorted().joined(separator: ",")))
            #expect(HomeFact.sessionHash(id, r) == text)
            seen.insert(text)
        }
        #expect(seen.count == sessions.count)
    }
    /// An owner's hashes of the sessions a gateway holds in a channel are the ones that gateway
    /// computes from its own record of them (placement version, presence, the user's state version),
    /// and only that gateway's sessions count.
    @Test func anOwnersChannelFactsAreTheGatewaysOwn() throws {
        let g = NodeInstance("g", boot: 1), other = NodeInstance("h", boot: 1)
        var m = ChannelMachine<NodeInstance>(key: ChannelKey(name: "room", type: .message), maxInstantEvents: 100)
        m.startLineage(now: 1_000)
        for u in 0..<12 {
            _ = m.join(user: "u\(u)", session: SessionID(raw: UInt64(u + 1)), withPresence: u % 3 != 0, sink: u % 4 == 0 ? other : g,
                       version: UInt64(10 + u), now: 1_000)
        }
        _ = m.join(user: "u1", session: SessionID(raw: 99), withPresence: true, sink: g, version: 50, now: 1_000)   // a second session
        for u in [1, 2, 5] {
            _ = try m.setState(user: "u\(u)", session: SessionID(raw: UInt64(u + 1)), items: [StateItem(key: "mic", value: "on")], now: 2_000)
        }
        let expected = m.places(at: g).map { id, p in
            ChannelFact(session: id, user: p.user, withPresence: p.withPresence, joinVersion: p.version, state: [],
                        stateVersion: m.stateVersion(of: p.user)).hash
        }
        #expect(expected.count == 10)
        #expect(m.stateVersion(of: "u5") > m.stateVersion(of: "u3"))   // (some users' state is newer)
        #expect(m.factHashes(at: g).sorted() == expected.sorted())
        #expect(m.factHashes(at: NodeInstance("nobody", boot: 1)).isEmpty)
    }
}
