import EventLoop
import Foundation
import GRPCTransport
import PresenceClient
import PresenceWire

/// `presencectl`: a command line for any presenced node, on the Swift client library.
public enum PresenceCtl {
    static let usage = """
    presencectl: look at and take part in presence on a presenced node.

    Usage: presencectl [--server HOST:PORT] [--token TOKEN] COMMAND ...
      --server HOST:PORT   the node (default 127.0.0.1:7400, or $PRESENCECTL_SERVER)
      --token TOKEN        HMAC token for nodes in token mode (or $PRESENCECTL_TOKEN)
      --tls-ca-file PATH   TLS to the node, whose certificate must chain to this CA and name the
                           --server host (or $PRESENCECTL_TLS_CA_FILE; default: cleartext h2c)

    Commands:
      who CHANNEL [--type message|stream] [--state] [--count]
                           users in a channel (all pages); --count prints only how many
      where USER           channels a user is in
      state get CHANNEL USER [--type T]
                           a user's state in a channel
      status get USER...   users' status (UNKNOWN, ONLINE, AWAY, BUSY, OFFLINE)
      join CHANNEL --user U [--type T] [--state k=v ...] [--status S] [--quiet]
                           stay in the channel as a device of U until interrupted; stdin lines:
                           'set k=v ...', 'remove k ...' (or 'remove' for all), 'status away|busy|online|offline',
                           'leave' (leave and exit)
      watch CHANNEL --user U [--type T] [--json] [--follow USER ...]
                           join with presence as U and print each event on a line (JSON with --json);
                           --follow also prints status changes of those users
      members              the cluster members this node knows: id, peer address, status, incarnation
      ring [CHANNEL] [--type T] [--user U]
                           ring members; with CHANNEL its owner and replicas, with --user the user's home
      top [--http HOST:PORT,...] [--interval S] [--count N]
                           a live view of nodes from their /metrics (default 127.0.0.1:7402): members,
                           sessions, channels, calls/s, events/s, peer traffic, memory, CPU
      bench setstate|online-users|fanout|populate [--clients N] [--duration S] [--members N] [--channels K]
                           [--rate R] [--subscribers N] [--connections N]
      bench ws-setstate|ws-fanout|ws-idle [--http HOST:PORT] [--clients N] [--subscribers N] [--sockets N]
                           load tests (see BENCHMARKS.md); ws-* go over the WebSocket API
      help                 this text
    """

    /// Run from `main` with SIGTERM/SIGINT already blocked (`SignalWaiter.blockTermination()`).
    public static func main(_ args: [String]) async {
        do {
            try await run(args)
            exit(0)
        } catch let e as UsageError {
            FileHandle.standardError.write(Data("presencectl: \(e)\n(see presencectl help)\n".utf8))
            exit(2)
        } catch let e as GRPCStatus {
            FileHandle.standardError.write(Data("presencectl: \(e.code.name): \(e.message)\n".utf8))
            exit(1)
        } catch {
            FileHandle.standardError.write(Data("presencectl: \(error)\n".utf8))
            exit(1)
        }
    }

    static let valued: Set<String> = ["server", "token", "tls-ca-file", "type", "user", "status", "clients", "duration",
                                      "subscribers", "connections", "follow", "rate", "publishers", "http", "interval", "count", "sockets", "members", "channels", "channel"]

