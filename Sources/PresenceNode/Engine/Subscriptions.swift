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
        /// Sessions that left a channel: the channel's sequence at the leave, and until when
        /// (monotonic ns) it is kept (`left`).
        let floors = Mutex(Floors())
        /// Sessions owed a fresh SNAPSHOT of a channel once their join of it is acknowledged (`owe`).
        let owed = Mutex<Set<Owed>>([])
    }
    /// Each channel's leave floors, and how many there are in all (kept, not summed per leave).
    private struct Floors {
        var byKey: [ChannelKey: [SessionID: (sequence: UInt64, until: UInt64)]] = [:]
        var count = 0

        mutating func set(_ key: ChannelKey, _ id: SessionID, _ floor: (sequence: UInt64, until: UInt64)) {
            if byKey[key, default: [:]].updateValue(floor, forKey: id) == nil { count += 1 }
        }

        mutating func remove(_ key: ChannelKey, _ id: SessionID) {
            guard byKey[key]?.removeValue(forKey: id) != nil else { return }
            count -= 1
            if byKey[key]?.isEmpty == true { byKey[key] = nil }
        }

        /// Drops the floors that ran out by `now`.
        mutating func expire(now: UInt64) {
            for k in Array(byKey.keys) {
                byKey[k] = byKey[k]!.filter { $0.value.until > now }
                if byKey[k]!.isEmpty { byKey[k] = nil }
            }
            count = byKey.values.reduce(0) { $0 + $1.count }
        }
    }
    private struct Owed: Hashable {
        let key: ChannelKey
        let session: SessionID
    }
    /// How long a leave's sequence is kept to judge SNAPSHOTs by (a delayed one comes within a
    /// push's retries; 30 s).
    static let floorMemory: UInt64 = 30_000_000_000
    /// Floors kept per shard at most: past it, the expired ones go (then all of them).
    static let maxFloors = 4_096
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

    /// The session's join of `key` was undone here (it failed without a definite answer): its
    /// subscription, which a SNAPSHOT of the join may have started, ends, and where it stood is
    /// kept as a leave's floor, so a late SNAPSHOT from that join does not take the session back
    /// below what it saw.
    func undone(_ key: ChannelKey, _ id: SessionID, now: UInt64) {
        guard let last = shard(key).map.withLock({ $0[key]?[id]?.position.last }) else { return }
        left(key, id, atSequence: last, now: now)   // (which ends the subscription: it stands at the floor)
        unsubscribe(key, id)                         // (one that saw nothing yet has no floor to end it)
    }

    /// The session's leave of `key` was carried out at the channel's `sequence`: a SNAPSHOT for
    /// it numbered at or below that is from before the leave, delayed (a slow link): it must not
    /// start a subscription after the session joined again, nor let the events of the time it was
    /// away through. One such SNAPSHOT that started a subscription meanwhile is undone.
    func left(_ key: ChannelKey, _ id: SessionID, atSequence sequence: UInt64, now: UInt64) {
        guard sequence > 0 else { return }
        let shard = shard(key)
        shard.floors.withLock { f in
            f.set(key, id, (sequence, now &+ Self.floorMemory))
            if f.count > Self.maxFloors { f.expire(now: now) }
            // (all still fresh: forgotten at once, so each leave past the bound does not walk them
            // again; at worst, a delayed SNAPSHOT from before one of those leaves is taken)
            if f.count > Self.maxFloors { f = Floors() }
        }
        shard.map.withLock { m in
            guard let sub = m[key]?[id], sub.position.last <= sequence else { return }
            _ = m[key]?.removeValue(forKey: id)
            if m[key]?.isEmpty == true { m[key] = nil }
        }
    }

    /// How many leave floors are kept in all (tests: the bound).
    var floorsKept: Int { shards.reduce(0) { n, s in n + s.floors.withLock { $0.count } } }

    /// A join of `key` by `id` failed without a definite answer: the owner may have carried it
    /// out, sent its SNAPSHOT, and then events this gateway dropped (the session was not in the
    /// channel here), or pushes to it may have been lost meanwhile. A retry that succeeds finds
    /// the session a member already, which sends nothing; so the session is owed a fresh SNAPSHOT
    /// (`takeOwed`): the SNAPSHOT that would have repaired what it missed may have come while the
    /// join was undone here.
    func owe(_ key: ChannelKey, _ id: SessionID) {
        shard(key).owed.withLock { o in
            if o.count >= Self.maxFloors { o.removeAll() }  // (bounded: at worst, one repair is missed)
            o.insert(Owed(key: key, session: id))
        }
    }

    /// Whether `id` is owed a fresh SNAPSHOT of `key` (`owe`), and the sequence it has seen; clears it.
    func takeOwed(_ key: ChannelKey, _ id: SessionID) -> UInt64? {
        let shard = shard(key)
        guard shard.owed.withLock({ $0.remove(Owed(key: key, session: id)) != nil }) else { return nil }
        let floor = shard.floors.withLock { $0.byKey[key]?[id]?.sequence ?? 0 }
        return max(floor, shard.map.withLock { $0[key]?[id]?.position.last ?? 0 })
    }

    /// Whether a SNAPSHOT numbered `sequence` for `id` is from before its last leave of `key`.
    private func fromBeforeLeave(_ key: ChannelKey, _ id: SessionID, sequence: UInt64, now: UInt64) -> Bool {
        shard(key).floors.withLock { f in
            guard let floor = f.byKey[key]?[id] else { return false }
            if floor.until > now && sequence <= floor.sequence { return true }
            f.remove(key, id)
            return false
        }
    }

    /// A SNAPSHOT for `id` from `from`: starts (or renews) its subscription and passes it on if
    /// it is above what the session saw. Returns a request for a fresher one otherwise.
    func snapshot(_ key: ChannelKey, _ id: SessionID, _ outbox: SessionOutbox, from: NodeInstance, sequence: UInt64,
                  framed: [UInt8], now: UInt64) -> Resnapshot? {
        if fromBeforeLeave(key, id, sequence: sequence, now: now) { return nil }
        return shard(key).map.withLock { m -> Resnapshot? in
            // (a subscription kept for an outbox the session no longer has — it moved away and
            // came back with a new one — goes on in the outbox it has now; where it stood stays:
            // the client saw that much through its earlier stream)
            var sub = m[key]?[id].map { Subscriber(outbox: outbox, position: $0.position) } ?? Subscriber(outbox: outbox, position: FeedPosition())
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
