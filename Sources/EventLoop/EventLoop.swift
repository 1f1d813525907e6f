import CSystemShim
import Foundation
import Synchronization

/// Something registered with an `EventLoop` for readiness of one file descriptor.
/// Called on the loop's thread only.
public protocol FileDescriptorHandler: AnyObject {
    /// `events` is the epoll mask (`EPOLLIN`, `EPOLLOUT`, `EPOLLERR`, `EPOLLHUP`, ...).
    func handleEvents(_ events: UInt32)
    /// The loop is stopping with this handler still registered: release the descriptor and
    /// whatever else it holds (the loop drops its reference right after).
    func loopStopping()
}

extension FileDescriptorHandler {
    public func loopStopping() {}
}

/// Something that wants a call once the loop has handled the current batch of readiness events,
/// so that everything queued during that batch goes out in one write.
public protocol FlushHandler: AnyObject {
    func flush()
}

/// Identifies a timer of one loop, to cancel it.
public struct TimerID: Hashable, Sendable {
    fileprivate let raw: UInt64
}

/// One epoll thread: readiness callbacks, timers, tasks submitted from other threads and
/// end-of-batch flushes, all run on that one thread, one at a time.
///
/// `@unchecked Sendable`: the only state touched from other threads is `inbox` (a `Mutex`) and the
/// immutable file descriptors; every other member is read and written on the loop thread alone,
/// which `assertInLoop()` checks in debug builds.
public final class EventLoop: @unchecked Sendable {
    public let name: String
    let epollFD: Int32
    let wakeFD: Int32
    let timerFD: Int32
    private let inbox = Mutex<Inbox>(Inbox())
    private struct Inbox {
        var tasks: [LoopTask] = []
        var wakePending = false
        var stopping = false
        /// Set when `run()` has returned: later tasks are dropped (nothing would ever run them,
        /// and holding them would keep what they capture alive forever).
        var closed = false
    }

    // Loop-thread state.
    private var handlers: [Int32: FileDescriptorHandler] = [:]
    private var timers = TimerHeap()
    private var armedDeadline: UInt64 = .max
    private var flushQueue: [FlushHandler] = []
    /// Tasks the loop gave itself (no lock, no wake-up needed): run after the current batch.
    private var localTasks: [LoopTask] = []
    /// The batch being run, swapped with the queue it came from: each queue and its batch keep
    /// their storage from batch to batch. (Copying the queue and emptying it with
    /// `removeAll(keepingCapacity:)` allocated a new buffer for every batch, since the copy still
    /// shared the old one.)
    private var inboxBatch: [LoopTask] = []
    private var localBatch: [LoopTask] = []
    private var flushBatch: [FlushHandler] = []
    private var thread: pthread_t? = nil
    private let finished = Mutex<Bool>(false)
    /// The time of a stepped loop (nil: a loop with a thread of its own, on the monotonic clock).
    private let steppedClock: (@Sendable () -> UInt64)?

    private static let wakeToken: UInt64 = UInt64.max
    private static let timerToken: UInt64 = UInt64.max - 1

    public convenience init(name: String) {
        self.init(name: name, steppedClock: nil)
    }

    private init(name: String, steppedClock: (@Sendable () -> UInt64)?) {
        self.name = name
        self.steppedClock = steppedClock
        guard steppedClock == nil else {
            // a stepped loop waits on nothing: its driver steps it (and it holds no descriptor,
            // so a long simulation that makes thousands of them runs out of none)
            (epollFD, wakeFD, timerFD) = (-1, -1, -1)
            return
        }
        epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeFD = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        timerFD = timerfd_create(CLOCK_MONOTONIC, Int32(TFD_NONBLOCK | TFD_CLOEXEC))
        precondition(epollFD >= 0 && wakeFD >= 0 && timerFD >= 0, "epoll/eventfd/timerfd creation failed: errno \(errno)")
        var ev = cshim_epoll_event_make(UInt32(EPOLLIN.rawValue), EventLoop.wakeToken)
        epoll_ctl(epollFD, EPOLL_CTL_ADD, wakeFD, &ev)
        ev = cshim_epoll_event_make(UInt32(EPOLLIN.rawValue), EventLoop.timerToken)
        epoll_ctl(epollFD, EPOLL_CTL_ADD, timerFD, &ev)
    }

