import Synchronization

/// The engine's background work (retries, timers, anti-entropy rounds): every task is registered
/// here so that it stops with the node instead of outliving it.
final class BackgroundTasks: Sendable {
    private struct State {
        var next = 0
        var tasks: [Int: Task<Void, Never>] = [:]
        var stopped = false
    }
    private let state = Mutex(State())
    private let placement: TaskPlacement

    init(placement: TaskPlacement = .pool) { self.placement = placement }

    /// Runs `body` in the background until it returns or the node stops.
    func run(_ body: @escaping @Sendable () async -> Void) {
        let ticket = state.withLock { s -> Int? in
            guard !s.stopped else { return nil }
            s.next += 1
            return s.next
        }
        guard let ticket else { return }
        let task = placement.start { [weak self] in
            await body()
            self?.state.withLock { _ = $0.tasks.removeValue(forKey: ticket) }
        }
        state.withLock { s in
            if s.stopped { task.cancel() } else if !task.isCancelled { s.tasks[ticket] = task }
        }
    }

    /// Cancels everything running and refuses new work.
    func stopAll() {
        let tasks = state.withLock { s -> [Task<Void, Never>] in
            s.stopped = true
            defer { s.tasks = [:] }
            return Array(s.tasks.values)
        }
        for t in tasks { t.cancel() }
    }

    var count: Int { state.withLock { $0.tasks.count } }
}
