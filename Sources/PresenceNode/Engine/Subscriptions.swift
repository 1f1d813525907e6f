import PresenceCore
import PresenceWire
import Synchronization

/// The gateway's side of fan-out: which of this node's sessions follow each channel's presence,
/// and where each stands in that channel's events (`FeedPosition`). An owner sends each channel
/// event once per gateway; the gateway passes it to the sessions it may reach (in order, from the
/// owner they follow). A session is added when its SNAPSHOT arrives (so nothing reaches it before
/// the SNAPSHOT) and removed when it leaves, stops following, or ends. Sharded by channel, each
/// shard under a mutex.
final class Subscriptions: Sendable {
    struct Subscriber {
        let outbox: SessionOutbox
        var position: FeedPosition<NodeInstance>
    }
    private final class Shard: Sendable {
        /// (Each channel's subscribers in a `DenseDictionary`: an event walks them in one array.)
        let map = Mutex<[ChannelKey: DenseDictionary<SessionID, Subscriber>]>([:])
    }
    private let shards: [Shard]

    /// A session that should get a fresh SNAPSHOT of a channel, numbered above `floor`.
    struct Resnapshot: Sendable {
        let key: ChannelKey
        let session: SessionID
        let floor: UInt64
    }

    init(shards: Int = 64) {
        self.shards = (0..<max(1, shards)).map { _ in Shard() }
    }

    private func shard(_ key: ChannelKey) -> Shard {
        shards[Int(StableHash.of(key) % UInt64(shards.count))]
    }

    func unsubscribe(_ key: ChannelKey, _ id: SessionID) {
        shard(key).map.withLock { m in
            // (in place: a copy written back would copy the channel's subscribers whole)
            guard m[key]?.removeValue(forKey: id) != nil else { return }
            if m[key]?.isEmpty == true { m[key] = nil }
        }
    }

    /// A SNAPSHOT for `id` from `from`: starts (or renews) its subscription and passes it on if
    /// it is above what the session saw. Returns a request for a fresher one otherwise.
    func snapshot(_ key: ChannelKey, _ id: SessionID, _ outbox: SessionOutbox, from: NodeInstance, sequence: UInt64,
                  framed: [UInt8], now: UInt64) -> Resnapshot? {
        shard(key).map.withLock { m -> Resnapshot? in
            var sub = m[key]?[id] ?? Subscriber(outbox: outbox, position: FeedPosition())
            let decision = sub.position.decide(from: from, sequence: sequence, snapshot: true, now: now)
            m[key, default: [:]][id] = sub
            switch decision {
            case .deliver:
                outbox.push(framed)
                return nil
            case .drop:
                return nil
            case .resnapshot(let floor):
                return Resnapshot(key: key, session: id, floor: floor)
            }
        }
    }

    /// One channel event from `from` for every local subscriber of `key` except `except`; returns
    /// the subscribers that need a fresh SNAPSHOT (they follow another owner).
    func deliver(_ key: ChannelKey, except: SessionID?, from: NodeInstance, sequence: UInt64, framed: [UInt8], now: UInt64) -> [Resnapshot] {
        shard(key).map.withLock { m -> [Resnapshot] in
            // (taken out and put back, so the positions change in place: through `m[key]?` the
            // dictionary's storage is shared while it is changed, and every entry was copied)
            guard var subs = m.removeValue(forKey: key) else { return [] }
            defer { m[key] = subs }
            var asks: [Resnapshot] = []
            subs.updateEach { id, sub in
                guard id != except else { return }
                switch sub.position.decide(from: from, sequence: sequence, snapshot: false, now: now) {
                case .deliver: sub.outbox.push(framed)
                case .drop: break
                case .resnapshot(let floor): asks.append(Resnapshot(key: key, session: id, floor: floor))
                }
            }
            return asks
        }
    }
}
