import Synchronization

/// Metrics for Prometheus (WEB.md, "Metrics"): counters, gauges and histograms kept in atomics
/// where the code counts, and families computed at scrape time from state the node already keeps
/// (sessions, members), rendered in the text exposition format 0.0.4.
public final class MetricsRegistry: Sendable {
    private let families = Mutex<[Family]>([])

    public init() {}

    /// A counter family; `labels` are the label names its children are told apart by. With
    /// `hideZero`, children still at zero are left out (children made up front, for a lookup-free
    /// hot path, then show only once counted).
    public func counter(_ name: String, _ help: String, labels: [String] = [], hideZero: Bool = false) -> CounterFamily {
        let f = CounterFamily(name: name, help: help, labels: labels, hideZero: hideZero)
        add(.counter(f))
        return f
    }

    /// A histogram family with the given bucket upper bounds (`+Inf` is added).
    public func histogram(_ name: String, _ help: String, labels: [String] = [], buckets: [Double], hideZero: Bool = false) -> HistogramFamily {
        let f = HistogramFamily(name: name, help: help, labels: labels, buckets: buckets.sorted(), hideZero: hideZero)
        add(.histogram(f))
        return f
    }

    /// A family whose samples are read when scraped (`kind` is `gauge` or `counter`).
    public func computed(_ name: String, _ help: String, kind: MetricKind = .gauge, labels: [String] = [],
                         _ read: @escaping @Sendable () async -> [Sample]) {
        add(.computed(Computed(name: name, help: help, kind: kind, labels: labels, read: read)))
    }

    private func add(_ f: Family) {
        families.withLock { fs in
            precondition(!fs.contains { $0.name == f.name }, "metric \(f.name) registered twice")
            fs.append(f)
        }
    }

    /// Every family in the text exposition format, in the order registered.
    public func render() async -> String {
        var out = ""
        for f in families.withLock({ $0 }) {
            switch f {
            case .counter(let c): c.render(into: &out)
            case .histogram(let h): h.render(into: &out)
            case .computed(let c):
                let samples = await c.read()
                Exposition.head(&out, c.name, c.help, c.kind.rawValue)
                for s in samples { Exposition.line(&out, c.name, c.labels, s.labels, s.value) }
            }
        }
        return out
    }

    private enum Family: Sendable {
        case counter(CounterFamily)
        case histogram(HistogramFamily)
        case computed(Computed)
        var name: String {
            switch self {
            case .counter(let c): c.name
            case .histogram(let h): h.name
            case .computed(let c): c.name
            }
        }
    }

    private struct Computed: Sendable {
        let name: String
        let help: String
        let kind: MetricKind
        let labels: [String]
        let read: @Sendable () async -> [Sample]
    }
}

public enum MetricKind: String, Sendable {
    case counter, gauge
}

/// One value of a computed family: its label values (in the family's label order) and the value.
public struct Sample: Sendable, Equatable {
    public var labels: [String]
    public var value: Double
    public init(_ labels: [String] = [], _ value: Double) {
        self.labels = labels
        self.value = value
    }
}

/// A monotonically increasing count.
public final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    public init() {}
    public func add(_ n: Int = 1) { value.add(n, ordering: .relaxed) }
    public var count: Int { value.load(ordering: .relaxed) }
}

/// Counters told apart by label values. A child, once made, is kept (hold on to it where the
/// label values are fixed, to skip the lookup).
public final class CounterFamily: Sendable {
    public let name: String
    public let help: String
    public let labels: [String]
    public let hideZero: Bool
    private let children = Mutex<[[String]: Counter]>([:])

    init(name: String, help: String, labels: [String], hideZero: Bool = false) {
        self.name = name
        self.help = help
        self.labels = labels
        self.hideZero = hideZero
    }

    /// The counter for these label values (made on first use).
    public func with(_ values: String...) -> Counter { child(values) }

    public func child(_ values: [String]) -> Counter {
        precondition(values.count == labels.count, "\(name) takes \(labels.count) label values")
        return children.withLock { c in
            if let x = c[values] { return x }
            let x = Counter()
            c[values] = x
            return x
        }
    }

    /// Adds to the counter of these label values.
    public func add(_ values: [String], _ n: Int = 1) { child(values).add(n) }

    func render(into out: inout String) {
        Exposition.head(&out, name, help, "counter")
        for (values, c) in children.withLock({ $0 }).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) where !hideZero || c.count > 0 {
            Exposition.line(&out, name, labels, values, Double(c.count))
        }
    }
}

