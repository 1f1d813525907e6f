import Synchronization

/// One observer closure, set once (or replaced) and called from any thread.
///
/// Why not a closure kept directly in a `Mutex` and read with `withLock { $0 }`: the read passes
/// the closure `inout` through the generic `withLock`, and the compiler writes it back wrapped in a
/// new pair of reabstraction thunks, on every read. Each call then runs through every pair: it
/// gets slower with each call and overflows the stack after about 100,000 (`ObserverSlotTests`).
/// Wrapped in a struct, the closure is stored as it was given.
final class ObserverSlot<Argument: Sendable>: Sendable {
    private struct Stored: Sendable {
        let call: @Sendable (Argument) -> Void
    }
    private let slot = Mutex<Stored?>(nil)

    init() {}

    func set(_ observer: @escaping @Sendable (Argument) -> Void) {
        slot.withLock { $0 = Stored(call: observer) }
    }

    /// Calls the observer (outside the lock), if one is set.
    func callAsFunction(_ argument: Argument) {
        slot.withLock { $0 }?.call(argument)
    }
}
