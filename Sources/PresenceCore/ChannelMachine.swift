import PresenceWire

/// Where one event goes.
public enum Recipients: Equatable, Sendable {
    /// Every session subscribed with presence, except the one whose call caused the event.
    case subscribers(except: SessionID?)
    /// One session (its SNAPSHOT).
    case session(SessionID)
}

/// An event computed once, and who gets it.
public struct Delivery: Sendable, Equatable {
    public let event: PresenceEvent
    public let to: Recipients
}

/// The presence rules of one channel (API.md, "Events"): membership, per-user state, the event
/// sequence, and the switch between real-time and interval mode. A plain value: callers pass the
/// wall-clock time in and carry out the deliveries it returns. `Sink` is where a session lives (in
/// the cluster: its gateway node); the machine only stores it, and counts subscribers per sink so an
/// event goes once to each sink that has any.
public struct ChannelMachine<Sink: Hashable> {
    public let key: ChannelKey
    public var maxInstantEvents: Int

    struct Member {
        var sessions: SessionList
        var state: StateItems
        /// When the state last changed (wall ms; 0: never set). Decides between two versions of a
        /// user after a partition (the later change wins).
        var stateAt: Int64 = 0
    }

    enum Mode: Equatable { case realtime, interval }

    private var members: [String: Member] = [:]
    /// User ids in order, for paging.
    private var order: [String] = []
    public private(set) var subscribers: [SessionID: Sink] = [:]
    /// Sessions in the channel without presence, and where they live.
    private var quiet: [SessionID: Sink] = [:]
    /// Subscribers per sink: where each event must go.
    public private(set) var subscriberSinks: [Sink: Int] = [:]
    public private(set) var sequence: UInt64 = 0
    private(set) var mode = Mode.realtime
    private var batch = IntervalBatch()

    public init(key: ChannelKey, maxInstantEvents: Int) {
        self.key = key
        self.maxInstantEvents = maxInstantEvents
    }

    /// Users in the channel.
    public var occupancy: Int { order.count }
    public var isEmpty: Bool { order.isEmpty }
    public var isIntervalMode: Bool { mode == .interval }

    public func contains(user: String) -> Bool { members[user] != nil }
    public func contains(user: String, session: SessionID) -> Bool { members[user]?.sessions.contains(session) ?? false }
    public func state(of user: String) -> [StateItem]? { members[user]?.state.items }

    // MARK: Calls

    /// A session joins (or re-joins, to change `withPresence`). `pendingState` is state the session
    /// set before joining. A user's first session makes REMOTE_JOIN; a subscribing session gets a
    /// SNAPSHOT as its first event of this channel.
    public mutating func join(user: String, session: SessionID, withPresence: Bool, sink: Sink,
                              pendingState: [StateItem] = [], now: Int64) -> [Delivery] {
        var out: [Delivery] = []
        if var m = members[user] {
            if !m.sessions.contains(session) {
                m.sessions.append(session)
                var changed = false
                if !pendingState.isEmpty, m.state.countAfterMerging(pendingState) <= Limits.maxStateKeys {
                    changed = m.state.merge(pendingState)
                    if changed { m.stateAt = now }
                }
                members[user] = m
                if changed { emit(.remoteStateChanged, user: user, except: session, now: now, into: &out) }
            }
        } else {
            var state = StateItems()
            state.merge(pendingState)
            members[user] = Member(sessions: SessionList(session), state: state, stateAt: state.isEmpty ? 0 : now)
            let at = insertionIndex(for: user)
            order.insert(user, at: at)
            updateMode(now: now, into: &out)
            emit(.remoteJoin, user: user, except: session, now: now, into: &out)
            if !state.isEmpty { emit(.remoteStateChanged, user: user, except: session, now: now, into: &out) }
        }
        let before = subscribers[session]
        place(session, at: sink, withPresence: withPresence)
        if withPresence && before != sink {
            out.append(Delivery(event: snapshot(now: now), to: .session(session)))
        }
        return out
    }