    static func run(_ argv: [String]) async throws {
        // `--state` is a switch for `who` (show state) and takes k=v for `join`.
        let isDevice = argv.contains("join") || argv.contains("watch")
        let a = try Arguments(argv, valued: isDevice ? valued.union(["state"]) : valued)
        guard let command = a.positionals.first, command != "help", !a.has("help") else {
            Output.line(usage)
            return
        }
        let env = ProcessInfo.processInfo.environment
        let serverText = a.value("server") ?? env["PRESENCECTL_SERVER"] ?? "127.0.0.1:7400"
        guard let server = HostPort(parsing: serverText) else { throw UsageError("--server wants HOST:PORT, got '\(serverText)'") }
        let token = a.value("token") ?? env["PRESENCECTL_TOKEN"] ?? ""
        var tls: TLSContextSource? = nil
        if let ca = a.value("tls-ca-file") ?? env["PRESENCECTL_TLS_CA_FILE"] {
            // (the node's certificate must name the host given; an IP address is checked as the CA alone)
            let name = server.host.contains(where: { $0.isLetter }) && !server.host.contains(":") ? server.host : nil
            do {
                tls = try TLSContextSource(TLSConfiguration(trustedCAFile: ca, serverName: name), server: false)
            } catch {
                throw UsageError("--tls-ca-file: \(error)")
            }
        }
        let rest = Array(a.positionals.dropFirst())
        if command == "top" {
            let targets = (a.value("http") ?? env["PRESENCECTL_HTTP"] ?? "127.0.0.1:7402").split(separator: ",").map(String.init)
            guard let interval = Double(a.value("interval") ?? "2"), interval >= 0.1, interval <= 3600 else { throw UsageError("--interval wants seconds from 0.1 to 3600") }
            let count = try a.value("count").map { v throws -> Int in
                guard let n = Int(v), n >= 1 else { throw UsageError("--count wants a whole number of refreshes, at least 1") }
                return n
            }
            try await Top(targets: targets, interval: interval, count: count).run()
            return
        }
        let group = EventLoopGroup(count: 1, name: "presencectl")
        let ctx = Context(server: server, token: token, tls: tls, group: group, args: a)
        switch command {
        case "who": try await ctx.who(rest)
        case "where": try await ctx.whereIs(rest)
        case "state": try await ctx.state(rest)
        case "status": try await ctx.status(rest)
        case "join": try await ctx.join(rest, watch: false)
        case "watch": try await ctx.join(rest, watch: true)
        case "members": try await ctx.members(rest)
        case "ring": try await ctx.ring(rest)
        case "bench": try await Bench(ctx: ctx).run(rest)
        default: throw UsageError("unknown command '\(command)'")
        }
    }
}

struct Context: Sendable {
    let server: HostPort
    let token: String
    let tls: TLSContextSource?
    let group: EventLoopGroup
    let args: Arguments

    func channelType() throws(UsageError) -> ChannelType {
        switch args.value("type") ?? "message" {
        case "message": return .message
        case "stream": return .stream
        case let t: throw UsageError("--type wants message or stream, got '\(t)'")
        }
    }

    /// A client whose calls carry the token (token mode), if one was given.
    func rawClient() -> GRPCClient {
        var c = ClientConfiguration(target: server)
        if !token.isEmpty { c.metadata = [("authorization", "Bearer " + token)] }
        c.tls = tls
        return GRPCClient(configuration: c, group: group)
    }

