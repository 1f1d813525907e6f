import Foundation
import PresenceCore
import PresenceWire
import Testing

let lobby = ChannelKey(name: "lobby", type: .message)
let s1 = SessionID(raw: 1), s2 = SessionID(raw: 2), s3 = SessionID(raw: 3), s4 = SessionID(raw: 4)

func item(_ k: String, _ v: String) -> StateItem { StateItem(key: k, value: v) }

/// Who got which event types, in order, given the machine's subscribers.
func received(_ d: [Delivery], _ m: ChannelMachine<String>) -> [String: [PresenceEventType]] {
    var out: [String: [PresenceEventType]] = [:]
    for x in d {
        switch x.to {
        case .session(let id): out[m.subscribers[id] ?? "?", default: []].append(x.event.type)
        case .subscribers(let except):
            for (id, name) in m.subscribers where id != except { out[name, default: []].append(x.event.type) }
        }
    }
    return out
}

@Suite struct ChannelMachineTests {
    @Test func firstJoinWithPresenceGetsSnapshotOfEveryoneIncludingItself() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "tony", session: s2, withPresence: false, sink: "tony", pendingState: [item("mic", "on")], now: 10)
        let d = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 20)
        let snap = d.last!
        #expect(snap.to == .session(s1))
        #expect(snap.event.type == .snapshot)
        #expect(snap.event.publisher == "")
        #expect(snap.event.snapshot == [UserState(userID: "ann"), UserState(userID: "tony", states: [item("mic", "on")])])
        #expect(snap.event.timestampMs == 20)
    }

    /// Found by Cluster/chaos (netns, a cut link): relayed replica pushes overtook each other; a
    /// change older than the user's leave, installed after it, brought the user back in the
    /// replica, and its SNAPSHOT listed them once it took over.
    @Test func aReplicaSkipsAChangeOlderThanOneItHasInstalled() {
        var r = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        let joined = MemberCopy<String>(userID: "bob", sessions: [.init(id: s2, sink: "gw", withPresence: false, version: 5)], state: [item("k", "v")])
        let left = MemberCopy<String>(userID: "bob", sessions: [], state: [])
        r.install(ChannelCopy(key: lobby, sequence: 10, term: 1, full: false, handoff: false, members: [joined]))
        r.install(ChannelCopy(key: lobby, sequence: 12, term: 1, full: false, handoff: false, members: [left]))
        #expect(!r.contains(user: "bob"))
        r.install(ChannelCopy(key: lobby, sequence: 10, term: 1, full: false, handoff: false, members: [joined]))  // late
        #expect(!r.contains(user: "bob"))
        // a later change is taken, and so is anything from a new owner (another lineage) or a full copy
        r.install(ChannelCopy(key: lobby, sequence: 13, term: 1, full: false, handoff: false, members: [joined]))
        #expect(r.contains(user: "bob"))
        r.install(ChannelCopy(key: lobby, sequence: 2, term: 2, full: true, handoff: false, members: []))
        #expect(!r.contains(user: "bob"))
    }

    /// Found by Cluster/chaos (netns seed 50): a change queued for a replica during a partition
    /// arrived after the full copy its owner sent at the heal; the user it listed had left in
    /// between (the full copy no longer named him), and came back on the replica.
    @Test func aReplicaSkipsAChangeOlderThanTheFullCopyItInstalledSince() {
        var r = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        let joined = MemberCopy<String>(userID: "bob", sessions: [.init(id: s2, sink: "gw", withPresence: true, version: 5)], state: [item("k", "v")])
        let ann = MemberCopy<String>(userID: "ann", sessions: [.init(id: s1, sink: "gw", withPresence: true, version: 1)], state: [])
        r.install(ChannelCopy(key: lobby, sequence: 20, term: 1, full: true, handoff: false, members: [ann]))   // bob left before 20
        r.install(ChannelCopy(key: lobby, sequence: 12, term: 1, full: false, handoff: false, members: [joined]))  // late
        #expect(!r.contains(user: "bob") && r.contains(user: "ann"))
        r.install(ChannelCopy(key: lobby, sequence: 21, term: 1, full: false, handoff: false, members: [joined]))
        #expect(r.contains(user: "bob"))
    }

    @Test func aLeaveFromBeforeTheSessionsLatestJoinChangesNothing() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 10)
        _ = m.join(user: "bob", session: s2, withPresence: false, sink: "bob", version: 5, now: 20)
        // bob left at version 6 and joined again at 7; the leave of 6 arrives late (again)
        _ = m.leave(user: "bob", session: s2, version: 6, now: 30)
        _ = m.join(user: "bob", session: s2, withPresence: false, sink: "bob", version: 7, now: 40)
        #expect(m.leave(user: "bob", session: s2, version: 6, now: 50).isEmpty)
        #expect(m.contains(user: "bob"))
        // his leave of 8 counts
        #expect(received(m.leave(user: "bob", session: s2, version: 8, now: 60), m) == ["ann": [.remoteLeave]])
        #expect(!m.contains(user: "bob"))
    }

    @Test func joinSendsRemoteJoinToOthersNotToTheJoiner() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 1)
        let d = m.join(user: "tony", session: s2, withPresence: true, sink: "tony", now: 2)
        #expect(received(d, m) == ["ann": [.remoteJoin], "tony": [.snapshot]])
        #expect(d[0].event.publisher == "tony")
        #expect(d[0].event.channelName == "lobby" && d[0].event.channelType == .message)
    }

    @Test func pendingStateArrivesAsJoinThenStateChanged() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 1)
        let d = m.join(user: "tony", session: s2, withPresence: false, sink: "tony", pendingState: [item("mic", "on")], now: 2)
        #expect(d.map(\.event.type) == [.remoteJoin, .remoteStateChanged])
        #expect(d[1].event.states == [item("mic", "on")])
    }

    @Test func secondSessionOfAUserSendsNoJoinAndLastLeaveSendsLeave() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 1)
        _ = m.join(user: "tony", session: s2, withPresence: false, sink: "tony-phone", now: 2)
        let second = m.join(user: "tony", session: s3, withPresence: false, sink: "tony-laptop", now: 3)
        #expect(second.isEmpty)
        #expect(m.occupancy == 2)
        #expect(m.leave(user: "tony", session: s2, now: 4).isEmpty)
        let last = m.leave(user: "tony", session: s3, now: 5)
        #expect(received(last, m) == ["ann": [.remoteLeave]])
        #expect(m.occupancy == 1)
        #expect(m.state(of: "tony") == nil)
    }

    @Test func rejoiningSendsNothingButCanTurnPresenceOn() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: false, sink: "ann", now: 1)
        #expect(m.join(user: "ann", session: s1, withPresence: false, sink: "ann", now: 2).isEmpty)
        let on = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 3)
        #expect(on.map(\.event.type) == [.snapshot])
        #expect(m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 4).isEmpty)
        _ = m.join(user: "ann", session: s1, withPresence: false, sink: "ann", now: 5)
        #expect(m.subscribers.isEmpty)
    }

    @Test func timeoutSendsRemoteTimeoutAndDeletesState() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 1)
        _ = m.join(user: "tony", session: s2, withPresence: false, sink: "tony", pendingState: [item("a", "1")], now: 2)
        let d = m.leave(user: "tony", session: s2, timedOut: true, now: 3)
        #expect(d.map(\.event.type) == [.remoteTimeout])
        #expect(!m.contains(user: "tony"))
        _ = m.join(user: "tony", session: s3, withPresence: false, sink: "tony", now: 4)
        #expect(m.state(of: "tony") == [])
    }

    @Test func setStateMergesAndSendsFullStateToOthersOnly() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 1)
        _ = m.join(user: "tony", session: s2, withPresence: true, sink: "tony", now: 2)
        _ = try m.setState(user: "tony", session: s2, items: [item("mic", "on"), item("cam", "off")], now: 3)
        let d = try m.setState(user: "tony", session: s2, items: [item("mic", "off"), item("score", "9")], now: 4)
        #expect(received(d, m) == ["ann": [.remoteStateChanged]])
        #expect(d[0].event.states == [item("cam", "off"), item("mic", "off"), item("score", "9")])  // full, sorted
        #expect(try m.setState(user: "tony", session: s2, items: [item("mic", "off")], now: 5).isEmpty)  // no change, no event
    }

    @Test func anotherSessionOfTheSameUserDoesGetTheEvent() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "tony", session: s1, withPresence: true, sink: "tony-phone", now: 1)
        _ = m.join(user: "tony", session: s2, withPresence: true, sink: "tony-laptop", now: 2)
        let d = try m.setState(user: "tony", session: s1, items: [item("k", "v")], now: 3)
        #expect(received(d, m) == ["tony-laptop": [.remoteStateChanged]])
    }

    @Test func thirtyThreeKeysFailAndChangeNothing() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "tony", session: s1, withPresence: false, sink: "t", now: 1)
        _ = try m.setState(user: "tony", session: s1, items: (0..<30).map { item("k\($0)", "v") }, now: 2)
        #expect(throws: PresenceError.self) {
            _ = try m.setState(user: "tony", session: s1, items: [item("k0", "new"), item("x", "1"), item("y", "2"), item("z", "3")], now: 3)
        }
        #expect(m.state(of: "tony")?.count == 30)
        #expect(m.state(of: "tony")?.first(where: { $0.key == "k0" })?.value == "v")
        _ = try m.setState(user: "tony", session: s1, items: [item("x", "1"), item("y", "2")], now: 4)  // exactly 32 is fine
        #expect(m.state(of: "tony")?.count == 32)
    }

    @Test func removeStateRemovesKeysOrEverything() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "ann", now: 1)
        _ = m.join(user: "tony", session: s2, withPresence: false, sink: "tony", now: 1)
        _ = try m.setState(user: "tony", session: s2, items: [item("a", "1"), item("b", "2"), item("c", "3")], now: 2)
        let d = m.removeState(user: "tony", session: s2, keys: ["b", "nope"], now: 3)
        #expect(d.first?.event.states == [item("a", "1"), item("c", "3")])
        let all = m.removeState(user: "tony", session: s2, keys: [], now: 4)
        #expect(all.first?.event.type == .remoteStateChanged && all.first?.event.states == [])
        #expect(m.removeState(user: "tony", session: s2, keys: [], now: 5).isEmpty)
    }

    @Test func everyEventTakesTheNextSequenceASnapshotIncluded() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        let a = m.join(user: "a", session: s1, withPresence: true, sink: "a", now: 1)
        let j = m.join(user: "b", session: s2, withPresence: true, sink: "b", now: 2)
        let st = try m.setState(user: "a", session: s1, items: [item("k", "v")], now: 3)
        // a's join (sent to nobody) and its SNAPSHOT; b's join, then b's SNAPSHOT above it
        #expect(a.map(\.event.sequence) == [1, 2])
        #expect(j.map(\.event.type) == [.remoteJoin, .snapshot] && j.map(\.event.sequence) == [3, 4])
        // a state change takes a version of its own (5) and its event the next sequence
        #expect(st[0].event.sequence == 6 && m.stateVersion(of: "a") == 5)
        #expect(m.sequence == 6)
        // a fresh SNAPSHOT for a session is above everything before it, and above a gateway's floor
        #expect(m.resnapshot(for: s2, now: 4)?.event.sequence == 7)
        #expect(m.resnapshot(for: s2, floor: 100, now: 5)?.event.sequence == 101)
    }

    @Test func aNewOwnersLineageIsAboveEverythingTheOldOneIssued() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "a", session: s1, withPresence: true, sink: "a", now: 1)
        let before = m.sequence
        m.startLineage(now: 1_000)
        #expect(m.term >= before + (1 << 32) && m.term >= 1_000 << 22 && m.sequence == m.term)
        let snap = m.snapshotForAll(now: 2)
        #expect(snap.map(\.event.sequence) == [m.term + 1])
        // a copy of it keeps the lineage
        var replica = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        for c in m.fullCopies() { replica.install(c) }
        #expect(replica.term == m.term && replica.sequence == m.sequence)
    }

    @Test func aSupersededGatewaysCallsAreRecognised() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        let e1 = SessionVersion.make(epoch: 1, counter: 3), e2 = SessionVersion.make(epoch: 2, counter: 0)
        _ = m.join(user: "a", session: s1, withPresence: false, sink: "gw1", version: e1, now: 1)
        #expect(m.supersedingVersion(of: s1, e1) == nil)
        // the session was claimed by gw2 (epoch 2) and announced there
        #expect(m.announce(user: "a", session: s1, withPresence: false, sink: "gw2", version: e2, now: 2).deliveries.isEmpty)
        #expect(m.sink(of: s1) == "gw2")
        // gw1 still thinks it holds it: its word is older
        #expect(m.supersedingVersion(of: s1, e1 + 1) == e2)
        #expect(m.announce(user: "a", session: s1, withPresence: false, sink: "gw1", version: e1 + 1, now: 3).superseded == e2)
        #expect(m.sink(of: s1) == "gw2")
    }

    @Test func aLeaveIsRememberedSoAnOlderJoinOrCopyDoesNotBringItBack() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "w", session: s1, withPresence: true, sink: "gw", version: 1, now: 1)
        _ = m.join(user: "a", session: s2, withPresence: false, sink: "gw", version: 5, now: 1)
        let before = m.fullCopies()[0]
        _ = m.leave(user: "a", session: s2, version: 6, now: 2)
        #expect(m.leftAfter(s2, 5) && m.leftAfter(s2, 6) && !m.leftAfter(s2, 7))
        // an announce from before the leave changes nothing
        #expect(m.announce(user: "a", session: s2, withPresence: false, sink: "gw", version: 5, now: 3).deliveries.isEmpty)
        #expect(!m.contains(user: "a"))
        // neither does merging the copy from before the leave (a partition's other side)
        #expect(m.merge(before, now: 4).isEmpty)
        #expect(!m.contains(user: "a"))
        // while the older copy, merging this one, learns the leave: REMOTE_LEAVE to its subscribers
        var old = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        old.install(before)
        let learnt = old.merge(m.fullCopies()[0], now: 5)
        #expect(learnt.map(\.event.type) == [.remoteLeave] && !old.contains(user: "a"))
    }

    /// A user who closed one session and joined again with another while this version was cut
    /// off is in the channel on both sides of the merge: merging tells subscribers nothing (no
    /// LEAVE and JOIN for a presence that never ended), and the user is listed with the new session.
    @Test func aMergeThatSwapsAUsersSessionEmitsNoLeaveAndJoin() {
        var base = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = base.join(user: "w", session: s1, withPresence: true, sink: "gw", version: 1, now: 1)
        _ = base.join(user: "a", session: s2, withPresence: false, sink: "gw", version: 2, now: 1)
        var stale = base, current = base
        _ = current.leave(user: "a", session: s2, version: 3, now: 2)
        _ = current.join(user: "a", session: s3, withPresence: false, sink: "gw", version: 4, now: 3)
        let d = stale.merge(current.fullCopies()[0], now: 5)
        #expect(d.filter { $0.event.publisher == "a" }.isEmpty, "\(d.map(\.event.type))")
        #expect(stale.sessions(of: "a") == [s3])
    }

    /// Found by Cluster/chaos (netns seed 67): a node cut off by a partition timed out, in the copy
    /// it kept, the sessions of gateways it could not see; back in the cluster, that copy merged
    /// with the majority's (where those gateways were alive all along) and its own timeouts
    /// removed live users from the SNAPSHOTs it then sent (a flap, repaired by anti-entropy 0.5 s
    /// later). A timeout one version decided does not outweigh a session whose gateway is live —
    /// whichever side of the merge decided it.
    @Test func aTimeoutThisVersionDecidedDoesNotRemoveASessionWhoseGatewayIsLive() {
        var base = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = base.join(user: "w", session: s1, withPresence: true, sink: "gw-near", version: 1, now: 1)
        _ = base.join(user: "a", session: s2, withPresence: false, sink: "gw-far", version: 1, now: 1)
        var cutOff = base, majority = base
        majority.startLineage(now: 10)  // the majority took the channel over
        // the cut-off side sees gw-far's process as gone and times its session out
        _ = cutOff.timeOut(sessionsAt: "gw-far", now: 5)
        #expect(!cutOff.contains(user: "a"))
        // back together: gw-far was alive all along
        let d = cutOff.merge(majority.fullCopies()[0], keepsSessionsOf: { $0 == "gw-far" }, now: 12)
        #expect(cutOff.contains(user: "a"), "a live gateway's session comes back with the merge")
        #expect(d.map(\.event.type) == [.remoteJoin])
        // while a gateway that is gone indeed keeps its session out
        var cutOff2 = base
        _ = cutOff2.timeOut(sessionsAt: "gw-far", now: 5)
        _ = cutOff2.merge(majority.fullCopies()[0], keepsSessionsOf: { _ in false }, now: 12)
        #expect(!cutOff2.contains(user: "a"))
        // and a leave the gateway itself made does too
        var left = base
        _ = left.leave(user: "a", session: s2, version: 2, now: 5)
        _ = left.merge(majority.fullCopies()[0], keepsSessionsOf: { _ in true }, now: 12)
        #expect(!left.contains(user: "a"))
    }

    /// Found by Cluster/chaos (netns seed 92): a gateway's SetState to an owner cut off by a
    /// partition got no answer and was retried at the new owner, and a later SetState was
    /// acknowledged there; after the partition the channel went back to the old owner, and the
    /// first attempt, still in TCP's queue to it, arrived then and was applied as a new write: the
    /// acknowledged later value lost, and anti-entropy then spread the older one. Writes are
    /// numbered per session; the handoff back told the old owner which were carried out.
    @Test func aDelayedDuplicateOfAnOlderSetStateDoesNotOverwriteALaterOne() throws {
        let v = SessionVersion.make(epoch: 1, counter: 5)
        var old = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = old.join(user: "u", session: s1, withPresence: false, sink: "gw", version: v, now: 1)
        _ = try old.setState(user: "u", session: s1, items: [item("k3", "v100")], write: 6, version: v, now: 2)
        var taker = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        for c in old.fullCopies() { taker.install(c) }
        taker.startLineage(now: 10)  // the majority took the channel over
        _ = try taker.setState(user: "u", session: s1, items: [item("k3", "v437")], write: 7, version: v, now: 11)  // the retry
        _ = try taker.setState(user: "u", session: s1, items: [item("k3", "v216")], write: 8, version: v, now: 12)  // later, acknowledged
        _ = old.merge(taker.fullCopies(handoff: true)[0], now: 13)  // handed back after the partition
        #expect(old.state(of: "u") == [item("k3", "v216")])
        // the first attempt of write 7 arrives at last, and a RemoveState's as old
        #expect(try old.setState(user: "u", session: s1, items: [item("k3", "v437")], write: 7, version: v, now: 14).isEmpty)
        #expect(old.removeState(user: "u", session: s1, keys: [], write: 8, version: v, now: 14).isEmpty)
        #expect(old.state(of: "u") == [item("k3", "v216")])
        // the session's next write acts
        _ = try old.setState(user: "u", session: s1, items: [item("k3", "v9")], write: 9, version: v, now: 15)
        #expect(old.state(of: "u") == [item("k3", "v9")])
    }

    /// Writes of one session that overtake each other at one owner (a client sent them without
    /// waiting) both act: only what another owner's copy showed carried out fences writes off.
    @Test func writesOfOneSessionThatOvertakeEachOtherAtOneOwnerBothAct() throws {
        let v = SessionVersion.make(epoch: 1, counter: 1)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "u", session: s1, withPresence: false, sink: "gw", version: v, now: 1)
        _ = try m.setState(user: "u", session: s1, items: [item("b", "2")], write: 2, version: v, now: 2)
        _ = try m.setState(user: "u", session: s1, items: [item("a", "1")], write: 1, version: v, now: 3)
        #expect(m.state(of: "u") == [item("a", "1"), item("b", "2")])
        // a replica that takes over knows write 2 was carried out: its retry is not applied twice
        var replica = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        for c in m.fullCopies() { replica.install(c) }
        #expect(try replica.setState(user: "u", session: s1, items: [item("b", "old")], write: 2, version: v, now: 5).isEmpty)
        #expect(replica.state(of: "u") == [item("a", "1"), item("b", "2")])
        // a new epoch (the session resumed on another gateway) numbers its writes afresh
        let resumed = SessionVersion.make(epoch: 2, counter: 0)
        _ = replica.announce(user: "u", session: s1, withPresence: false, sink: "gw2", version: resumed, now: 6)
        _ = try replica.setState(user: "u", session: s1, items: [item("c", "3")], write: 1, version: resumed, now: 7)
        #expect(replica.state(of: "u")?.contains(item("c", "3")) == true)
    }

    /// Found by the simulation with late requests (seed 45): a SetState's first attempt, held on a
    /// cut link, was given up on and retried through another node to the same owner; the client's
    /// next SetState of the same key was applied, and then the first attempt arrived and put the
    /// older value back. Each write carries the number at or below which its gateway finished
    /// every write of the session: an attempt numbered there arrives late.
    @Test func aWriteItsGatewaySettledBeforeTheNextOneIsLateWhenItArrivesAfterIt() throws {
        let v = SessionVersion.make(epoch: 1, counter: 1)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "u", session: s1, withPresence: true, sink: "gw", version: v, now: 1)
        _ = try m.setState(user: "u", session: s1, items: [item("k1", "v130")], write: 7, settled: 6, version: v, now: 2)  // the retry
        _ = try m.setState(user: "u", session: s1, items: [item("k1", "v137")], write: 8, settled: 7, version: v, now: 3)
        #expect(try m.setState(user: "u", session: s1, items: [item("k1", "v130")], write: 7, settled: 6, version: v, now: 4).isEmpty)
        #expect(m.removeState(user: "u", session: s1, keys: [], write: 7, settled: 6, version: v, now: 4).isEmpty)
        #expect(m.state(of: "u") == [item("k1", "v137")])
        // a replica that takes over learns the fence with the copy
        var replica = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        for c in m.fullCopies() { replica.install(c) }
        #expect(try replica.setState(user: "u", session: s1, items: [item("k1", "v130")], write: 7, version: v, now: 5).isEmpty)
        // writes still in flight together (settled below both) both act, in whatever order
        _ = try m.setState(user: "u", session: s1, items: [item("b", "2")], write: 10, settled: 8, version: v, now: 6)
        _ = try m.setState(user: "u", session: s1, items: [item("a", "1")], write: 9, settled: 8, version: v, now: 7)
        #expect(m.state(of: "u") == [item("a", "1"), item("b", "2"), item("k1", "v137")])
    }

    /// Found by the simulation with late requests (seed 53): a SetState's first attempt, held on a
    /// cut link, was retried through another node and acknowledged; the client left the channel
    /// and joined it again, and then a copy of the old attempt arrived and gave the fresh member
    /// the state of the one before. A fresh join carries the session's last write number: every
    /// write numbered up to it belongs to an earlier membership.
    @Test func aWriteFromBeforeAFreshJoinChangesNothing() throws {
        let v = { (n: UInt64) in SessionVersion.make(epoch: 1, counter: n) }
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "u", session: s1, withPresence: true, sink: "gw", version: v(1), now: 1)
        _ = try m.setState(user: "u", session: s1, items: [item("k1", "v33")], write: 4, settled: 3, version: v(1), now: 2)
        _ = m.leave(user: "u", session: s1, version: v(2), now: 3)
        _ = m.join(user: "u", session: s1, withPresence: true, sink: "gw", version: v(3), settled: 4, now: 4)
        #expect(try m.setState(user: "u", session: s1, items: [item("k1", "v33")], write: 4, settled: 3, version: v(1), now: 5).isEmpty)
        #expect(m.state(of: "u") == [])
        // the new membership's writes act
        _ = try m.setState(user: "u", session: s1, items: [item("k2", "v150")], write: 5, settled: 4, version: v(3), now: 6)
        #expect(m.state(of: "u") == [item("k2", "v150")])
    }

    /// Write numbers wrap (a session's 2^32nd write) and compare as serial numbers; 0 is unnumbered.
    @Test func writeNumbersWrapAndCompareAsSerialNumbers() {
        #expect(WriteNumber.next(1) == 2 && WriteNumber.next(.max) == 1)
        #expect(WriteNumber.isAfter(2, 1) && !WriteNumber.isAfter(1, 2) && !WriteNumber.isAfter(5, 5))
        #expect(WriteNumber.isAfter(1, .max) && WriteNumber.isAfter(3, UInt32.max - 3))
        #expect(WriteNumber.latest(0, 7) == 7 && WriteNumber.latest(7, 0) == 7 && WriteNumber.latest(.max, 2) == 2)
    }

    @Test func mergingTwoVersionsKeepsEveryJoinAndTheLaterState() throws {
        var base = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = base.join(user: "w", session: s1, withPresence: true, sink: "gw", version: 1, now: 1)
        _ = base.join(user: "a", session: s2, withPresence: false, sink: "gw", version: 1, now: 1)
        var left = base, right = base
        right.startLineage(now: 10)  // the other side took the channel over
        _ = left.join(user: "b", session: s3, withPresence: false, sink: "gw", version: 1, now: 2)
        _ = try right.setState(user: "a", session: s2, items: [item("k", "v")], now: 3)
        let d = left.merge(right.fullCopies()[0], now: 4)
        #expect(left.contains(user: "b") && left.state(of: "a") == [item("k", "v")])
        #expect(d.map(\.event.type) == [.remoteStateChanged])
        #expect(left.sequence >= right.sequence && left.term == right.term)
        let e = right.merge(left.fullCopies()[0], now: 5)
        #expect(e.map(\.event.type) == [.remoteJoin] && right.contains(user: "b"))
    }

    @Test func aSubscriberLearntFromAMergeIsListedTheWholeMergedChannelBeforeAnyOfItsEvents() {
        // the channel's version from the node that held it meanwhile: a subscriber ("a" sorts
        // before the others) and two users this (returning) owner never saw
        var other = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = other.join(user: "a", session: s1, withPresence: true, sink: "gw", version: 1, now: 1)
        _ = other.join(user: "b", session: s2, withPresence: false, sink: "gw", version: 1, now: 1)
        _ = other.join(user: "c", session: s3, withPresence: false, sink: "gw", version: 1, now: 1)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "z", session: s4, withPresence: false, sink: "gw2", version: 1, now: 1)
        let d = m.merge(other.fullCopies()[0], now: 5)
        let snapshots = d.filter { $0.event.type == .snapshot }
        #expect(snapshots.count == 1 && d.first == snapshots.first && d.first?.to == .session(s1))
        #expect(snapshots.first?.event.snapshot.map(\.userID) == ["a", "b", "c", "z"])
        // numbered above the merge's events, so the gateway drops those the SNAPSHOT covers
        let events = d.dropFirst().map(\.event.sequence)
        #expect(!events.isEmpty && events.allSatisfy { $0 < snapshots[0].event.sequence })
    }

    @Test func aBatchOwesEachSessionOneSnapshotTakenAtItsEnd() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        let (out, snapshots) = m.batched(now: 3) { m in
            m.announce(user: "a", session: s1, withPresence: true, sink: "gw", version: 1, now: 3).deliveries
                + m.announce(user: "a", session: s1, withPresence: true, sink: "gw2", version: 1, now: 3).deliveries
                + m.announce(user: "b", session: s2, withPresence: false, sink: "gw", version: 1, now: 3).deliveries
                + m.announce(user: "c", session: s3, withPresence: true, sink: "gw", version: 1, now: 3).deliveries
                + m.leave(user: "c", session: s3, version: 2, now: 3)
        }
        #expect(!out.contains { $0.event.type == .snapshot })
        // s3 left within the batch: nothing owed to it any more
        #expect(snapshots.map(\.to) == [.session(s1)])
        #expect(snapshots.first?.event.snapshot.map(\.userID) == ["a", "b"])
        // outside a batch, SNAPSHOTs come at once again
        #expect(m.announce(user: "d", session: s4, withPresence: true, sink: "gw", version: 1, now: 4).deliveries.last?.event.type == .snapshot)
    }

    @Test func aGatewaysLaterStateRestoresWhatTheOwnerLost() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "w", session: s1, withPresence: true, sink: "gw", now: 1)
        // the owner lost the user (a copy that missed it); the gateway still holds it with state
        let o = m.announce(user: "a", session: s2, withPresence: false, sink: "gw2", version: 3, state: [item("mic", "on")], stateVersion: 40, now: 2)
        #expect(o.deliveries.map(\.event.type) == [.remoteJoin, .remoteStateChanged])
        #expect(m.state(of: "a") == [item("mic", "on")] && m.stateVersion(of: "a") == 40)
        // a gateway with an older state is corrected, not obeyed
        let stale = m.announce(user: "a", session: s2, withPresence: false, sink: "gw2", version: 3, state: [], stateVersion: 7, now: 3)
        #expect(stale.deliveries.isEmpty && stale.correction?.state == [item("mic", "on")] && stale.correction?.version == 40)
    }

    @Test func sessionsOfAGoneGatewayTimeOut() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "w", session: s1, withPresence: true, sink: "gw1", now: 1)
        _ = m.join(user: "a", session: s2, withPresence: false, sink: "gw2", now: 1)
        _ = m.join(user: "a", session: s3, withPresence: false, sink: "gw1", now: 1)
        // a has another session on a live gateway: no event
        #expect(m.timeOut(sessionsAt: "gw2", now: 2).isEmpty)
        #expect(m.contains(user: "a") && m.departed[s2]?.byGateway == false)
        _ = m.leave(user: "a", session: s3, now: 3)
        #expect(m.route(m.timeOut(sessionsAt: "gw2", now: 4)).isEmpty)
    }

    @Test func intervalModeAboveTheLimitAndBack() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 3)
        _ = m.join(user: "watcher", session: s1, withPresence: true, sink: "w", now: 1)
        _ = m.join(user: "u1", session: s2, withPresence: false, sink: "u1", now: 2)
        #expect(m.join(user: "u2", session: s3, withPresence: false, sink: "u2", now: 3).map(\.event.type) == [.remoteJoin])  // 3 users: real time
        // the 4th user makes occupancy 4 > 3: events are held for the interval
        #expect(m.join(user: "u3", session: s4, withPresence: false, sink: "u3", now: 4).isEmpty)
        #expect(m.isIntervalMode)
        #expect(try m.setState(user: "u1", session: s2, items: [item("mic", "on")], now: 5).isEmpty)
        let tick = m.tick(now: 1000)
        #expect(tick.count == 1)
        let e = tick[0].event
        #expect(e.type == .interval && e.publisher == "" && tick[0].to == .subscribers(except: nil))
        #expect(e.interval?.joinUserIDs == ["u3"])
        #expect(e.interval?.userStates == [UserState(userID: "u1", states: [item("mic", "on")])])
        #expect(m.tick(now: 2000).isEmpty)  // nothing new: no event
        // a leave brings it back to 3: real time again, with the leave sent at once
        let back = m.leave(user: "u2", session: s3, now: 2500)
        #expect(!m.isIntervalMode)
        #expect(back.map(\.event.type) == [.remoteLeave])
    }

    @Test func pendingIntervalIsFlushedBeforeRealTimeResumes() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 1)
        _ = m.join(user: "w", session: s1, withPresence: true, sink: "w", now: 1)
        _ = m.join(user: "x", session: s2, withPresence: false, sink: "x", now: 2)   // interval mode, join held
        let d = m.leave(user: "x", session: s2, timedOut: true, now: 3)               // back to 1 user
        // what the interval held goes out first, then the timeout in real time, in sequence order
        #expect(d.map(\.event.type) == [.interval, .remoteTimeout])
        #expect(d[0].event.interval?.joinUserIDs == ["x"])
        #expect(d[0].event.sequence < d[1].event.sequence)
    }

    /// A channel in interval mode (one event at most in real time) with a subscriber and users
    /// a, b and c (sessions 10, 11, 12), its first interval already sent.
    static func intervalModeWithThreeUsers() -> ChannelMachine<String> {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 1)
        _ = m.join(user: "w", session: s1, withPresence: true, sink: "w", now: 1)
        for (i, u) in ["a", "b", "c"].enumerated() { _ = m.join(user: u, session: SessionID(raw: UInt64(10 + i)), withPresence: false, sink: u, now: 2) }
        _ = m.tick(now: 3)
        return m
    }

    @Test func intervalListsLeavesAndTimeouts() {
        var m = Self.intervalModeWithThreeUsers()
        _ = m.leave(user: "a", session: SessionID(raw: 10), now: 4)
        _ = m.leave(user: "b", session: SessionID(raw: 11), timedOut: true, now: 5)
        let e = m.tick(now: 6)[0].event.interval!
        #expect(e.leaveUserIDs == ["a"] && e.timeoutUserIDs == ["b"] && e.joinUserIDs.isEmpty)
    }

    /// A user who left or timed out and came back within one interval never left, as far as the
    /// subscribers know: the interval lists it with its state (which the rejoin reset), neither
    /// as joined nor as gone.
    @Test func aUserBackWithinTheIntervalIsListedWithItsStateNotAsJoinedOrGone() {
        var m = Self.intervalModeWithThreeUsers()
        _ = m.leave(user: "a", session: SessionID(raw: 10), now: 4)
        _ = m.leave(user: "b", session: SessionID(raw: 11), timedOut: true, now: 5)
        _ = m.join(user: "a", session: SessionID(raw: 20), withPresence: false, sink: "a", now: 6)
        _ = m.join(user: "b", session: SessionID(raw: 21), withPresence: false, sink: "b", now: 7)
        let e = m.tick(now: 8)[0].event.interval!
        #expect(e.joinUserIDs.isEmpty && e.leaveUserIDs.isEmpty && e.timeoutUserIDs.isEmpty)
        #expect(Set(e.userStates.map(\.userID)) == ["a", "b"])
    }

    @Test func pagesWalkEveryStayingUserOnceWhileOthersChurn() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 10_000)
        let stayers = (0..<250).map { String(format: "s%04d", $0 * 2) }
        for (i, u) in stayers.enumerated() { _ = m.join(user: u, session: SessionID(raw: UInt64(i + 1)), withPresence: false, sink: u, now: 1) }
        var seen: [String] = []
        var after: String? = nil
        var round = 0
        repeat {
            let (users, next) = m.page(after: after, includeState: false)
            #expect(users.count <= 100)
            if next != nil { #expect(users.count == 100) }
            seen += users.map(\.userID)
            // churn between pages: newcomers before and after the cursor
            _ = m.join(user: String(format: "s%04d", round * 2 + 1), session: SessionID(raw: UInt64(1000 + round)), withPresence: false, sink: "", now: 2)
            _ = m.join(user: "zz\(round)", session: SessionID(raw: UInt64(2000 + round)), withPresence: false, sink: "", now: 2)
            after = next
            round += 1
        } while after != nil
        let stayerSeen = seen.filter { stayers.contains($0) }
        #expect(stayerSeen == stayers)  // every stayer, once, in order
        #expect(Set(seen).count == seen.count)
    }

    @Test func pageOfUnknownOrEmptyIsEmpty() {
        let m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        #expect(m.page(after: nil, includeState: true).users.isEmpty)
        #expect(m.occupancy == 0)
    }
}

