@testable import PresenceCore
import PresenceWire
import Testing

@Suite struct ListingCacheTests {
    let first = ListingCache.Page(channel: lobby, after: "", includeState: true)

    @Test func aPageIsServedOnlyAtTheRevisionItWasMadeAt() {
        var cache = ListingCache(byteLimit: 1 << 20)
        cache.keep(first, at: 7, bytes: [1, 2, 3])
        #expect(cache.page(first, at: 7) == [1, 2, 3])
        #expect(cache.page(first, at: 8) == nil)
        #expect(cache.page(ListingCache.Page(channel: lobby, after: "", includeState: false), at: 7) == nil)
        #expect(cache.page(ListingCache.Page(channel: lobby, after: "ann", includeState: true), at: 7) == nil)
        cache.keep(first, at: 8, bytes: [4])
        #expect(cache.page(first, at: 7) == nil)
        #expect(cache.page(first, at: 8) == [4])
        #expect(cache.count == 1)
    }

    @Test func itStaysWithinItsByteLimit() {
        let one = ListingCache.cost(of: first, [UInt8](repeating: 0, count: 100))
        var cache = ListingCache(byteLimit: 3 * one)
        for i in 0..<10 {
            cache.keep(ListingCache.Page(channel: ChannelKey(name: "lobby", type: .message), after: "", includeState: i % 2 == 0), at: UInt64(i),
                       bytes: [UInt8](repeating: 0, count: 100))
            #expect(cache.bytes <= cache.byteLimit)
        }
        #expect(cache.count >= 1)
        // a page bigger than the whole cache is not kept
        var small = ListingCache(byteLimit: 50)
        small.keep(first, at: 1, bytes: [UInt8](repeating: 0, count: 100))
        #expect(small.page(first, at: 1) == nil)
        #expect(small.bytes == 0)
        var none = ListingCache(byteLimit: 0)
        none.keep(first, at: 1, bytes: [])
        #expect(none.page(first, at: 1) == nil)
    }

    /// What `ListingCache` relies on: whatever a machine's pages list changes, its revision changes
    /// too — checked over random joins, leaves, state changes, timeouts, copies and merges.
    @Test func everyChangeToAChannelsPagesChangesItsRevision() throws {
        var rng = SplitMix(seed: 11)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 3)
        var other = ChannelMachine<String>(key: lobby, maxInstantEvents: 3)
        let users = ["ann", "bob", "cy", "dee", "eve"]
        func pages(_ m: ChannelMachine<String>) -> [[UserState]] {
            [m.page(after: nil, limit: 2, includeState: true).users, m.page(after: "bob", limit: 2, includeState: true).users,
             m.page(after: nil, limit: 10, includeState: false).users, [UserState(userID: "\(m.occupancy)")]]
        }
        var seen: [UInt64: [[UserState]]] = [:]
        var changes = 0
        for step in 0..<3_000 {
            let user = users[Int(rng.next() % UInt64(users.count))]
            let session = SessionID(raw: rng.next() % 8 + 1)
            let sink = "g\(rng.next() % 3)"
            let now = Int64(step)
            let before = (m.listingRevision, pages(m))
            switch rng.next() % 9 {
            case 0, 1: _ = m.join(user: user, session: session, withPresence: true, sink: sink, version: UInt64(step), now: now)
            case 2: _ = m.leave(user: user, session: session, version: UInt64(step), now: now)
            case 3: _ = try? m.setState(user: user, session: session, items: [item("k\(rng.next() % 3)", "\(step)")], now: now)
            case 4: _ = m.removeState(user: user, session: session, keys: rng.next() % 2 == 0 ? [] : ["k0"], now: now)
            case 5: _ = m.timeOut(sessionsAt: sink, now: now)
            case 6: _ = other.join(user: user, session: session, withPresence: false, sink: sink, version: UInt64(step), now: now)
                    _ = try? other.setState(user: user, session: session, items: [item("o", "\(step)")], now: now)
            case 7: for copy in other.fullCopies() { _ = m.merge(copy, now: now) }
            default: for copy in m.fullCopies() { other.install(copy) }
            }
            let after = pages(m)
            if after != before.1 {
                changes += 1
                #expect(m.listingRevision != before.0, "step \(step): the pages changed, the revision did not")
            }
            // one revision, one content
            if let known = seen[m.listingRevision] { #expect(known == after, "step \(step): revision \(m.listingRevision) listed two ways") }
            seen[m.listingRevision] = after
        }
        #expect(changes > 200)  // (the property held for that many changes of the pages)
    }
}

/// A small seeded generator (tests must be repeatable).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
