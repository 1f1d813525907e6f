import PresenceWire

/// One user's home record (API.md, "User-level status" and GetUserChannels): the user's sessions,
/// where each lives and at which version, the channels each is in (GetUserChannels is their union;
/// a session that moves to another gateway is resumed from this record), the status the user chose,
/// and who watches the user. A plain value; `Sink` is where a session lives (in the cluster: its
/// gateway's process).
///
/// The home is where a session's *epoch* is kept: `claim` (a resume, on any gateway) starts a new
/// one, so whatever the gateway it left still says about the session is recognisably older.
public struct HomeRecord<Sink: Hashable & Sendable>: Sendable, Equatable {
    /// One session of the user, as its home keeps it.
    public struct Session: Equatable, Sendable {
        public var sink: Sink
        /// The session's version (`SessionVersion`) as its gateway last stamped it.
        public var version: UInt64
        /// Channels joined, with `with_presence`.
        public var channels: [ChannelKey: Bool]
        /// Users this session watches.
        public var watching: [String]
        /// For channels the session left (the last `changesRemembered`), the version of their last
        /// change: a join or leave stamped earlier arrives late (a retransmission once a cut link
        /// heals) and changes nothing. Kept by this home only: copies do not carry it, and it takes
        /// no part in `==`.
        public var lastChange: [ChannelKey: UInt64] = [:]
        /// The last SetStatus and the last list of watched users this home took from the session,
        /// as `CallStamp`s (its epoch and its gateway's number): a call stamped at or below one
        /// arrives late (a first attempt retransmitted once a cut link heals, behind the call its
        /// client made next) and changes nothing. 0: none yet. The status stamp travels with
        /// copies and handoffs: a SetStatus delivered late to a node that is home again (it read
        /// the call after a freeze, while another home took the client's next one) must find it,
        /// or it puts the earlier status back under a new version that wins every merge. The
        /// watching stamp travels too: a Watch does not move the session's version, so of two
        /// copies of one version (each side of a partition kept one) the later list is told by
        /// its stamp alone.
        public var statusStamp: UInt64 = 0
        public var watchingStamp: UInt64 = 0

        public init(sink: Sink, version: UInt64 = 0, channels: [ChannelKey: Bool] = [:], watching: [String] = []) {
            self.sink = sink
            self.version = version
            self.channels = channels
            self.watching = watching
        }

        public static func == (a: Session, b: Session) -> Bool {
            a.sink == b.sink && a.version == b.version && a.channels == b.channels && a.watching == b.watching
        }

        /// This session with what `known` (the home's own record of it) remembers of the calls it
        /// took: a gateway's record does not carry it, a copy only its call stamps.
        func keepingWhatIsRemembered(of known: Session) -> Session {
            var s = self
            s.lastChange = known.lastChange
            s.statusStamp = CallStamp.later(s.statusStamp, known.statusStamp)
            s.watchingStamp = CallStamp.later(s.watchingStamp, known.watchingStamp)
            return s
        }

        /// This session with the list of watched users of `other` (a copy of the same version)
        /// when that list is the later one by its stamp.
        func takingTheLaterWatchingList(of other: Session) -> Session {
            guard other.watchingStamp != 0, CallStamp.later(watchingStamp, other.watchingStamp) != watchingStamp else { return self }
            var s = self
            s.watching = other.watching
            s.watchingStamp = other.watchingStamp
            return s
        }

        /// How many channels' last changes a session remembers (the oldest is forgotten first).
        public static var changesRemembered: Int { 16 }

        /// Whether a join or leave of `channel` stamped `version` comes from before the channel's
        /// last change (a message that arrived late).
        func isOlderThanLastChange(of channel: ChannelKey, _ version: UInt64) -> Bool {
            guard let last = lastChange[channel] else { return false }
            return version < last
        }

