import EventLoop
import PresenceCore
import PresenceWire

/// Owns a share of the users: the channels each is in, its status, its watchers. Runs on an event loop.
actor UserHomeShard {
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var directory = UserDirectory<SessionOutbox>()
    private let clock: EngineClock

    init(clock: EngineClock, loop: EventLoop) {
        self.loop = loop
        self.clock = clock
    }

    private func notify(_ change: UserDirectory<SessionOutbox>.StatusChange?) {
        guard let change, !change.watchers.isEmpty else { return }
        let bytes = EventEncoding.framed(status: change.userID, change.status, at: clock.wallMilliseconds())
        for (_, outbox) in change.watchers { outbox.push(bytes) }
    }

    func sessionOpened(_ user: String, session: SessionID, initial: UserStatus) {
        notify(directory.sessionOpened(user, session: session, initial: initial))
    }

    func sessionEnded(_ user: String, session: SessionID) {
        notify(directory.sessionEnded(user, session: session))
    }

    func setStatus(_ user: String, _ status: UserStatus) {
        notify(directory.setStatus(user, status))
    }

    func addChannel(_ user: String, _ key: ChannelKey) { directory.addChannel(user, key) }
    func removeChannel(_ user: String, _ key: ChannelKey) { directory.removeChannel(user, key) }
    func channels(of user: String) -> [ChannelKey] { directory.channels(of: user) }

    func statuses(_ users: [String]) -> [String: UserStatus] {
        var out: [String: UserStatus] = [:]
        for u in users { out[u] = directory.visibleStatus(u) }
        return out
    }

    func watch(_ users: [String], by session: SessionID, outbox: SessionOutbox) -> [String: UserStatus] {
        var out: [String: UserStatus] = [:]
        for u in users {
            directory.watch(u, by: session, sink: outbox)
            out[u] = directory.visibleStatus(u)
        }
        return out
    }

    func unwatch(_ users: [String], by session: SessionID) {
        for u in users { directory.unwatch(u, by: session) }
    }
}