@Suite struct ChannelMachineClusterTests {
    @Test func eventsGoOncePerGatewayWithSubscribers() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "node-a", now: 1)
        _ = m.join(user: "bob", session: s2, withPresence: true, sink: "node-a", now: 2)
        _ = m.join(user: "cy", session: s3, withPresence: false, sink: "node-b", now: 3)
        #expect(m.subscriberSinks == ["node-a": 2])
        #expect(m.allSinks == ["node-a", "node-b"])
        _ = m.leave(user: "bob", session: s2, now: 4)
        #expect(m.subscriberSinks == ["node-a": 1])
        _ = m.leave(user: "ann", session: s1, now: 5)
        #expect(m.subscriberSinks.isEmpty)
    }

    /// A place names its sink by an entry of the channel's sink table; the entry of a gateway no
    /// session lives at any more is reused, and every session still finds its own gateway.
    @Test func eachSessionKeepsItsGatewayWhileGatewaysComeAndGo() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        let s5 = SessionID(raw: 5)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "node-a", now: 1)
        _ = m.join(user: "bob", session: s2, withPresence: true, sink: "node-b", now: 2)
        _ = m.join(user: "ann", session: s3, withPresence: false, sink: "node-a", now: 3)
        _ = m.leave(user: "ann", session: s1, now: 4)
        // node-a still holds s3 (no subscriber there any more): its entry is not free
        _ = m.join(user: "cy", session: s4, withPresence: true, sink: "node-c", now: 5)
        #expect(m.sink(of: s3) == "node-a" && m.sink(of: s4) == "node-c")
        #expect(m.sinkCounts == ["node-a": 1, "node-b": 1, "node-c": 1] && m.subscriberSinks == ["node-b": 1, "node-c": 1])
        _ = m.leave(user: "ann", session: s3, now: 6)
        _ = m.join(user: "dan", session: s5, withPresence: true, sink: "node-d", now: 7)  // takes node-a's entry
        #expect(m.sink(of: s2) == "node-b" && m.sink(of: s4) == "node-c" && m.sink(of: s5) == "node-d" && m.sink(of: s1) == nil)
        #expect(m.sessions(at: "node-a").isEmpty)
        #expect(m.sessions(at: "node-d").map(\.session) == [s5] && m.sessions(at: "node-b").map(\.session) == [s2])
        #expect(m.allPlaces.mapValues { "\($0.user)@\($0.sink)" } == [s2: "bob@node-b", s4: "cy@node-c", s5: "dan@node-d"])
        #expect(m.subscriberSinks == ["node-b": 1, "node-c": 1, "node-d": 1] && m.allSinks == ["node-b", "node-c", "node-d"])
        // a session that moves between gateways leaves no entry behind
        _ = m.announce(user: "bob", session: s2, withPresence: true, sink: "node-c", version: 1, now: 8)
        #expect(m.sink(of: s2) == "node-c" && m.sessions(at: "node-b").isEmpty && m.allSinks == ["node-c", "node-d"])
        let snapshot = m.resnapshot(for: s2, now: 9)
        #expect(m.route(snapshot.map { [$0] } ?? []).map(\.sink) == ["node-c"])
        // an event goes once to each gateway with subscribers
        let change = (try? m.setState(user: "dan", session: s5, items: [StateItem(key: "mic", value: "on")], now: 10)) ?? []
        #expect(Set(m.route(change).map(\.sink)) == ["node-c", "node-d"] && m.route(change).count == 2)
    }

    /// Random joins, re-joins, moves and leaves over five gateways: after every step each session
    /// is found at its gateway and belongs to its user, and the counts per gateway (sessions,
    /// subscribers) are the model's, however the entries of the sink and member tables moved.
    @Test func sinkCountsFollowAModelUnderRandomMoves() {
        var rng = SplitMix64(seed: 11)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 1_000)
        var model: [SessionID: (sink: String, presence: Bool)] = [:]
        var version: UInt64 = 0
        for step in 0..<800 {
            let i = Int.random(in: 1...24, using: &rng)
            let session = SessionID(raw: UInt64(i)), user = "u\(i % 7)"
            let sink = "node-\(Int.random(in: 0..<5, using: &rng))"
            let presence = Bool.random(using: &rng)
            version += 1
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<4:
                _ = m.join(user: user, session: session, withPresence: presence, sink: sink, version: version, now: Int64(step))
                model[session] = (sink, presence)
            case 4..<7:
                _ = m.announce(user: user, session: session, withPresence: presence, sink: sink, version: version, now: Int64(step))
                model[session] = (sink, presence)
            default:
                _ = m.leave(user: user, session: session, version: version, now: Int64(step))
                model[session] = nil
            }
            var sessions: [String: Int] = [:], subscribers: [String: Int] = [:]
            for (_, p) in model {
                sessions[p.sink, default: 0] += 1
                if p.presence { subscribers[p.sink, default: 0] += 1 }
            }
            #expect(m.sinkCounts == sessions && m.subscriberSinks == subscribers && m.allSinks == Set(sessions.keys))
            for id in 1...24 {
                let s = SessionID(raw: UInt64(id))
                #expect(m.sink(of: s) == model[s]?.sink)
                // each session stays its user's while other users' entries move (a removal moves one)
                let user = model[s] == nil ? nil : "u\(id % 7)"
                #expect(m.user(of: s) == user && m.place(of: s)?.user == user)
                if let user { #expect(m.copy(of: user).sessions.contains { $0.id == s && $0.sink == model[s]?.sink }) }
            }
            for k in sessions.keys { #expect(Set(m.sessions(at: k).map(\.session)) == Set(model.filter { $0.value.sink == k }.keys)) }
        }
    }

    /// Members join and leave at random, by calls, copies installed and versions merged: after
    /// every step the pages list exactly the members, in id order, each with its own state, a
    /// page's bookmark continues where it stopped, and each session belongs to its user (the order
    /// and the placements keep entry indices that a removal moves).
    @Test func pagesListTheMembersInOrderUnderRandomJoinsAndLeaves() throws {
        var rng = SplitMix64(seed: 5)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 1_000)
        var model: [String: String] = [:]   // member -> its state value
        for step in 0..<600 {
            let i = Int.random(in: 0..<60, using: &rng)
            let user = "user-\(i)", session = SessionID(raw: UInt64(i + 1))
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<4:
                if model[user] == nil {
                    _ = m.join(user: user, session: session, withPresence: false, sink: "node-a", now: Int64(step))
                    model[user] = ""
                }
                let v = "v\(step)"
                _ = try m.setState(user: user, session: session, items: [StateItem(key: "k", value: v)], now: Int64(step))
                model[user] = v
            case 4..<6:
                m.install(MemberCopy(userID: user, sessions: [.init(id: session, sink: "node-b", withPresence: false)],
                                     state: [StateItem(key: "k", value: "c\(step)")], stateVersion: UInt64(step)))
                model[user] = "c\(step)"
            case 6..<8:
                _ = m.leave(user: user, session: session, now: Int64(step))
                model[user] = nil
            case 8:
                // another version of the channel, later in every respect: it adds the session or
                // moves it, and its state wins
                let copy = MemberCopy(userID: user, sessions: [.init(id: session, sink: "node-c", withPresence: false,
                                                                     version: 1_000 + UInt64(step))],
                                      state: [StateItem(key: "k", value: "m\(step)")], stateVersion: 1_000_000 + UInt64(step))
                _ = m.merge(ChannelCopy(key: lobby, sequence: 0, term: 0, full: false, handoff: false, members: [copy]), now: Int64(step))
                model[user] = "m\(step)"
            default:
                m.install(MemberCopy(userID: user, sessions: [], state: []))
                model[user] = nil
            }
            var listed: [String: String] = [:]
            var names: [String] = []
            var after: String? = nil
            repeat {
                let (users, next) = m.page(after: after, limit: 7, includeState: true)
                for u in users {
                    names.append(u.userID)
                    listed[u.userID] = u.states.first?.value ?? ""
                }
                after = next
            } while after != nil
            #expect(names == model.keys.sorted() && listed == model && m.occupancy == model.count)
            #expect(m.copies.map(\.userID) == model.keys.sorted())
            // each session still belongs to its user, however the member entries moved
            for j in 0..<60 {
                let u = "user-\(j)", s = SessionID(raw: UInt64(j + 1))
                #expect(m.user(of: s) == (model[u] == nil ? nil : u))
                if model[u] != nil { #expect(m.copy(of: u).sessions.map(\.id) == [s]) }
            }
        }
    }

    @Test func announceMovesAKnownSessionSilentlyAndJoinsAnUnknownOne() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "node-a", now: 1)
        _ = m.join(user: "bob", session: s2, withPresence: true, sink: "node-b", now: 2)
        // ann's session moved to node-c: only she gets a fresh SNAPSHOT, nobody sees an event
        let moved = m.announce(user: "ann", session: s1, withPresence: true, sink: "node-c", now: 3).deliveries
        #expect(moved.map(\.to) == [.session(s1)] && moved.map(\.event.type) == [.snapshot])
        #expect(m.sink(of: s1) == "node-c" && m.sessions(at: "node-a").isEmpty)
        // the same announce again changes nothing
        #expect(m.announce(user: "ann", session: s1, withPresence: true, sink: "node-c", now: 4).deliveries.isEmpty)
        // a session the owner lost is joined back, with the usual events
        let back = m.announce(user: "cy", session: s3, withPresence: false, sink: "node-b", now: 5).deliveries
        #expect(back.map(\.event.type) == [.remoteJoin])
    }

    /// A merged version is numbered above both it merged: a copy of the other version (in
    /// flight from the owner that kept it) cannot pass for the merged whole at a replica.
    @Test func aMergedVersionIsNumberedAboveBothItMerged() throws {
        var mine = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = mine.join(user: "ann", session: s1, withPresence: true, sink: "node-a", now: 1)
        _ = mine.join(user: "bob", session: s2, withPresence: true, sink: "node-b", now: 2)
        var other = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        other.startLineage(now: 9_000)
        _ = other.join(user: "ann", session: s1, withPresence: true, sink: "node-a", now: 9_000)
        let theirs = try #require(other.fullCopies().first)
        _ = mine.merge(theirs, now: 9_001)
        #expect(mine.term == theirs.term && mine.sequence > theirs.sequence)
        #expect(mine.contains(user: "bob"))
    }

    /// The announce of a resume does not bring back a session this owner timed out (its state
    /// went with it): it says the session expired, and nothing changes. A session still here is
    /// moved as any announce moves it; anti-entropy's announce adds a missing one back.
    @Test func aResumesAnnounceDoesNotBringBackASessionThisOwnerTimedOut() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "node-a", version: SessionVersion.make(epoch: 1, counter: 1), now: 1)
        _ = m.join(user: "bob", session: s2, withPresence: true, sink: "node-b", version: SessionVersion.make(epoch: 1, counter: 1), now: 2)
        _ = try m.setState(user: "ann", session: s1, items: [item("mic", "on")], now: 3)
        #expect(m.timeOut(sessionsAt: "node-a", now: 4).map(\.event.type) == [.remoteTimeout])
        let later = SessionVersion.make(epoch: 2, counter: 0)
        let late = m.announce(user: "ann", session: s1, withPresence: true, sink: "node-c", version: later, resume: true, now: 5)
        #expect(late.expired && late.deliveries.isEmpty && !m.contains(user: "ann"))
        let still = m.announce(user: "bob", session: s2, withPresence: true, sink: "node-c", version: later, resume: true, now: 6)
        #expect(!still.expired && m.sink(of: s2) == "node-c")
        let repaired = m.announce(user: "ann", session: s1, withPresence: true, sink: "node-c", version: later, now: 7)
        #expect(!repaired.expired && m.contains(user: "ann"))
    }

    @Test func copiesRebuildTheChannelExactly() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "ann", session: s1, withPresence: true, sink: "node-a", now: 1)
        _ = m.join(user: "bob", session: s2, withPresence: false, sink: "node-b", pendingState: [item("mic", "on")], now: 2)
        _ = try m.setState(user: "ann", session: s1, items: [item("score", "7")], now: 3)
        var replica = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        for c in m.copies { replica.install(c) }
        replica.advanceSequence(to: m.sequence)
        #expect(replica.copies == m.copies)
        #expect(replica.sequence == m.sequence && replica.subscriberSinks == ["node-a": 1])
        #expect(replica.state(of: "bob") == [item("mic", "on")])
        // a record without sessions removes the user
        replica.install(MemberCopy(userID: "bob", sessions: [], state: []))
        #expect(replica.occupancy == 1 && !replica.contains(user: "bob"))
        // a new owner after a failover snapshots every subscriber
        #expect(replica.snapshotForAll(now: 9).map(\.to) == [.session(s1)])
    }
}

