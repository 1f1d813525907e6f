/// An event loop is also a Swift concurrency executor: actors can be pinned to it
/// (`unownedExecutor`), and tasks can prefer it (`Task(executorPreference:)`). Work for an actor on
/// the loop that serves the calling connection then runs on the same thread, queued locally
/// instead of crossing threads (see `execute`).
extension EventLoop: SerialExecutor, TaskExecutor {
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        execute { [self] in
            job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor())
        }
    }

    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
        UnownedTaskExecutor(ordinary: self)
    }

    public func checkIsolated() {
        precondition(inEventLoop, "not on event loop \(name)")
    }
}

/// Wraps a loop-confined object so it can be named in a `@Sendable` closure sent to its loop.
///
/// `@unchecked Sendable`: the wrapped object is only ever touched through `value`, which asserts
/// that the caller is on `loop`'s thread; other threads can only carry the box back to the loop.
public struct LoopBound<Value: AnyObject>: @unchecked Sendable {
    public let loop: EventLoop
    private let wrapped: Value

    public init(_ value: Value, loop: EventLoop) {
        loop.assertInLoop()
        self.loop = loop
        self.wrapped = value
    }

    public var value: Value {
        loop.assertInLoop()
        return wrapped
    }

    /// Runs `body` with the value on its loop. False when the loop has stopped (`body` never runs).
    @discardableResult
    public func execute(_ body: @escaping @Sendable (Value) -> Void) -> Bool {
        let box = self
        return loop.execute { body(box.value) }
    }

    /// Runs `body` with the value at once when called on its loop, else as `execute` does.
    @discardableResult
    public func run(_ body: @escaping @Sendable (Value) -> Void) -> Bool {
        if loop.inEventLoop {
            body(wrapped)
            return true
        }
        return execute(body)
    }
}
