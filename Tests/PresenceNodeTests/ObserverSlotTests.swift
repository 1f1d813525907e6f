@testable import PresenceNode
import Synchronization
import Testing

@Suite struct ObserverSlotTests {
    /// A closure read out of a `Mutex` with `withLock { $0 }` got a new pair of reabstraction
    /// thunks on every read: a node whose peer link reported 100,000 lost pushes overflowed its
    /// stack (simulation seed 3). An observer must cost the same on its millionth call as on its first.
    @Test func anObserverCalledAMillionTimesStaysOneCall() {
        let slot = ObserverSlot<(String, Bool)>()
        let calls = Atomic<Int>(0)
        slot.set { _, copies in if copies { calls.add(1, ordering: .relaxed) } }
        for _ in 0..<1_000_000 { slot(("n2", true)) }
        #expect(calls.load(ordering: .relaxed) == 1_000_000)
    }
}
