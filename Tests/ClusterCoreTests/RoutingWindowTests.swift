import ClusterCore
import Testing

/// The gateway's retries of one call (`RoutingWindow`), on a fake clock (milliseconds written as
/// nanoseconds).
@Suite struct RoutingWindowTests {
    static let ms: UInt64 = 1_000_000
    /// The default timings: a 1.4 s window, 0.7 s first attempt, 2 s per call, at least 0.3 s last.
    static let settings = RoutingWindow.Settings(window: 1_400 * ms, firstAttempt: 700 * ms, callTimeout: 2_000 * ms,
                                                 minimumAttempt: 300 * ms)

    /// Runs a call whose every attempt fails as unavailable, each taking what `duration` says of
    /// its timeout, from `start`; returns the attempts made and when the call was answered.
    static func run(start: UInt64 = 5_000 * ms, unreachable: Bool, cutOffAfter: UInt64? = nil,
                    duration: (RoutingWindow.Attempt) -> UInt64) -> (attempts: [RoutingWindow.Attempt], answeredAt: UInt64) {
        var window = RoutingWindow(settings, now: start)
        var attempt = window.first
        var now = start
        var attempts: [RoutingWindow.Attempt] = []
        for _ in 0..<1_000 {
            attempts.append(attempt)
            now += min(attempt.timeout, duration(attempt))
            let cutOff = cutOffAfter.map { now >= start + $0 } ?? false
            switch window.failed(ownerUnreachable: unreachable, cutOff: cutOff, now: now) {
            case .answer: return (attempts, now)
            case .retry(let pause, let next):
                now += pause
                attempt = next
            }
        }
        Issue.record("the call never stopped retrying")
        return (attempts, now)
    }

    @Test func anOwnerThatRefusesIsTriedAgainWithGrowingPausesUntilTheWindowCloses() {
        let (attempts, answeredAt) = Self.run(unreachable: false) { _ in 1 * Self.ms }
        let took = answeredAt - 5_000 * Self.ms
        #expect(took <= Self.settings.window, "answered \(took / Self.ms) ms after the start")
        #expect(took >= Self.settings.window - Self.settings.maximumPause, "gave up \(took / Self.ms) ms in, early")
        #expect(attempts.allSatisfy { !$0.throughRelay }, "an owner that answers is never reached through a relay")
        #expect(attempts.map(\.number) == Array(0..<attempts.count))
    }

    @Test func pausesDoubleFromTheFirstUpToTheMaximum() {
        var window = RoutingWindow(Self.settings, now: 0)
        var pauses: [UInt64] = []
        var now: UInt64 = 0
        for _ in 0..<8 {
            guard case .retry(let pause, _) = window.failed(ownerUnreachable: false, cutOff: false, now: now) else { break }
            pauses.append(pause / Self.ms)
            now += pause
        }
        #expect(pauses == [10, 20, 40, 80, 160, 200, 200, 200])
    }

    @Test func afterAnUnansweredAttemptEveryOtherAttemptGoesThroughARelay() {
        let (attempts, _) = Self.run(unreachable: true) { _ in 50 * Self.ms }
        #expect(attempts.count >= 4)
        #expect(attempts.map(\.throughRelay) == attempts.map { $0.number % 2 == 1 })
        #expect(attempts[0].timeout == Self.settings.firstAttempt)
    }

    /// RELIABILITY.md, invariant 7: attempts that get no answer at all never carry the call far past
    /// its window, so a client that tries its node twice and then another is answered within 5 s.
    @Test func aCallWhoseAttemptsAreNeverAnsweredIsAnsweredWithinTheBound() {
        let (attempts, answeredAt) = Self.run(unreachable: true) { $0.timeout }
        let took = answeredAt - 5_000 * Self.ms
        #expect(took <= Self.settings.answerBound, "answered \(took / Self.ms) ms after the start")
        #expect(took >= Self.settings.window, "gave up \(took / Self.ms) ms in, with the window still open")
        #expect(attempts.count == 2, "a 0.7 s attempt, then one with what is left of the window: \(attempts)")
        #expect(attempts.last?.timeout == Self.settings.window - Self.settings.firstAttempt - Self.settings.firstPause)
        // two attempts at the same node with a client's 0.1 s pause between them leave 1.5 s of the 5
        // for the move to another node and the call there (the 2 s window and 0.7 s floor before
        // left nothing: 2 x 2.7 s + 0.1 s)
        #expect(Self.settings.answerBound * 2 + 100 * Self.ms <= 3_500 * Self.ms)
    }