    deinit {
        for fd in [epollFD, wakeFD, timerFD] where fd >= 0 { close(fd) }
    }

    /// Starts a loop on a thread of its own.
    public static func start(name: String) -> EventLoop {
        let loop = EventLoop(name: name)
        let t = Thread { loop.run() }
        t.name = name
        t.start()
        return loop
    }

    /// A loop that no thread runs (the executor seam, RELIABILITY.md "Seams, not hooks"): one
    /// driver steps it (`step()`), with its timers on `clock` — the deterministic simulation runs
    /// every node's loops so, one at a time, on one thread, in an order it draws from its seed.
    /// Such a loop is used from the driver's thread only: while it steps, that thread is its
    /// thread (`inEventLoop`), and between steps it has none.
    public static func stepped(name: String, clock: @escaping @Sendable () -> UInt64) -> EventLoop {
        EventLoop(name: name, steppedClock: clock)
    }

    /// (stepped loops) Whether a step would run anything now: queued tasks, or a timer due.
    public var hasWorkNow: Bool {
        if !localTasks.isEmpty || !flushQueue.isEmpty { return true }
        if inbox.withLock({ !$0.tasks.isEmpty }) { return true }
        return timers.nextDeadline.map { $0 <= now() } ?? false
    }

    /// (stepped loops) When the earliest timer is due (nil: none armed).
    public var nextTimerDeadline: UInt64? { timers.nextDeadline }

    /// (stepped loops) Runs what is due: timers, then the tasks queued (and those they queue),
    /// then the flushes, as one pass of a loop thread would.
    public func step() {
        precondition(steppedClock != nil, "step() drives stepped loops only")
        thread = pthread_self()
        defer { thread = nil }
        let now = self.now()
        while let (_, callback) = timers.popDue(now: now) { callback() }
        _ = runInbox()
        runLocalTasks()
        runFlushes()
    }

    /// Monotonic nanoseconds as this loop's timers count them.
    @inline(__always)
    private func now() -> UInt64 { steppedClock?() ?? MonotonicClock.now() }

    // MARK: Any thread

    /// Runs `task` on the loop thread, soon. Safe from any thread. Dropped once the loop has
    /// stopped: returns false then, so a caller holding a continuation can resume it itself.
    @discardableResult
    public func execute(_ task: @escaping @Sendable () -> Void) -> Bool {
        if inEventLoop {
            localTasks.append(LoopTask(run: task))
            return true
        }
        let (accepted, wake) = inbox.withLock { inbox -> (Bool, Bool) in
            if inbox.closed { return (false, false) }
            inbox.tasks.append(LoopTask(run: task))
            if inbox.wakePending { return (true, false) }
            inbox.wakePending = true
            return (true, true)
        }
        if wake { signalWake() }
        return accepted
    }

    /// Asks the loop to return from `run()` after its current batch.
    public func stop() {
        inbox.withLock { $0.stopping = true }
        signalWake()
    }

    /// True when called on this loop's thread.
    public var inEventLoop: Bool {
        guard let thread else { return false }
        return pthread_equal(thread, pthread_self()) != 0
    }

    /// Traps in debug builds when called off the loop thread.
    @inline(__always)
    public func assertInLoop(file: StaticString = #fileID, line: UInt = #line) {
        assert(inEventLoop, "called off event loop \(name)", file: file, line: line)
    }

