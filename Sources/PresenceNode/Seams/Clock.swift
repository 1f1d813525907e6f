import EventLoop
import PresenceCore

/// The clock seam (RELIABILITY.md, "Seams, not hooks"): every reading of time and every wait in
/// the engine and the cluster code goes through it, and so does every random draw (session ids,
/// relay choices, SWIM's probe order), the other thing a simulation must replay from its seed.
/// Production: `SystemClock` (the monotonic clock, the wall clock, `Task.sleep`, the system's
/// random generator); the deterministic simulation plugs in virtual time and a seeded generator.
public protocol EngineClock: Sendable {
    /// Monotonic nanoseconds (timeouts, deadlines, leases).
    func monotonicNanoseconds() -> UInt64
    /// Milliseconds since the Unix epoch (event timestamps, signatures of peer requests).
    func wallMilliseconds() -> Int64
    /// Suspends the calling task for `nanoseconds`, or until it is cancelled (then it returns early).
    func sleep(nanoseconds: UInt64) async
    /// 64 random bits.
    func randomBits() -> UInt64
}

extension EngineClock {
    /// One of `items` drawn at random (nil when empty).
    func pick<T>(_ items: [T]) -> T? {
        items.isEmpty ? nil : items[Int(randomBits() % UInt64(items.count))]
    }

    /// A fresh session id drawn from this clock's randomness.
    func newSessionID() -> SessionID { SessionID.random(bits: randomBits) }
}

public struct SystemClock: EngineClock {
    public init() {}
    public func monotonicNanoseconds() -> UInt64 { MonotonicClock.now() }
    public func wallMilliseconds() -> Int64 { WallClock.nowMilliseconds() }
    public func sleep(nanoseconds: UInt64) async { try? await Task.sleep(nanoseconds: nanoseconds) }
    public func randomBits() -> UInt64 {
        var g = SystemRandomNumberGenerator()
        return g.next()
    }
}

/// The executor seam for the tasks a node starts itself (background work, senders, probes):
/// production leaves them to the global pool (`pool`); the simulation pins them to one of the
/// node's stepped loops, so that nothing the node does runs on a thread it does not drive.
/// (Shard actors run on the loops they are given; structured child tasks inherit the preference.)
public struct TaskPlacement: Sendable {
    /// The executor every task started here prefers (nil: the global pool).
    public let preferred: EventLoop?

    public init(preferred: EventLoop?) { self.preferred = preferred }

    public static let pool = TaskPlacement(preferred: nil)

    /// Starts `body` as an unstructured task on this placement.
    @discardableResult
    public func start(_ body: sending @escaping @isolated(any) () async -> Void) -> Task<Void, Never> {
        Task(executorPreference: preferred, operation: body)
    }
}