        /// Remembers a change of `channel` at `version`: always for a leave, and for a join of a
        /// channel already remembered (a repeat of the leave must not undo it).
        mutating func remember(_ channel: ChannelKey, at version: UInt64, leave: Bool) {
            guard leave || lastChange[channel] != nil else { return }
            lastChange[channel] = max(lastChange[channel] ?? 0, version)
            if lastChange.count > Self.changesRemembered, let oldest = lastChange.min(by: { $0.value < $1.value })?.key {
                lastChange[oldest] = nil
            }
        }
    }

    /// A session watching this user.
    public struct Watcher: Equatable, Sendable {
        public var sink: Sink
        public var version: UInt64
        /// The number of the Watch call that added it (its gateway's count for the session's
        /// Watch calls; 0: unnumbered, as an announce or a restore): within an epoch it orders the
        /// watch against an unwatch.
        public var write: UInt32
        public init(sink: Sink, version: UInt64 = 0, write: UInt32 = 0) {
            self.sink = sink
            self.version = version
            self.write = write
        }
    }

    /// A session that ended: its version then, and whether its gateway said so.
    public struct Departure: Equatable, Sendable {
        public var version: UInt64
        public var byGateway: Bool
        public var at: Int64
        public init(version: UInt64, byGateway: Bool, at: Int64) {
            self.version = version
            self.byGateway = byGateway
            self.at = at
        }
    }

    /// A call of a session its home orders (SetStatus, Watch): the session's epoch in the high 32
    /// bits, the gateway's number for the call (`WriteNumber`, counted per session) in the low 32.
    /// A later epoch's call always comes later (its gateway numbers afresh: a merge or announce
    /// that brings a claim this home missed must not hold the new gateway to the old one's
    /// numbers; found in review); within an epoch, the numbers decide.
    public enum CallStamp {
        public static func make(version: UInt64, write: UInt32) -> UInt64 { SessionVersion.epoch(version) << 32 | UInt64(write) }

        /// Whether a call stamped `version` and numbered `write` comes after the one `last` stamps
        /// (unnumbered calls, from a peer that does not number them, count as they arrive).
        public static func isLater(version: UInt64, write: UInt32, than last: UInt64) -> Bool {
            guard write != 0, last != 0 else { return true }
            return isAfter(make(version: version, write: write), last)
        }

        /// The later of two stamps (0: none).
        public static func later(_ a: UInt64, _ b: UInt64) -> UInt64 {
            guard a != 0, b != 0 else { return a == 0 ? b : a }
            return isAfter(b, a) ? b : a
        }

        /// Whether stamp `a` comes after stamp `b` (both numbered): a later epoch, or the same
        /// epoch and a later write number.
        static func isAfter(_ a: UInt64, _ b: UInt64) -> Bool {
            a >> 32 != b >> 32 ? a >> 32 > b >> 32 : WriteNumber.isAfter(UInt32(truncatingIfNeeded: a), UInt32(truncatingIfNeeded: b))
        }
    }

    /// A change of the user's visible status, for its watchers, read at `version` of the record
    /// (`counterValue`: it only grows, home after home; a gateway gives a session no status read
    /// at a lower version than one it gave it: `StatusOrder`).
    public struct StatusChange: Equatable, Sendable {
        public let userID: String
        public let status: UserStatus
        public let watchers: [SessionID: Sink]
        public var version: UInt64 = 0
    }

    public let userID: String
    /// Where this home's lineage of versions started (a new home starts above the previous one).
    public private(set) var term: UInt64 = 0
    public private(set) var chosen: UserStatus = .online
    /// The counter value of the last SetStatus (merges keep the later choice).
    public private(set) var chosenVersion: UInt64 = 0
    public private(set) var everOpened = false
    /// (A `DenseDictionary`: a user has a few sessions, mostly one, and a `Dictionary` of one entry
    /// took twice the storage of a small array: 100 bytes a user.)
    public private(set) var sessions: DenseDictionary<SessionID, Session> = [:]
    public private(set) var watchers: [SessionID: Watcher] = [:]
    public private(set) var departed: [SessionID: Departure] = [:]
    private var counter: UInt64 = 0
    /// The last unwatches this home took, with the epoch and the Watch call's number of each
    /// (`unwatch(by:at:version:write:)`), oldest first. Copies carry them: a replica that takes the record over (a handoff merged
    /// into a copy it kept from before) must not keep or take back a watcher one of them removed.
    private var unwatched: [Unwatch] = []
    private struct Unwatch: Equatable, Sendable {
        let session: SessionID
        let epoch: UInt64
        let write: UInt32