    /// Blocks until `run()` has returned (after `stop()`), or the timeout passes. Returns whether it did.
    @discardableResult
    public func waitUntilStopped(timeoutNanoseconds: UInt64 = 5_000_000_000) -> Bool {
        let deadline = MonotonicClock.now() + timeoutNanoseconds
        while MonotonicClock.now() < deadline {
            if finished.withLock({ $0 }) { return true }
            usleep(1000)
        }
        return false
    }

    private func signalWake() {
        guard wakeFD >= 0 else { return }  // (a stepped loop: its driver sees the work)
        var one: UInt64 = 1
        _ = withUnsafeBytes(of: &one) { write(wakeFD, $0.baseAddress, 8) }
    }

    // MARK: Loop thread

    /// Watches `fd` for `events`; `handler` is held strongly until `unregister`.
    public func register(fd: Int32, events: UInt32, handler: FileDescriptorHandler) {
        assertInLoop()
        handlers[fd] = handler
        var ev = cshim_epoll_event_make(events, UInt64(UInt32(bitPattern: fd)))
        epoll_ctl(epollFD, EPOLL_CTL_ADD, fd, &ev)
    }

    /// Changes the events watched on `fd`.
    public func modify(fd: Int32, events: UInt32) {
        assertInLoop()
        var ev = cshim_epoll_event_make(events, UInt64(UInt32(bitPattern: fd)))
        epoll_ctl(epollFD, EPOLL_CTL_MOD, fd, &ev)
    }

    /// Stops watching `fd` (call before closing it).
    public func unregister(fd: Int32) {
        assertInLoop()
        handlers[fd] = nil
        epoll_ctl(epollFD, EPOLL_CTL_DEL, fd, nil)
    }

    /// Calls `handler.flush()` once the current batch of events has been handled.
    public func scheduleFlush(_ handler: FlushHandler) {
        assertInLoop()
        flushQueue.append(handler)
    }

    /// Timers armed and not yet fired or cancelled (on the loop thread; for tests).
    public var armedTimerCount: Int {
        assertInLoop()
        return timers.count
    }

    /// Calls `callback` on the loop thread at `deadline` (monotonic nanoseconds).
    @discardableResult
    public func scheduleTimer(at deadline: UInt64, _ callback: @escaping () -> Void) -> TimerID {
        assertInLoop()
        let id = timers.insert(deadline: deadline, callback: callback)
        if steppedClock == nil && deadline < armedDeadline { arm(deadline) }
        return TimerID(raw: id)
    }

    /// Calls `callback` after `nanoseconds`.
    @discardableResult
    public func scheduleTimer(after nanoseconds: UInt64, _ callback: @escaping () -> Void) -> TimerID {
        scheduleTimer(at: MonotonicClock.deadline(after: nanoseconds, from: now()), callback)
    }

    /// Cancels a timer that has not fired; harmless when it has.
    public func cancelTimer(_ id: TimerID) {
        assertInLoop()
        timers.cancel(id.raw)
    }

    /// Cancels the timer `id` holds, if any, and forgets it.
    public func cancelTimer(_ id: inout TimerID?) {
        if let t = id { cancelTimer(t) }
        id = nil
    }

    private func arm(_ deadline: UInt64) {
        armedDeadline = deadline
        var spec = itimerspec()
        if deadline != .max {
            let d = max(deadline, 1)
            spec.it_value.tv_sec = Int(d / 1_000_000_000)
            spec.it_value.tv_nsec = Int(d % 1_000_000_000)
        }
        if timerFD >= 0 { timerfd_settime(timerFD, Int32(TFD_TIMER_ABSTIME), &spec, nil) }
    }

