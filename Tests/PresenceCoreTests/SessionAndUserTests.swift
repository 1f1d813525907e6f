import PresenceCore
import PresenceWire
import Testing

let sec: UInt64 = 1_000_000_000

@Suite struct SessionTableTests {
    @Test func resumeWithinTheWindowKeepsTheSession() throws {
        var t = SessionTable(resumeWindow: 10 * sec)
        guard case .created(let id, let g1) = t.open(user: "ann", resume: nil, newID: s1, now: 0) else { Issue.record("not created"); return }
        _ = try t.joined(id, channel: lobby, withPresence: true)
        #expect(t.disconnect(id, generation: g1, now: 5 * sec) == 15 * sec)
        #expect(t.expireIfDue(id, now: 14 * sec) == nil)
        guard case .resumed(let again, let g2) = t.open(user: "ann", resume: id, newID: s2, now: 14 * sec) else { Issue.record("not resumed"); return }
        #expect(again == id && g2 == g1 + 1)
        #expect(t[id]?.channels[lobby] == true)
        #expect(t.expireIfDue(id, now: 100 * sec) == nil)  // connected again: never expires
    }

    @Test func afterTheWindowASessionTimesOutAndCannotResume() throws {
        var t = SessionTable(resumeWindow: 10 * sec)
        _ = t.open(user: "ann", resume: nil, newID: s1, now: 0)
        _ = t.disconnect(s1, generation: 1, now: 1 * sec)
        #expect(throws: PresenceError.self) { _ = try t.session(s1, now: 11 * sec) }
        #expect(t.open(user: "ann", resume: s1, newID: s2, now: 11 * sec) == .created(s2, generation: 1))
        #expect(t.expireIfDue(s1, now: 11 * sec)?.userID == "ann")
    }

    @Test func anotherUserCannotResumeASession() {
        var t = SessionTable(resumeWindow: 10 * sec)
        _ = t.open(user: "ann", resume: nil, newID: s1, now: 0)
        _ = t.disconnect(s1, generation: 1, now: 0)
        #expect(t.open(user: "mallory", resume: s1, newID: s2, now: 1) == .created(s2, generation: 1))
        #expect(t[s1]?.userID == "ann")
    }

    @Test func aStaleStreamBreakingDoesNotDisconnectTheResumedOne() {
        var t = SessionTable(resumeWindow: 10 * sec)
        _ = t.open(user: "ann", resume: nil, newID: s1, now: 0)
        _ = t.open(user: "ann", resume: s1, newID: s2, now: 1)  // taken over while connected: generation 2
        #expect(t.disconnect(s1, generation: 1, now: 2) == nil)
        #expect(t[s1]?.liveness == .connected)
    }

    @Test func pendingStateIsConsumedByJoinAndLimited() throws {
        var t = SessionTable(resumeWindow: sec)
        _ = t.open(user: "ann", resume: nil, newID: s1, now: 0)
        try t.setPendingState(s1, channel: lobby, items: [item("b", "2"), item("a", "1")])
        try t.setPendingState(s1, channel: lobby, items: [item("a", "9")])
        #expect(throws: PresenceError.self) { try t.setPendingState(s1, channel: lobby, items: (0..<31).map { item("k\($0)", "") }) }
        t.removePendingState(s1, channel: lobby, keys: ["b"])
        let (pending, already) = try t.joined(s1, channel: lobby, withPresence: false)
        #expect(pending == [item("a", "9")] && !already)
        #expect(try t.joined(s1, channel: lobby, withPresence: true) == ([], true))
    }

    @Test func closeRemovesAtOnce() {
        var t = SessionTable(resumeWindow: sec)
        _ = t.open(user: "ann", resume: nil, newID: s1, now: 0)
        #expect(t.close(s1)?.id == s1)
        #expect(t.count == 0)
        #expect(t.close(s1) == nil)
    }

    @Test func watchLimitsAndReportsNewlyWatched() throws {
        var t = SessionTable(resumeWindow: sec)
        _ = t.open(user: "ann", resume: nil, newID: s1, now: 0)
        #expect(try t.watch(s1, add: ["b", "a", "a"], remove: []) == ["a", "b"])
        #expect(try t.watch(s1, add: ["a", "c"], remove: ["b"]) == ["c"])
        #expect(t[s1]?.watching == ["a", "c"])
    }
}

