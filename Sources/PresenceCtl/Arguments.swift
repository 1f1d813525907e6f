import EventLoop
import Foundation

/// A command line split into positionals and `--flag value` / `--flag=value` / `--switch` options.
struct Arguments {
    var positionals: [String] = []
    var options: [String: [String]] = [:]
    var switches: Set<String> = []

    /// `valued`: flags that take a value; every other `--x` is a switch.
    init(_ args: [String], valued: Set<String>) throws(UsageError) {
        var i = 0
        while i < args.count {
            let a = args[i]
            if a.hasPrefix("--") {
                var name = String(a.dropFirst(2))
                if let eq = name.firstIndex(of: "=") {
                    options[String(name[..<eq]), default: []].append(String(name[name.index(after: eq)...]))
                } else if valued.contains(name) {
                    i += 1
                    guard i < args.count else { throw UsageError("--\(name) needs a value") }
                    options[name, default: []].append(args[i])
                } else {
                    name = name.lowercased()
                    switches.insert(name)
                }
            } else {
                positionals.append(a)
            }
            i += 1
        }
    }

    func value(_ name: String) -> String? { options[name]?.last }
    func values(_ name: String) -> [String] { options[name] ?? [] }
    func has(_ name: String) -> Bool { switches.contains(name) }

    func int(_ name: String, default d: Int) throws(UsageError) -> Int {
        guard let v = value(name) else { return d }
        guard let n = Int(v), n > 0 else { throw UsageError("--\(name) wants a positive whole number, got '\(v)'") }
        return n
    }

    /// A whole number that may be 0.
    func count(_ name: String, default d: Int) throws(UsageError) -> Int {
        guard let v = value(name) else { return d }
        guard let n = Int(v), n >= 0 else { throw UsageError("--\(name) wants a whole number, got '\(v)'") }
        return n
    }

    func double(_ name: String, default d: Double) throws(UsageError) -> Double {
        guard let v = value(name) else { return d }
        guard let n = Double(v), n > 0 else { throw UsageError("--\(name) wants a positive number, got '\(v)'") }
        return n
    }

    /// Fails on any option not in `allowed`, so a typo is reported rather than ignored.
    func check(allowed: Set<String>) throws(UsageError) {
        let allowed = allowed.union(["server", "token", "tls-ca-file"])   // (global options)
        for k in options.keys where !allowed.contains(k) { throw UsageError("unknown option --\(k)") }
        for k in switches where !allowed.contains(k) { throw UsageError("unknown option --\(k)") }
    }
}

struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}
