import EventLoop
import Foundation
import Synchronization

/// Writes one line per event to standard error (or to `sink`), as text or JSON, at or above a level.
public final class Logger: Sendable {
    public let level: NodeConfiguration.LogLevel
    public let format: NodeConfiguration.LogFormat
    /// Where lines go instead of standard error (the simulation puts them in its trace).
    private let sink: (@Sendable (String) -> Void)?
    private let lock = Mutex(())

    public init(level: NodeConfiguration.LogLevel, format: NodeConfiguration.LogFormat, sink: (@Sendable (String) -> Void)? = nil) {
        self.level = level
        self.format = format
        self.sink = sink
    }

    private static func rank(_ l: NodeConfiguration.LogLevel) -> Int {
        switch l {
        case .debug: 0
        case .info: 1
        case .warning: 2
        case .error: 3
        }
    }

    public func log(_ l: NodeConfiguration.LogLevel, _ message: String, _ fields: KeyValuePairs<String, String> = [:]) {
        guard Logger.rank(l) >= Logger.rank(level) else { return }
        if let sink {
            sink(([message] + fields.map { "\($0.key)=\(Logger.escaped($0.value))" }).joined(separator: " "))
            return
        }
        let ms = WallClock.nowMilliseconds()
        let time = ISO8601DateFormatter.string(from: Date(timeIntervalSince1970: Double(ms) / 1000), timeZone: .gmt,
                                               formatOptions: [.withInternetDateTime, .withFractionalSeconds])
        var line: String
        switch format {
        case .text:
            line = "\(time) \(l.rawValue.uppercased()) \(Logger.escaped(message))"
            for (k, v) in fields {
                let e = Logger.escaped(v)
                line += " \(k)=\(e.contains(" ") || e.isEmpty ? "\"\(e)\"" : e)"
            }
        case .json:
            var obj: [String: String] = ["time": time, "level": l.rawValue, "msg": message]
            for (k, v) in fields { obj[k] = v }
            let data = (try? JSONSerialization.data(withJSONObject: obj, options: [.sortedKeys])) ?? Data()
            line = String(decoding: data, as: UTF8.self)
        }
        line += "\n"
        lock.withLock { _ in FileHandle.standardError.write(Data(line.utf8)) }
    }

    /// A value as one line of text: control characters (a newline in an id a peer gossiped
    /// would forge a log line), quotes and backslashes escaped.
    static func escaped(_ s: String) -> String {
        guard s.unicodeScalars.contains(where: { $0.value < 0x20 || $0 == "\"" || $0 == "\\" || $0.value == 0x7f }) else { return s }
        var out = ""
        for u in s.unicodeScalars {
            switch u {
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            default:
                if u.value < 0x20 || u.value == 0x7f { out += String(format: "\\x%02x", u.value) } else { out.unicodeScalars.append(u) }
            }
        }
        return out
    }

    public func debug(_ m: String, _ f: KeyValuePairs<String, String> = [:]) { log(.debug, m, f) }
    /// `debug` as a closure for the parts that trace, or nil when debug lines are not logged (they
    /// then skip building them).
    public var debugTrace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)? {
        guard level == .debug else { return nil }
        return { [self] m, f in debug(m, f) }
    }
    public func info(_ m: String, _ f: KeyValuePairs<String, String> = [:]) { log(.info, m, f) }
    public func warning(_ m: String, _ f: KeyValuePairs<String, String> = [:]) { log(.warning, m, f) }
    public func error(_ m: String, _ f: KeyValuePairs<String, String> = [:]) { log(.error, m, f) }
}