@Suite struct UserDirectoryTests {
    @Test func visibleStatusFollowsTheRules() {
        var d = UserDirectory<String>()
        #expect(d.visibleStatus("ann") == .unknown)
        #expect(d.sessionOpened("ann", session: s1, sink: "gw", initial: .unknown)?.status == .online)
        #expect(d.setStatus("ann", .away)?.status == .away)
        #expect(d.sessionOpened("ann", session: s2, sink: "gw", initial: .unknown) == nil)  // keeps AWAY
        #expect(d.visibleStatus("ann") == .away)
        #expect(d.sessionEnded("ann", session: s1) == nil)
        #expect(d.sessionEnded("ann", session: s2)?.status == .offline)
        #expect(d.visibleStatus("ann") == .offline)  // stays OFFLINE
        #expect(d.sessionOpened("ann", session: s3, sink: "gw", initial: .unknown)?.status == .online)  // a new session starts ONLINE
    }

    @Test func invisibleReadsOfflineWhileConnected() {
        var d = UserDirectory<String>()
        _ = d.sessionOpened("ann", session: s1, sink: "gw", initial: .offline)
        #expect(d.visibleStatus("ann") == .offline)
        #expect(d.setStatus("ann", .busy)?.status == .busy)
        // going invisible is a change watchers see as OFFLINE
        #expect(d.setStatus("ann", .offline)?.status == .offline)
        // ending the session while invisible changes nothing visible
        #expect(d.sessionEnded("ann", session: s1) == nil)
    }

    @Test func watchersAreReturnedWithChanges() {
        var d = UserDirectory<String>()
        d.watch("tony", by: s1, sink: "ann")
        let c = d.sessionOpened("tony", session: s2, sink: "gw", initial: .busy)
        #expect(c?.status == .busy && c?.watchers[s1] == "ann")
        d.unwatch("tony", by: s1)
        #expect(d.setStatus("tony", .away)?.watchers.isEmpty == true)
    }

    @Test func channelIndexIsTheUnionOfTheSessionsChannels() {
        var d = UserDirectory<String>()
        let b = ChannelKey(name: "b", type: .stream), a = ChannelKey(name: "a", type: .message)
        _ = d.sessionOpened("ann", session: s1, sink: "gw", initial: .unknown)
        _ = d.sessionOpened("ann", session: s2, sink: "gw2", initial: .unknown)
        d.sessionJoined("ann", session: s1, channel: b, withPresence: true)
        d.sessionJoined("ann", session: s2, channel: a, withPresence: false)
        d.sessionJoined("ann", session: s2, channel: b, withPresence: false)
        #expect(d.channels(of: "ann") == [a, b])
        d.sessionLeft("ann", session: s1, channel: b)
        #expect(d.channels(of: "ann") == [a, b])  // s2 is still in b
        _ = d.sessionEnded("ann", session: s2)
        #expect(d.channels(of: "ann").isEmpty)
        #expect(d.channels(of: "nobody").isEmpty)
    }

    @Test func aSessionRecordCanMoveToAnotherGatewayWithoutAStatusChange() {
        var d = UserDirectory<String>()
        let lobby = ChannelKey(name: "lobby", type: .message)
        d.watch("ann", by: s3, sink: "gw3")
        _ = d.sessionOpened("ann", session: s1, sink: "gw1", initial: .busy)
        d.sessionJoined("ann", session: s1, channel: lobby, withPresence: true)
        d.sessionWatching("ann", session: s1, watching: ["tony"])
        #expect(d.sessions(at: "gw1").map(\.session) == [s1])
        #expect(d.watchers(at: "gw3").map(\.user) == ["ann"])
        let r = d.session("ann", s1)
        #expect(r?.channels == [lobby: true] && r?.watching == ["tony"])
        // its client resumed it on gw2: no status change, and gw1's late end is not the session's end
        #expect(d.announce("ann", session: s1, record: .init(sink: "gw2", channels: r!.channels, watching: r!.watching)) == nil)
        #expect(d.sessions(at: "gw1").isEmpty && d.session("ann", s1)?.sink == "gw2")
        #expect(d.visibleStatus("ann") == .busy)
    }

