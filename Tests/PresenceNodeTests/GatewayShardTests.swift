import ClusterCore
import GRPCTransport
import PresenceCore
@testable import PresenceNode
import PresenceWire
import Synchronization
import Testing

/// A clock the test moves by hand.
final class HandClock: EngineClock {
    let ns = Atomic<UInt64>(1_000)
    func monotonicNanoseconds() -> UInt64 { ns.load(ordering: .relaxed) }
    func wallMilliseconds() -> Int64 { Int64(ns.load(ordering: .relaxed) / 1_000_000) }
    func advance(_ d: UInt64) { ns.add(d, ordering: .relaxed) }
    /// (a gateway shard never waits: its deadlines are read, not slept on)
    func sleep(nanoseconds: UInt64) async { Issue.record("a gateway shard slept") }
    func randomBits() -> UInt64 { SystemClock().randomBits() }
}

@Suite struct GatewayShardTests {
    /// Found by Cluster/chaos (rolling restart): a call racing the session's move to another node
    /// was answered NOT_FOUND, which a client takes as "the session is gone". It is retryable.
    @Test func aCallForASessionThatMovedIsRetryableWhereItIsNow() throws {
        let clock = HandClock()
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: clock, movedMemory: 10_000_000_000)
        let id = SessionID(raw: 42)
        _ = g.create(id, user: "ann")
        #expect(throws: Never.self) { _ = try g.session(id) }
        let elsewhere = NodeInstance("n2", boot: 7)
        #expect(g.movedAway(id, to: elsewhere, version: SessionVersion.make(epoch: 2, counter: 0)) != nil)
        do {
            _ = try g.session(id)
            Issue.record("the call succeeded")
        } catch {
            #expect(error.kind == .unavailable && error.name == "SESSION_MOVED" && error.detail.contains("n2"))
        }
        // once the move is forgotten, the session is simply unknown here
        clock.advance(11_000_000_000)
        do {
            _ = try g.session(id)
            Issue.record("the call succeeded")
        } catch {
            #expect(error.kind == .notFound)
        }
    }
}

extension GatewayShardTests {
    /// A session resumed here after it lived at another gateway gets none of what its outbox
    /// buffered here meanwhile: its client saw those events (or later ones) there, and the
    /// announces of its return bring SNAPSHOTs. Flushed to the new stream, they came after events
    /// of the same channel with higher sequences (simulation seeds 739 and 1026 with model clients
    /// that roam). A session resumed where it stayed gets what it missed.
    @Test func aSessionBackAtAGatewayItLeftGetsNothingItsOutboxBufferedMeanwhile() {
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: HandClock(), movedMemory: 10_000_000_000)
        let id = SessionID(raw: 42)
        let outbox = g.create(id, user: "ann").outbox
        outbox.push([1, 2, 3])
        _ = g.adopt(id, user: "ann", version: SessionVersion.make(epoch: 2, counter: 0), heldElsewhere: false, channels: [:], watching: [])
        #expect(outbox.bufferedEvents == 1)
        _ = g.adopt(id, user: "ann", version: SessionVersion.make(epoch: 3, counter: 0), heldElsewhere: true, channels: [:], watching: [])
        #expect(g.outbox(id) === outbox && outbox.bufferedEvents == 0)
    }
}

@Suite struct WireRecordTests {
    /// A channel record carries each session's last state write, so the owner it goes to can fence
    /// off delayed attempts of writes carried out at the sender.
    @Test func aMemberRecordCarriesTheSessionsLastWrite() throws {
        let gw = NodeInstance("n1", boot: 3)
        let copy = MemberCopy(userID: "ann", sessions: [.init(id: SessionID(raw: 9), sink: gw, withPresence: true, version: 77, written: 12)],
                              state: [StateItem(key: "mic", value: "on")], stateVersion: 5)
        let bytes = ClusterMemberRecord(copy).serializedBytes()
        let back = try #require(try ClusterMemberRecord(serializedBytes: bytes).copy)
        #expect(back == copy)
    }
}

