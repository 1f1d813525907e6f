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

/// An event for the sessions of one sink (gateway): every subscriber there but `except`, or
/// exactly `sessions` (a SNAPSHOT). What an owner sends a gateway, once per gateway.
public struct RoutedDelivery<Sink: Hashable & Sendable>: Sendable, Equatable {
    public let sink: Sink
    public let event: PresenceEvent
    /// Empty: every subscriber of the channel at `sink` except `except`.
    public let sessions: [SessionID]
    public let except: SessionID?
    public var isSnapshot: Bool { event.type == .snapshot }
}

/// The presence rules of one channel (API.md, "Events"): membership, per-user state, the event
/// sequence, and the switch between real-time and interval mode; and the versions that let copies
/// of it on several nodes be told apart and merged (RELIABILITY.md, "Every fact carries its version").
/// A plain value: callers pass the wall-clock time in and carry out the deliveries it returns. `Sink`
/// is where a session lives (in the cluster: its gateway's process); the machine only stores it,
/// and counts subscribers per sink so an event goes once to each sink that has any.
///
/// Versions: each session's placement carries the session version its gateway stamped (epoch and
/// counter, `SessionVersion`); each user's state carries the channel counter value of its last
/// change. `sequence` only grows, by one per event (a SNAPSHOT included, so every event a session
/// gets is above the ones before); `startLineage` moves it far above what any earlier owner of the
/// channel can have issued. Sessions that left are remembered for a while (`departed`), so a merge
/// with an older copy does not bring them back.
public struct ChannelMachine<Sink: Hashable & Sendable>: Sendable {
    public let key: ChannelKey
    public var maxInstantEvents: Int

    struct Member: Sendable {
        var state: StateItems
        /// The channel counter value at the state's last change (0: never set).
        var stateVersion: UInt64 = 0
        /// The index in `placements` of the user's first session here (a user whose last session
        /// leaves is no longer a member; any others are in `moreSessions`): 4 bytes where its id
        /// is 16, and the entry 40 bytes instead of 48. `place` changes placements where they lie
        /// and `unplace` moves the last one into the hole, keeping its member's index in step.
        var firstPlace: UInt32
    }

    /// Where a session of the channel lives, whether it follows presence, and at which version.
    public struct Place: Equatable, Sendable {
        public var user: String
        public var sink: Sink
        public var withPresence: Bool
        public var version: UInt64
    }

    /// A `Place` as the machine stores it, in 16 bytes: its user named by the index of the user's
    /// entry in `members`, its sink by its index in `sinks` (4 bytes each, where an id is 16 and a
    /// sink 24; `removeMember` keeps the member indices in step when an entry moves), and
    /// `withPresence` in the sink field's top bit (a channel has a few sinks, one per gateway);
    /// and the session's state writes (`WriteNumber`, in the epoch of `version`): the last one
    /// this owner applied or learnt, and the fence: the last one learnt from another owner's copy
    /// or settled by its gateway (a write numbered at or below that is a delayed attempt its
    /// gateway retried elsewhere or finished with).
    struct Placement: Sendable {
        var member: UInt32
        private var sinkAndPresence: UInt32
        var version: UInt64
        var written: UInt32 = 0
        var fence: UInt32 = 0
        var sink: UInt32 { sinkAndPresence & ~Self.presenceBit }
        var withPresence: Bool { sinkAndPresence & Self.presenceBit != 0 }
        private static var presenceBit: UInt32 { 1 << 31 }

        init(member: UInt32, sink: UInt32, version: UInt64, withPresence: Bool) {
            precondition(sink < Self.presenceBit, "ChannelMachine: too many sinks")
            self.member = member
            self.sinkAndPresence = sink | (withPresence ? Self.presenceBit : 0)
            self.version = version
        }
    }

    /// A session that left: whose it was, its version then, and whether its gateway said so (a
    /// leave) or this owner decided it (a timeout of a session whose gateway was gone).
    public struct Departure: Equatable, Sendable {
        public var user: String
        public var version: UInt64
        public var byGateway: Bool
        public var at: Int64
        public init(user: String, version: UInt64, byGateway: Bool, at: Int64) {
            self.user = user
            self.version = version
            self.byGateway = byGateway
            self.at = at
        }
    }

    /// How long departures are remembered (wall ms): longer than any partition whose two versions
    /// of the channel are merged afterwards is likely to last.
    public static var departureMemory: Int64 { 120_000 }

    enum Mode: Equatable { case realtime, interval }

    private var members: DenseDictionary<String, Member> = [:] { didSet { listingRevision = ListingRevision.next() } }
    /// The sessions after the first of each member that has several, by user id. A user almost
    /// always has one session in a channel: kept beside the members rather than in each (an array
    /// reference in every entry was 8 bytes per membership), this is empty in most channels and
    /// costs nothing while it is.
    private var moreSessions: [String: [SessionID]] = [:]
    /// The members in user id order, for paging: indices of their entries in `members` (4 bytes
    /// where an id is 16; `addMember` and `removeMember` keep the two in step).
    private var order: [UInt32] = [] { didSet { listingRevision = ListingRevision.next() } }
    /// Changes whenever what `page` lists may have changed (its users, their state, the occupancy),
    /// to a value no other change in this process had: two machines, or two copies of one, with
    /// the same revision list the same pages. What a cache of encoded pages is keyed by.
    public private(set) var listingRevision: UInt64 = ListingRevision.next()
    /// Where each session lives, its sink named by its index in `sinks`: a channel has many
    /// sessions and few gateways, and a sink (a node's id and boot) is 24 bytes where its index is 4.
    private var placements: DenseDictionary<SessionID, Placement> = [:]
    /// The sinks sessions live at, with how many sessions and subscribers each holds: a small
    /// array (one per gateway), searched by scanning. An entry whose sessions all left is reused.
    private var sinks: [SinkEntry] = []
    struct SinkEntry: Sendable {
        var sink: Sink
        var sessions: Int
        var subscribers: Int
    }
    /// Subscribers per sink: where each event must go.
    public var subscriberSinks: [Sink: Int] {
        var out: [Sink: Int] = [:]
        for e in sinks where e.subscribers > 0 { out[e.sink] = e.subscribers }
        return out
    }
    /// Sessions per sink (with or without presence).
    public var sinkCounts: [Sink: Int] {
        var out: [Sink: Int] = [:]
        for e in sinks where e.sessions > 0 { out[e.sink] = e.sessions }
        return out
    }
    public private(set) var departed: [SessionID: Departure] = [:]
    public private(set) var sequence: UInt64 = 0
    /// Where this owner's lineage of sequence numbers started (copies and merges keep the higher).
    public private(set) var term: UInt64 = 0
    private(set) var mode = Mode.realtime
    private var batch = IntervalBatch()
    /// Inside `batched`: the sessions owed a SNAPSHOT, taken once the whole batch is done.
    private var deferredSnapshots: [SessionID]?
    /// On a replica: the owner's sequence of the last change installed for each user. A change
    /// that arrives after a later one (relayed pushes can overtake each other) is older and
    /// skipped: installed, it would bring back a user who had left since (found by Cluster/chaos,
    /// netns: a replica took over and its SNAPSHOT listed a user who had left).
    private var installedAt: DenseDictionary<String, UInt64> = [:]
    /// On a replica: the owner's sequence when the last full copy was taken. A change of the same
    /// lineage from before it is already in it, also for users it no longer lists (they left:
    /// found by Cluster/chaos, netns seed 50, a change queued during a partition arrived after the
    /// full copy sent at the heal and brought back a user who had left).
    private var fullCopyAt: UInt64 = 0