    @Test func aUserCopyRoundTrips() {
        var d = UserDirectory<String>()
        _ = d.sessionOpened("ann", session: s1, sink: "gw1", initial: .away)
        d.sessionJoined("ann", session: s1, channel: ChannelKey(name: "x", type: .stream), withPresence: false)
        d.watch("ann", by: s2, sink: "gw2")
        var replica = UserDirectory<String>()
        replica.install(d.copy(of: "ann"))
        #expect(replica.copy(of: "ann") == d.copy(of: "ann"))
        #expect(replica.visibleStatus("ann") == .away)
        replica.remove("ann")
        #expect(replica.visibleStatus("ann") == .unknown)
    }
}

@Suite struct OrphanTimerTests {
    @Test func dueOnlyAfterTheDeadlineAndCancelable() {
        var t = OrphanTimers<String>()
        t.start("a", deadline: 100)
        t.start("b", deadline: 200)
        t.start("a", deadline: 500)  // keeps the earlier deadline
        #expect(t.next == 100)
        #expect(t.due(now: 99).isEmpty)
        #expect(t.due(now: 100) == ["a"])
        t.cancel("b")
        #expect(t.due(now: 1_000).isEmpty && t.isEmpty)
    }

    @Test func postponingOnlyMovesARunningTimerLater() {
        var t = OrphanTimers<String>()
        t.start("a", deadline: 100)
        t.postpone("a", to: 50)    // never earlier
        t.postpone("b", to: 500)   // not running: nothing starts
        #expect(t.deadline("a") == 100 && t.deadline("b") == nil)
        t.postpone("a", to: 300)
        #expect(t.due(now: 200).isEmpty && t.due(now: 300) == ["a"])
    }
}

@Suite struct ValidationTests {
    @Test func identifiers() throws {
        #expect(throws: PresenceError.self) { _ = try Validate.channel("", .message) }
        #expect(throws: PresenceError.self) { _ = try Validate.channel("a b", .message) }
        #expect(throws: PresenceError.self) { _ = try Validate.channel("a/b", .message) }
        #expect(throws: PresenceError.self) { _ = try Validate.channel(String(repeating: "x", count: 65), .message) }
        #expect(throws: PresenceError.self) { _ = try Validate.channel("ok", .unspecified) }
        #expect(throws: PresenceError.self) { _ = try Validate.channel("ok", .unrecognized(7)) }
        #expect(try Validate.channel(String(repeating: "x", count: 64), .stream).name.count == 64)
        #expect(throws: PresenceError.self) { _ = try Validate.userID("ü") }
        #expect(try Validate.userID("a.b:c@d-e_f") == "a.b:c@d-e_f")
    }

    @Test func stateLimits() throws {
        #expect(throws: PresenceError.self) { _ = try Validate.stateItems([item("", "v")]) }
        #expect(throws: PresenceError.self) { _ = try Validate.stateItems([item(String(repeating: "k", count: 65), "v")]) }
        #expect(throws: PresenceError.self) { _ = try Validate.stateItems([item("k", String(repeating: "v", count: 1025))]) }
        _ = try Validate.stateItems([item(String(repeating: "k", count: 64), String(repeating: "é", count: 512))])  // 1024 bytes
        let e = #expect(throws: PresenceError.self) { _ = try Validate.stateItems((0..<33).map { item("k\($0)", "") }) }
        #expect(e?.kind == .resourceExhausted && e?.name == "STATE_KEY_LIMIT")
    }

    @Test func bookmarks() throws {
        let b = PageBookmark.make(after: "user:42")
        #expect(try PageBookmark.parse(b) == "user:42")
        for bad in ["", "x", "p1.", "p1.!!!", "p1." + PageBookmark.base64URLEncode(Array("a b".utf8)), String(repeating: "p", count: 300)] {
            #expect(throws: PresenceError.self) { _ = try PageBookmark.parse(bad) }
        }
    }

    @Test func sessionIDs() {
        let id = SessionID.random()
        #expect(SessionID(text: id.description) == id)
        #expect(SessionID(text: "xyz") == nil)
        #expect(SessionID(text: "0000000000000000") == nil)
        #expect(SessionID(raw: 255).description == "00000000000000ff")
    }

    @Test func stableHashIsStable() {
        #expect(StableHash.of("lobby") == StableHash.of("lobby"))
        #expect(StableHash.of("lobby") != StableHash.of("lobbz"))
        #expect(StableHash.of(ChannelKey(name: "x", type: .message)) != StableHash.of(ChannelKey(name: "x", type: .stream)))
    }
}
