import PresenceWire

/// A session's id: 64 random bits, shown as 16 hex digits.
public struct SessionID: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The high 64 bits (0 for ids of the 64-bit form, which are still read).
    public let hi: UInt64
    /// The low 64 bits (shards and digests start from them).
    public let raw: UInt64

    public init(raw: UInt64) {
        self.hi = 0
        self.raw = raw
    }

    public init(hi: UInt64, lo: UInt64) {
        self.hi = hi
        self.raw = lo
    }

    /// 128 random bits (issue 9: a session id is what a call acts on; 64 bits were guessable in
    /// principle, 128 are not).
    public static func random() -> SessionID {
        var g = SystemRandomNumberGenerator()
        return random(bits: { g.next() })
    }

    /// 128 bits from `bits` (a seeded source replays the same ids).
    public static func random(bits: () -> UInt64) -> SessionID {
        SessionID(hi: bits(), lo: bits() | 1)  // never 0
    }

    /// Parses the 32-hex-digit text form (or the 16-digit form of 64-bit ids), lower-case; nil for
    /// anything else. (Read straight from the UTF-8 bytes: every call names its session this way.)
    public init?(text: String) {
        var text = text
        let parsed = text.withUTF8 { bytes -> (hi: UInt64, lo: UInt64)? in
            switch bytes.count {
            case 16:
                guard let lo = Self.hexWord(bytes, at: 0) else { return nil }
                return (0, lo)
            case 32:
                guard let hi = Self.hexWord(bytes, at: 0), let lo = Self.hexWord(bytes, at: 16) else { return nil }
                return (hi, lo)
            default:
                return nil
            }
        }
        guard let parsed, parsed.hi != 0 || parsed.lo != 0 else { return nil }
        hi = parsed.hi
        raw = parsed.lo
    }

    /// The 64-bit number the 16 lower-case hex digits at `start` spell; nil if any is not one.
    /// (Without a branch per digit: every call names its session this way, some twice.)
    @inline(__always)
    private static func hexWord(_ bytes: UnsafeBufferPointer<UInt8>, at start: Int) -> UInt64? {
        var word: UInt64 = 0
        var bad = false
        for i in start..<(start + 16) {
            let c = bytes[i]
            let decimal = c &- 48      // 0-9: 0 ... 9
            let letter = c &- 97       // a-f: 0 ... 5
            bad = bad || (decimal > 9 && letter > 5)
            word = word << 4 | UInt64(decimal <= 9 ? decimal : letter &+ 10)
        }
        return bad ? nil : word
    }

    public var description: String {
        let digits = hi == 0 ? 16 : 32
        return String(unsafeUninitializedCapacity: digits) { out in
            var i = 0
            func put(_ word: UInt64) {
                for shift in stride(from: 60, through: 0, by: -4) {
                    let d = UInt8(truncatingIfNeeded: word >> UInt64(shift)) & 0xf
                    out[i] = d < 10 ? 48 &+ d : 87 &+ d
                    i += 1
                }
            }
            if hi != 0 { put(hi) }
            put(raw)
            return digits
        }
    }

    /// Hashed with the seeded `Hasher`, all 128 bits: a client can make a node hold ids it chose
    /// for a while (a resume's claim, an id in doubt), and an unkeyed fold of the two halves would
    /// let it pick thousands that land in one bucket chain (found in review; `KeyHashTests`).
    public func hash(into hasher: inout Hasher) {
        hasher.combine(hi)
        hasher.combine(raw)
    }

    /// All 128 bits folded into one number, for digests.
    public var digest: UInt64 { raw ^ (hi &* 0x9E37_79B9_7F4A_7C15) }

    public static func < (a: SessionID, b: SessionID) -> Bool { (a.hi, a.raw) < (b.hi, b.raw) }
}

/// One process of a node: its id and the boot it drew at start (RELIABILITY.md: "every process start
/// is a new member incarnation"). Sessions live at an instance; when that instance is gone (dead,
/// left, or replaced by a restart of the same id) its sessions are orphans.
public struct NodeInstance: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let id: String
    public let boot: UInt64

    public init(_ id: String, boot: UInt64) {
        self.id = id
        self.boot = boot
    }

    public static func < (a: NodeInstance, b: NodeInstance) -> Bool { (a.id, a.boot) < (b.id, b.boot) }
    public var description: String { "\(id)@\(boot)" }
}

