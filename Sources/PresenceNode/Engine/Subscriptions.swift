import PresenceCore
import PresenceWire
import Synchronization

/// The gateway's side of fan-out: which of this node's sessions follow each channel's presence.
/// An owner sends each channel event once per gateway; the gateway hands it to these outboxes.
/// A session is added when its SNAPSHOT arrives (so nothing reaches it before the SNAPSHOT) and
/// removed when it leaves, stops following, or ends. Sharded by channel, each shard under a mutex.
final class Subscriptions: Sendable {
    private final class Shard: Sendable {
        let map = Mutex<[ChannelKey: [SessionID: SessionOutbox]]>([:])
        func withLock<R>(_ body: (inout [ChannelKey: [SessionID: SessionOutbox]]) -> R) -> R { map.withLock { body(&$0) } }
    }
    private let shards: [Shard]

    init(shards: Int = 64) {
        self.shards = (0..<max(1, shards)).map { _ in Shard() }
    }

    private func shard(_ key: ChannelKey) -> Shard {
        shards[Int(StableHash.of(key) % UInt64(shards.count))]
    }

    func subscribe(_ key: ChannelKey, _ id: SessionID, _ outbox: SessionOutbox) {
        shard(key).withLock { $0[key, default: [:]][id] = outbox }
    }

    func unsubscribe(_ key: ChannelKey, _ id: SessionID) {
        shard(key).withLock { m in
            guard var subs = m[key], subs.removeValue(forKey: id) != nil else { return }
            m[key] = subs.isEmpty ? nil : subs
        }
    }

    /// Pushes one framed event to every local subscriber of `key` except `except`.
    func deliver(_ key: ChannelKey, except: SessionID?, framed: [UInt8]) {
        shard(key).withLock { m in
            guard let subs = m[key] else { return }
            for (id, outbox) in subs where id != except { outbox.push(framed) }
        }
    }
}