/// Observations counted into buckets (cumulative when rendered), with their count and sum.
public final class Histogram: Sendable {
    let bounds: [Double]
    private let buckets: [Counter]
    private let total = Atomic<Int>(0)
    /// The sum in millionths (atomics hold integers).
    private let sumMicros = Atomic<Int>(0)

    init(bounds: [Double]) {
        self.bounds = bounds
        buckets = bounds.map { _ in Counter() }
    }

    public func observe(_ value: Double) {
        if let i = bounds.firstIndex(where: { value <= $0 }) { buckets[i].add() }
        total.add(1, ordering: .relaxed)
        let micros = value * 1e6
        sumMicros.add(micros.isFinite && abs(micros) < 9e18 ? Int(micros) : 0, ordering: .relaxed)
    }

    /// Observes a duration given in nanoseconds, in seconds.
    public func observe(nanoseconds: UInt64) { observe(Double(nanoseconds) / 1e9) }

    var snapshot: (cumulative: [Int], count: Int, sum: Double) {
        var running = 0
        let cumulative = buckets.map { b in
            running += b.count
            return running
        }
        return (cumulative, total.load(ordering: .relaxed), Double(sumMicros.load(ordering: .relaxed)) / 1e6)
    }
}

public final class HistogramFamily: Sendable {
    public let name: String
    public let help: String
    public let labels: [String]
    public let buckets: [Double]
    public let hideZero: Bool
    private let children = Mutex<[[String]: Histogram]>([:])

    init(name: String, help: String, labels: [String], buckets: [Double], hideZero: Bool = false) {
        self.name = name
        self.help = help
        self.labels = labels
        self.buckets = buckets
        self.hideZero = hideZero
    }

    public func with(_ values: String...) -> Histogram { child(values) }

    public func child(_ values: [String]) -> Histogram {
        precondition(values.count == labels.count, "\(name) takes \(labels.count) label values")
        return children.withLock { c in
            if let x = c[values] { return x }
            let x = Histogram(bounds: buckets)
            c[values] = x
            return x
        }
    }

    func render(into out: inout String) {
        Exposition.head(&out, name, help, "histogram")
        for (values, h) in children.withLock({ $0 }).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            let s = h.snapshot
            if hideZero && s.count == 0 { continue }
            for (bound, n) in zip(buckets, s.cumulative) {
                Exposition.line(&out, name + "_bucket", labels + ["le"], values + [Exposition.number(bound)], Double(n))
            }
            Exposition.line(&out, name + "_bucket", labels + ["le"], values + ["+Inf"], Double(s.count))
            Exposition.line(&out, name + "_sum", labels, values, s.sum)
            Exposition.line(&out, name + "_count", labels, values, Double(s.count))
        }
    }
}

/// The text exposition format 0.0.4.
public enum Exposition {
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    static func head(_ out: inout String, _ name: String, _ help: String, _ type: String) {
        out += "# HELP \(name) \(escapeHelp(help))\n# TYPE \(name) \(type)\n"
    }

    static func line(_ out: inout String, _ name: String, _ labelNames: [String], _ values: [String], _ value: Double) {
        out += name
        if !labelNames.isEmpty {
            out += "{"
            for (i, (n, v)) in zip(labelNames, values).enumerated() {
                if i > 0 { out += "," }
                out += "\(n)=\"\(escapeLabel(v))\""
            }
            out += "}"
        }
        out += " " + number(value) + "\n"
    }

    /// A sample value: integers without a fraction, `+Inf`/`-Inf`/`NaN` spelled as Prometheus does.
    public static func number(_ v: Double) -> String {
        if v.isNaN { return "NaN" }
        if v.isInfinite { return v > 0 ? "+Inf" : "-Inf" }
        if v == v.rounded(), abs(v) < 1e15 { return String(Int64(v)) }
        return "\(v)"
    }

    /// Backslash, double quote and line feed escaped (by Unicode scalar: "\r\n" is one Character).
    public static func escapeLabel(_ s: String) -> String { escape(s, quote: true) }

    static func escapeHelp(_ s: String) -> String { escape(s, quote: false) }

    private static func escape(_ s: String, quote: Bool) -> String {
        var out = String.UnicodeScalarView()
        for u in s.unicodeScalars {
            switch u {
            case "\\": out.append(contentsOf: "\\\\".unicodeScalars)
            case "\"" where quote: out.append(contentsOf: "\\\"".unicodeScalars)
            case "\n": out.append(contentsOf: "\\n".unicodeScalars)
            default: out.append(u)
            }
        }
        return String(out)
    }
}
