// presence-bench: in-process measurements of the presence engine (no network).
//   presence-bench memory [--users N] [--channels-per-user K] [--channels C] [--in-flight N] [--id-bytes N]
// prints resident bytes per (user, channel) membership.
//   presence-bench breakdown [--users N] [--channels-per-user K] [--channels C]
// builds the same memberships in each of the engine's per-membership structures alone (the
// channels' machines, the gateway's session table, the users' home records) and prints the resident
// bytes each costs per membership: where `memory`'s figure goes.
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
guard args.count >= 2, ["memory", "ring", "breakdown"].contains(args[1]) else {
    print("usage: presence-bench memory [--users N] [--channels-per-user K] [--channels C] [--in-flight N]\n       presence-bench breakdown [--users N] [--channels-per-user K] [--channels C]\n       presence-bench ring [--nodes N] [--keys K]")
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
// (--id-bytes N: user ids and channel names padded to N bytes, as UUID-style ids are (36); the
// default names fit Swift's 15-byte inline strings and cost no allocation of their own)
let idBytes = option("id-bytes", 0)
func padded(_ s: String) -> String { s.utf8.count >= idBytes ? s : String(repeating: "0", count: idBytes - s.utf8.count) + s }
func userName(_ u: Int) -> String { padded("user\(u)") }
func channelName(_ c: Int) -> String { padded("channel\(c)") }
if args[1] == "breakdown" {
    // Each structure alone, filled as `memory` fills the engine (user u joins channels
    // u*K ... u*K+K-1 modulo C, one session per user, no state), measured by RSS.
    let sink = NodeInstance("bench", boot: 1)
    let memberships = Double(users * perUser)
    func ids(_ u: Int) -> SessionID { SessionID(hi: UInt64(u) &+ 1, lo: UInt64(u) &* 2 &+ 1) }
    func channel(_ u: Int, _ c: Int) -> ChannelKey { ChannelKey(name: channelName((u * perUser + c) % channels), type: .message) }
    // (everything built stays alive to the end: memory freed by one structure's growth would
    // otherwise be reused by the next, and counted for neither)
    var kept: [Any] = []
    func measure(_ name: String, _ build: () -> Any) {
        let before = rssBytes()
        let start = Date()
        kept.append(build())
        let after = rssBytes()
        print(String(format: "bench=breakdown structure=%@ bytes_per_membership=%.0f build_s=%.2f",
                     name, Double(after - before) / memberships, Date().timeIntervalSince(start)))
    }
    measure("channel-machines") {
        var machines: [ChannelKey: ChannelMachine<NodeInstance>] = [:]
        for u in 0..<users {
            for c in 0..<perUser {
                let key = channel(u, c)
                _ = machines[key, default: ChannelMachine(key: key, maxInstantEvents: 50)]
                    .join(user: userName(u), session: ids(u), withPresence: false, sink: sink, now: 0)
            }
        }
        return machines
    }
    measure("session-table") {
        var table = SessionTable(resumeWindow: 1)
        for u in 0..<users {
            _ = table.open(user: userName(u), resume: nil, newID: ids(u), now: 0)
            for c in 0..<perUser { _ = try? table.joined(ids(u), channel: channel(u, c), withPresence: false) }
        }
        return table
    }
    measure("home-records") {
        var homes: [String: HomeRecord<NodeInstance>] = [:]
        for u in 0..<users {
            var home = HomeRecord<NodeInstance>(userID: userName(u))
            _ = home.sessionOpened(session: ids(u), sink: sink, initial: .online)
            for c in 0..<perUser { home.sessionJoined(session: ids(u), channel: channel(u, c), withPresence: false) }
            homes[userName(u)] = home
        }
        return homes
    }
    withExtendedLifetime(kept) {}
    exit(0)
}
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
        let s = try await engine.openSession(user: userName(u), resume: "", initialStatus: .unknown)
        for c in 0..<perUser {
            try await engine.join(s.id.description, channel: channelName((u * perUser + c) % channels), type: .message, withPresence: false)
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
if CommandLine.arguments.contains("--heap") {
    // (glibc's own account of its arenas, on stderr: system bytes against bytes in use)
    if let f = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc_stats") {
        unsafeBitCast(f, to: (@convention(c) () -> Void).self)()
    }
}
let check = try await engine.getOnlineUsers(GetOnlineUsersRequest(channelName: channelName(0), channelType: .message, includeUserID: false))
print(String(format: "bench=memory users=%d channels=%d memberships=%d rss_before_mib=%.1f rss_after_mib=%.1f bytes_per_membership=%.0f build_s=%.1f occupancy_channel0=%d",
             users, channels, memberships, Double(before) / 1048576, Double(after) / 1048576,
             Double(after - before) / Double(memberships), Date().timeIntervalSince(start), check.totalOccupancy))
withExtendedLifetime(sessions) {}