    public init(key: ChannelKey, maxInstantEvents: Int) {
        self.key = key
        self.maxInstantEvents = maxInstantEvents
    }

    /// Users in the channel.
    public var occupancy: Int { order.count }
    public var isEmpty: Bool { order.isEmpty }
    public var isIntervalMode: Bool { mode == .interval }

    // (The queries a shard makes on every call are pre-specialised for the node's sink, as its
    // changes are: generic code called across modules looks metadata up for each table access.)
    @_specialize(exported: true, where Sink == NodeInstance)
    public func contains(user: String) -> Bool { members[user] != nil }
    @_specialize(exported: true, where Sink == NodeInstance)
    public func contains(user: String, session: SessionID) -> Bool { members[user].map { has($0, user, session) } ?? false }
    @_specialize(exported: true, where Sink == NodeInstance)
    public func state(of user: String) -> [StateItem]? { members[user]?.state.items }
    @_specialize(exported: true, where Sink == NodeInstance)
    public func stateVersion(of user: String) -> UInt64 { members[user]?.stateVersion ?? 0 }
    /// `state(of:)` and `stateVersion(of:)` in one lookup (what an owner answers every write with).
    @_specialize(exported: true, where Sink == NodeInstance)
    public func stateAndVersion(of user: String) -> (items: [StateItem], version: UInt64) {
        guard let i = members.index(forKey: user) else { return ([], 0) }
        return (members[valueAt: i].state.items, members[valueAt: i].stateVersion)
    }
    /// The user a session of this channel belongs to.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func user(of session: SessionID) -> String? { placements[session].map { userID(atEntry: $0.member) } }

    /// Where a session of this channel lives (nil: not here).
    @_specialize(exported: true, where Sink == NodeInstance)
    public func place(of session: SessionID) -> Place? { placements[session].map(place) }

    /// A stored placement with its sink named in full.
    private func place(_ p: Placement) -> Place {
        Place(user: userID(atEntry: p.member), sink: sinks[Int(p.sink)].sink, withPresence: p.withPresence, version: p.version)
    }

    /// Every session's place, built on each call (for inspection and tests: a lookup is `place(of:)`).
    public var allPlaces: [SessionID: Place] {
        var out: [SessionID: Place] = [:]
        for (id, p) in placements { out[id] = place(p) }
        return out
    }

    /// The places of the sessions living at `sink`, in no particular order.
    /// Each session placed at `sink`: its id, version, whether it follows presence, and its user's
    /// state version (what anti-entropy digests). Read where they lie: no table is copied or
    /// searched, and no user id is hashed (each owned channel is digested for each gateway every
    /// anti-entropy round, a 100,000-member channel included).
    @_specialize(exported: true, where Sink == NodeInstance)
    public func forEachPlacement(at sink: Sink, _ body: (SessionID, _ version: UInt64, _ withPresence: Bool, _ stateVersion: UInt64) -> Void) {
        guard let index = sinkEntry(sink) else { return }
        members.entries.withUnsafeBufferPointer { members in
            placements.forEachEntry { id, p in
                if p.sink == index { body(id, p.version, p.withPresence, members[Int(p.member)].value.stateVersion) }
            }
        }
    }

    public func places(at sink: Sink) -> [(session: SessionID, place: Place)] {
        guard let index = sinkEntry(sink) else { return [] }
        return placements.filter { $0.value.sink == index }.map { ($0.key, place($0.value)) }
    }

    /// Sessions with presence and where they live.
    public var subscribers: [SessionID: Sink] {
        var out: [SessionID: Sink] = [:]
        for (id, p) in placements where p.withPresence { out[id] = sinks[Int(p.sink)].sink }
        return out
    }

    // MARK: Versions

