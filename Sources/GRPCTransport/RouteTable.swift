import Glibc

/// A served method as a connection finds it for a request: its handler and, when the server
/// has a call observer, what to tell when one of its calls ends. Made once when the server
/// starts, so a request costs neither a `String` for its `:path` nor a hash of it.
final class Route: Sendable {
    let path: String
    let method: ServerMethod
    let observe: (@Sendable (GRPCStatus.Code, UInt64) -> Void)?

    init(path: String, method: ServerMethod, observe: (@Sendable (GRPCStatus.Code, UInt64) -> Void)?) {
        self.path = path
        self.method = method
        self.observe = observe
    }
}

/// The server's methods by `:path`, looked up straight from the header's bytes: the routes of
/// the same length (a handful at most), compared byte for byte.
struct RouteTable: Sendable {
    private let byLength: [[(bytes: [UInt8], route: Route)]]
    /// Told of calls to paths no method serves (`"unknown"`).
    let unknownObserver: (@Sendable (GRPCStatus.Code, UInt64) -> Void)?

    init(methods: [String: ServerMethod], observer: (@Sendable (String) -> @Sendable (GRPCStatus.Code, UInt64) -> Void)?) {
        let longest = methods.keys.map(\.utf8.count).max() ?? 0
        var table = [[(bytes: [UInt8], route: Route)]](repeating: [], count: longest + 1)
        for (path, method) in methods.sorted(by: { $0.key < $1.key }) {
            let bytes = Array(path.utf8)
            table[bytes.count].append((bytes, Route(path: path, method: method, observe: observer?(path))))
        }
        byLength = table
        unknownObserver = observer?("unknown")
    }

    /// The route of a `:path` header's value; nil when no method serves it.
    func find(_ path: UnsafeBufferPointer<UInt8>) -> Route? {
        guard path.count < byLength.count, let base = path.baseAddress else { return nil }
        for candidate in byLength[path.count] {
            let same = candidate.bytes.withUnsafeBufferPointer { memcmp($0.baseAddress!, base, path.count) == 0 }
            if same { return candidate.route }
        }
        return nil
    }
}
