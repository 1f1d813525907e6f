import EventLoop

/// The two clocks the engine reads: monotonic for timeouts, wall for event timestamps.
public protocol EngineClock: Sendable {
    func monotonicNanoseconds() -> UInt64
    func wallMilliseconds() -> Int64
}

public struct SystemClock: EngineClock {
    public init() {}
    public func monotonicNanoseconds() -> UInt64 { MonotonicClock.now() }
    public func wallMilliseconds() -> Int64 { WallClock.nowMilliseconds() }
}
