/// Runs `step` every `period` nanoseconds of `clock` until it returns false (or the task is
/// cancelled): the shards' interval ticks and orphan sweeps, which stop themselves once there is
/// nothing to do.
func periodically(every period: UInt64, clock: EngineClock, placement: TaskPlacement,
                  _ step: @escaping @Sendable () async -> Bool) -> Task<Void, Never> {
    placement.start {
        while !Task.isCancelled {
            await clock.sleep(nanoseconds: period)
            guard await step() else { return }
        }
    }
}