    func who(_ rest: [String]) async throws {
        try args.check(allowed: ["server", "token", "type", "state", "count"])
        guard rest.count == 1 else { throw UsageError("who takes one CHANNEL") }
        let client = rawClient()
        let type = try channelType()
        if args.has("count") {
            let r = try await client.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: rest[0], channelType: type, includeUserID: false))
            Output.line(String(r.totalOccupancy))
            return
        }
        var page = ""
        repeat {
            let r = try await client.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: rest[0], channelType: type, includeUserID: true, includeState: args.has("state"), page: page))
            for u in r.users {
                Output.line(args.has("state") && !u.states.isEmpty ? "\(u.userID) \(Format.state(u.states))" : u.userID)
            }
            page = r.nextPage
        } while !page.isEmpty
    }

    func whereIs(_ rest: [String]) async throws {
        try args.check(allowed: ["server", "token"])
        guard rest.count == 1 else { throw UsageError("where takes one USER") }
        let r = try await rawClient().unary(PresenceMethods.getUserChannels, GetUserChannelsRequest(userID: rest[0]))
        for c in r.channels { Output.line("\(c.channelName) \(Format.type(c.channelType))") }
    }

    func members(_ rest: [String]) async throws {
        try args.check(allowed: ["server", "token"])
        guard rest.isEmpty else { throw UsageError("members takes no arguments") }
        let r = try await rawClient().unary(AdminMethods.members, AdminMembersRequest())
        for m in r.members {
            let status: String
            switch m.status {
            case .alive: status = "alive"
            case .suspect: status = "suspect"
            case .dead: status = "dead"
            case .left: status = "left"
            default: status = "unknown"
            }
            let clients = m.clientAddress.isEmpty ? "" : " clients=\(m.clientAddress)"
            Output.line("\(m.nodeID) peers=\(m.peerAddress)\(clients) \(status) incarnation=\(m.incarnation) boot=\(m.boot)\(m.isSelf ? " (this node)" : "")")
        }
    }

    func ring(_ rest: [String]) async throws {
        try args.check(allowed: ["server", "token", "type", "user"])
        guard rest.count <= 1 else { throw UsageError("ring takes at most one CHANNEL") }
        let type = try channelType()
        let r = try await rawClient().unary(AdminMethods.ring, AdminRingRequest(channelName: rest.first ?? "", channelType: type.rawValue, userID: args.value("user") ?? ""))
        Output.line("members: \(r.ringMembers.joined(separator: " "))")
        if let ch = rest.first { Output.line("channel \(ch): owner \(r.channelOwners.first ?? "-"), replicas \(r.channelOwners.dropFirst().joined(separator: " "))") }
        if let u = args.value("user") { Output.line("user \(u): home \(r.userHome)") }
    }

    func state(_ rest: [String]) async throws {
        try args.check(allowed: ["server", "token", "type"])
        guard rest.count == 3, rest[0] == "get" else { throw UsageError("usage: state get CHANNEL USER") }
        let r = try await rawClient().unary(PresenceMethods.getState, GetStateRequest(channelName: rest[1], channelType: try channelType(), userID: rest[2]))
        for s in r.state?.states ?? [] { Output.line("\(s.key)=\(s.value)") }
    }

    func status(_ rest: [String]) async throws {
        try args.check(allowed: ["server", "token"])
        guard rest.count >= 2, rest[0] == "get" else { throw UsageError("usage: status get USER...") }
        let r = try await rawClient().unary(PresenceMethods.getUserStatuses, GetUserStatusesRequest(userIDs: Array(rest.dropFirst())))
        for s in r.statuses { Output.line("\(s.userID) \(Format.status(s.status))") }
    }

    static func parseStatus(_ s: String) throws(UsageError) -> UserStatus {
        switch s.lowercased() {
        case "online": return .online
        case "away": return .away
        case "busy": return .busy
        case "offline", "invisible": return .offline
        default: throw UsageError("status wants online, away, busy or offline, got '\(s)'")
        }
    }

    static func parsePairs(_ pairs: [String]) throws(UsageError) -> [String: String] {
        var out: [String: String] = [:]
        for p in pairs {
            guard let eq = p.firstIndex(of: "=") else { throw UsageError("state wants k=v, got '\(p)'") }
            out[String(p[..<eq])] = String(p[p.index(after: eq)...])
        }
        return out
    }

    /// `join` and `watch`: a device that stays until interrupted.
    func join(_ rest: [String], watch: Bool) async throws {
        try args.check(allowed: ["server", "token", "type", "user", "state", "status", "quiet", "json", "follow"])
        guard rest.count == 1 else { throw UsageError("\(watch ? "watch" : "join") takes one CHANNEL") }
        guard let user = args.value("user") else { throw UsageError("--user U is required") }
        let channel = rest[0]
        let type = try channelType()
        let initialState = try Self.parsePairs(args.values("state"))
        let client = PresenceClient(server: server, userID: user, token: token, tls: tls, group: group)
        if let s = args.value("status") { try await client.setStatus(try Self.parseStatus(s)) }
        let json = args.has("json")
        let quiet = args.has("quiet") && !watch
        let printer = Task {
            for await e in client.events where !quiet { Output.line(json ? Format.json(e) : Format.line(e)) }
        }
        try await client.connect()
        if !initialState.isEmpty { try await client.setState(channel, type: type, initialState) }
        try await client.join(channel, type: type, withPresence: watch || !quiet)
        let follow = args.values("follow")
        if !follow.isEmpty {
            for s in try await client.watch(follow) {
                Output.line(json ? Format.json(.status(UserStatusEvent(userID: s.userID, status: s.status))) : "STATUS \(s.userID) \(Format.status(s.status))")
            }
        }
        FileHandle.standardError.write(Data("presencectl: \(user) is in \(channel) (session \(client.sessionID ?? "?")); Ctrl-C to leave\n".utf8))
        if !json && !quiet { Output.line("# joined \(channel) as \(user)") }
        // Until SIGINT/SIGTERM, or 'leave' on stdin.
        let done = AsyncStream<String>.makeStream()
        SignalWaiter.start { _ in done.continuation.yield("signal") }
        let lines = StdinLines.start()
        let commands = Task {
            for await line in lines {
                do {
                    if try await handle(line, client: client, channel: channel, type: type) { done.continuation.yield("leave") }
                } catch {
                    FileHandle.standardError.write(Data("presencectl: \(error)\n".utf8))
                }
            }
        }
        for await _ in done.stream { break }
        commands.cancel()
        await client.close()
        printer.cancel()
    }

    /// One stdin command; true when it asks to leave.
    func handle(_ line: String, client: PresenceClient, channel: String, type: ChannelType) async throws -> Bool {
        let words = line.split(separator: " ").map(String.init)
        guard let verb = words.first else { return false }
        switch verb {
        case "set": try await client.setState(channel, type: type, try Self.parsePairs(Array(words.dropFirst())))
        case "remove": try await client.removeState(channel, type: type, keys: Array(words.dropFirst()))
        case "status":
            guard words.count == 2 else { throw UsageError("usage: status away|busy|online|offline") }
            try await client.setStatus(try Self.parseStatus(words[1]))
        case "leave": return true
        default: throw UsageError("unknown command '\(verb)' (set k=v, remove k, status S, leave)")
        }
        return false
    }
}