    /// Anti-entropy: a gateway (`sink`) says its live session is in the channel. A session already
    /// here moves to that gateway without any event (a subscriber that moved gets a fresh SNAPSHOT,
    /// since its new gateway may have missed events); a missing one joins as usual.
    public mutating func announce(user: String, session: SessionID, withPresence: Bool, sink: Sink, now: Int64) -> [Delivery] {
        guard contains(user: user, session: session) else {
            return join(user: user, session: session, withPresence: withPresence, sink: sink, now: now)
        }
        let before = subscribers[session]
        place(session, at: sink, withPresence: withPresence)
        guard withPresence, before != sink else { return [] }
        return [Delivery(event: snapshot(now: now), to: .session(session))]
    }

    /// Where a session of this channel lives.
    public func sink(of session: SessionID) -> Sink? { subscribers[session] ?? quiet[session] }

    /// Every place a session of this channel lives.
    public var allSinks: Set<Sink> { Set(subscriberSinks.keys).union(quiet.values) }

    /// Every session living at `sink`, with its user (to time them out when that node dies).
    public func sessions(at sink: Sink) -> [(user: String, session: SessionID)] {
        var out: [(String, SessionID)] = []
        for (user, m) in members {
            for s in m.sessions.all where self.sink(of: s) == sink { out.append((user, s)) }
        }
        return out
    }

    private mutating func place(_ session: SessionID, at sink: Sink, withPresence: Bool) {
        unplace(session)
        if withPresence {
            subscribers[session] = sink
            subscriberSinks[sink, default: 0] += 1
        } else {
            quiet[session] = sink
        }
    }

    private mutating func unplace(_ session: SessionID) {
        quiet[session] = nil
        guard let old = subscribers.removeValue(forKey: session) else { return }
        if let n = subscriberSinks[old], n > 1 { subscriberSinks[old] = n - 1 } else { subscriberSinks[old] = nil }
    }

    /// A session leaves (`timedOut`: its resume window passed). The user's last session makes
    /// REMOTE_LEAVE (or REMOTE_TIMEOUT) and deletes the user's state here.
    public mutating func leave(user: String, session: SessionID, timedOut: Bool = false, now: Int64) -> [Delivery] {
        guard var m = members[user], m.sessions.contains(session) else { return [] }
        unplace(session)
        m.sessions.remove(session)
        if !m.sessions.isEmpty {
            members[user] = m
            return []
        }
        members[user] = nil
        let at = insertionIndex(for: user)
        if at < order.count, order[at] == user { order.remove(at: at) }
        var out: [Delivery] = []
        updateMode(now: now, into: &out)
        emit(timedOut ? .remoteTimeout : .remoteLeave, user: user, except: session, now: now, into: &out)
        return out
    }

    /// Merges state for a user whose `session` is in the channel. Throws STATE_KEY_LIMIT (and
    /// changes nothing) when the user would hold more than 32 keys.
    public mutating func setState(user: String, session: SessionID, items: [StateItem], now: Int64) throws(PresenceError) -> [Delivery] {
        guard var m = members[user], m.sessions.contains(session) else { return [] }
        let after = m.state.countAfterMerging(items)
        guard after <= Limits.maxStateKeys else {
            throw PresenceError(.resourceExhausted, "STATE_KEY_LIMIT", "a user may hold at most \(Limits.maxStateKeys) state keys per channel; this call would make \(after)")
        }
        guard m.state.merge(items) else { return [] }
        m.stateAt = now
        members[user] = m
        var out: [Delivery] = []
        emit(.remoteStateChanged, user: user, except: session, now: now, into: &out)
        return out
    }

    /// Removes state keys (all when `keys` is empty).
    public mutating func removeState(user: String, session: SessionID, keys: [String], now: Int64) -> [Delivery] {
        guard var m = members[user], m.sessions.contains(session), m.state.remove(keys) else { return [] }
        m.stateAt = now
        members[user] = m
        var out: [Delivery] = []
        emit(.remoteStateChanged, user: user, except: session, now: now, into: &out)
        return out
    }

    /// Called every presence interval: in interval mode, the INTERVAL event with what happened since.
    public mutating func tick(now: Int64) -> [Delivery] {
        guard mode == .interval else { return [] }
        var out: [Delivery] = []
        flushInterval(now: now, into: &out)
        return out
    }

    /// A fresh SNAPSHOT for one session (after events may have been lost).
    public func resnapshot(for session: SessionID, now: Int64) -> Delivery? {
        guard subscribers[session] != nil else { return nil }
        return Delivery(event: snapshot(now: now), to: .session(session))
    }