/// A session's version as its gateway stamps every call: the *epoch* in the high 32 bits (bumped
/// by the user's home each time the session is claimed by a gateway, so a superseded gateway's word
/// loses), and a counter in the low 32 bits that the gateway bumps on every join and leave (so an
/// owner can tell a leave, or "I no longer hold it", from a join that came after it).
public enum SessionVersion {
    public static func epoch(_ v: UInt64) -> UInt64 { v >> 32 }
    public static func make(epoch: UInt64, counter: UInt64) -> UInt64 { (epoch << 32) | (counter & 0xffff_ffff) }
    /// The next counter value in the same epoch (saturating: a session never makes 4 billion joins).
    public static func bumped(_ v: UInt64) -> UInt64 { v & 0xffff_ffff == 0xffff_ffff ? v : v + 1 }
    /// The first version of the epoch after `v`'s.
    public static func nextEpoch(_ v: UInt64) -> UInt64 { epoch(v) >= 0xffff_ffff ? v : make(epoch: epoch(v) + 1, counter: 0) }
}

/// A failed presence call: a gRPC-style kind, an upper-case error name and a sentence for a person.
public struct PresenceError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        case invalidArgument, notFound, permissionDenied, unauthenticated, resourceExhausted, unavailable, failedPrecondition
    }

    public let kind: Kind
    public let name: String
    public let detail: String
    /// SESSION_MOVED (between nodes): the session version that superseded the caller's.
    public var supersededBy: UInt64 = 0

    public init(_ kind: Kind, _ name: String, _ detail: String, supersededBy: UInt64 = 0) {
        self.kind = kind
        self.name = name
        self.detail = detail
        self.supersededBy = supersededBy
    }

    /// `NAME: detail`, as `grpc-message` carries it.
    public var description: String { "\(name): \(detail)" }

    /// An owner's or home's refusal of a gateway its client left (the session was resumed
    /// elsewhere, at the later version `newer`): the gateway drops the session.
    public static func sessionMoved(_ id: SessionID, supersededBy newer: UInt64) -> PresenceError {
        PresenceError(.failedPrecondition, "SESSION_MOVED", "session \(id) was resumed elsewhere (epoch \(SessionVersion.epoch(newer)))", supersededBy: newer)
    }
}

/// Limits and identifier rules of the API (API.md), in one place.
public enum Limits {
    public static let maxIdentifierBytes = 64
    public static let maxStateKeys = 32
    public static let maxStateKeyBytes = 64
    public static let maxStateValueBytes = 1024
    public static let pageSize = 100
    /// User ids one GetUserStatuses or Watch call may name.
    public static let maxUsersPerCall = 1000
    /// Users one session may watch at once.
    public static let maxWatchedPerSession = 10_000
    /// Channels one session may be in at once.
    public static let maxChannelsPerSession = 10_000
    /// Bookmarks longer than this cannot be ours.
    public static let maxBookmarkBytes = 256
    /// Channels one session may hold state for before joining them (SetState before Join).
    public static let maxPendingStateChannels = 64
    /// Sessions one user may have open at once, cluster-wide (devices, tabs).
    public static let maxSessionsPerUser = 64
    /// A SNAPSHOT whose message would be larger than this goes out in pages, each at most this
    /// size (1 MiB, a quarter of the 4 MiB gRPC clients accept by default). One user's full state
    /// (32 keys of 64 + 1024 bytes) is ~35 KiB, so a page always holds at least one user.
    public static let maxSnapshotPageBytes = 1 << 20
}