/// A member's first session is kept in its entry and any others beside the members
/// (`moreSessions`): every path that adds, removes, moves or copies sessions keeps the two together.
@Suite struct ChannelMachineSeveralSessionsTests {
    let a1 = SessionID(raw: 11), b1 = SessionID(raw: 21), b2 = SessionID(raw: 22), b3 = SessionID(raw: 23)
    let c1 = SessionID(raw: 31), c2 = SessionID(raw: 32)

    @Test func aUsersSessionsSurviveLeavesEntryMovesAndCopies() throws {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "a", session: a1, withPresence: false, sink: "n1", now: 1)
        for s in [b1, b2, b3] { _ = m.join(user: "b", session: s, withPresence: false, sink: "n1", now: 2) }
        _ = m.join(user: "c", session: c1, withPresence: true, sink: "n1", now: 3)
        _ = m.join(user: "c", session: c2, withPresence: true, sink: "n2", now: 4)
        #expect(m.sessions(of: "b") == [b1, b2, b3])
        #expect(m.contains(user: "b", session: b3) && !m.contains(user: "b", session: c1))

        // "a" goes: "c", the last entry, moves into its place with both its sessions
        let gone = m.leave(user: "a", session: a1, now: 5)
        #expect(gone.map(\.event.type) == [.remoteLeave])
        #expect(m.sessions(of: "c") == [c1, c2])
        #expect(m.user(of: c2) == "c" && m.place(of: c1)?.user == "c" && m.sink(of: c2) == "n2")

