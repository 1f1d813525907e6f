import Foundation
import Testing

/// Tools for exploring the simulation, inert unless asked for through the environment:
/// `SIM_SWEEP_FROM`/`SIM_SWEEP_TO` (seeds), `SIM_SWEEP_NODES` (e.g. `3,4,5`), `SIM_SWEEP_FAULTS`
/// run many random scenarios and print the failing ones; `SIM_SEED` (with `SIM_NODES`,
/// `SIM_FAULTS`, `SIM_MIX`: the clients' action mix, `SIM_STALE`: late requests of gateways clients left, `SIM_JITTER_MS`, `SIM_HELD`: the network)
/// replays one with its trace, printing the lines that contain any word of
/// `SIM_GREP`, and `SIM_DUMP` prints each node's keyspace at the end.
@Suite struct KeyspaceSimulationTools {
    @Test func sweep() {
        let env = ProcessInfo.processInfo.environment
        guard let from = env["SIM_SWEEP_FROM"].flatMap({ UInt64($0) }), let to = env["SIM_SWEEP_TO"].flatMap({ UInt64($0) }) else { return }
        let sizes = (env["SIM_SWEEP_NODES"] ?? "4").split(separator: ",").compactMap { Int($0) }
        let faults = Int(env["SIM_SWEEP_FAULTS"] ?? "4") ?? 4
        var gaps: [String: Int] = [:]
        var failed = 0
        for nodes in sizes {
            for seed in from..<to {
                let r = SimRuns.random(seed: seed, nodes: nodes, faults: faults)
                gaps["known problems", default: 0] += r.sim.convergenceProblems().count - r.problems.count
                for g in r.sim.knownGaps { gaps[String(g.prefix(while: { $0 != ":" })), default: 0] += 1 }
                if !r.sim.violations.isEmpty || !r.problems.isEmpty {
                    failed += 1
                    print("== nodes \(nodes) seed \(seed) \(r.log)")
                    for x in r.sim.violations.prefix(4) { print("  V " + x) }
                    for x in r.problems.prefix(4) { print("  P " + x) }
                }
            }
        }
        print("failed \(failed) of \(sizes.count * Int(to - from)); known gaps: \(gaps)")
    }

    @Test func trace() {
        let env = ProcessInfo.processInfo.environment
        guard let seed = env["SIM_SEED"].flatMap({ UInt64($0) }) else { return }
        let nodes = Int(env["SIM_NODES"] ?? "4") ?? 4
        let faults = Int(env["SIM_FAULTS"] ?? "3") ?? 3
        let mix = env["SIM_MIX"].map { $0.split(separator: ",").compactMap { Double($0) } }
        let r = SimRuns.random(seed: seed, nodes: nodes, faults: faults, config: { cfg in
            if let j = env["SIM_JITTER_MS"].flatMap({ UInt64($0) }) { cfg.jitter = j * simMs }
            if let h = env["SIM_HELD"].flatMap({ Int($0) }) { cfg.heldDeliveryLimit = h }
        }, tune: { sim in
            sim.record = true
            if let mix { sim.mix = mix }
        }, afterFault: { sim in if env["SIM_STALE"] != nil { _ = SimRuns.injectStaleRequests(&sim) } })
        let words = (env["SIM_GREP"] ?? "").split(separator: " ").map(String.init)
        for line in r.sim.trace where words.isEmpty || words.contains(where: { line.contains($0) }) { print(line) }
        for v in r.sim.violations.prefix(10) { print("V", v) }
        for p in r.problems.prefix(10) { print("P", p) }
        if env["SIM_DUMP"] != nil {
            for n in r.sim.upNodes {
                let sp = r.sim.procs[n]!.space
                print("DUMP \(n): orphanKeys \(sp.orphanKeys.map(\.name)) goneSince \(sp.goneSince) ring \(sp.ring.members.map { "\($0)@\(sp.ring.boot(of: $0))" })")
                for (k, m) in sp.owned { print("   \(k.name): \(m.allPlaces.values.map { "\($0.user)@\($0.sink)" })") }
            }
        }
    }
}
