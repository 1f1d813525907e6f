import EventLoop
import PresenceCore
import PresenceWire

/// Owns a share of the channels outright (no locks): each channel's `ChannelMachine`, and delivery
/// of the events it computes. One hop to this actor per call on its channels. The actor runs on an
/// event loop: a call arriving on that loop's connections reaches it without changing threads.
actor ChannelShard {
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var channels: [ChannelKey: ChannelMachine<SessionOutbox>] = [:]
    private let maxInstantEvents: Int
    private let intervalNanoseconds: UInt64
    private let clock: EngineClock
    private var intervalChannels = Set<ChannelKey>()
    private var ticker: Task<Void, Never>? = nil

    init(maxInstantEvents: Int, intervalNanoseconds: UInt64, clock: EngineClock, loop: EventLoop) {
        self.loop = loop
        self.maxInstantEvents = maxInstantEvents
        self.intervalNanoseconds = intervalNanoseconds
        self.clock = clock
    }

    private func deliver(_ deliveries: [Delivery], in machine: ChannelMachine<SessionOutbox>) {
        for d in deliveries {
            let bytes = EventEncoding.framed(d.event)
            switch d.to {
            case .session(let id):
                machine.subscribers[id]?.push(bytes)
            case .subscribers(let except):
                for (id, outbox) in machine.subscribers where id != except { outbox.push(bytes) }
            }
        }
    }

    /// Runs `body` on the channel's machine (created on demand, changed in place), delivers the
    /// events it computed, and drops the channel once nobody is in it.
    private func update<R>(_ key: ChannelKey, create: Bool, _ body: (inout ChannelMachine<SessionOutbox>) throws(PresenceError) -> ([Delivery], R)) throws(PresenceError) -> R? {
        if channels[key] == nil {
            guard create else { return nil }
            channels[key] = ChannelMachine(key: key, maxInstantEvents: maxInstantEvents)
        }
        let deliveries: [Delivery]
        let result: R
        do {
            (deliveries, result) = try body(&channels[key]!)
        } catch {
            if channels[key]!.isEmpty { channels[key] = nil }
            throw error
        }
        let machine = channels[key]!
        deliver(deliveries, in: machine)
        if machine.isIntervalMode { startTicking(key) } else { intervalChannels.remove(key) }
        if machine.isEmpty { channels[key] = nil }
        return result
    }

    func join(_ key: ChannelKey, user: String, session: SessionID, withPresence: Bool, outbox: SessionOutbox, pending: [StateItem]) {
        let now = clock.wallMilliseconds()
        _ = try? update(key, create: true) { m in
            (m.join(user: user, session: session, withPresence: withPresence, sink: outbox, pendingState: pending, now: now), ())
        }
    }

    /// Returns true when the user is no longer in the channel (its last session left).
    func leave(_ key: ChannelKey, user: String, session: SessionID, timedOut: Bool) -> Bool {
        let now = clock.wallMilliseconds()
        let gone = try? update(key, create: false) { m in
            let d = m.leave(user: user, session: session, timedOut: timedOut, now: now)
            return (d, !m.contains(user: user))
        }
        return gone ?? true
    }

    func setState(_ key: ChannelKey, user: String, session: SessionID, items: [StateItem]) throws(PresenceError) {
        let now = clock.wallMilliseconds()
        _ = try update(key, create: false) { m throws(PresenceError) in
            (try m.setState(user: user, session: session, items: items, now: now), ())
        }
    }

    func removeState(_ key: ChannelKey, user: String, session: SessionID, keys: [String]) {
        let now = clock.wallMilliseconds()
        _ = try? update(key, create: false) { m in
            (m.removeState(user: user, session: session, keys: keys, now: now), ())
        }
    }

    func resnapshot(_ key: ChannelKey, session: SessionID) {
        guard let m = channels[key], let d = m.resnapshot(for: session, now: clock.wallMilliseconds()) else { return }
        deliver([d], in: m)
    }

    func state(_ key: ChannelKey, user: String) -> [StateItem]? {
        channels[key]?.state(of: user)
    }

    func page(_ key: ChannelKey, after: String?, includeState: Bool) -> (total: Int, users: [UserState], next: String?) {
        guard let m = channels[key] else { return (0, [], nil) }
        let (users, next) = m.page(after: after, includeState: includeState)
        return (m.occupancy, users, next)
    }

    func occupancy(_ key: ChannelKey) -> Int { channels[key]?.occupancy ?? 0 }

    var channelCount: Int { channels.count }

    // MARK: Interval mode

    private func startTicking(_ key: ChannelKey) {
        intervalChannels.insert(key)
        guard ticker == nil else { return }
        let period = intervalNanoseconds
        ticker = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(nanoseconds: period)
                guard let self, await self.tick() else { return }
            }
        }
    }

    /// Sends each interval channel's INTERVAL event; false once no channel needs ticking.
    private func tick() -> Bool {
        let now = clock.wallMilliseconds()
        for key in intervalChannels {
            _ = try? update(key, create: false) { m in (m.tick(now: now), ()) }
        }
        if intervalChannels.isEmpty {
            ticker = nil
            return false
        }
        return true
    }
}