        // the first session leaves: the next one becomes the first, and no event is made
        #expect(m.leave(user: "b", session: b1, now: 6).isEmpty)
        #expect(m.sessions(of: "b") == [b2, b3])
        #expect(!m.contains(user: "b", session: b1))
        // a session past the first acts for its user
        let changed = try m.setState(user: "b", session: b3, items: [item("mic", "on")], now: 7)
        #expect(changed.map(\.event.type) == [.remoteStateChanged])
        #expect(try m.setState(user: "b", session: b1, items: [item("mic", "off")], now: 8).isEmpty)

        // copies carry every session, and installing one replaces the user's sessions whole
        let copy = m.copy(of: "b")
        #expect(copy.sessions.map(\.id) == [b2, b3])
        var replica = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        replica.install(copy)
        #expect(replica.sessions(of: "b") == [b2, b3] && replica.state(of: "b") == [item("mic", "on")])
        var fewer = copy
        fewer.sessions.removeLast()
        replica.install(fewer)
        #expect(replica.sessions(of: "b") == [b2])
        #expect(!replica.contains(user: "b", session: b3) && replica.place(of: b3) == nil)
        // a copy without sessions takes the user away with all of them
        replica.install(copy)
        replica.install(MemberCopy(userID: "b", sessions: [], state: []))
        #expect(!replica.contains(user: "b") && replica.place(of: b2) == nil && replica.place(of: b3) == nil)
        _ = replica.join(user: "b", session: b1, withPresence: false, sink: "n1", now: 9)
        #expect(replica.sessions(of: "b") == [b1])