/// RELIABILITY.md, invariant 7: a retried call is idempotent. A CloseSession whose answer was
/// lost (its node paused as it answered) and that the client retries finds the session closed,
/// not unknown, for a resume window; after it, a close of an unknown session is NOT_FOUND.
@Suite struct GatewayCloseTests {
    @Test func aCloseRetriedWithinTheResumeWindowFindsTheSessionClosed() {
        let clock = HandClock()
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: clock, movedMemory: 10_000_000_000)
        let id = SessionID(raw: 44)
        _ = g.create(id, user: "ann")
        guard case .closed? = g.close(id) else { Issue.record("the first close did not close"); return }
        guard case .alreadyClosed? = g.close(id) else { Issue.record("a retried close did not find it closed"); return }
        clock.advance(4_000_000_001)
        #expect(g.close(id) == nil)
        #expect(g.close(SessionID(raw: 45)) == nil)
    }
}

@Suite struct LoggerTests {
    /// Issue 9: ids taken from gossip went into text logs as they were: a newline forged a line.
    @Test func textLogValuesStayOnOneLine() {
        #expect(Logger.escaped("node-1") == "node-1")
        #expect(Logger.escaped("evil\n2026-12-01T00:00:00Z ERROR forged") == "evil\\n2026-12-01T00:00:00Z ERROR forged")
        #expect(Logger.escaped("a\"b\\c\u{1}") == "a\\\"b\\\\c\\x01")
        #expect(!Logger.escaped("x\r\ny\t").contains(where: { $0.isNewline }))
    }

    /// Found by Cluster/chaos (netns seed 49, a session lost): a resume here claimed the session at
    /// its home, the home's answer was lost (its node had just died), and this gateway never
    /// adopted it; anti-entropy then told the home "not here", which removed the session while
    /// its client was resuming it on a third node. For a resume window the answer is "held".
    @Test func aClaimThatGotNoAnswerIsNotDeniedForAResumeWindow() {
        let clock = HandClock()
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: clock, movedMemory: 10_000_000_000)
        let id = SessionID(raw: 43)
        #expect(!g.isClaiming(id))
        g.claiming(id, true)
        #expect(g.isClaiming(id))
        g.claiming(id, false)
        g.claimInDoubt(id)
        #expect(g.isClaiming(id))
        #expect(GatewayFacts.verdict(channel: nil, user: "ann", placedAt: 5, held: g.held(id), claiming: g.isClaiming(id), movedTo: g.movedTo(id)) == .held)
        clock.advance(4_000_000_001)
        #expect(!g.isClaiming(id))
        #expect(GatewayFacts.verdict(channel: nil, user: "ann", placedAt: 5, held: g.held(id), claiming: g.isClaiming(id), movedTo: g.movedTo(id)) == .gone(version: 5))
    }

    /// A claim that failed in doubt may reach the home long after its resume window (held on a
    /// cut link): asked then about the session it does not hold, the gateway counts the claim in
    /// doubt for one more resume window from that moment, once.
    @Test func aClaimGivenUpOnCountsInDoubtAgainOnceWhenItLandsLate() {
        let clock = HandClock()
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: clock, movedMemory: 10_000_000_000)
        let id = SessionID(raw: 46)
        #expect(!g.claimLandedLate(id))
        g.claimInDoubt(id)
        clock.advance(6_000_000_000)
        #expect(!g.isClaiming(id))
        #expect(g.claimLandedLate(id) && g.isClaiming(id))
        clock.advance(4_000_000_001)
        #expect(!g.isClaiming(id) && !g.claimLandedLate(id))
        // not past the memory of moves, and not for a session held here
        let other = SessionID(raw: 47)
        g.claimInDoubt(other)
        clock.advance(10_000_000_001)
        #expect(!g.claimLandedLate(other))
        let held = SessionID(raw: 48)
        _ = g.create(held, user: "ann")
        g.claimInDoubt(held)
        clock.advance(5_000_000_000)
        #expect(!g.claimLandedLate(held))
    }

    /// A session whose open this gateway gave up on (its client was told the open failed) is
    /// answered as never opened to its user's home, for as long as moves are remembered: the open
    /// may reach the home late, and what it set is not the client's word. To a channel, it is gone.
    @Test func aSessionWhoseOpenWasGivenUpOnIsAnsweredAsNeverOpened() {
        let clock = HandClock()
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: clock, movedMemory: 10_000_000_000)
        let id = SessionID(raw: 44)
        _ = g.create(id, user: "ann")
        g.abandonOpen(id)
        #expect(!g.holds(id) && g.outbox(id) == nil && g.openAbandoned(id))
        let verdict = { (channel: ChannelKey?, user: String?) in
            GatewayFacts.verdict(channel: channel, user: user, placedAt: 5, held: g.held(id), claiming: g.isClaiming(id),
                                 movedTo: g.movedTo(id), abandoned: g.openAbandoned(id))
        }
        #expect(verdict(nil, "ann") == .neverOpened)
        #expect(verdict(ChannelKey(name: "room", type: .message), nil) == .gone(version: 5))
        clock.advance(10_000_000_001)
        #expect(!g.openAbandoned(id) && verdict(nil, "ann") == .gone(version: 5))
    }
}