        /// Whether this unwatch came after a watch at `version` numbered `write`: a later epoch,
        /// or the same one and a later call (both numbered).
        func isAfter(version: UInt64, write w: UInt32) -> Bool {
            let e = SessionVersion.epoch(version)
            if epoch != e { return epoch > e }
            guard write != 0, w != 0 else { return false }
            return CallStamp.isAfter(CallStamp.make(version: version, write: write), CallStamp.make(version: version, write: w))
        }
    }
    /// The lowest epoch a claim under this home's lineage gives a session (`startLineage`). Kept
    /// by this node only: a copy's receiver that takes the record over starts its own lineage.
    private var claimFloor: UInt64 = 0
    /// The last status an open set, while it stands: taken back if the session's gateway says it
    /// never opened the session (`sessionNeverOpened`). Kept by this node only.
    private var setByOpen: StatusSetByOpen?
    private struct StatusSetByOpen: Equatable, Sendable {
        let session: SessionID
        /// The status the user would have had without that open.
        let before: UserStatus
        /// `chosenVersion` as the open left it: a later choice stands whatever the open was.
        let version: UInt64
    }

    public init(userID: String) {
        self.userID = userID
    }

    /// A record as a copy carries it (replication and handoff).
    public init(userID: String, term: UInt64, chosen: UserStatus, chosenVersion: UInt64, everOpened: Bool,
                sessions: DenseDictionary<SessionID, Session>, watchers: [SessionID: Watcher], departed: [SessionID: Departure], counter: UInt64,
                unwatched: [(session: SessionID, epoch: UInt64, write: UInt32)] = []) {
        self.userID = userID
        // (a peer's list past the bound keeps its last entries, as this home would have)
        self.unwatched = unwatched.suffix(Self.unwatchesRemembered).map { Unwatch(session: $0.session, epoch: $0.epoch, write: $0.write) }
        self.term = term
        self.chosen = chosen
        self.chosenVersion = chosenVersion
        self.everOpened = everOpened
        self.sessions = sessions
        self.watchers = watchers
        self.departed = departed
        self.counter = counter
    }

    /// The last unwatches, oldest first, with the epoch and number of each (copies carry them).
    public var unwatches: [(session: SessionID, epoch: UInt64, write: UInt32)] { unwatched.map { ($0.session, $0.epoch, $0.write) } }

    /// The counter versions are drawn from (copies carry it).
    public var counterValue: UInt64 { counter }

    /// Nothing worth keeping: never opened a session, watched by nobody.
    public var isEmpty: Bool { !everOpened && sessions.isEmpty && watchers.isEmpty }

    /// UNKNOWN if the user never opened a session; its chosen status while it has a session (OFFLINE
    /// when it chose to be invisible); OFFLINE once it has none.
    public var visibleStatus: UserStatus {
        guard everOpened else { return .unknown }
        return sessions.isEmpty ? .offline : chosen
    }

    private mutating func change(_ body: (inout HomeRecord) -> Void) -> StatusChange? {
        let before = visibleStatus
        body(&self)
        revised()
        let after = visibleStatus
        guard before != after else { return nil }
        return StatusChange(userID: userID, status: after, watchers: watchers.mapValues(\.sink), version: counter)
    }

    /// Every change takes the counter up, so the counter orders the record's copies: a replica can
    /// tell an older whole copy that arrives late (a delayed push) from a newer one and skip it
    /// (found by Cluster/chaos, netns seed 52: a copy from before a session opened arrived after
    /// the one that had it, and the replica that then took over had lost the session).
    private mutating func revised() { _ = nextVersion() }

