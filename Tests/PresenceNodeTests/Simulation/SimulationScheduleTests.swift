import Foundation
import Testing

/// Seeded fault schedules on real nodes, every invariant checked (RELIABILITY.md, "The real node
/// in a deterministic simulation"). `PRESENCED_SIM_SEEDS=FROM-TO` picks the seeds (default: the
/// CI set); `PRESENCED_SIM_TRACE=1` prints the trace of a failing seed.
@Suite struct SimulationScheduleTests {
    static func seeds(default range: ClosedRange<UInt64>) -> ClosedRange<UInt64> {
        let parts = ProcessInfo.processInfo.environment["PRESENCED_SIM_SEEDS"].map { $0.split(separator: "-").compactMap { UInt64($0) } }
        return parts.flatMap { $0.count == 2 && $0[0] <= $0[1] ? $0[0]...$0[1] : ($0.count == 1 ? $0[0]...$0[0] : nil) } ?? range
    }

    @Test func seededFaultSchedulesHoldEveryInvariant() {
        let trace = ProcessInfo.processInfo.environment["PRESENCED_SIM_TRACE"] == "1"
        for seed in Self.seeds(default: 1...3) {
            var o = SimScenario.Options.drawn(seed: seed, maxNodes: 8, seconds: 30)
            o.keepsTrace = trace
            let r = SimScenario.run(o)
            print(r.summary)
            print("  faults: \(r.faults.joined(separator: "; "))")
            print("  counts: \(r.counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))")
            if trace && !r.violations.isEmpty { for line in r.trace { print(line) } }
            #expect(r.violations.isEmpty, "\(r.summary)\n\(r.violations.prefix(20).map { "  \($0)" }.joined(separator: "\n"))")
        }
    }
}