/// A state write is in flight at its gateway until it ends, however it ends (answered at once by
/// an owner on this node, on another loop, or after a wait): the next write carries every write
/// finished before it as settled, and owners fence off late attempts of those.
@Suite(.serialized) struct StateWriteSettlingTests {
    @Test func everyStateWriteIsFinishedAtItsGatewayWhenItEnds() async throws {
        let node = try TestNode(presenceTimeout: 3, nodeID: "n0")
        let ann = node.client("ann")
        try await ann.connect()
        try await ann.join("lobby", withPresence: true)
        try await ann.setState("lobby", ["mic": "on"])
        try await ann.setState("lobby", ["mic": "off"])
        try await ann.removeState("lobby", keys: ["mic"])
        try await ann.setState("lobby", Dictionary(uniqueKeysWithValues: (0..<30).map { ("k\($0)", "v") }))
        // (refused by the owner, after its gateway numbered it)
        await expectError(.resourceExhausted, "STATE_KEY_LIMIT") {
            try await ann.setState("lobby", Dictionary(uniqueKeysWithValues: (30..<35).map { ("k\($0)", "v") }))
        }
        let id = try #require(ann.sessionID.flatMap(SessionID.init(text:)))
        let s = try #require(node.node.engine.core.gatewayShard(id).held(id))
        #expect(s.writes == 5 && s.writesInFlight == 0 && s.settledWrites == 5)
    }
}

extension StateWriteSettlingTests {
    /// A status event read at a lower version of its user's record than one the session was given
    /// (by an event or by a Watch answer) is older news, delivered late: it is not queued, nor
    /// taken for what a Watch call in flight answers (`StatusOrder`).
    @Test func aStatusOlderThanOneGivenIsNotQueued() {
        let g = GatewayShard(resumeWindow: 4_000_000_000, clock: HandClock(), movedMemory: 10_000_000_000)
        let id = SessionID(raw: 45)
        let o = g.create(id, user: "ann").outbox
        let framed = { (s: UserStatus) in EventEncoding.framed(status: "u21", s, at: 1) }
        g.deliverStatus(id, framed: framed(.online), status: StatusNews(user: "u21", status: .online, version: 30))
        g.deliverStatus(id, framed: framed(.offline), status: StatusNews(user: "u21", status: .offline, version: 12))
        #expect(o.bufferedEvents == 1)
        o.noteStatusGiven("u8", version: 7)
        g.openWatchWindow(id)
        g.deliverStatus(id, framed: EventEncoding.framed(status: "u8", .away, at: 1), status: StatusNews(user: "u8", status: .away, version: 6))
        #expect(g.closeWatchWindow(id).isEmpty && o.bufferedEvents == 1)
        g.deliverStatus(id, framed: framed(.busy), status: StatusNews(user: "u21", status: .busy, version: 31))
        #expect(o.bufferedEvents == 2)
    }
}

extension StateWriteSettlingTests {
    /// A Watch answer is news as of the version each status was read at: a status event read
    /// earlier (a push delivered late) is not given after it.
    @Test func aStatusReadBeforeTheWatchAnswerIsNotGivenAfterIt() async throws {
        let node = try TestNode(presenceTimeout: 3, nodeID: "n0")
        let engine = node.node.engine
        _ = try await engine.openSession(user: "bob", resume: "", initialStatus: .busy)
        let ann = try await engine.openSession(user: "ann", resume: "", initialStatus: .unknown)
        #expect(try await engine.watch(ann.id.description, add: ["bob"], remove: []).map(\.status) == [.busy])
        let g = engine.core.gatewayShard(ann.id)
        let before = ann.outbox.bufferedEvents
        g.deliverStatus(ann.id, framed: EventEncoding.framed(status: "bob", .offline, at: 1), status: StatusNews(user: "bob", status: .offline, version: 1))
        #expect(ann.outbox.bufferedEvents == before)
    }
}
