@testable import EventLoop
import Synchronization
import Testing

@Suite struct TimerHeapTests {
    @Test func popsInDeadlineOrderAndSkipsCancelled() {
        var h = TimerHeap()
        var fired: [Int] = []
        let ids = [50, 10, 40, 20, 30].map { d in h.insert(deadline: UInt64(d)) { fired.append(d) } }
        h.cancel(ids[2]) // 40
        #expect(h.nextDeadline == 10)
        while let (_, cb) = h.popDue(now: 35) { cb() }
        #expect(fired == [10, 20, 30])
        #expect(h.nextDeadline == 50)
        #expect(h.popDue(now: 49) == nil)
        h.cancel(ids[0])
        #expect(h.nextDeadline == nil)
    }

    @Test func manyCancellationsDoNotGrowWithoutBound() {
        var h = TimerHeap()
        for i in 0..<10_000 {
            let id = h.insert(deadline: UInt64(1_000_000 + i)) {}
            h.cancel(id)
        }
        #expect(h.count == 0)
        #expect(h.nextDeadline == nil)
    }
}

@Suite struct EventLoopTests {
    @Test func executeRunsOnTheLoopInOrder() async throws {
        let group = EventLoopGroup(count: 1)
        let loop = group.loops[0]
        let seen = Mutex<[Int]>([])
        let onLoop = Atomic<Int>(0)
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            for i in 0..<1000 {
                loop.execute {
                    if loop.inEventLoop { onLoop.add(1, ordering: .relaxed) }
                    seen.withLock { $0.append(i) }
                    if i == 999 { c.resume() }
                }
            }
        }
        #expect(seen.withLock { $0 } == Array(0..<1000))
        #expect(onLoop.load(ordering: .relaxed) == 1000)
        #expect(!loop.inEventLoop)
        group.shutdown()
    }

    @Test func timersFireInOrderAndCancelledOnesDoNot() async throws {
        let group = EventLoopGroup(count: 1)
        let loop = group.loops[0]
        let fired = Mutex<[Int]>([])
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            loop.execute {
                let now = MonotonicClock.now()
                loop.scheduleTimer(at: now + 30_000_000) { fired.withLock { $0.append(3) }; c.resume() }
                loop.scheduleTimer(at: now + 10_000_000) { fired.withLock { $0.append(1) } }
                let cancelled = loop.scheduleTimer(at: now + 15_000_000) { fired.withLock { $0.append(99) } }
                loop.scheduleTimer(at: now + 20_000_000) { fired.withLock { $0.append(2) } }
                loop.cancelTimer(cancelled)
            }
        }
        #expect(fired.withLock { $0 } == [1, 2, 3])
        group.shutdown()
    }

    @Test func hostPortParsing() {
        #expect(HostPort(parsing: "127.0.0.1:7400") == HostPort(host: "127.0.0.1", port: 7400))
        #expect(HostPort(parsing: "[::1]:80") == HostPort(host: "::1", port: 80))
        #expect(HostPort(parsing: "localhost:0")?.port == 0)
        #expect(HostPort(parsing: "localhost") == nil)
        #expect(HostPort(parsing: "h:70000") == nil)
        #expect(HostPort(parsing: ":80") == nil)
        #expect(HostPort(parsing: "::1:80") == nil)
        #expect(HostPort(host: "::1", port: 5).description == "[::1]:5")
    }
}

@Suite struct IdleTimeoutStateMachineTests {
    /// One timer however many calls come and go; it closes only after a whole idle timeout.
    @Test func oneTimerClosesAfterAWholeIdleSpell() {
        var m = IdleTimeoutStateMachine(timeout: 100)
        #expect(m.becameIdle(now: 0) == 100)       // opened: arm
        for t in stride(from: UInt64(10), to: 60, by: 10) {  // calls come and go: no more timers
            m.becameBusy()
            #expect(m.becameIdle(now: t + 5) == nil)
        }
        #expect(m.timerFired(now: 100) == .rearm(at: 155))  // idle since 55 only
        #expect(m.timerFired(now: 154) == .rearm(at: 155))  // (an early wake-up changes nothing)
        #expect(m.timerFired(now: 155) == .close)
    }

    @Test func aCallInProgressIsNotIdleAndTheNextIdleSpellArmsAgain() {
        var m = IdleTimeoutStateMachine(timeout: 100)
        _ = m.becameIdle(now: 0)
        m.becameBusy()
        #expect(m.timerFired(now: 100) == .none)   // a long call: never closed under it
        #expect(m.timerFired(now: 500) == .none)
        #expect(m.becameIdle(now: 700) == 800)     // the timer had stopped: armed again
        #expect(m.timerFired(now: 800) == .close)
    }
}

extension IdleTimeoutStateMachineTests {
    /// A timeout of `UInt64.max` means never: the deadline does not wrap into the past.
    @Test func aTimeoutOfNeverDoesNotWrap() {
        var m = IdleTimeoutStateMachine(timeout: .max)
        #expect(m.becameIdle(now: 1_000) == .max)
        #expect(m.timerFired(now: 2_000) == .rearm(at: .max))
    }
}

@Suite struct SteppedLoopTests {
    final class Time: Sendable { let ns = Atomic<UInt64>(0) }

    /// A stepped loop runs its tasks and its timers on the driver's clock, only when stepped, and
    /// holds no file descriptor (a simulation sweep makes thousands of them in one process).
    @Test func aSteppedLoopRunsOnlyWhenSteppedOnItsDriversClockAndHoldsNoDescriptor() {
        let time = Time()
        let loop = EventLoop.stepped(name: "stepped", clock: { time.ns.load(ordering: .relaxed) })
        #expect([loop.epollFD, loop.wakeFD, loop.timerFD] == [-1, -1, -1])
        let ran = Mutex<[String]>([])
        loop.execute { ran.withLock { $0.append("task") } }
        loop.execute { loop.scheduleTimer(after: 100) { ran.withLock { $0.append("timer") } } }
        #expect(loop.hasWorkNow && ran.withLock { $0 }.isEmpty)
        loop.step()
        #expect(ran.withLock { $0 } == ["task"])
        #expect(loop.nextTimerDeadline == 100 && !loop.hasWorkNow)
        time.ns.store(100, ordering: .relaxed)
        #expect(loop.hasWorkNow)
        loop.step()
        #expect(ran.withLock { $0 } == ["task", "timer"])
    }
}