    // MARK: Copies (replication and handoff)

    /// A user's whole record here; no sessions means the user is gone.
    public func copy(of user: String) -> MemberCopy<Sink> {
        guard let m = members[user] else { return MemberCopy(userID: user, sessions: [], state: []) }
        let sessions = m.sessions.all.compactMap { s in
            sink(of: s).map { MemberCopy<Sink>.Session(id: s, sink: $0, withPresence: subscribers[s] != nil) }
        }
        return MemberCopy(userID: user, sessions: sessions, state: m.state.items, stateAt: m.stateAt)
    }

    /// Every user's record, in id order.
    public var copies: [MemberCopy<Sink>] { order.map { copy(of: $0) } }

    /// Replaces a user's record with `copy`, silently (a replica applying its owner's change, or a
    /// new owner taking a channel over). Events were already sent by whoever made the change.
    public mutating func install(_ copy: MemberCopy<Sink>) {
        if let m = members[copy.userID] {
            for s in m.sessions.all { unplace(s) }
        }
        if copy.sessions.isEmpty {
            if members.removeValue(forKey: copy.userID) != nil {
                let at = insertionIndex(for: copy.userID)
                if at < order.count, order[at] == copy.userID { order.remove(at: at) }
            }
        } else {
            var list = SessionList()
            for s in copy.sessions {
                list.append(s.id)
                place(s.id, at: s.sink, withPresence: s.withPresence)
            }
            if members[copy.userID] == nil { order.insert(copy.userID, at: insertionIndex(for: copy.userID)) }
            members[copy.userID] = Member(sessions: list, state: StateItems(copy.state), stateAt: copy.stateAt)
        }
        mode = occupancy > maxInstantEvents ? .interval : .realtime
    }

    /// Merges another version of a user's record into this one, silently (a channel handed over
    /// after a partition, when each side kept its own version): sessions are the union (where a
    /// session lives, this version says), and the state is the one changed last.
    public mutating func merge(_ copy: MemberCopy<Sink>) {
        guard let m = members[copy.userID] else {
            if !copy.sessions.isEmpty { install(copy) }
            return
        }
        var merged = MemberCopy<Sink>(userID: copy.userID, sessions: [], state: m.state.items, stateAt: m.stateAt)
        for s in m.sessions.all {
            if let sink = sink(of: s) { merged.sessions.append(.init(id: s, sink: sink, withPresence: subscribers[s] != nil)) }
        }
        for s in copy.sessions where !m.sessions.contains(s.id) { merged.sessions.append(s) }
        if copy.stateAt > m.stateAt {
            merged.state = copy.state
            merged.stateAt = copy.stateAt
        }
        install(merged)
    }

    /// Keeps the event sequence going from where the previous owner left it.
    public mutating func advanceSequence(to s: UInt64) { sequence = max(sequence, s) }

    /// A SNAPSHOT to every subscriber (a new owner after a failover: events may have been lost).
    public func snapshotForAll(now: Int64) -> [Delivery] {
        subscribers.keys.sorted().map { Delivery(event: snapshot(now: now), to: .session($0)) }
    }

    // MARK: Queries

    /// One page of users in id order, starting after `after`; `next` is the last id when more follow.
    public func page(after: String?, limit: Int = Limits.pageSize, includeState: Bool) -> (users: [UserState], next: String?) {
        var start = 0
        if let after {
            start = insertionIndex(for: after)
            if start < order.count, order[start] == after { start += 1 }
        }
        let end = min(order.count, start + limit)
        guard start < end else { return ([], nil) }
        let users = order[start..<end].map { id in
            UserState(userID: id, states: includeState ? (members[id]?.state.items ?? []) : [])
        }
        return (users, end < order.count ? order[end - 1] : nil)
    }

    /// Sessions of a user here.
    public func sessions(of user: String) -> [SessionID] { members[user]?.sessions.all ?? [] }

    // MARK: Rules

