/// Shrinks a failing schedule to a short one that still fails (RELIABILITY.md, "The real node in a
/// deterministic simulation": a failing seed "can be shrunk to a short schedule").
///
/// A schedule is its seed's fault slots, in order: slot k is the k-th fault the seed draws. A
/// shorter schedule keeps the first `slots` of them and leaves some out: a left-out slot still
/// draws what it would have (so every other slot draws the same fault), but starts nothing.
/// `fails` runs a candidate and says whether it still fails as the original did. The shrinker
/// first cuts the schedule after the shortest prefix that fails, then leaves slots out one at a
/// time while it still fails (until no single slot can go: a 1-minimal schedule, as delta
/// debugging calls it). Every run is counted and bounded: a schedule of n slots takes at most
/// about log2(n) + n * (n + 1) / 2 runs, and `maxRuns` stops it sooner.
struct ScheduleShrinker {
    struct Candidate: Equatable, CustomStringConvertible {
        var slots: Int
        var leftOut: Set<Int>

        var kept: [Int] { (0..<slots).filter { !leftOut.contains($0) } }
        var description: String { "slots \(slots), kept \(kept.map(String.init).joined(separator: ","))" }
    }

    let maxRuns: Int
    private(set) var runs = 0

    init(maxRuns: Int = 200) { self.maxRuns = maxRuns }

    /// The shortest failing schedule found from a failing one of `slots` slots. `fails` is not
    /// asked about the original (it is known to fail).
    mutating func shrink(slots: Int, fails: (Candidate) -> Bool) -> Candidate {
        var best = Candidate(slots: slots, leftOut: [])
        // 1. the shortest failing prefix (binary search: a prefix that fails stays the answer)
        var lo = 0, hi = slots   // hi fails; lo is unknown (0 slots: the schedule with no fault)
        while lo < hi && runs < maxRuns {
            let mid = (lo + hi) / 2
            runs += 1
            if fails(Candidate(slots: mid, leftOut: [])) { hi = mid } else { lo = mid + 1 }
        }
        best.slots = hi
        // 2. leave slots out, one at a time, latest first, until none can go
        var changed = true
        while changed && runs < maxRuns {
            changed = false
            for slot in best.kept.reversed() where runs < maxRuns {
                var c = best
                c.leftOut.insert(slot)
                runs += 1
                if fails(c) {
                    best = c
                    changed = true
                }
            }
        }
        // (left-out slots past the last kept one are the same as a shorter prefix)
        if let last = best.kept.last {
            best.slots = last + 1
            best.leftOut = best.leftOut.filter { $0 <= last }
        } else {
            best = Candidate(slots: 0, leftOut: [])
        }
        return best
    }
}
