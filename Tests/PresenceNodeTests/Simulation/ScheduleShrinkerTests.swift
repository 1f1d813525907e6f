import Testing

/// `ScheduleShrinker` against failures whose cause is known, and a shrunk schedule run for real.
@Suite struct ScheduleShrinkerTests {
    @Test func aFailureThatNeedsTwoFaultsShrinksToThoseTwo() {
        var s = ScheduleShrinker()
        let best = s.shrink(slots: 12) { c in c.kept.contains(2) && c.kept.contains(5) }
        #expect(best.kept == [2, 5] && best.slots == 6)
    }

    @Test func aFailureThatNeedsOneLateFaultShrinksToIt() {
        var s = ScheduleShrinker()
        let best = s.shrink(slots: 10) { c in c.kept.contains(7) }
        #expect(best.kept == [7] && best.slots == 8 && best.leftOut == Set(0..<7))
    }

    /// Either of two faults alone fails: one of them is left (1-minimal), not both, not none.
    @Test func aFailureThatEitherOfTwoFaultsMakesKeepsOne() {
        var s = ScheduleShrinker()
        let best = s.shrink(slots: 9) { c in c.kept.contains(3) || c.kept.contains(4) }
        #expect(best.kept == [3])
    }

    @Test func aFailureThatNeedsEveryFaultKeepsThemAll() {
        var s = ScheduleShrinker()
        let best = s.shrink(slots: 5) { c in c.kept == [0, 1, 2, 3, 4] }
        #expect(best.kept == [0, 1, 2, 3, 4] && best.leftOut.isEmpty)
    }

    @Test func itStopsAfterItsRunsAndReturnsAScheduleThatFailed() {
        var s = ScheduleShrinker(maxRuns: 7)
        var asked = 0
        var failed: [ScheduleShrinker.Candidate] = []
        let best = s.shrink(slots: 40) { c in
            asked += 1
            let fails = c.kept.contains(30) && c.kept.contains(1)
            if fails { failed.append(c) }
            return fails
        }
        #expect(asked == 7 && s.runs == 7)
        // the answer is the original (40 slots, all kept) or one that was seen to fail
        #expect(best.kept.contains(30) && best.kept.contains(1))
    }

    /// A shrunk schedule on real nodes: it runs its first slots only, and a slot left out draws
    /// its fault (listed as not started) but starts nothing.
    @Test func aShrunkScheduleRunsItsFirstSlotsAndStartsNoneLeftOut() {
        var o = SimScenario.Options.drawn(seed: 7, maxNodes: 5, seconds: 60)
        o.slots = 4
        o.leftOut = [1, 2]
        let r = SimScenario.run(o)
        #expect(r.slots.map(\.index) == [0, 1, 2, 3])
        #expect(r.slots.map(\.started) == [true, false, false, true])
        #expect(r.faults == r.slots.filter(\.started).map(\.label))
        // a slot left out draws the fault it drew in the whole schedule (slot 1; slot 2 comes
        // after it, on a cluster where slot 1 did not happen, and may draw another node)
        var all = SimScenario.Options.drawn(seed: 7, maxNodes: 5, seconds: 60)
        all.slots = 4
        let whole = SimScenario.run(all)
        #expect(whole.slots.map(\.started) == [true, true, true, true])
        #expect(Array(whole.slots.prefix(2).map(\.label)) == Array(r.slots.prefix(2).map(\.label)))
    }
}
