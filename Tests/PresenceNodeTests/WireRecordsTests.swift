import ClusterCore
import PresenceCore
@testable import PresenceNode
import PresenceWire
import Testing

/// Replicated records as they cross the wire between nodes.
@Suite struct WireRecordsTests {
    /// A home copy carries each session's status stamp (`HomeRecord.Session.statusStamp`): the
    /// node it reaches refuses a SetStatus that arrives late, as the home that took the later one does.
    @Test func aHomeCopyCarriesEachSessionsStatusStamp() throws {
        let gw = NodeInstance("n1", boot: 7)
        let session = SessionID(raw: 42)
        let v = SessionVersion.make(epoch: 1, counter: 0)
        var home = HomeRecord<NodeInstance>(userID: "ann")
        _ = home.sessionOpened(session: session, sink: gw, version: v, initial: .online)
        _ = home.setStatus(.away, by: session, version: v, write: 1)
        _ = home.setStatus(.busy, by: session, version: v, write: 2)
        let bytes = ClusterUserRecord(HomeCopy(record: home, handoff: true)).serializedBytes()
        var arrived = try #require(try ClusterUserRecord(serializedBytes: bytes).copy).record
        #expect(arrived.sessions[session]?.statusStamp == home.sessions[session]?.statusStamp)
        #expect(arrived.setStatus(.away, by: session, version: v, write: 1) == nil)
        #expect(arrived.visibleStatus == .busy)
    }

    /// A home copy carries each session's watching stamp: the node it reaches, merging it with a
    /// copy of its own of the same version, keeps the later list of watched users.
    @Test func aHomeCopyCarriesEachSessionsWatchingStamp() throws {
        let gw = NodeInstance("n1", boot: 7)
        let session = SessionID(raw: 44)
        let v = SessionVersion.make(epoch: 1, counter: 3)
        var stale = HomeRecord<NodeInstance>(userID: "ann")
        _ = stale.sessionOpened(session: session, sink: gw, version: v, initial: .online)
        var home = stale
        home.sessionWatching(session: session, watching: ["bob"], version: v, write: 4)
        let bytes = ClusterUserRecord(HomeCopy(record: home, handoff: true)).serializedBytes()
        let arrived = try #require(try ClusterUserRecord(serializedBytes: bytes).copy).record
        #expect(arrived.sessions[session]?.watchingStamp == home.sessions[session]?.watchingStamp)
        _ = stale.merge(arrived)
        #expect(stale.sessions[session]?.watching == ["bob"])
    }

    /// A home copy carries the record's last unwatches (`HomeRecord.unwatches`): the node that
    /// takes it over does not take back a watcher from the word of a gateway the session left.
    @Test func aHomeCopyCarriesTheLastUnwatches() throws {
        let watcher = SessionID(raw: 43)
        let v = SessionVersion.make(epoch: 1_024, counter: 3)
        var home = HomeRecord<NodeInstance>(userID: "ann")
        home.watch(by: watcher, sink: NodeInstance("n3", boot: 2), version: v, write: 5)
        home.unwatch(by: watcher, at: NodeInstance("n3", boot: 2), version: v, write: 6)
        let bytes = ClusterUserRecord(HomeCopy(record: home, handoff: true)).serializedBytes()
        var arrived = try #require(try ClusterUserRecord(serializedBytes: bytes).copy).record
        #expect(arrived.unwatches.map(\.session) == [watcher] && arrived.unwatches.map(\.epoch) == [1_024])
        #expect(arrived.unwatches.map(\.write) == [6] && arrived.watchers.isEmpty)
        arrived.watch(by: watcher, sink: NodeInstance("n1", boot: 1), version: SessionVersion.make(epoch: 1, counter: 9))
        #expect(arrived.watchers[watcher] == nil)
        // and each watcher's call number: a merge orders it against an unwatch of the same epoch
        let other = SessionID(raw: 45)
        home.watch(by: other, sink: NodeInstance("n2", boot: 3), version: v, write: 7)
        let again = try #require(try ClusterUserRecord(serializedBytes: ClusterUserRecord(HomeCopy(record: home, handoff: false)).serializedBytes()).copy).record
        #expect(again.watchers[other]?.write == 7)
    }
}
