@testable import PresenceNode
import Testing

/// Every timing follows from the probe interval and the presence timeout (`ClusterTimings`).
@Suite struct ClusterTimingsTests {
    /// A push attempt gets the time its bytes need, not a whole `pushTimeout`: one message lost
    /// on a lossy link must not hold a replica's copies past the replication wait (the writes
    /// answered meanwhile were lost with their owner).
    @Test func aPushAttemptGetsTheTimeItsBytesNeedWithinTheReplicationWait() {
        let t = ClusterTimings()
        #expect(t.pushAttemptTimeout(bytes: 64) < t.replicationWait)
        #expect(t.pushAttemptTimeout(bytes: 0) == t.firstPushTimeout)
        #expect(t.pushAttemptTimeout(bytes: 2 << 20) > t.pushAttemptTimeout(bytes: 64))
        #expect(t.pushAttemptTimeout(bytes: 2 << 20) <= t.pushTimeout)
        #expect(t.pushAttemptTimeout(bytes: Int.max) == t.pushTimeout)
    }
}