    /// Runs the loop on the calling thread until `stop()`.
    public func run() {
        thread = pthread_self()
        defer { finished.withLock { $0 = true } }
        let capacity = 256
        let events = UnsafeMutableRawPointer.allocate(byteCount: cshim_epoll_event_size() * capacity, alignment: 8)
        defer { events.deallocate() }
        let stride = cshim_epoll_event_size()
        while true {
            let n = epoll_wait(epollFD, events.assumingMemoryBound(to: epoll_event.self), Int32(capacity), -1)
            if n < 0 {
                if errno == EINTR { continue }
                fatalError("epoll_wait failed: errno \(errno)")
            }
            var stop = false
            for i in 0..<Int(n) {
                let ev = (events + i * stride).assumingMemoryBound(to: epoll_event.self)
                let token = cshim_epoll_event_u64(ev)
                let mask = cshim_epoll_event_events(ev)
                switch token {
                case EventLoop.wakeToken:
                    var value: UInt64 = 0
                    _ = withUnsafeMutableBytes(of: &value) { read(wakeFD, $0.baseAddress, 8) }
                    stop = runInbox() || stop
                case EventLoop.timerToken:
                    var value: UInt64 = 0
                    _ = withUnsafeMutableBytes(of: &value) { read(timerFD, $0.baseAddress, 8) }
                    fireTimers()
                default:
                    handlers[Int32(truncatingIfNeeded: token)]?.handleEvents(mask)
                }
            }
            runLocalTasks()
            runFlushes()
            if stop { break }
        }
        // Let tasks submitted during shutdown run, so nobody waits forever on a continuation.
        _ = runInbox()
        runFlushes()
        // Handlers and the loop refer to each other: break those cycles so both can be freed.
        let remaining = Array(handlers.values)
        for h in remaining { h.loopStopping() }
        handlers.removeAll()
        timers = TimerHeap()
        flushQueue.removeAll()
        let last = inbox.withLock { inbox -> [LoopTask] in
            inbox.closed = true
            defer { inbox.tasks = [] }
            return inbox.tasks
        }
        for t in last { t.run() }
    }

    private func runInbox() -> Bool {
        var stopping = false
        Self.runBatch(reusing: &inboxBatch, take: { batch in
            stopping = inbox.withLock { inbox -> Bool in
                swap(&inbox.tasks, &batch)
                inbox.wakePending = false
                return inbox.stopping
            }
        }, each: { $0.run() })
        return stopping
    }

    /// Runs one batch of a queue: `take` swaps the queue's items into the empty batch it is given,
    /// whose storage is `spare`'s; `each` runs them; the emptied storage goes back to `spare`.
    /// The queue and its batch trade buffers, so neither is allocated anew per batch. (`spare` is
    /// a queue's own batch, which the items run cannot reach: no batch of it runs within another.)
    @inline(__always)
    private static func runBatch<T>(reusing spare: inout [T], take: (inout [T]) -> Void, each: (T) -> Void) {
        var batch: [T] = []
        swap(&batch, &spare)
        take(&batch)
        for item in batch { each(item) }
        batch.removeAll(keepingCapacity: true)
        swap(&batch, &spare)
    }

    private func fireTimers() {
        let now = MonotonicClock.now()
        while let (_, callback) = timers.popDue(now: now) {
            callback()
        }
        arm(timers.nextDeadline ?? .max)
    }

    private func runLocalTasks() {
        while !localTasks.isEmpty {
            Self.runBatch(reusing: &localBatch, take: { swap(&localTasks, &$0) }, each: { $0.run() })
        }
    }

    private func runFlushes() {
        // A flush may schedule more work (rarely): run until quiet.
        while !flushQueue.isEmpty || !localTasks.isEmpty {
            Self.runBatch(reusing: &flushBatch, take: { swap(&flushQueue, &$0) }, each: { $0.flush() })
            runLocalTasks()
        }
    }
}

/// Monotonic nanoseconds since an arbitrary point (CLOCK_MONOTONIC).
public enum MonotonicClock {
    @inline(__always)
    public static func now() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }

    /// `nanoseconds` after `time`, saturating: a delay near `UInt64.max` (a peer's huge
    /// grpc-timeout, a timeout meaning "never") is never, not a deadline wrapped into the past.
    @inline(__always)
    public static func deadline(after nanoseconds: UInt64, from time: UInt64) -> UInt64 {
        let (at, overflow) = time.addingReportingOverflow(nanoseconds)
        return overflow ? .max : at
    }
}