    private mutating func nextVersion() -> UInt64 {
        if counter < .max { counter += 1 }
        return counter
    }

    /// Starts a new lineage of versions (a new home): above what the previous home can have
    /// issued since its last copy (2^32 of margin) and above the wall clock (ms times 2^22).
    public mutating func startLineage(now: Int64) {
        let (fromCopy, overflow) = max(counter, term).addingReportingOverflow(1 << 32)
        let ms = UInt64(clamping: max(0, min(now, 1 << 41)))
        term = max(overflow ? .max : fromCopy, ms << 22)
        counter = max(counter, term)
        // A previous home cut off from the others may still have claimed sessions that never
        // reached its replicas (a resume refused there, its client gone elsewhere). A claim here
        // must not reuse the epoch of such a claim for another gateway: merged after the heal, the
        // two would tie, and the record might keep the gateway the client left. So this lineage's
        // claims start `claimEpochMargin` epochs above every epoch the copy knows.
        let known = sessions.values.map(\.version) + departed.values.map(\.version) + watchers.values.map(\.version)
        let highest = known.map(SessionVersion.epoch).max() ?? 0
        claimFloor = max(claimFloor, min(highest + Self.claimEpochMargin, 0xffff_ffff))
    }

    /// How many claims of one session a cut-off home could make unseen (each is a resume that
    /// its lease let it take, about one a retry pause for under a second), with room to spare.
    /// Epochs are 32 bits: four million lineages of one session.
    static var claimEpochMargin: UInt64 { 1 << 10 }

    // MARK: Versions

    // (What a home shard calls on every call is pre-specialised for the node's sink, as in
    // ChannelMachine: generic code called across modules looked metadata up for each table access.)

    /// The version that supersedes a call stamped `version` for `session` (it moved on under a
    /// later epoch), or nil when the call may act.
    @_specialize(exported: true, where Sink == NodeInstance)
    public func supersedingVersion(of session: SessionID, _ version: UInt64) -> UInt64? {
        if let s = sessions[session], SessionVersion.epoch(s.version) > SessionVersion.epoch(version) { return s.version }
        if let d = departed[session], SessionVersion.epoch(d.version) > SessionVersion.epoch(version) { return d.version }
        return nil
    }

    /// Whether the session's gateway ended it at `version` or later (a message from before that).
    @_specialize(exported: true, where Sink == NodeInstance)
    public func endedAfter(_ session: SessionID, _ version: UInt64) -> Bool {
        guard let d = departed[session], d.byGateway else { return false }
        return d.version >= version
    }

    // MARK: Sessions

