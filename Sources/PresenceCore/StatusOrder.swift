/// The order of one session's status events (API.md, "Friends' status"): each carries the version
/// of the watched user's home record it was read at, which only grows, home after home. A status
/// read at a lower version than one the session was already given is older news (a push held on
/// a cut link and delivered once it healed, behind the Watch answer or the push that followed) and
/// is not passed on. Version 0 is unversioned (a peer that does not number them): always passed.
public struct StatusOrder: Sendable, Equatable {
    /// The version of the last status given for each watched user.
    public private(set) var given: [String: UInt64] = [:]

    public init() {}

    /// Whether a status of `user` at `version` is older than one the session was given.
    public func isOlder(_ user: String, version: UInt64) -> Bool {
        version != 0 && version < given[user] ?? 0
    }

    /// Whether a status of `user` at `version` may be given now; if so, it is recorded.
    public mutating func admits(_ user: String, version: UInt64) -> Bool {
        guard !isOlder(user, version: version) else { return false }
        noteGiven(user, version: version)
        return true
    }

    /// The session was given `user`'s status at `version` some other way (the Watch answer).
    public mutating func noteGiven(_ user: String, version: UInt64) {
        guard version != 0 else { return }
        // (bounded: a session watches at most `maxWatchedPerSession` users at a time; past twice
        // that, the users it stopped watching are forgotten with the rest, which only lets an old
        // status through once)
        if given[user] == nil, given.count >= 2 * Limits.maxWatchedPerSession { given = [:] }
        given[user] = max(given[user] ?? 0, version)
    }
}