        // the last sessions leave: one REMOTE_LEAVE, and a later first session starts alone
        #expect(m.leave(user: "b", session: b3, now: 9).isEmpty)
        #expect(m.leave(user: "b", session: b2, now: 10).map(\.event.type) == [.remoteLeave])
        #expect(m.sessions(of: "b").isEmpty && !m.contains(user: "b"))
        _ = m.join(user: "b", session: b1, withPresence: false, sink: "n1", now: 11)
        #expect(m.sessions(of: "b") == [b1])
        #expect(!m.contains(user: "b", session: b2))
        #expect(m.occupancy == 2)
    }

    /// A session id is its user's own: a join naming another user's session changes nothing, and
    /// a copy that gives it to another user takes it from the first (found in review: placed under
    /// both, the first user's member named an entry that had become someone else's).
    @Test func aSessionOfOneUserIsNeverAlsoAnothers() {
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 50)
        _ = m.join(user: "x", session: a1, withPresence: false, sink: "n1", now: 1)
        _ = m.join(user: "z", session: c1, withPresence: false, sink: "n1", now: 2)
        #expect(m.join(user: "y", session: a1, withPresence: true, sink: "n2", now: 3).isEmpty)
        #expect(!m.contains(user: "y") && m.user(of: a1) == "x" && m.sink(of: a1) == "n1")

        m.install(MemberCopy(userID: "y", sessions: [.init(id: a1, sink: "n2", withPresence: false)], state: []))
        #expect(m.user(of: a1) == "y" && m.sessions(of: "y") == [a1])
        #expect(!m.contains(user: "x") && m.sessions(of: "x").isEmpty)
        _ = m.leave(user: "y", session: a1, now: 4)
        #expect(m.sessions(of: "z") == [c1] && m.user(of: c1) == "z" && m.occupancy == 1)
    }
}

