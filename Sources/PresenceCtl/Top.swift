import Foundation
import Glibc

/// `presencectl top`: a live view of one node or a cluster, read from the nodes' `/metrics`
/// (WEB.md): members, sessions, channels, calls/s, events/s, peer traffic, memory and CPU.
struct Top {
    let targets: [String]
    let interval: Double
    let count: Int?

    func run() async throws {
        var previous = await scrapeAll()
        var shown = 0
        let tty = isatty(STDOUT_FILENO) == 1
        while count.map({ shown < $0 }) ?? true {
            try await Task.sleep(nanoseconds: UInt64(interval * 1e9))
            let current = await scrapeAll()
            let table = TopView.render(before: previous, after: current)
            let stamp = ISO8601DateFormatter().string(from: Date())
            Output.line((tty ? "\u{1B}[H\u{1B}[2J" : "") + "presencectl top · \(stamp) · every \(interval) s\n" + table)
            previous = current
            shown += 1
        }
    }

    private func scrapeAll() async -> [TopView.Scrape] {
        await withTaskGroup(of: (Int, TopView.Scrape).self) { group in
            for (i, t) in targets.enumerated() {
                group.addTask {
                    let at = Date().timeIntervalSince1970
                    do {
                        let text = try await Task.detached { try MetricsFetch.get(t, path: "/metrics") }.value
                        return (i, TopView.Scrape(target: t, at: at, samples: MetricsText.parse(text), error: nil))
                    } catch {
                        return (i, TopView.Scrape(target: t, at: at, samples: [], error: "\(error)"))
                    }
                }
            }
            var out = [TopView.Scrape?](repeating: nil, count: targets.count)
            for await (i, s) in group { out[i] = s }
            return out.compactMap { $0 }
        }
    }
}

/// One sample of the text exposition format.
struct MetricSample: Equatable {
    var name: String
    var labels: [String: String]
    var value: Double
}

/// Reads Prometheus's text exposition format (the lines `presenced` writes; comments skipped).
enum MetricsText {
    static func parse(_ text: String) -> [MetricSample] {
        var out: [MetricSample] = []
        for line in text.split(separator: "\n") where !line.hasPrefix("#") && !line.isEmpty {
            var name = Substring(""), labels: [String: String] = [:], rest = Substring("")
            if let brace = line.firstIndex(of: "{"), let close = line.lastIndex(of: "}") {
                name = line[..<brace]
                labels = parseLabels(line[line.index(after: brace)..<close])
                rest = line[line.index(after: close)...]
            } else if let space = line.firstIndex(of: " ") {
                name = line[..<space]
                rest = line[space...]
            }
            let valueText = rest.split(separator: " ").first.map(String.init) ?? ""
            let value = valueText == "+Inf" ? Double.infinity : valueText == "-Inf" ? -Double.infinity : Double(valueText)
            if let value, !name.isEmpty { out.append(MetricSample(name: String(name), labels: labels, value: value)) }
        }
        return out
    }

    private static func parseLabels(_ s: Substring) -> [String: String] {
        var out: [String: String] = [:]
        var i = s.startIndex
        while i < s.endIndex {
            guard let eq = s[i...].firstIndex(of: "=") else { break }
            let key = s[i..<eq].trimmingCharacters(in: CharacterSet(charactersIn: ", "))
            var j = s.index(after: eq)
            guard j < s.endIndex, s[j] == "\"" else { break }
            j = s.index(after: j)
            var value = ""
            while j < s.endIndex, s[j] != "\"" {
                if s[j] == "\\", s.index(after: j) < s.endIndex {
                    j = s.index(after: j)
                    value.append(s[j] == "n" ? "\n" : s[j])
                } else {
                    value.append(s[j])
                }
                j = s.index(after: j)
            }
            out[key] = value
            i = j < s.endIndex ? s.index(after: j) : j
        }
        return out
    }
}

/// The table `top` prints: a plain function of two scrapes of each node.
enum TopView {
    struct Scrape {
        var target: String
        /// Seconds since the epoch.
        var at: Double
        var samples: [MetricSample]
        var error: String?

        func sum(_ name: String, _ match: [String: String] = [:], excluding: [String: String] = [:]) -> Double? {
            let hits = samples.filter { s in
                s.name == name && match.allSatisfy { s.labels[$0.key] == $0.value } && !excluding.contains { s.labels[$0.key] == $0.value }
            }
            return hits.isEmpty ? nil : hits.reduce(0) { $0 + $1.value }
        }
        var nodeID: String { samples.first { $0.name == "presenced_node_info" }?.labels["node_id"] ?? target }
    }