    /// When a call stamped with `version` comes from a superseded gateway (the session moved on
    /// under a later epoch), the version that superseded it; nil when the call may act.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func supersedingVersion(of session: SessionID, _ version: UInt64) -> UInt64? {
        if let p = placements[session], SessionVersion.epoch(p.version) > SessionVersion.epoch(version) { return p.version }
        if let d = departed[session], SessionVersion.epoch(d.version) > SessionVersion.epoch(version) { return d.version }
        return nil
    }

    /// Whether a join or announce stamped `version` is older than the session's leave here (a
    /// delayed message from before it): it must not bring the session back.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func leftAfter(_ session: SessionID, _ version: UInt64) -> Bool {
        guard let d = departed[session], d.byGateway else { return false }
        return d.version >= version
    }

    /// Starts a new lineage of sequence numbers (a new owner): above everything the previous owner
    /// can have issued since its last copy reached this one (2^32 of margin) and above any earlier
    /// life of the channel (the wall clock in ms, times 2^22).
    public mutating func startLineage(now: Int64) {
        let (fromCopy, overflow) = max(sequence, term).addingReportingOverflow(1 << 32)
        let ms = UInt64(clamping: max(0, min(now, 1 << 41)))
        term = max(overflow ? .max : fromCopy, ms << 22)
        sequence = max(sequence, term)
    }

    /// Where a lineage started at wall time `now` (ms) begins at least (see `startLineage`).
    static func lineageFloor(_ now: Int64) -> UInt64 { UInt64(clamping: max(0, min(now, 1 << 41))) << 22 }

    /// Keeps the event sequence at or above `s` (a copy, a merge, or a gateway's floor).
    public mutating func advanceSequence(to s: UInt64) { sequence = max(sequence, s) }

    private mutating func nextSequence() -> UInt64 {
        if sequence < .max { sequence += 1 }
        return sequence
    }

    // MARK: Calls

    /// A session joins (or re-joins, to change `withPresence`). `pendingState` is state the session
    /// set before joining. A user's first session makes REMOTE_JOIN; a subscribing session gets a
    /// SNAPSHOT as its first event of this channel.
    @_specialize(exported: true, where Sink == NodeInstance)
    /// `settled`: the number of the session's last state write before this join, when its gateway
    /// joins it afresh: every write numbered at or below it belongs to an earlier membership (a
    /// first attempt delivered late, or a duplicate), and changes nothing here.
    public mutating func join(user: String, session: SessionID, withPresence: Bool, sink: Sink, version: UInt64 = 0,
                              pendingState: [StateItem] = [], settled: UInt32 = 0, now: Int64) -> [Delivery] {
        let out = join(user: user, session: session, withPresence: withPresence, sink: sink, version: version, pendingState: pendingState,
                       datingState: true, now: now)
        fence(settled, of: session, version: version)
        return out
    }

    /// `datingState`: a user's first session starts its state afresh (a client's join), dated now,
    /// so an older state of the user — from before it left, in another version of the channel
    /// merged later — does not come back. Announces and merges add members whose state comes
    /// with them (from the gateway, or from the other version): not dated.
    private mutating func join(user: String, session: SessionID, withPresence: Bool, sink: Sink, version: UInt64,
                               pendingState: [StateItem], datingState: Bool, now: Int64) -> [Delivery] {
        // a session is its user's own (its gateway and its home check it): one that another user
        // holds here is a faulty sender's word, and changes nothing (found in review: placed under
        // both, a member named its first session by an entry that had become another's)
        let before = place(of: session)
        if let before, before.user != user { return [] }
        var out: [Delivery] = []
        departed[session] = nil
        let member: Int
        if let i = members.index(forKey: user) {
            member = i
            var m = members[valueAt: i]
            if !has(m, user, session) {
                moreSessions[user, default: []].append(session)
                var changed = false
                if !pendingState.isEmpty, m.state.countAfterMerging(pendingState) <= Limits.maxStateKeys {
                    changed = m.state.merge(pendingState)
                    if changed { m.stateVersion = nextSequence() }
                }
                members[valueAt: i] = m
                if changed { emit(.remoteStateChanged, user: user, except: session, now: now, into: &out) }
            }
        } else {
            var state = StateItems()
            state.merge(pendingState)
            // (its first session's index is set once the session is placed, below)
            member = addMember(user, Member(state: state, stateVersion: state.isEmpty ? (datingState ? sequence : 0) : nextSequence(),
                                            firstPlace: UInt32.max))
            updateMode(now: now, into: &out)
            emit(.remoteJoin, user: user, except: session, now: now, into: &out)
            if !state.isEmpty { emit(.remoteStateChanged, user: user, except: session, now: now, into: &out) }
        }
        let at = place(session, member: member, at: sink, withPresence: withPresence, version: max(before?.version ?? 0, version))
        if members[valueAt: member].firstPlace == UInt32.max { members[valueAt: member].firstPlace = UInt32(at) }
        if withPresence && (before?.withPresence != true || before?.sink != sink) {
            snapshot(for: session, now: now, into: &out)
        }
        return out
    }

    /// What an announce did: the events it caused; `superseded` when the announcing gateway's word
    /// is older than what this owner knows of the session (it moved on, or left after that);
    /// `correction` when this owner holds a later state of the user than the gateway said.
    public struct AnnounceOutcome: Sendable {
        public var deliveries: [Delivery] = []
        public var superseded: UInt64? = nil
        public var correction: (state: [StateItem], version: UInt64)? = nil
        /// An announce of a resume found the session timed out here: it was not added back.
        public var expired = false
        public init() {}
    }

    /// Anti-entropy (RELIABILITY.md, "The gateway is the authority on its sessions"): the gateway
    /// at `sink` holds `session` in this channel at `version`, with the user's state as it last
    /// learnt it. A session already here moves to that gateway without an event (a subscriber gets
    /// a fresh SNAPSHOT there); a missing one is added (REMOTE_JOIN, and its state) unless its
    /// gateway said it left after `version`; a later state from the gateway replaces this one's.
    /// The announce of a `resume` (the claim that moved the session) does not bring back a session
    /// this owner timed out: its state went with it, and the resume, past the timeout as this owner
    /// counted it (from an earlier sight of the gateway's end than the user's home had), is refused.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func announce(user: String, session: SessionID, withPresence: Bool, sink: Sink, version: UInt64 = 0,
                                  state: [StateItem]? = nil, stateVersion: UInt64 = 0, resume: Bool = false, now: Int64) -> AnnounceOutcome {
        var outcome = AnnounceOutcome()
        if let newer = supersedingVersion(of: session, version) {
            outcome.superseded = newer
            return outcome
        }
        if leftAfter(session, version) { return outcome }  // news from before its leave
        // A session that comes from another gateway, or was resumed (a later epoch), may have
        // followed another owner's lineage of this channel meanwhile (the other side of a
        // partition, started later and so numbered higher): it gets a SNAPSHOT numbered above any
        // lineage started before now.
        if let member = members.index(forKey: user), has(members[valueAt: member], user, session) {
            let before = place(of: session)
            place(session, member: member, at: sink, withPresence: withPresence, version: max(before?.version ?? 0, version))
            let resumed = SessionVersion.epoch(before?.version ?? 0) < SessionVersion.epoch(version)
            if withPresence && (before?.withPresence != true || before?.sink != sink || resumed) {
                advanceSequence(to: Self.lineageFloor(now))
                snapshot(for: session, now: now, into: &outcome.deliveries)
            }
        } else {
            if resume, let d = departed[session], !d.byGateway {
                outcome.expired = true
                return outcome
            }
            if withPresence { advanceSequence(to: Self.lineageFloor(now)) }
            outcome.deliveries = join(user: user, session: session, withPresence: withPresence, sink: sink, version: version,
                                      pendingState: [], datingState: false, now: now)
        }
        guard let state, var m = members[user] else { return outcome }
        if stateVersion > m.stateVersion {
            // the owner lost the gateway's last change (it took over from a copy that missed it)
            let next = StateItems(state)
            m.stateVersion = stateVersion
            let changed = next != m.state
            m.state = next
            members[user] = m
            if changed { emit(.remoteStateChanged, user: user, except: nil, now: now, into: &outcome.deliveries) }
        } else if stateVersion < m.stateVersion {
            outcome.correction = (m.state.items, m.stateVersion)
        }
        return outcome
    }

    /// Where a session of this channel lives.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func sink(of session: SessionID) -> Sink? { placements[session].map { sinks[Int($0.sink)].sink } }

    /// Every place a session of this channel lives.
    public var allSinks: Set<Sink> { Set(sinks.lazy.filter { $0.sessions > 0 }.map(\.sink)) }

    /// `sink`'s entry, if a session lives there.
    private func sinkEntry(_ sink: Sink) -> UInt32? {
        guard let i = sinks.firstIndex(where: { $0.sessions > 0 && $0.sink == sink }) else { return nil }
        return UInt32(i)
    }

    /// Every session living at `sink`, with its user.
    public func sessions(at sink: Sink) -> [(user: String, session: SessionID)] {
        places(at: sink).map { ($0.place.user, $0.session) }.sorted { $0.1 < $1.1 }
    }

    /// Places `session` as a session of the member whose entry is at `member` in `members`. Its
    /// record of writes stays while its epoch does.
    /// A session already placed keeps its entry in `placements` (members name their first
    /// session by that entry's index); returns the index of the session's entry.
    @discardableResult
    private mutating func place(_ session: SessionID, member: Int, at sink: Sink, withPresence: Bool, version: UInt64) -> Int {
        let at = placements.index(forKey: session)
        let before = at.map { placements[valueAt: $0] }
        if let before { uncount(before) }
        let entry = interned(sink)
        var p = Placement(member: UInt32(member), sink: entry, version: version, withPresence: withPresence)
        if let before, SessionVersion.epoch(before.version) == SessionVersion.epoch(version) {
            p.written = before.written
            p.fence = before.fence
        }
        sinks[Int(entry)].sessions += 1
        if withPresence { sinks[Int(entry)].subscribers += 1 }
        if let at {
            placements[valueAt: at] = p
            return at
        }
        placements[session] = p
        return placements.count - 1
    }

    /// Removes a session's placement. `placements` moves its last entry into the hole: a member
    /// that named that entry as its first session's names the new index.
    private mutating func unplace(_ session: SessionID) {
        guard let (at, old) = placements.removeEntry(forKey: session) else { return }
        uncount(old)
        if at < placements.count {
            // (the entry now at `at` was the last, at `placements.count`)
            let last = placements.count
            let owner = Int(placements[valueAt: at].member)
            if owner < members.count, members[valueAt: owner].firstPlace == UInt32(last) {
                members[valueAt: owner].firstPlace = UInt32(at)
            }
        }
    }

    /// Takes a placement out of its sink's counts.
    private mutating func uncount(_ old: Placement) {
        // (an entry whose sessions all left is free for the next sink: `sinkEntry` skips it)
        sinks[Int(old.sink)].sessions -= 1
        if old.withPresence { sinks[Int(old.sink)].subscribers -= 1 }
    }

    /// `sink`'s entry in `sinks`, made (or a free one taken) if it has none.
    private mutating func interned(_ sink: Sink) -> UInt32 {
        if let i = sinkEntry(sink) { return i }
        if let free = sinks.firstIndex(where: { $0.sessions == 0 }) {
            sinks[free] = SinkEntry(sink: sink, sessions: 0, subscribers: 0)
            return UInt32(free)
        }
        sinks.append(SinkEntry(sink: sink, sessions: 0, subscribers: 0))
        return UInt32(sinks.count - 1)
    }

    /// A session leaves (`timedOut`: its resume window passed). The user's last session makes
    /// REMOTE_LEAVE (or REMOTE_TIMEOUT) and deletes the user's state here. `byGateway`: its gateway
    /// said so (else this owner timed out a session whose gateway is gone).
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func leave(user: String, session: SessionID, version: UInt64 = 0, timedOut: Bool = false,
                               byGateway: Bool = true, now: Int64) -> [Delivery] {
        // a gateway's leave from before the session's latest join here (found by Cluster/chaos: a
        // leave the gateway had given up on and retried elsewhere, delivered by TCP once a
        // partition healed) changes nothing: versions of a session only grow
        if byGateway, version != 0, let p = placements[session], version < p.version { return [] }
        guard let member = members.index(forKey: user), has(members[valueAt: member], user, session) else {
            // (a gateway's leave of a session this version does not hold — it joined in another
            // version of the channel, not merged here yet — is remembered all the same: that
            // version, merged later, must not bring the session back)
            if byGateway, placements[session] == nil, (departed[session]?.version ?? 0) < version {
                forgetOldDepartures(now: now)
                departed[session] = Departure(user: user, version: version, byGateway: true, at: now)
            }
            return []
        }
        forgetOldDepartures(now: now)
        departed[session] = Departure(user: user, version: max(placements[session]?.version ?? 0, version), byGateway: byGateway, at: now)
        let wasFirst = firstSession(members[valueAt: member]) == session
        unplace(session)
        if drop(session, wasFirst: wasFirst, fromMemberAt: member, user) { return [] }
        removeMember(user)
        var out: [Delivery] = []
        updateMode(now: now, into: &out)
        emit(timedOut ? .remoteTimeout : .remoteLeave, user: user, except: session, now: now, into: &out)
        return out
    }

    private mutating func forgetOldDepartures(now: Int64) {
        guard departed.count > 64 else { return }
        departed = departed.filter { now - $0.value.at < Self.departureMemory }
    }

    /// Times out every session living at `sink` (its gateway is gone and did not come back in time).
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func timeOut(sessionsAt sink: Sink, now: Int64) -> [Delivery] {
        var out: [Delivery] = []
        for (user, s) in sessions(at: sink) {
            out += leave(user: user, session: s, timedOut: true, byGateway: false, now: now)
        }
        return out
    }

    /// Merges state for a user whose `session` is in the channel. Throws STATE_KEY_LIMIT (and
    /// changes nothing) when the user would hold more than 32 keys.
    @_specialize(exported: true, where Sink == NodeInstance)
    /// `write` is the gateway's number for it, in the epoch of `version` (0: unnumbered), and
    /// `settled` the number at or below which every write of the session finished at its gateway:
    /// a delayed attempt of a write this owner learnt was settled, or carried out (or overtaken)
    /// elsewhere, changes nothing.
    public mutating func setState(user: String, session: SessionID, items: [StateItem], write: UInt32 = 0, settled: UInt32 = 0,
                                  version: UInt64 = 0, now: Int64) throws(PresenceError) -> [Delivery] {
        guard var m = members[user], has(m, user, session), admits(write, of: session, version: version) else { return [] }
        let after = m.state.countAfterMerging(items)
        guard after <= Limits.maxStateKeys else {
            throw PresenceError(.resourceExhausted, "STATE_KEY_LIMIT", "a user may hold at most \(Limits.maxStateKeys) state keys per channel; this call would make \(after)")
        }
        applied(write, settled: settled, of: session, version: version)
        guard m.state.merge(items) else { return [] }
        m.stateVersion = nextSequence()
        members[user] = m
        var out: [Delivery] = []
        emit(.remoteStateChanged, user: user, except: session, now: now, into: &out)
        return out
    }

    /// Removes state keys (all when `keys` is empty); `write` as for `setState`.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func removeState(user: String, session: SessionID, keys: [String], write: UInt32 = 0, settled: UInt32 = 0,
                                     version: UInt64 = 0, now: Int64) -> [Delivery] {
        guard var m = members[user], has(m, user, session), admits(write, of: session, version: version) else { return [] }
        applied(write, settled: settled, of: session, version: version)
        guard m.state.remove(keys) else { return [] }
        m.stateVersion = nextSequence()
        members[user] = m
        var out: [Delivery] = []
        emit(.remoteStateChanged, user: user, except: session, now: now, into: &out)
        return out
    }

    /// Whether a state write numbered `write` (stamped `version`) may act: not when its gateway
    /// said it was settled, or a copy from another owner showed this one or a later one carried out.
    private func admits(_ write: UInt32, of session: SessionID, version: UInt64) -> Bool {
        guard write != 0, let p = placements[session], p.fence != 0,
              SessionVersion.epoch(p.version) == SessionVersion.epoch(version) else { return true }
        return WriteNumber.isAfter(write, p.fence)
    }

    /// A write numbered `write` acted; its gateway had settled every write up to `settled`.
    private mutating func applied(_ write: UInt32, settled: UInt32, of session: SessionID, version: UInt64) {
        guard write != 0, var p = placements[session], SessionVersion.epoch(p.version) == SessionVersion.epoch(version) else { return }
        p.written = WriteNumber.latest(p.written, write)
        placements[session] = p
        // (a settled number is below its write's: `WriteNumber` compares them within reach)
        if WriteNumber.isAfter(write, settled) { fence(settled, of: session, version: version) }
    }

    /// The session's writes up to `settled` are done with (its gateway says so).
    private mutating func fence(_ settled: UInt32, of session: SessionID, version: UInt64) {
        guard settled != 0, var p = placements[session], SessionVersion.epoch(p.version) == SessionVersion.epoch(version) else { return }
        p.fence = WriteNumber.latest(p.fence, settled)
        placements[session] = p
    }

    /// Another owner's copy says the session's writes up to `write` were carried out there.
    private mutating func learnt(_ write: UInt32, of session: SessionID, version: UInt64) {
        guard write != 0, var p = placements[session], SessionVersion.epoch(p.version) == SessionVersion.epoch(version) else { return }
        p.written = WriteNumber.latest(p.written, write)
        p.fence = WriteNumber.latest(p.fence, write)
        placements[session] = p
    }

    /// Called every presence interval: in interval mode, the INTERVAL event with what happened since.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func tick(now: Int64) -> [Delivery] {
        guard mode == .interval else { return [] }
        var out: [Delivery] = []
        flushInterval(now: now, into: &out)
        return out
    }

    /// A fresh SNAPSHOT for one session (after events may have been lost), numbered above `floor`
    /// (the last sequence its gateway passed on).
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func resnapshot(for session: SessionID, floor: UInt64 = 0, now: Int64) -> Delivery? {
        guard placements[session]?.withPresence == true else { return nil }
        advanceSequence(to: floor)
        return snapshotDelivery(for: session, now: now)
    }

    /// A fresh SNAPSHOT for every subscriber (a new owner: events may have been lost on the way).
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func snapshotForAll(now: Int64) -> [Delivery] {
        subscribers.keys.sorted().map { snapshotDelivery(for: $0, now: now) }
    }

    /// A fresh SNAPSHOT for every subscriber living at `sink` (pushes to it may have been lost).
    public mutating func snapshotForAll(at sink: Sink, now: Int64) -> [Delivery] {
        guard let index = sinkEntry(sink), sinks[Int(index)].subscribers > 0 else { return [] }
        return placements.filter { $0.value.withPresence && $0.value.sink == index }.map(\.key).sorted().map { snapshotDelivery(for: $0, now: now) }
    }

    /// Makes `change` and routes the events it returns by the channel as it is after it: what
    /// every change that is routed at once goes through. (In `route(change())` Swift reads `self`
    /// for `route` before it runs the change, so the events were routed by the channel as it was
    /// before: a merge's SNAPSHOT for a session the other version brought found no place and was
    /// dropped, and its events missed gateways new in the merge — the keyspace simulation's
    /// finding 18.)
    @inlinable
    public mutating func routing(_ change: (inout Self) -> [Delivery]) -> [RoutedDelivery<Sink>] {
        let deliveries = change(&self)
        return route(deliveries)
    }

    /// Resolves deliveries to the sinks they go to (one per sink with subscribers for a channel
    /// event), at the machine's current placements: call it right after the change that made them.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func route(_ deliveries: [Delivery]) -> [RoutedDelivery<Sink>] {
        var out: [RoutedDelivery<Sink>] = []
        for d in deliveries {
            switch d.to {
            case .session(let id):
                guard let sink = sink(of: id) else { continue }
                out.append(RoutedDelivery(sink: sink, event: d.event, sessions: [id], except: nil))
            case .subscribers(let except):
                for e in sinks where e.subscribers > 0 {
                    out.append(RoutedDelivery(sink: e.sink, event: d.event, sessions: [], except: except))
                }
            }
        }
        return out
    }

    // MARK: Copies (replication and handoff)

    /// A user's whole record here; no sessions means the user is gone.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func copy(of user: String) -> MemberCopy<Sink> {
        guard let m = members[user] else { return MemberCopy(userID: user, sessions: [], state: []) }
        let sessions = self.sessions(m, user).compactMap { s in
            placements[s].map { p in
                MemberCopy<Sink>.Session(id: s, sink: sinks[Int(p.sink)].sink, withPresence: p.withPresence, version: p.version,
                                         written: WriteNumber.latest(p.written, p.fence))
            }
        }
        return MemberCopy(userID: user, sessions: sessions, state: m.state.items, stateVersion: m.stateVersion)
    }

    /// Every user's record, in id order.
    public var copies: [MemberCopy<Sink>] { order.map { copy(of: userID(atEntry: $0)) } }

    /// The channel's whole state as copies of at most `chunk` users each; the first is `full`
    /// (it replaces whatever the receiver held) and carries the departures.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func fullCopies(handoff: Bool = false, chunk: Int = 500) -> [ChannelCopy<Sink>] {
        let all = copies
        var out: [ChannelCopy<Sink>] = []
        var i = 0
        repeat {
            out.append(ChannelCopy(key: key, sequence: sequence, term: term, full: i == 0, handoff: handoff,
                                   members: Array(all[i..<min(all.count, i + chunk)]), departed: i == 0 ? departed : [:]))
            i += chunk
        } while i < all.count
        return out
    }

    /// The records of `users` for the replicas, with the departure of `left` (a session that just left).
    @_specialize(exported: true, where Sink == NodeInstance)
    public func delta(users: [String], left: SessionID? = nil) -> ChannelCopy<Sink> {
        var gone: [SessionID: Departure] = [:]
        if let left, let d = departed[left] { gone[left] = d }
        return ChannelCopy(key: key, sequence: sequence, term: term, full: false, handoff: false,
                           members: users.map { copy(of: $0) }, departed: gone)
    }

    /// Replaces a user's record with `copy`, silently (a replica applying its owner's change, or a
    /// new owner taking a channel over). Events were already sent by whoever made the change.
    public mutating func install(_ copy: MemberCopy<Sink>) {
        if let m = members[copy.userID] {
            for s in sessions(m, copy.userID) { unplace(s) }
        }
        // (a session the copy gives this user that another member holds here — only a faulty
        // sender's word does that — leaves that member first, silently: the copy is its owner's)
        for s in copy.sessions {
            if let p = placements[s.id] { _ = leave(user: userID(atEntry: p.member), session: s.id, byGateway: false, now: 0) }
        }
        if copy.sessions.isEmpty {
            removeMember(copy.userID)
        } else {
            // (its first session's index is set once its sessions are placed, below)
            let m = Member(state: StateItems(copy.state), stateVersion: copy.stateVersion, firstPlace: UInt32.max)
            if copy.sessions.count > 1 || moreSessions[copy.userID] != nil {
                moreSessions[copy.userID] = copy.sessions.count > 1 ? copy.sessions.dropFirst().map(\.id) : nil
            }
            let member: Int
            if let i = members.index(forKey: copy.userID) {
                members[valueAt: i] = m
                member = i
            } else {
                member = addMember(copy.userID, m)
            }
            for s in copy.sessions {
                let at = place(s.id, member: member, at: s.sink, withPresence: s.withPresence, version: s.version)
                if s.id == copy.sessions[0].id { members[valueAt: member].firstPlace = UInt32(at) }
                learnt(s.written, of: s.id, version: s.version)
                departed[s.id] = nil
            }
        }
        mode = occupancy > maxInstantEvents ? .interval : .realtime
    }

    /// Applies a copy silently (a replica following its owner): a full copy replaces everything.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func install(_ copy: ChannelCopy<Sink>) {
        if copy.full {
            let keep = (maxInstantEvents, sequence, term)
            self = ChannelMachine(key: key, maxInstantEvents: keep.0)
            sequence = keep.1
            term = keep.2
        }
        let sameLineage = copy.term == term
        if copy.full {
            fullCopyAt = copy.sequence
        } else if sameLineage, copy.sequence < fullCopyAt {
            return   // (older than the full copy installed since)
        }
        for m in copy.members {
            if !copy.full, sameLineage, let at = installedAt[m.userID], copy.sequence < at { continue }  // (older than what is here)
            installedAt[m.userID] = copy.sequence
            install(m)
        }
        for (id, d) in copy.departed where placements[id] == nil { departed[id] = d }
        term = max(term, copy.term)
        sequence = max(sequence, copy.sequence)
    }

    /// Merges another version of this channel into this one, as its owner (each side of a
    /// partition, or an owner that was wrongly thought dead and a replica that took over, kept
    /// one): a session is here if either version has it and the other did not see it leave later;
    /// each user's state is the one with the later version. Returns the joins, leaves and state
    /// changes that makes, as events, and SNAPSHOTs for subscribers that came with the other version.
    /// A timeout the other side decided is not applied to a session whose gateway this node
    /// `keepsSessionsOf` (live here, or gone for less than a presence timeout as counted here):
    /// that gateway, or this node's own count of its absence, says whether its session lives.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func merge(_ other: ChannelCopy<Sink>, keepsSessionsOf: (Sink) -> Bool = { _ in false }, now: Int64) -> [Delivery] {
        let (out, snapshots) = batched(now: now) { $0.mergeEach(other, keepsSessionsOf: keepsSessionsOf, now: now) }
        return snapshots + out
    }

    /// Carries out several changes as one (a merge, the facts of one anti-entropy exchange): a
    /// session owed a SNAPSHOT by one of them gets it once all are done, so it does not list the
    /// channel half-rebuilt and then see the rest join (a flap). The SNAPSHOTs come back apart, to
    /// be sent before the batch's events: numbered above them, they make the session's gateway
    /// drop those it already covers.
    public mutating func batched<R>(now: Int64, _ body: (inout Self) -> R) -> (result: R, snapshots: [Delivery]) {
        guard deferredSnapshots == nil else { return (body(&self), []) }  // already inside one
        deferredSnapshots = []
        let result = body(&self)
        let owed = deferredSnapshots ?? []
        deferredSnapshots = nil
        let snapshots = owed.filter { placements[$0]?.withPresence == true }.map { snapshotDelivery(for: $0, now: now) }
        return (result, snapshots)
    }

    private mutating func mergeEach(_ other: ChannelCopy<Sink>, keepsSessionsOf: (Sink) -> Bool, now: Int64) -> [Delivery] {
        var out: [Delivery] = []
        // the merged version follows both: numbered above either, so that a copy of the other
        // (still in flight from the owner that kept it), with only that side's members, cannot
        // pass for it at a replica and replace the merged whole there
        let top = max(sequence, other.sequence)
        sequence = top < .max ? top + 1 : top
        term = max(term, other.term)
        for c in other.members {
            for s in c.sessions {
                if let stored = placements[s.id] {
                    // the same session on both sides: the later placement wins, silently (the
                    // session stays its member's: ids of sessions are the user's own)
                    let p = place(stored)
                    if s.version > p.version {
                        place(s.id, member: Int(stored.member), at: s.sink, withPresence: s.withPresence, version: s.version)
                        if s.withPresence && (p.sink != s.sink || !p.withPresence) { snapshot(for: s.id, now: now, into: &out) }
                    }
                    learnt(s.written, of: s.id, version: s.version)
                    continue
                }
                // it left here after that — unless this version only timed it out and its gateway
                // is live (this side was cut off from that gateway: found by Cluster/chaos, seed 67)
                if let d = departed[s.id], d.version >= s.version, d.byGateway || !keepsSessionsOf(s.sink) { continue }
                out += join(user: c.userID, session: s.id, withPresence: s.withPresence, sink: s.sink, version: s.version,
                            pendingState: [], datingState: false, now: now)
                learnt(s.written, of: s.id, version: s.version)
            }
            guard var m = members[c.userID], c.stateVersion > m.stateVersion else { continue }
            let next = StateItems(c.state)
            let changed = next != m.state
            m.state = next
            m.stateVersion = c.stateVersion
            members[c.userID] = m
            if changed { emit(.remoteStateChanged, user: c.userID, except: nil, now: now, into: &out) }
        }
        // sessions the other version saw leave after the version this one holds (after its
        // sessions are placed: a user who left with one session and is back with another stays a
        // member throughout, with no LEAVE and JOIN for a presence that never ended)
        for (id, d) in other.departed {
            if let p = place(of: id), d.version >= p.version, d.byGateway || !keepsSessionsOf(p.sink) {
                out += leave(user: p.user, session: id, version: d.version, timedOut: !d.byGateway, byGateway: d.byGateway, now: now)
            } else if placements[id] == nil, departed[id].map({ $0.version < d.version }) ?? true {
                departed[id] = d
            }
        }
        return out
    }

    // MARK: Queries

    /// One page of users in id order, starting after `after`; `next` is the last id when more follow.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func page(after: String?, limit: Int = Limits.pageSize, includeState: Bool) -> (users: [UserState], next: String?) {
        var start = 0
        if let after {
            start = insertionIndex(for: after)
            if start < order.count, userID(atEntry: order[start]) == after { start += 1 }
        }
        let end = min(order.count, start + limit)
        guard start < end else { return ([], nil) }
        let users = order[start..<end].map { i in
            UserState(userID: userID(atEntry: i), states: includeState ? members[valueAt: Int(i)].state.items : [])
        }
        return (users, end < order.count ? userID(atEntry: order[end - 1]) : nil)
    }

    /// Sessions of a user here.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func sessions(of user: String) -> [SessionID] { members[user].map { sessions($0, user) } ?? [] }

    /// The first session of the member whose entry is `m` (nil only if its index went wrong).
    private func firstSession(_ m: Member) -> SessionID? {
        Int(m.firstPlace) < placements.count ? placements.key(at: Int(m.firstPlace)) : nil
    }

    /// Whether `session` is a session of `user`, whose entry is `m`.
    private func has(_ m: Member, _ user: String, _ session: SessionID) -> Bool {
        firstSession(m) == session || (!moreSessions.isEmpty && moreSessions[user]?.contains(session) == true)
    }

    /// The sessions of `user`, whose entry is `m`, its first one first.
    private func sessions(_ m: Member, _ user: String) -> [SessionID] {
        let first = firstSession(m).map { [$0] } ?? []
        guard !moreSessions.isEmpty, let more = moreSessions[user] else { return first }
        return first + more
    }

    /// Takes `session` (already unplaced; `wasFirst`: it was the user's first) from the sessions
    /// of `user`, whose entry is at `member`: the next one becomes the first. False, changing
    /// nothing, when the user has no other session (the member goes).
    private mutating func drop(_ session: SessionID, wasFirst: Bool, fromMemberAt member: Int, _ user: String) -> Bool {
        guard !moreSessions.isEmpty, var more = moreSessions[user] else { return false }
        if wasFirst {
            while !more.isEmpty {
                let next = more.removeFirst()
                if let at = placements.index(forKey: next) {
                    members[valueAt: member].firstPlace = UInt32(at)
                    moreSessions[user] = more.isEmpty ? nil : more
                    return true
                }
            }
            moreSessions[user] = nil
            return false
        }
        if let i = more.firstIndex(of: session) { more.remove(at: i) }
        moreSessions[user] = more.isEmpty ? nil : more
        return true
    }

    // MARK: Rules

    private func insertionIndex(for user: String) -> Int {
        var lo = 0, hi = order.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if userID(atEntry: order[mid]) < user { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// The user whose entry is at `entry` in `members` (as the paging order and placements name it).
    private func userID(atEntry entry: UInt32) -> String { members.key(at: Int(entry)) }

    /// Adds a user who is not a member (its entry goes last in `members`, its index into `order`);
    /// returns the index of its entry.
    @discardableResult
    private mutating func addMember(_ user: String, _ m: Member) -> Int {
        let at = insertionIndex(for: user)
        members[user] = m
        order.insert(UInt32(members.count - 1), at: at)
        return members.count - 1
    }

    /// Removes a member (whose sessions are no longer placed), if it is one. `members` moves its
    /// last entry into the removed one's place, so the order's index of that entry, and its
    /// sessions' placements, are changed to follow it (found while every index is still valid).
    private mutating func removeMember(_ user: String) {
        guard let i = members.index(forKey: user) else { return }
        let at = insertionIndex(for: user)
        let last = members.count - 1
        if i != last {
            order[insertionIndex(for: members.key(at: last))] = UInt32(i)
            for s in sessions(members[valueAt: last], members.key(at: last)) {
                guard let p = placements.index(forKey: s), placements[valueAt: p].member == UInt32(last) else { continue }
                placements[valueAt: p].member = UInt32(i)
            }
        }
        order.remove(at: at)
        members.removeValue(forKey: user)
        if !moreSessions.isEmpty { moreSessions[user] = nil }
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
        var e = PresenceEvent(type: type, channelType: key.type, channelName: key.name, publisher: user, timestampMs: now, sequence: nextSequence())
        if type == .remoteStateChanged { e.states = members[user]?.state.items ?? [] }
        out.append(Delivery(event: e, to: .subscribers(except: except)))
    }

    private mutating func flushInterval(now: Int64, into out: inout [Delivery]) {
        guard !batch.isEmpty else { return }
        let b = batch
        batch = IntervalBatch()
        let states = b.stateChanged.sorted().compactMap { id in
            members[id].map { UserState(userID: id, states: $0.state.items) }
        }
        let info = IntervalInfo(joinUserIDs: b.joins.sorted(), leaveUserIDs: b.leaves.sorted(),
                                timeoutUserIDs: b.timeouts.sorted(), userStates: states)
        let e = PresenceEvent(type: .interval, channelType: key.type, channelName: key.name, interval: info,
                              timestampMs: now, sequence: nextSequence())
        out.append(Delivery(event: e, to: .subscribers(except: nil)))
    }

    /// A SNAPSHOT for one session; it takes a sequence number of its own, so it is above every
    /// event the session received before it, wherever it received them.
    /// A SNAPSHOT for `session` now, or at the end of the batch this change is part of.
    private mutating func snapshot(for session: SessionID, now: Int64, into out: inout [Delivery]) {
        if deferredSnapshots != nil {
            if !deferredSnapshots!.contains(session) { deferredSnapshots!.append(session) }
            return
        }
        out.append(snapshotDelivery(for: session, now: now))
    }

    private mutating func snapshotDelivery(for session: SessionID, now: Int64) -> Delivery {
        let users = order.map { UserState(userID: userID(atEntry: $0), states: members[valueAt: Int($0)].state.items) }
        let e = PresenceEvent(type: .snapshot, channelType: key.type, channelName: key.name, snapshot: users,
                              timestampMs: now, sequence: nextSequence())
        return Delivery(event: e, to: .session(session))
    }
}

/// One user's record in a channel, as replicas and new owners receive it.
public struct MemberCopy<Sink: Hashable & Sendable>: Equatable, Sendable {
    public struct Session: Equatable, Sendable {
        public var id: SessionID
        public var sink: Sink
        public var withPresence: Bool
        public var version: UInt64
        /// The last state write of the session (`WriteNumber`) its sender applied or learnt.
        public var written: UInt32
        public init(id: SessionID, sink: Sink, withPresence: Bool, version: UInt64 = 0, written: UInt32 = 0) {
            self.id = id
            self.sink = sink
            self.withPresence = withPresence
            self.version = version
            self.written = written
        }
    }
    public var userID: String
    public var sessions: [Session]
    public var state: [StateItem]
    /// The channel counter value at the state's last change (0: never set).
    public var stateVersion: UInt64
    public init(userID: String, sessions: [Session], state: [StateItem], stateVersion: UInt64 = 0) {
        self.userID = userID
        self.sessions = sessions
        self.state = state
        self.stateVersion = stateVersion
    }
}

/// A channel's state (or the part of it that changed) for a replica or a new owner.
public struct ChannelCopy<Sink: Hashable & Sendable>: Equatable, Sendable {
    public var key: ChannelKey
    public var sequence: UInt64
    public var term: UInt64
    /// Every member is listed (users not listed are gone); else only the users that changed.
    public var full: Bool
    /// Sent by the owner giving the channel up (a ring change or a graceful leave).
    public var handoff: Bool
    public var members: [MemberCopy<Sink>]
    public var departed: [SessionID: ChannelMachine<Sink>.Departure]

    public init(key: ChannelKey, sequence: UInt64, term: UInt64, full: Bool, handoff: Bool,
                members: [MemberCopy<Sink>], departed: [SessionID: ChannelMachine<Sink>.Departure] = [:]) {
        self.key = key
        self.sequence = sequence
        self.term = term
        self.full = full
        self.handoff = handoff
        self.members = members
        self.departed = departed
    }
}

/// What happened in a channel since the last INTERVAL event. A join and a leave of the same user
/// within one interval cancel out: subscribers never knew of that visit.
struct IntervalBatch: Sendable {
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