/// Members name their first session by its index in the placements (`firstPlace`), which moves
/// whenever a placement is removed: random joins, leaves, re-places and installs, checked after
/// each step against a plain model of who has which sessions.
@Suite struct ChannelMachineSessionIndexTests {
    @Test(arguments: [1, 2, 3, 4])
    func everySessionStaysWithItsUserThroughRandomChanges(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        var m = ChannelMachine<String>(key: lobby, maxInstantEvents: 1000)
        var model: [String: [SessionID]] = [:]   // each user's sessions, the order ignored
        var sinkOf: [SessionID: String] = [:]
        let users = (0..<12).map { "u\($0)" }
        var nextID: UInt64 = 1
        for step in 0..<1500 {
            let user = users[Int(rng.next() % UInt64(users.count))]
            let now = Int64(step)
            switch rng.next() % 10 {
            case 0...3:   // a new session joins
                let id = SessionID(raw: nextID)
                nextID += 1
                let sink = "n\(rng.next() % 3)"
                _ = m.join(user: user, session: id, withPresence: rng.next() % 2 == 0, sink: sink, now: now)
                model[user, default: []].append(id)
                sinkOf[id] = sink
            case 4...6:   // one of the user's sessions leaves
                guard let all = model[user], !all.isEmpty else { continue }
                let id = all[Int(rng.next() % UInt64(all.count))]
                _ = m.leave(user: user, session: id, now: now)
                model[user]!.removeAll { $0 == id }
                if model[user]!.isEmpty { model[user] = nil }
            case 7:       // a session moves to another gateway (placed again, where it lies), or a gateway's sessions time out
                guard rng.next() % 4 != 0 else {
                    let sink = "n\(rng.next() % 3)"
                    _ = m.timeOut(sessionsAt: sink, now: now)
                    for (u, ids) in model {
                        let left = ids.filter { sinkOf[$0] != sink }
                        model[u] = left.isEmpty ? nil : left
                    }
                    continue
                }
                guard let all = model[user], !all.isEmpty else { continue }
                let id = all[Int(rng.next() % UInt64(all.count))]
                let sink = "n\(rng.next() % 3)"
                _ = m.announce(user: user, session: id, withPresence: true, sink: sink, now: now)
                sinkOf[id] = sink
            case 8:       // a replica's view of the user replaces this one: some sessions kept, one new
                var copy = m.copy(of: user)
                copy.sessions = copy.sessions.filter { _ in rng.next() % 3 != 0 }
                if rng.next() % 2 == 0 {
                    copy.sessions.append(.init(id: SessionID(raw: nextID), sink: "n0", withPresence: false))
                    sinkOf[SessionID(raw: nextID)] = "n0"
                    nextID += 1
                }
                m.install(copy)
                model[user] = copy.sessions.isEmpty ? nil : copy.sessions.map(\.id)
            default:      // the whole channel is copied into a fresh replica, which carries on
                var replica = ChannelMachine<String>(key: lobby, maxInstantEvents: 1000)
                for c in m.fullCopies() { replica.install(c) }
                m = replica
            }
            for u in users {
                let want = Set(model[u] ?? [])
                #expect(Set(m.sessions(of: u)) == want, "step \(step): \(u)")
                #expect(m.sessions(of: u).count == want.count, "step \(step): \(u) listed a session twice")
                #expect(m.contains(user: u) == !want.isEmpty)
                for id in want {
                    #expect(m.contains(user: u, session: id) && m.user(of: id) == u, "step \(step): \(id) of \(u)")
                }
            }
            #expect(m.occupancy == model.count)
        }
    }
}