    @Test func theLastAttemptGetsAtLeastTheMinimumEvenWithLessOfTheWindowLeft() {
        var window = RoutingWindow(Self.settings, now: 0)
        guard case .retry(let pause, let attempt) = window.failed(ownerUnreachable: true, cutOff: false, now: 1_300 * Self.ms) else {
            Issue.record("no retry with 100 ms of the window left")
            return
        }
        #expect(pause == Self.settings.firstPause)
        #expect(attempt.timeout == Self.settings.minimumAttempt)
        #expect(window.failed(ownerUnreachable: true, cutOff: false, now: 1_395 * Self.ms) == .answer)
    }

    @Test func noAttemptIsGivenMoreThanOneCallToAnotherNodeMayTake() {
        var settings = Self.settings
        settings.window = 30_000 * Self.ms
        var window = RoutingWindow(settings, now: 0)
        guard case .retry(_, let attempt) = window.failed(ownerUnreachable: true, cutOff: false, now: 700 * Self.ms) else {
            Issue.record("no retry")
            return
        }
        #expect(attempt.timeout == settings.callTimeout)
    }

    /// Found by Cluster/chaos (netns seed 104): a Leave began at a node 0.3 s into its partition; it
    /// spent its whole retry window there, twice, before the client moved, and was answered 5.25 s
    /// after it began. A node cut off from the cluster stops at its first failure instead.
    @Test func aNodeCutOffFromTheClusterAnswersAtItsFirstFailure() {
        let (attempts, answeredAt) = Self.run(unreachable: true, cutOffAfter: 600 * Self.ms) { $0.timeout }
        #expect(attempts.count == 1)
        #expect(answeredAt - 5_000 * Self.ms == Self.settings.firstAttempt)
        // (a refusal from its own shard, NO_LEASE, is answered at once as well)
        var window = RoutingWindow(Self.settings, now: 0)
        #expect(window.failed(ownerUnreachable: false, cutOff: true, now: 1 * Self.ms) == .answer)
    }

    @Test func aWindowNearTheEndOfTheClockDoesNotOverflow() {
        let start = UInt64.max - 1_000 * Self.ms
        var window = RoutingWindow(Self.settings, now: start)
        #expect(window.first.timeout == Self.settings.firstAttempt)
        // (the window's end is past the clock's: it ends with the clock, 290 ms after this pause)
        #expect(window.failed(ownerUnreachable: false, cutOff: false, now: start + 700 * Self.ms)
                == .retry(after: Self.settings.firstPause, RoutingWindow.Attempt(number: 1, throughRelay: false, timeout: Self.settings.minimumAttempt)))
        #expect(window.failed(ownerUnreachable: false, cutOff: false, now: .max - 1) == .answer)
    }
}

@Suite struct ReplicaWaitTests {
    @Test func anOwnerWaitsForItsReplicasOnlyUntilTheCallerMustHaveItsAnswer() {
        // a caller's attempt of 0.7 s, made at 1 s: the answer must leave by 1.65 s
        #expect(ReplicaWait.left(until: 1_700_000_000, margin: 50_000_000, now: 1_000_000_000) == 650_000_000)
        // once past that, at once
        #expect(ReplicaWait.left(until: 1_700_000_000, margin: 50_000_000, now: 1_680_000_000) == 0)
        #expect(ReplicaWait.left(until: 1_700_000_000, margin: 50_000_000, now: 2_000_000_000) == 0)
        // a deadline as far as it goes is no bound, and nothing overflows near the end of the clock
        #expect(ReplicaWait.left(until: .max, margin: 50_000_000, now: 1_000) == UInt64.max - 50_001_000)
        #expect(ReplicaWait.left(until: .max, margin: 50_000_000, now: .max - 10) == 0)
    }
}
