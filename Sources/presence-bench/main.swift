// presence-bench: in-process measurements of the presence engine (no network).
//   presence-bench memory [--users N] [--channels-per-user K] [--channels C] [--in-flight N]
// prints resident bytes per (user, channel) membership.
import ClusterCore
import EventLoop
import Foundation
import PresenceCore
import PresenceNode
import PresenceWire

func rssBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
    for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return (Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0) * 1024
    }
    return 0
}

func option(_ name: String, _ d: Int) -> Int {
    let args = CommandLine.arguments
    if let i = args.firstIndex(of: "--\(name)"), i + 1 < args.count, let v = Int(args[i + 1]) { return v }
    return d
}

let args = CommandLine.arguments
guard args.count >= 2, ["memory", "ring"].contains(args[1]) else {
    print("usage: presence-bench memory [--users N] [--channels-per-user K] [--channels C] [--in-flight N]\n       presence-bench ring [--nodes N] [--keys K]")
    exit(2)
}
if args[1] == "ring" {
    // Balance of the consistent-hash ring and keys moved when a node joins.
    let n = option("nodes", 8), keys = option("keys", 1_000_000)
    let names = (1...n).map { "node-\($0)" }
    let ring = HashRing(members: names)
    var counts: [String: Int] = [:]
    for i in 0..<keys { counts[ring.owner(of: ChannelKey(name: "channel-\(i)", type: .message))!, default: 0] += 1 }
    let mean = Double(keys) / Double(n)
    let smaller = HashRing(members: names.dropLast())
    var moved = 0
    for i in 0..<keys {
        let k = ChannelKey(name: "channel-\(i)", type: .message)
        if smaller.owner(of: k) != ring.owner(of: k) { moved += 1 }
    }
    print(String(format: "bench=ring nodes=%d keys=%d virtual_nodes=%d max_over_mean=%.3f min_over_mean=%.3f moved_on_join=%.4f moved_times_n=%.3f",
                 n, keys, ring.virtualNodes, Double(counts.values.max()!) / mean, Double(counts.values.min()!) / mean,
                 Double(moved) / Double(keys), Double(moved) / Double(keys) * Double(n)))
    exit(0)
}
let users = option("users", 100_000)
let perUser = option("channels-per-user", 10)
let channels = option("channels", 10_000)
let group = EventLoopGroup(name: "bench")
let engine = PresenceEngine(settings: EngineSettings(nodeID: "bench", presenceTimeout: 10, maxInstantEvents: 50, presenceInterval: 1), loops: group.loops)
// Warm up allocator pools and shard actors before the baseline.
let warm = try await engine.openSession(user: "warm", resume: "", initialStatus: .unknown)
try await engine.join(warm.id.description, channel: "warm", type: .message, withPresence: false)
let before = rssBytes()
let start = Date()
// Users are built `inFlight` at a time, as a node's clients would call it: each loop then takes
// many calls per wake-up instead of one thread hop (and a futex wake) per call.
let inFlight = max(1, option("in-flight", 64))
var sessions: [PresenceEngine.OpenedSession] = []
sessions.reserveCapacity(users)
try await withThrowingTaskGroup(of: PresenceEngine.OpenedSession.self) { group in
    func build(_ u: Int) async throws -> PresenceEngine.OpenedSession {
        let s = try await engine.openSession(user: "user\(u)", resume: "", initialStatus: .unknown)
        for c in 0..<perUser {
            try await engine.join(s.id.description, channel: "channel\((u * perUser + c) % channels)", type: .message, withPresence: false)
        }
        return s
    }
    var next = 0
    while next < min(inFlight, users) {
        let u = next
        group.addTask { try await build(u) }
        next += 1
    }
    while let s = try await group.next() {
        sessions.append(s)
        if next < users {
            let u = next
            group.addTask { try await build(u) }
            next += 1
        }
    }
}
let after = rssBytes()
let memberships = users * perUser
let check = try await engine.getOnlineUsers(GetOnlineUsersRequest(channelName: "channel0", channelType: .message, includeUserID: false))
print(String(format: "bench=memory users=%d channels=%d memberships=%d rss_before_mib=%.1f rss_after_mib=%.1f bytes_per_membership=%.0f build_s=%.1f occupancy_channel0=%d",
             users, channels, memberships, Double(before) / 1048576, Double(after) / 1048576,
             Double(after - before) / Double(memberships), Date().timeIntervalSince(start), check.totalOccupancy))
withExtendedLifetime(sessions) {}