/// Unbuffered output, so a pipe or file sees each event as it happens.
enum Output {
    static func line(_ s: String) {
        FileHandle.standardOutput.write(Data((s + "\n").utf8))
    }
}

/// Lines of standard input, read on a thread of their own.
enum StdinLines {
    static func start() -> AsyncStream<String> {
        let (stream, cont) = AsyncStream<String>.makeStream()
        let t = Thread {
            while let line = readLine() { cont.yield(line) }
            cont.finish()
        }
        t.start()
        return stream
    }
}

/// How events look on a terminal.
enum Format {
    static func type(_ t: ChannelType) -> String {
        switch t {
        case .message: "message"
        case .stream: "stream"
        default: "\(t.rawValue)"
        }
    }

    static func status(_ s: UserStatus) -> String {
        switch s {
        case .unknown: "UNKNOWN"
        case .online: "ONLINE"
        case .away: "AWAY"
        case .busy: "BUSY"
        case .offline: "OFFLINE"
        case .unrecognized(let v): "\(v)"
        }
    }

    static func eventName(_ t: PresenceEventType) -> String {
        switch t {
        case .unspecified: "UNSPECIFIED"
        case .snapshot: "SNAPSHOT"
        case .interval: "INTERVAL"
        case .remoteJoin: "REMOTE_JOIN"
        case .remoteLeave: "REMOTE_LEAVE"
        case .remoteTimeout: "REMOTE_TIMEOUT"
        case .remoteStateChanged: "REMOTE_STATE_CHANGED"
        case .unrecognized(let v): "\(v)"
        }
    }

    static func state(_ items: [StateItem]) -> String {
        items.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
    }

    static func users(_ users: [UserState]) -> String {
        users.map { $0.states.isEmpty ? $0.userID : "\($0.userID){\(state($0.states))}" }.joined(separator: ",")
    }

    static func line(_ e: PresenceClientEvent) -> String {
        switch e {
        case .status(let s):
            return "STATUS \(s.userID) \(status(s.status))"
        case .presence(let p):
            var out = "\(eventName(p.type)) \(p.channelName)#\(p.sequence)"
            switch p.type {
            case .snapshot: out += " users=[\(users(p.snapshot))]"
            case .interval:
                let i = p.interval ?? IntervalInfo()
                out += " join=[\(i.joinUserIDs.joined(separator: ","))] leave=[\(i.leaveUserIDs.joined(separator: ","))] timeout=[\(i.timeoutUserIDs.joined(separator: ","))] states=[\(users(i.userStates))]"
            case .remoteStateChanged: out += " \(p.publisher) \(state(p.states))"
            default: out += " \(p.publisher)"
            }
            return out
        }
    }

    static func json(_ e: PresenceClientEvent) -> String {
        func usersJSON(_ u: [UserState]) -> [[String: Any]] {
            u.map { ["user_id": $0.userID, "states": Dictionary($0.states.map { ($0.key, $0.value) }) { a, _ in a }] }
        }
        var obj: [String: Any]
        switch e {
        case .status(let s):
            obj = ["kind": "status", "user_id": s.userID, "status": status(s.status), "timestamp_ms": s.timestampMs]
        case .presence(let p):
            obj = ["kind": "presence", "type": eventName(p.type), "channel_name": p.channelName, "channel_type": type(p.channelType),
                   "publisher": p.publisher, "sequence": p.sequence, "timestamp_ms": p.timestampMs,
                   "states": Dictionary(p.states.map { ($0.key, $0.value) }) { a, _ in a }]
            if p.type == .snapshot { obj["snapshot"] = usersJSON(p.snapshot) }
            if let i = p.interval {
                obj["interval"] = ["join_user_ids": i.joinUserIDs, "leave_user_ids": i.leaveUserIDs,
                                   "timeout_user_ids": i.timeoutUserIDs, "user_states": usersJSON(i.userStates)]
            }
        }
        let data = (try? JSONSerialization.data(withJSONObject: obj, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }
}
