import ClusterCore
import Testing

@Suite struct ServingLeaseTests {
    @Test func aNodeThatHasNeverHeardFromTheClusterIsNotHeldBack() {
        let lease = ServingLease(duration: 600)
        #expect(lease.holds(now: 10_000))
    }

    @Test func theLeaseRunsOutDurationAfterTheLastAnswerAndComesBackWithTheNext() {
        var lease = ServingLease(duration: 600)
        lease.heard(at: 1_000)
        #expect(lease.holds(now: 1_600))
        #expect(!lease.holds(now: 1_601))
        lease.heard(at: 5_000)
        #expect(lease.holds(now: 5_000))
        #expect(!lease.holds(now: 5_601))
    }

    @Test func anAnswerReadOnAnotherThreadWithAnEarlierClockDoesNotShortenTheLease() {
        var lease = ServingLease(duration: 600)
        lease.heard(at: 2_000)
        lease.heard(at: 1_900)
        #expect(lease.holds(now: 2_600))
        #expect(lease.holds(now: 1_950))
    }

    @Test func aZeroDurationNeverHoldsTheNodeBack() {
        var lease = ServingLease(duration: 0)
        lease.heard(at: 1)
        #expect(lease.holds(now: 1_000_000_000_000))
    }

    @Test func aNodeIsSilentOnlyOnceItHeardNothingForLongerThanTheSpan() {
        var lease = ServingLease(duration: 600)
        #expect(!lease.silent(for: 1_000, now: 1_000_000), "before the first answer the node is joining, not cut off")
        lease.heard(at: 2_000)
        #expect(!lease.silent(for: 1_000, now: 3_000))
        #expect(lease.silent(for: 1_000, now: 3_001))
        #expect(!lease.silent(for: 1_000, now: 1_500), "a reading from another thread, earlier than the answer")
        lease.heard(at: 3_500)
        #expect(!lease.silent(for: 1_000, now: 4_000))
    }

    @Test func aNodeServingWithOthersCountsItsLeaseFromThenUntilItsFirstAnswer() {
        var lease = ServingLease(duration: 600)
        lease.began(at: 1_000)
        #expect(lease.holds(now: 1_600))
        #expect(!lease.holds(now: 1_601), "never answered since it began serving with others")
        #expect(lease.silent(for: 1_000, now: 2_001))
        lease.heard(at: 3_000)
        lease.began(at: 9_000)
        #expect(!lease.holds(now: 3_601), "a later start does not stand for an answer")
    }
}