    static let columns = ["node", "alive", "sessions", "waiting", "channels", "members", "calls/s", "errors/s", "events/s",
                          "dropped/s", "peer KiB/s", "peer queue", "RSS MiB", "CPU %"]

    static func render(before: [Scrape], after: [Scrape]) -> String {
        var rows: [[String]] = []
        var problems: [String] = []
        var totals = [Double](repeating: 0, count: columns.count)
        let summed: Set<Int> = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
        for now in after {
            guard now.error == nil else {
                rows.append([now.target] + Array(repeating: "-", count: columns.count - 1))
                problems.append("\(now.target): unreachable (\(now.error!.prefix(80)))")
                continue
            }
            let then = before.first { $0.target == now.target && $0.error == nil }
            let dt = then.map { max(0.001, now.at - $0.at) }
            func rate(_ name: String, _ match: [String: String] = [:], excluding: [String: String] = [:]) -> Double? {
                guard let then, let dt else { return nil }
                // (a family with no sample yet, calls by code before any call, counts as 0)
                let a = then.sum(name, match, excluding: excluding) ?? 0, b = now.sum(name, match, excluding: excluding) ?? 0
                return max(0, b - a) / dt
            }
            let values: [Double?] = [
                nil,
                now.sum("presenced_members", ["status": "alive"]),
                now.sum("presenced_sessions", ["state": "connected"]),
                now.sum("presenced_sessions", ["state": "disconnected"]),
                now.sum("presenced_channels", ["role": "owner"]),
                now.sum("presenced_memberships"),
                rate("presenced_grpc_calls_total"),
                rate("presenced_grpc_calls_total", excluding: ["code": "OK"]),
                rate("presenced_events_queued_total"),
                rate("presenced_events_dropped_total"),
                rate("presenced_peer_bytes_received_total").map { $0 / 1024 },
                now.sum("presenced_peer_queue_items"),
                now.sum("presenced_process_resident_memory_bytes").map { $0 / 1_048_576 },
                rate("presenced_process_cpu_seconds_total").map { $0 * 100 },
            ]
            var row = [now.nodeID]
            for (i, v) in values.enumerated().dropFirst() {
                row.append(v.map { format($0) } ?? "-")
                if let v, summed.contains(i) { totals[i] += v }
            }
            rows.append(row)
        }
        if after.count > 1 {
            var row = ["total", ""]
            for i in 2..<columns.count { row.append(format(totals[i])) }
            rows.append(row)
        }
        return table([columns] + rows) + problems.map { "\n" + $0 }.joined()
    }

    static func format(_ v: Double) -> String {
        if v == v.rounded(), abs(v) < 1e12 { return String(Int64(v)) }
        return v >= 100 ? String(format: "%.0f", v) : String(format: "%.1f", v)
    }

    static func table(_ rows: [[String]]) -> String {
        let widths = (0..<(rows.map(\.count).max() ?? 0)).map { c in rows.map { c < $0.count ? $0[c].count : 0 }.max() ?? 0 }
        return rows.map { row in
            row.enumerated().map { c, cell in
                c == 0 ? cell.padding(toLength: widths[c], withPad: " ", startingAt: 0)
                       : String(repeating: " ", count: max(0, widths[c] - cell.count)) + cell
            }.joined(separator: "  ")
        }.joined(separator: "\n")
    }
}

/// A plain HTTP/1.1 GET over a blocking socket (the front door's routes are small and local).
enum MetricsFetch {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    static func get(_ target: String, path: String, timeoutSeconds: Int = 5) throws -> String {
        let parts = target.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count >= 2, let port = Int(parts.last!) else { throw Failure(description: "want HOST:PORT, got \(target)") }
        let host = parts.dropLast().joined(separator: ":").trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var res: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &res) == 0, let ai = res else { throw Failure(description: "cannot resolve \(host)") }
        defer { freeaddrinfo(res) }
        let fd = socket(ai.pointee.ai_family, ai.pointee.ai_socktype, 0)
        guard fd >= 0 else { throw Failure(description: "socket failed") }
        defer { close(fd) }
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        guard connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 else { throw Failure(description: "connection refused") }
        let request = Array("GET \(path) HTTP/1.1\r\nHost: \(target)\r\nConnection: close\r\n\r\n".utf8)
        guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else {
            throw Failure(description: "send failed")
        }
        var body: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while body.count < 64 << 20 {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            body += chunk[0..<n]
        }
        let text = String(decoding: body, as: UTF8.self)
        guard let headEnd = text.range(of: "\r\n\r\n") else { throw Failure(description: "no answer") }
        let status = text[..<headEnd.lowerBound].split(separator: " ").dropFirst().first ?? ""
        guard status == "200" else { throw Failure(description: "HTTP \(status)") }
        return String(text[headEnd.upperBound...])
    }
}