    private func insertionIndex(for user: String) -> Int {
        var lo = 0, hi = order.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if order[mid] < user { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// Interval mode above `maxInstantEvents` users; back to real time (after flushing) at or below.
    private mutating func updateMode(now: Int64, into out: inout [Delivery]) {
        if occupancy > maxInstantEvents {
            mode = .interval
        } else if mode == .interval {
            flushInterval(now: now, into: &out)
            mode = .realtime
        }
    }

    private mutating func emit(_ type: PresenceEventType, user: String, except: SessionID?, now: Int64, into out: inout [Delivery]) {
        if mode == .interval {
            batch.record(type, user: user)
            return
        }
        sequence += 1
        var e = PresenceEvent(type: type, channelType: key.type, channelName: key.name, publisher: user, timestampMs: now, sequence: sequence)
        if type == .remoteStateChanged { e.states = members[user]?.state.items ?? [] }
        out.append(Delivery(event: e, to: .subscribers(except: except)))
    }

    private mutating func flushInterval(now: Int64, into out: inout [Delivery]) {
        guard !batch.isEmpty else { return }
        let b = batch
        batch = IntervalBatch()
        sequence += 1
        let states = b.stateChanged.sorted().compactMap { id in
            members[id].map { UserState(userID: id, states: $0.state.items) }
        }
        let info = IntervalInfo(joinUserIDs: b.joins.sorted(), leaveUserIDs: b.leaves.sorted(),
                                timeoutUserIDs: b.timeouts.sorted(), userStates: states)
        let e = PresenceEvent(type: .interval, channelType: key.type, channelName: key.name, interval: info,
                              timestampMs: now, sequence: sequence)
        out.append(Delivery(event: e, to: .subscribers(except: nil)))
    }

    private func snapshot(now: Int64) -> PresenceEvent {
        let users = order.map { UserState(userID: $0, states: members[$0]?.state.items ?? []) }
        return PresenceEvent(type: .snapshot, channelType: key.type, channelName: key.name, snapshot: users,
                             timestampMs: now, sequence: sequence)
    }
}

/// One user's record in a channel, as replicas and new owners receive it.
public struct MemberCopy<Sink: Hashable>: Equatable {
    public struct Session: Equatable {
        public var id: SessionID
        public var sink: Sink
        public var withPresence: Bool
        public init(id: SessionID, sink: Sink, withPresence: Bool) {
            self.id = id
            self.sink = sink
            self.withPresence = withPresence
        }
    }
    public var userID: String
    public var sessions: [Session]
    public var state: [StateItem]
    /// When the state last changed (wall ms; 0: never set).
    public var stateAt: Int64
    public init(userID: String, sessions: [Session], state: [StateItem], stateAt: Int64 = 0) {
        self.userID = userID
        self.sessions = sessions
        self.state = state
        self.stateAt = stateAt
    }
}

/// What happened in a channel since the last INTERVAL event. A join and a leave of the same user
/// within one interval cancel out: subscribers never knew of that visit.
struct IntervalBatch {
    var joins = Set<String>()
    var leaves = Set<String>()
    var timeouts = Set<String>()
    var stateChanged = Set<String>()

    var isEmpty: Bool { joins.isEmpty && leaves.isEmpty && timeouts.isEmpty && stateChanged.isEmpty }

    mutating func record(_ type: PresenceEventType, user: String) {
        switch type {
        case .remoteJoin:
            if leaves.remove(user) != nil || timeouts.remove(user) != nil {
                // back within the interval: still present, but its state was reset
                stateChanged.insert(user)
            } else {
                joins.insert(user)
            }
        case .remoteLeave, .remoteTimeout:
            stateChanged.remove(user)
            if joins.remove(user) != nil { return }
            if type == .remoteLeave { leaves.insert(user) } else { timeouts.insert(user) }
        case .remoteStateChanged:
            stateChanged.insert(user)
        default:
            break
        }
    }
}

/// The sessions of one user in one channel: almost always one, so that case needs no allocation.
struct SessionList: Equatable {
    private var first: SessionID?
    private var more: [SessionID] = []

    init() {}
    init(_ s: SessionID) { first = s }

    var isEmpty: Bool { first == nil }
    var all: [SessionID] { (first.map { [$0] } ?? []) + more }

    func contains(_ s: SessionID) -> Bool { first == s || more.contains(s) }

    mutating func append(_ s: SessionID) {
        if first == nil { first = s } else { more.append(s) }
    }

    mutating func remove(_ s: SessionID) {
        if first == s {
            first = more.isEmpty ? nil : more.removeFirst()
        } else if let i = more.firstIndex(of: s) {
            more.remove(at: i)
        }
    }
}
