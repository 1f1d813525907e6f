import PresenceCore
import PresenceWire
import Testing

@Suite struct StatusOrderTests {
    /// Found by the simulation with late requests (seeds 17, 70, 112, 162): a watched user's home
    /// pushed two status changes to a watcher's gateway over a link then cut; the watcher's next
    /// Watch answered the current status, and then, once the link healed, the two pushes arrived
    /// and the watcher was left with an older status. Each status carries the version of the
    /// user's record it was read at, and a session is given none older than one it was given.
    @Test func aStatusReadAtALowerVersionThanOneGivenIsNotGiven() {
        var o = StatusOrder()
        o.noteGiven("u21", version: 30)       // the Watch answer
        var admitted: [Bool] = []
        for (user, version) in [("u21", UInt64(12)), ("u21", 29), ("u21", 30), ("u21", 31), ("u21", 30), ("u8", 1), ("u21", 0)] {
            admitted.append(o.admits(user, version: version))
        }
        // the late pushes are not given; the same news again changes nothing the client sees;
        // users are ordered apart, and unversioned statuses always pass
        #expect(admitted == [false, false, true, true, false, true, true])
        // a Watch answer older than what was given lowers nothing
        o.noteGiven("u21", version: 5)
        #expect(o.given["u21"] == 31)
    }

    /// Bounded: past twice the watch limit, what was given is forgotten (an old status may then
    /// pass once; nothing is refused that should be given).
    @Test func theOrderIsBounded() {
        var o = StatusOrder()
        for i in 0..<(2 * Limits.maxWatchedPerSession) { o.noteGiven("u\(i)", version: 9) }
        #expect(o.given.count == 2 * Limits.maxWatchedPerSession)
        o.noteGiven("one-more", version: 9)
        #expect(o.given.count == 1)
    }

    /// The record's status changes carry its version, which only grows.
    @Test func aHomesStatusChangesCarryTheRecordsGrowingVersion() {
        var r = HomeRecord<String>(userID: "u21")
        let v = SessionVersion.make(epoch: 1, counter: 0)
        _ = r.watch(by: s2, sink: "gw2", version: v)
        let opened = r.sessionOpened(session: s1, sink: "gw", version: v, initial: .busy)
        let away = r.setStatus(.away, by: s1, version: v, write: 1)
        let moved = r.watch(by: s2, sink: "gw3", version: v)
        let versions = [opened, away, moved].compactMap { $0?.version }
        #expect(versions.count == 3 && versions == versions.sorted() && Set(versions).count == 3 && versions.last == r.counterValue)
        #expect(r.currentStatus()?.version == r.counterValue)
    }
}
