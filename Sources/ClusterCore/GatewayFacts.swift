import PresenceCore
import PresenceWire

/// The gateway's side of anti-entropy, as plain values (RELIABILITY.md, "The gateway is the
/// authority on its sessions"): what a gateway holding `sessions` says it holds to each owner of
/// the ring (digests, and the facts behind them by bucket), and what it answers about a session an
/// owner places at it that it did not mention.
public struct GatewayFacts: Sendable {
    public var channels = FactDigest()
    public var homes = FactDigest()
    /// Facts by digest bucket.
    public var channelFacts: [Int: [(key: ChannelKey, fact: ChannelFact)]] = [:]
    public var homeFacts: [Int: [(user: String, fact: HomeFact)]] = [:]

    public init() {}

    /// What the gateway `me`, holding `sessions`, says to each owner on `ring` (by node id): each
    /// session's membership (and state) in the channels that owner owns, each session's record at
    /// its user's home, and that it watches each user it watches, at that user's home.
    public static func byOwner(_ sessions: some Sequence<SessionTable.Session>, me: NodeInstance, ring: HashRing) -> [String: GatewayFacts] {
        var out: [String: GatewayFacts] = [:]
        for s in sessions { add(s, me: me, ring: ring, to: &out) }
        return out
    }

    /// `byOwner` of the sessions of several tables (a gateway's shards), each session read where
    /// it lies (a copy of each, or of the table's values, is a retain and a release of each of its
    /// tables, for every session every round).
    public static func byOwner(tables: [DenseDictionary<SessionID, SessionTable.Session>], me: NodeInstance, ring: HashRing) -> [String: GatewayFacts] {
        var out: [String: GatewayFacts] = [:]
        for table in tables {
            table.forEachEntry { _, s in add(s, me: me, ring: ring, to: &out) }
        }
        return out
    }

    private static func add(_ s: borrowing SessionTable.Session, me: NodeInstance, ring: HashRing, to out: inout [String: GatewayFacts]) {
        for (key, m) in s.channels {
            guard let owner = ring.owner(of: key) else { continue }
            let h = StableHash.of(key)
            let fact = ChannelFact(session: s.id, user: s.userID, withPresence: m.withPresence, joinVersion: m.joinVersion,
                                   state: m.state, stateVersion: m.stateVersion)
            out[owner, default: GatewayFacts()].channels.add(keyHash: h, fact: fact.hash)
            out[owner]!.channelFacts[FactDigest.bucket(h), default: []].append((key, fact))
        }
        if let home = ring.home(ofUser: s.userID) {
            let h = HashRing.hash(ofUser: s.userID)
            let fact = HomeFact.session(s.id, record(of: s, at: me))
            out[home, default: GatewayFacts()].homes.add(keyHash: h, fact: fact.hash)
            out[home]!.homeFacts[FactDigest.bucket(h), default: []].append((s.userID, fact))
        }
        for w in s.watching {
            guard let home = ring.home(ofUser: w) else { continue }
            let h = HashRing.hash(ofUser: w)
            let fact = HomeFact.watcher(s.id, version: s.version)
            out[home, default: GatewayFacts()].homes.add(keyHash: h, fact: fact.hash)
            out[home]!.homeFacts[FactDigest.bucket(h), default: []].append((w, fact))
        }
    }

    /// A session's record as its user's home should hold it.
    public static func record(of s: SessionTable.Session, at me: NodeInstance) -> HomeRecord<NodeInstance>.Session {
        HomeRecord.Session(sink: me, version: s.version, channels: s.channels.mapValues(\.withPresence), watching: s.watching.sorted())
    }

    /// What the gateway answers about a suspect: a session an owner places at it in a channel
    /// (`channel`) or at a user's home (`user`) that it did not mention.
    public enum Verdict: Equatable, Sendable {
        /// It is there after all (it joined since the facts were taken): leave it.
        case held
        /// It is not here, as of this version (the session's own, or, for one this gateway does not
        /// know at all, the version the owner placed it at: never a later one, which a claim in
        /// flight may have given it).
        case gone(version: UInt64)
        /// Its client resumed it on another gateway.
        case moved(to: NodeInstance, version: UInt64)
        /// This gateway gave up on its open before its client heard of it (asked of a user's
        /// home): gone, and nothing its open set is the client's word.
        case neverOpened
    }

    /// `movedTo`: where the session went when its client resumed it elsewhere (`to` nil: another
    /// gateway claimed it, but which is not known here: it is left alone, the new one speaks for it).
    /// `abandoned`: this gateway gave up on the session's open.
    public static func verdict(channel: ChannelKey?, user: String?, placedAt version: UInt64, held: SessionTable.Session?,
                               claiming: Bool = false, movedTo: (to: NodeInstance?, version: UInt64)?, abandoned: Bool = false) -> Verdict {
        if claiming { return .held }  // its client is resuming it here right now
        if held == nil, abandoned, user != nil { return .neverOpened }
        if let s = held {
            let stillThere: Bool
            if let channel {
                stillThere = s.channels[channel] != nil
            } else if let user {
                stillThere = s.userID == user || s.watching.contains(user)
            } else {
                stillThere = true
            }
            return stillThere ? .held : .gone(version: s.version)
        }
        if let movedTo {
            guard let to = movedTo.to else { return .held }
            return .moved(to: to, version: movedTo.version)
        }
        return .gone(version: version)
    }
}
