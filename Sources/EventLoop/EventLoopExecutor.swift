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