/// Milliseconds since the Unix epoch (wall clock), for event timestamps.
public enum WallClock {
    public static func nowMilliseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }
}

/// A min-heap of timers; cancelled entries are dropped lazily when they reach the top.
struct TimerHeap {
    private var heap: [(deadline: UInt64, id: UInt64)] = []
    /// (each closure in a struct, as `LoopTask`: stored bare in the dictionary it was re-wrapped
    /// in a thunk allocated per timer)
    private var callbacks: [UInt64: Callback] = [:]
    private struct Callback { let run: () -> Void }
    private var nextID: UInt64 = 1

    var count: Int { callbacks.count }

    mutating func insert(deadline: UInt64, callback: @escaping () -> Void) -> UInt64 {
        let id = nextID
        nextID += 1
        callbacks[id] = Callback(run: callback)
        heap.append((deadline, id))
        siftUp(heap.count - 1)
        return id
    }

    mutating func cancel(_ id: UInt64) {
        callbacks[id] = nil
        // keep the heap small when many timers are cancelled long before they are due
        if heap.count > 64 && heap.count > 4 * callbacks.count { rebuild() }
    }

    var nextDeadline: UInt64? {
        mutating get {
            dropCancelledTop()
            return heap.first?.deadline
        }
    }

    mutating func popDue(now: UInt64) -> (UInt64, () -> Void)? {
        dropCancelledTop()
        guard let top = heap.first, top.deadline <= now else { return nil }
        removeTop()
        let cb = callbacks.removeValue(forKey: top.id)!
        return (top.id, cb.run)
    }

    private mutating func dropCancelledTop() {
        while let top = heap.first, callbacks[top.id] == nil { removeTop() }
    }

    private mutating func rebuild() {
        heap = heap.filter { callbacks[$0.id] != nil }
        heap.sort { $0.deadline < $1.deadline }
    }

    private mutating func removeTop() {
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            siftDown(0)
        }
    }

    private mutating func siftUp(_ i: Int) {
        var i = i
        while i > 0 {
            let parent = (i - 1) / 2
            if heap[parent].deadline <= heap[i].deadline { break }
            heap.swapAt(parent, i)
            i = parent
        }
    }

    private mutating func siftDown(_ i: Int) {
        var i = i
        let n = heap.count
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < n && heap[l].deadline < heap[m].deadline { m = l }
            if r < n && heap[r].deadline < heap[m].deadline { m = r }
            if m == i { return }
            heap.swapAt(m, i)
            i = m
        }
    }
}

/// A fixed set of loops; connections are spread over them.
public final class EventLoopGroup: Sendable {
    public let loops: [EventLoop]
    private let counter = Atomic<Int>(0)

    /// Starts `count` loops (default: one per core).
    public init(count: Int = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))), name: String = "loop") {
        loops = (0..<count).map { EventLoop.start(name: "\(name)-\($0)") }
        // wait until each loop thread has recorded itself, so inEventLoop answers correctly
        for loop in loops {
            let ready = Mutex<Bool>(false)
            loop.execute { ready.withLock { $0 = true } }
            while !ready.withLock({ $0 }) { usleep(100) }
        }
    }

    /// The next loop, round robin.
    public func next() -> EventLoop {
        loops[counter.add(1, ordering: .relaxed).oldValue % loops.count]
    }

    /// Stops every loop and waits for them.
    public func shutdown() {
        for l in loops { l.stop() }
        for l in loops { l.waitUntilStopped() }
    }
}

/// A task queued for a loop. The closure is kept in a struct of its own: stored straight in an
/// array (a generic container) it was re-wrapped, at every append, in a thunk the runtime
/// allocated (one malloc per hand-over between loops, found with `Scripts/count-allocs`).
struct LoopTask {
    let run: @Sendable () -> Void
}