    /// A session opened (or resumed) at `sink`. `initial` UNKNOWN keeps the user's status (ONLINE if
    /// it had no session). An open this record knows to be late — the session is here at a later
    /// version, or already took a SetStatus (the first attempt of an open, read by a node after a
    /// freeze while another home served the session) — sets no status: the client's later word stands.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func sessionOpened(session: SessionID, sink: Sink, version: UInt64 = 0, initial: UserStatus) -> StatusChange? {
        let late = sessions[session].map { $0.version > version || $0.statusStamp != 0 } ?? false
        return change { r in
            if r.sessions.isEmpty { r.chosen = .online }
            r.everOpened = true
            r.departed[session] = nil
            if var s = r.sessions[session] {
                s.sink = sink
                s.version = max(s.version, version)
                r.sessions[session] = s
            } else {
                r.sessions[session] = Session(sink: sink, version: version)
            }
            if initial != .unknown && !late {
                let before = r.chosen
                r.chosen = initial
                r.chosenVersion = r.nextVersion()
                r.setByOpen = StatusSetByOpen(session: session, before: before, version: r.chosenVersion)
            }
        }
    }

    /// The session's gateway never opened it: it gave up on the open before its client heard of
    /// it, and the open reached this home all the same (a first attempt delivered late, once a cut
    /// link healed). The session goes, and the status its open set, if no choice came since, is
    /// taken back: the client's word is what it said after that, on the session it did open.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func sessionNeverOpened(session: SessionID, at sink: Sink, now: Int64 = 0) -> StatusChange? {
        guard let s = sessions[session], s.sink == sink else { return nil }
        let taken = setByOpen.flatMap { $0.session == session && $0.version == chosenVersion ? $0.before : nil }
        forgetOldDepartures(now: now)
        departed[session] = Departure(version: s.version, byGateway: true, at: now)
        return change { r in
            r.sessions[session] = nil
            if let taken {
                r.chosen = taken
                r.chosenVersion = r.nextVersion()
                r.setByOpen = nil
            }
        }
    }

    /// A gateway takes the session over (its client resumed it there): a new epoch starts, and the
    /// session's record is returned with the sink it had. Nil when the session is unknown here.
    public mutating func claim(session: SessionID, sink: Sink) -> (record: Session, previous: Sink)? {
        guard var s = sessions[session] else { return nil }
        let previous = s.sink
        s.version = max(SessionVersion.nextEpoch(s.version), SessionVersion.make(epoch: claimFloor, counter: 0))
        s.sink = sink
        // (every message of the old epoch is refused by its epoch from now on)
        s.lastChange = [:]
        sessions[session] = s
        revised()
        return (s, previous)
    }

    /// What an announce did: a status change, or `superseded` when this home knows a later epoch
    /// of the session than the announcing gateway.
    public struct AnnounceOutcome: Equatable, Sendable {
        public var change: StatusChange? = nil
        public var superseded: UInt64? = nil
    }

    /// Anti-entropy: the gateway at `sink` holds the session with this record. A known session
    /// takes it (unless this home knows a later epoch); an unknown one is added (unless its gateway
    /// ended it after that). Keeps the chosen status.
    public mutating func announce(session: SessionID, record: Session) -> AnnounceOutcome {
        var outcome = AnnounceOutcome()
        if let newer = supersedingVersion(of: session, record.version) {
            outcome.superseded = newer
            return outcome
        }
        if endedAfter(session, record.version) { return outcome }
        if let s = sessions[session], s.version > record.version, s.sink == record.sink { return outcome }
        outcome.change = change { r in
            if r.sessions.isEmpty && !r.everOpened { r.chosen = .online }
            r.everOpened = true
            r.departed[session] = nil
            // (the gateway's record is the newer word; what is remembered of changes still refuses
            // messages from before them)
            r.sessions[session] = r.sessions[session].map { record.keepingWhatIsRemembered(of: $0) } ?? record
        }
        return outcome
    }

    /// A session ended (closed or timed out) at `version`; `byGateway`: its gateway said so (else
    /// this home timed out a session whose gateway is gone).
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func sessionEnded(session: SessionID, version: UInt64 = .max, byGateway: Bool = true, now: Int64 = 0) -> StatusChange? {
        guard let s = sessions[session] else { return nil }
        forgetOldDepartures(now: now)
        departed[session] = Departure(version: byGateway ? max(s.version, version) : s.version, byGateway: byGateway, at: now)
        return change { r in r.sessions[session] = nil }
    }

    private mutating func forgetOldDepartures(now: Int64) {
        guard departed.count > 16 else { return }
        departed = departed.filter { now - $0.value.at < 120_000 }
    }

    /// SetStatus: ONLINE, AWAY, BUSY or OFFLINE (invisible), by `session` (its gateway numbered the
    /// call `write`, and stamped it with the session's `version`). A call numbered at or below the
    /// session's last SetStatus here, or from a session its gateway ended since, arrived late and
    /// changes nothing (nil is returned either way: the client's later word stands).
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func setStatus(_ status: UserStatus, by session: SessionID? = nil, version: UInt64 = 0, write: UInt32 = 0) -> StatusChange? {
        if let session, write != 0 {
            // (found by review after Cluster/chaos netns seed 106: a SetStatus's first attempt,
            // retransmitted once a cut link healed, arrived behind the SetStatus its client made
            // next and put the earlier status back)
            if let i = sessions.index(forKey: session) {
                guard CallStamp.isLater(version: version, write: write, than: sessions[valueAt: i].statusStamp) else { return nil }
                sessions[valueAt: i].statusStamp = CallStamp.make(version: version, write: write)
            } else if endedAfter(session, version) {
                return nil
            }
        }
        return change { r in
            r.chosen = status
            r.chosenVersion = r.nextVersion()
        }
    }

    /// Applies `change` to a known session where it lies (a copy written back would copy its
    /// channels whole on every call) and raises its version to `version`.
    private mutating func changeSession(_ session: SessionID, version: UInt64, _ change: (inout Session) -> Void) {
        guard let i = sessions.index(forKey: session) else { return }
        change(&sessions[valueAt: i])
        sessions[valueAt: i].version = max(sessions[valueAt: i].version, version)
        revised()
    }

    /// The session joined a channel (its gateway stamped the join `version`).
    /// The session's gateway says it joined `channel`. Returns the later version this home knows
    /// when that gateway was superseded (its client resumed the session elsewhere): nothing changes,
    /// and the gateway must not acknowledge the join — the new gateway started from this record.
    @discardableResult
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func sessionJoined(session: SessionID, channel: ChannelKey, withPresence: Bool, version: UInt64 = 0) -> UInt64? {
        if let newer = supersedingVersion(of: session, version) { return newer }
        // (a join from before the session last left this channel: found by Cluster/chaos, netns
        // seed 106, a join's first attempt retransmitted after a 6 s link cut healed, behind the
        // leave its client made meanwhile; the record kept the channel, and a resume elsewhere
        // announced the session in it again)
        if sessions[session]?.isOlderThanLastChange(of: channel, version) == true { return nil }
        changeSession(session, version: version) { s in
            s.channels[channel] = withPresence
            s.remember(channel, at: version, leave: false)
        }
        return nil
    }

    /// The session's gateway says it left `channel`; a superseded gateway's word changes nothing
    /// (the later version is returned, as for `sessionJoined`).
    @discardableResult
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func sessionLeft(session: SessionID, channel: ChannelKey, version: UInt64 = 0) -> UInt64? {
        if let newer = supersedingVersion(of: session, version) { return newer }
        if sessions[session]?.isOlderThanLastChange(of: channel, version) == true { return nil }
        changeSession(session, version: version) { s in
            s.channels[channel] = nil
            s.remember(channel, at: version, leave: true)
        }
        return nil
    }

    /// The users the session watches, as its gateway says; the same rule for a superseded gateway.
    /// A list numbered (`write`) at or below the last one taken from the session arrived late and
    /// changes nothing.
    @discardableResult
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func sessionWatching(session: SessionID, watching: [String], version: UInt64 = 0, write: UInt32 = 0) -> UInt64? {
        if let newer = supersedingVersion(of: session, version) { return newer }
        guard let i = sessions.index(forKey: session),
              CallStamp.isLater(version: version, write: write, than: sessions[valueAt: i].watchingStamp) else { return nil }
        sessions[valueAt: i].watching = watching
        if write != 0 { sessions[valueAt: i].watchingStamp = CallStamp.make(version: version, write: write) }
        revised()
        return nil
    }

    /// Channels the user is in (through any of its sessions), sorted.
    public var channels: [ChannelKey] {
        var all = Set<ChannelKey>()
        for s in sessions.values { all.formUnion(s.channels.keys) }
        return all.sorted()
    }

    // MARK: Watchers

    /// Adds (or moves) a watcher. Returns the user's visible status for the watcher when it moved
    /// here from another sink (its new gateway may have missed changes: it is told the current one).
    @discardableResult
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func watch(by session: SessionID, sink: Sink, version: UInt64 = 0, write: UInt32 = 0) -> StatusChange? {
        if let w = watchers[session], SessionVersion.epoch(w.version) > SessionVersion.epoch(version) { return nil }
        if isUnwatchedLater(session, than: version, write: write) { return nil }
        let before = watchers[session]
        watchers[session] = Watcher(sink: sink, version: max(before?.version ?? 0, version), write: write != 0 ? write : before?.write ?? 0)
        revised()
        guard let before, before.sink != sink else { return nil }
        return StatusChange(userID: userID, status: visibleStatus, watchers: [session: sink], version: counter)
    }

    /// A watcher a gateway's anti-entropy facts list and this home lacked (or placed elsewhere):
    /// taken as `watch` takes it, and told the user's visible status — while the home lacked it,
    /// it missed whatever changed.
    @_specialize(exported: true, where Sink == NodeInstance)
    public mutating func restoreWatcher(by session: SessionID, sink: Sink, version: UInt64) -> StatusChange? {
        let had = watchers[session] != nil
        let moved = watch(by: session, sink: sink, version: version)
        guard moved == nil, !had, let w = watchers[session], everOpened else { return moved }
        return StatusChange(userID: userID, status: visibleStatus, watchers: [session: w.sink], version: counter)
    }

    /// The user's visible status for every watcher (`at`: only those living at these sinks), for
    /// watchers that may have missed changes.
    public func currentStatus(at: ((Sink) -> Bool)? = nil) -> StatusChange? {
        let to = at.map { f in watchers.filter { f($0.value.sink) } } ?? watchers
        guard !to.isEmpty, everOpened else { return nil }
        return StatusChange(userID: userID, status: visibleStatus, watchers: to.mapValues(\.sink), version: counter)
    }

    /// Removes a watcher; with `sink`, only if it still lives there (it may have moved on).
    public mutating func unwatch(by session: SessionID, at sink: Sink? = nil) {
        guard let w = watchers[session], sink == nil || w.sink == sink else { return }
        watchers[session] = nil
        revised()
    }

    /// The session's gateway says, at `version`, that the session stops watching this user. The
    /// epoch is remembered: a gateway the session left may still list the watcher in its
    /// anti-entropy facts (it learns of the move later), and must not put it back under the older
    /// epoch — the watcher would sit at a gateway that no longer has the session, and be asked
    /// about there every round. The Watch call's number (`write`) orders it within the epoch: a
    /// copy that kept the watcher from an earlier call of that epoch does not bring it back in a
    /// merge. A watch of a later call or epoch (the client watching again), or unnumbered of the
    /// same epoch, is taken.
    public mutating func unwatch(by session: SessionID, at sink: Sink, version: UInt64, write: UInt32 = 0) {
        let epoch = SessionVersion.epoch(version)
        if let w = watchers[session], w.sink == sink || SessionVersion.epoch(w.version) < epoch {
            watchers[session] = nil
            revised()
        }
        remember(Unwatch(session: session, epoch: epoch, write: write))
    }

    /// Keeps an unwatch (the later of a session's two), forgetting the oldest past the bound.
    private mutating func remember(_ u: Unwatch) {
        if let i = unwatched.firstIndex(where: { $0.session == u.session }) {
            guard u.isAfter(version: SessionVersion.make(epoch: unwatched[i].epoch, counter: 0), write: unwatched[i].write) else { return }
            unwatched.remove(at: i)
        }
        unwatched.append(u)
        if unwatched.count > Self.unwatchesRemembered { unwatched.removeFirst(unwatched.count - Self.unwatchesRemembered) }
    }

    /// Whether the session's gateway unwatched this user after a watch at `version` numbered
    /// `write` (`Unwatch.isAfter`).
    private func isUnwatchedLater(_ session: SessionID, than version: UInt64, write: UInt32) -> Bool {
        unwatched.contains { $0.session == session && $0.isAfter(version: version, write: write) }
    }

    /// How many unwatches a record remembers (the oldest is forgotten first): a gateway's stale
    /// word comes within seconds of the move, and a user has few watchers leaving at once.
    static var unwatchesRemembered: Int { 64 }

    // MARK: Gateways gone

    /// Every sink a session or watcher of this user lives at.
    public var allSinks: Set<Sink> { Set(sessions.values.map(\.sink)).union(watchers.values.map(\.sink)) }

    /// Ends the sessions and drops the watchers living at `sink` (its gateway is gone).
    public mutating func timeOut(at sink: Sink, now: Int64) -> StatusChange? {
        forgetOldDepartures(now: now)
        return change { r in
            r.watchers = r.watchers.filter { $0.value.sink != sink }
            for (id, s) in r.sessions where s.sink == sink {
                r.departed[id] = Departure(version: s.version, byGateway: false, at: now)
                r.sessions[id] = nil
            }
        }
    }

    // MARK: Copies

    /// Replaces this record with another (a replica following its home), keeping the higher term.
    public mutating func install(_ other: HomeRecord) {
        let term = max(self.term, other.term), counter = max(self.counter, other.counter)
        self = other
        self.term = term
        self.counter = counter
    }

    /// Merges another version of this record (each side of a partition kept one): a session is
    /// here if either version has it and the other did not see it end later (the later version of
    /// a session wins); watchers likewise; the later status choice wins. Returns the visible change.
    /// A timeout the other side decided is not applied to a session whose gateway this node
    /// `keepsSessionsOf` (live here, or gone for less than a presence timeout as counted here).
    public mutating func merge(_ other: HomeRecord, keepsSessionsOf: (Sink) -> Bool = { _ in false }) -> StatusChange? {
        change { r in
            r.term = max(r.term, other.term)
            r.counter = max(r.counter, other.counter)
            r.claimFloor = max(r.claimFloor, other.claimFloor)
            r.everOpened = r.everOpened || other.everOpened
            if other.chosenVersion > r.chosenVersion {
                r.chosen = other.chosen
                r.chosenVersion = other.chosenVersion
            }
            for (id, d) in other.departed {
                if let s = r.sessions[id], d.version >= s.version, d.byGateway || !keepsSessionsOf(s.sink) {
                    r.sessions[id] = nil
                    r.departed[id] = d
                } else if r.sessions[id] == nil, r.departed[id].map({ $0.version < d.version }) ?? true {
                    r.departed[id] = d
                }
            }
            for (id, s) in other.sessions {
                if var mine = r.sessions[id] {
                    if s.version > mine.version {
                        // (a copy does not carry all this home remembers of the session's calls)
                        r.sessions[id] = s.keepingWhatIsRemembered(of: mine)
                    } else {
                        let stamp = CallStamp.later(mine.statusStamp, s.statusStamp)
                        if stamp != mine.statusStamp {
                            mine.statusStamp = stamp
                            r.sessions[id] = mine
                        }
                        // (a Watch taken by the other side while this one was cut off: the
                        // version is the same, the list is not)
                        if s.version == mine.version { r.sessions[id] = mine.takingTheLaterWatchingList(of: s) }
                    }
                } else if !(r.departed[id].map { $0.version >= s.version && ($0.byGateway || !keepsSessionsOf(s.sink)) } ?? false) {
                    // (a timeout this record decided while cut off from a gateway that is live
                    // does not keep the session out: found by Cluster/chaos, netns seed 67)
                    r.sessions[id] = s
                    r.departed[id] = nil
                }
            }
            // (an unwatch either side took removes the watcher the other side still has from an
            // earlier epoch: a watch is never added back by a merge after its session dropped it)
            for u in other.unwatched { r.remember(u) }
            for (id, w) in r.watchers where r.isUnwatchedLater(id, than: w.version, write: w.write) { r.watchers[id] = nil }
            // (the later epoch wins: a stale side lists the watcher at the gateway its session left)
            for (id, w) in other.watchers where !r.isUnwatchedLater(id, than: w.version, write: w.write) {
                if let mine = r.watchers[id], SessionVersion.epoch(mine.version) >= SessionVersion.epoch(w.version) { continue }
                r.watchers[id] = w
            }
        }
    }
}
