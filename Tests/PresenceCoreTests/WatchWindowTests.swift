import PresenceCore
import PresenceWire
import Testing

@Suite struct WatchWindowTests {
    /// Found by Cluster/chaos (loopback seed 1): an event sent while a Watch call was in flight is
    /// newer than the status the call's home answered; the answer takes it.
    @Test func aStatusDeliveredDuringTheCallWinsOverTheHomesAnswer() {
        var w = WatchWindow()
        w.open()
        w.delivered(.online, of: "vic")
        w.delivered(.away, of: "vic")
        let seen = w.close()
        let answer = WatchWindow.answer(["vic", "zoe", "nobody"], homes: ["vic": .offline, "zoe": .busy], delivered: seen)
        #expect(answer.map(\.status) == [.away, .busy, .unknown])
        #expect(answer.map(\.userID) == ["vic", "zoe", "nobody"])
    }

    @Test func nothingIsRecordedOutsideACallAndEachCallStartsClean() {
        var w = WatchWindow()
        w.delivered(.online, of: "vic")
        #expect(!w.isOpen && w.delivered.isEmpty)
        w.open()
        #expect(w.close().isEmpty)
        w.open()
        w.delivered(.busy, of: "vic")
        #expect(w.close() == ["vic": .busy])
        w.open()
        #expect(w.close().isEmpty, "a new call saw what the last one was sent")
        #expect(w.close().isEmpty && w.calls == 0, "an extra close opened something")
    }

    /// Two calls of one session overlap: the window records until the last of them ends.
    @Test func overlappingCallsShareTheWindowUntilTheLastEnds() {
        var w = WatchWindow()
        w.open()
        w.open()
        w.delivered(.online, of: "vic")
        #expect(w.close() == ["vic": .online])
        w.delivered(.offline, of: "zoe")
        #expect(w.isOpen)
        #expect(w.close() == ["vic": .online, "zoe": .offline])
        #expect(!w.isOpen && w.delivered.isEmpty)
    }

    /// The record is bounded by the users a session may watch, whatever its gateway is sent.
    @Test func theRecordIsBounded() {
        var w = WatchWindow()
        w.open()
        for i in 0..<(Limits.maxWatchedPerSession + 50) { w.delivered(.online, of: "u\(i)") }
        w.delivered(.away, of: "u0")
        #expect(w.delivered.count == Limits.maxWatchedPerSession)
        #expect(w.delivered["u0"] == .away)
    }
}