/// Checks requests against the rules of API.md. Each failure names the offending field.
public enum Validate {
    /// 1-64 bytes of `[A-Za-z0-9_.:@-]`: the rule for user ids, channel names and node ids.
    public static func isIdentifier(_ s: String) -> Bool {
        let utf8 = s.utf8
        guard !utf8.isEmpty, utf8.count <= Limits.maxIdentifierBytes else { return false }
        for b in utf8 {
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "."),
                 UInt8(ascii: ":"), UInt8(ascii: "@"), UInt8(ascii: "-"):
                continue
            default:
                return false
            }
        }
        return true
    }

    public static func userID(_ s: String, field: String = "user_id") throws(PresenceError) -> String {
        guard isIdentifier(s) else {
            throw PresenceError(.invalidArgument, "INVALID_USER_ID", "\(field) must be 1-64 bytes of [A-Za-z0-9_.:@-], got \(quoted(s))")
        }
        return s
    }

    public static func channel(_ name: String, _ type: ChannelType) throws(PresenceError) -> ChannelKey {
        guard isIdentifier(name) else {
            throw PresenceError(.invalidArgument, "INVALID_CHANNEL_NAME", "channel_name must be 1-64 bytes of [A-Za-z0-9_.:@-], got \(quoted(name))")
        }
        guard type == .message || type == .stream else {
            throw PresenceError(.invalidArgument, "INVALID_CHANNEL_TYPE", "channel_type must be CHANNEL_TYPE_MESSAGE or CHANNEL_TYPE_STREAM")
        }
        return ChannelKey(name: name, type: type)
    }

    public static func sessionID(_ s: String) throws(PresenceError) -> SessionID {
        guard let id = SessionID(text: s) else {
            throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(quoted(s)) (open one with OpenSession)")
        }
        return id
    }

    public static func stateItems(_ items: [StateItem]) throws(PresenceError) -> [StateItem] {
        guard items.count <= Limits.maxStateKeys else {
            throw PresenceError(.resourceExhausted, "STATE_KEY_LIMIT", "a user may hold at most \(Limits.maxStateKeys) state keys per channel; the call sets \(items.count)")
        }
        for item in items {
            try stateKey(item.key)
            guard item.value.utf8.count <= Limits.maxStateValueBytes else {
                throw PresenceError(.invalidArgument, "INVALID_STATE_VALUE", "state value of key \(quoted(item.key)) is \(item.value.utf8.count) bytes; at most \(Limits.maxStateValueBytes)")
            }
        }
        return items
    }

    public static func stateKey(_ key: String) throws(PresenceError) {
        let n = key.utf8.count
        guard n >= 1, n <= Limits.maxStateKeyBytes else {
            throw PresenceError(.invalidArgument, "INVALID_STATE_KEY", "state keys are 1-\(Limits.maxStateKeyBytes) bytes, got \(n)")
        }
    }

    public static func userList(_ ids: [String], field: String) throws(PresenceError) -> [String] {
        guard ids.count <= Limits.maxUsersPerCall else {
            throw PresenceError(.invalidArgument, "TOO_MANY_USERS", "\(field) may name at most \(Limits.maxUsersPerCall) users, got \(ids.count)")
        }
        for id in ids { _ = try userID(id, field: field) }
        return ids
    }

    static func quoted(_ s: String) -> String {
        let shown = s.utf8.count > 80 ? String(s.prefix(80)) + "…" : s
        return "'\(shown)'"
    }
}

/// The numbers a session's gateway gives its state writes (SetState, RemoveState), one counter
/// per session: a channel's owner that learnt from another owner's copy that a later (or the same)
/// write was applied there drops a delayed attempt of an earlier one (found by Cluster/chaos, netns
/// seed 92: a SetState's first attempt, queued in TCP to an owner cut off by a partition, arrived
/// after the channel came back to it and replaced the value a later SetState had set). 0 means
/// unnumbered; numbers wrap and are compared as serial numbers (RFC 1982), never 0.
public enum WriteNumber {
    /// The number after `n`.
    public static func next(_ n: UInt32) -> UInt32 { n == .max ? 1 : n + 1 }
    /// Whether `a` comes after `b` (both numbered: within 2^31 of each other).
    public static func isAfter(_ a: UInt32, _ b: UInt32) -> Bool { Int32(bitPattern: a &- b) > 0 }
    /// The later of two numbers (0, unnumbered, is before any).
    public static func latest(_ a: UInt32, _ b: UInt32) -> UInt32 { a == 0 ? b : b == 0 ? a : (isAfter(b, a) ? b : a) }
}
