import EventLoop

/// A wait in a test ran out: names what it waited for.
public struct TimedOutWaiting: Error, CustomStringConvertible {
    public let what: String
    public init(what: String) { self.what = what }
    public var description: String { "timed out waiting for \(what)" }
}

/// Runs `body` (a stream read, say) with a deadline: its result, or `TimedOutWaiting` once
/// `seconds` pass (the body is cancelled then). A test reading a stream fails instead of hanging.
/// (The body must honour cancellation — stream reads do, they cancel their call — since the
/// task group waits for it to return.)
public func within<T: Sendable>(_ seconds: Double, _ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try? await Task.sleep(nanoseconds: UInt64(seconds * 1e9))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw TimedOutWaiting(what: what) }
        return value
    }
}

/// Waits until `condition` holds, checking every 2 ms, failing with `TimedOutWaiting` after `seconds`.
public func waitUntil(_ what: String, within seconds: Double = 5, _ condition: () async throws -> Bool) async throws {
    let deadline = MonotonicClock.now() + UInt64(seconds * 1e9)
    while !(try await condition()) {
        if MonotonicClock.now() > deadline { throw TimedOutWaiting(what: what) }
        try await Task.sleep(nanoseconds: 2_000_000)
    }
}
