/// Runs `step` every `period` nanoseconds until it returns false (or the task is cancelled): the
/// shards' interval ticks and orphan sweeps, which stop themselves once there is nothing to do.
func periodically(every period: UInt64, _ step: @escaping @Sendable () async -> Bool) -> Task<Void, Never> {
    Task {
        while !Task.isCancelled {
            try? await Task.sleep(nanoseconds: period)
            guard await step() else { return }
        }
    }
}
