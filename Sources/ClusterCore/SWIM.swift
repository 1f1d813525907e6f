import Foundation
import PresenceCore

/// SWIM membership with Lifeguard's suspicion and local health (ARCHITECTURE.md, "Membership"),
/// as a plain value: inputs are messages, timer firings and clock readings; outputs are
/// `SWIM.Directive`s that a thin shell carries out (send, schedule a timer, report a change).
public enum SWIM {
    /// A member's state. Incarnations order what is said about one member (see `supersedes`).
    public enum Status: Sendable, Hashable, CustomStringConvertible {
        case alive
        case suspect
        case dead
        /// Left gracefully: like dead, but said by the member itself.
        case left

        public var description: String {
            switch self {
            case .alive: "alive"
            case .suspect: "suspect"
            case .dead: "dead"
            case .left: "left"
            }
        }
    }

    /// What one node says about one member; gossiped on every probe message.
    public struct Update: Sendable, Hashable {
        public var id: String
        public var address: String
        public var status: Status
        public var incarnation: UInt64
        /// The member's process instance: drawn afresh at every start (RELIABILITY.md, "Every
        /// process start is a new member incarnation"), so a restart is told apart from the
        /// process before it however fast it happens, and whatever was last believed of that one.
        public var boot: UInt64
        /// For a suspicion: the member whose own probe failed ("" when not known). Lifeguard
        /// shortens a suspicion for each other member that suspects independently; one that only
        /// passes a suspicion on (or echoes it back to its accuser) confirms nothing.
        public var accuser: String

        public init(id: String, address: String, status: Status, incarnation: UInt64, boot: UInt64 = 0, accuser: String = "") {
            self.id = id
            self.address = address
            self.status = status
            self.incarnation = incarnation
            self.boot = boot
            self.accuser = accuser
        }

        /// Who vouches for this suspicion: its accuser, or (from a node that does not name one)
        /// the member that sent it.
        func witness(sentBy from: String?) -> String? { accuser.isEmpty ? from : accuser }

        /// The SWIM precedence rules: does `self` override `old` (about the same member)?
        /// A later boot beats anything said of an earlier one (a restarted member is admitted
        /// whether it was last known alive, suspect, dead or left), and nothing said of an earlier
        /// boot counts once a later one is known. Within one boot: alive beats alive/suspect only
        /// with a higher incarnation; suspect beats alive at an equal or higher incarnation and
        /// suspect at a higher one; dead/left beat everything at an equal or higher incarnation.
        public func supersedes(_ old: Update) -> Bool {
            if boot != old.boot { return boot > old.boot }
            switch (status, old.status) {
            case (.alive, .alive), (.alive, .suspect): return incarnation > old.incarnation
            case (.alive, .dead), (.alive, .left): return incarnation > old.incarnation
            case (.suspect, .alive): return incarnation >= old.incarnation
            case (.suspect, .suspect): return incarnation > old.incarnation
            case (.suspect, .dead), (.suspect, .left): return false
            case (.dead, .alive), (.dead, .suspect), (.left, .alive), (.left, .suspect): return incarnation >= old.incarnation
            case (.dead, .dead), (.dead, .left), (.left, .dead), (.left, .left): return incarnation > old.incarnation
            }
        }
    }

    public struct Settings: Sendable {
        /// The protocol period: one probe per period.
        public var probeInterval: UInt64 = 200_000_000
        /// How long to wait for a direct ack before asking others to probe.
        public var probeTimeout: UInt64 = 80_000_000
        /// Members asked to probe indirectly.
        public var indirectProbes = 3
        /// Suspicion timeout bounds (Lifeguard): from max down to min as independent confirmations arrive.
        public var suspicionMin: UInt64 = 400_000_000
        public var suspicionMax: UInt64 = 1_200_000_000
        /// Local health multiplier cap: timeouts stretch by (1 + health) while this node itself is slow.
        public var maxLocalHealth = 8
        /// Updates carried per message, and how many times each is sent: mult * ceil(log2(n + 1)).
        public var gossipPerMessage = 8
        public var retransmitMultiplier = 3
        /// Every this many periods, one member believed dead is pinged with what we believe of it, so
        /// that the two sides of a healed partition (each sure the other is dead) find each other.
        /// Once one of them answers (the partition healed), every other is pinged at the next period.
        public var reconnectEvery = 5

        public init() {}

        /// Settings for another protocol period, keeping the defaults' proportions (probe timeout
        /// 0.4 periods, suspicion 2 to 6 periods).
        public init(probeInterval: UInt64) {
            self.probeInterval = probeInterval
            probeTimeout = probeInterval * 2 / 5
            suspicionMin = probeInterval * 2
            suspicionMax = probeInterval * 6
        }
    }

    /// What the shell must do.
    public enum Directive: Sendable, Equatable {
        case sendPing(to: String, address: String, sequence: UInt64, gossip: [Update])
        case sendAck(to: String, address: String, sequence: UInt64, gossip: [Update])
        case sendPingRequest(to: String, address: String, target: String, targetAddress: String, sequence: UInt64, gossip: [Update])
        /// Call `probeTimedOut(sequence:now:)` at `at`.
        case scheduleProbeTimeout(sequence: UInt64, at: UInt64)
        /// Call `suspicionsDue(now:)` at `at`.
        case scheduleSuspicionCheck(at: UInt64)
        /// A member's status changed (for the ring and the log).
        case memberChanged(Update)
        /// Others had declared this node dead (it refuted): they took its keys over meanwhile, and
        /// will hand them back once they see it alive again.
        case declaredDead(incarnation: UInt64)
        /// Ask `with` for its whole view (as a joining node does) and hand it to
        /// `receivedView(_:from:now:)`: this node forgot its own accusations on learning it had been
        /// declared dead, and members the others hold dead meanwhile are learnt at once rather than
        /// found again by its own probes (seconds of a ring that disagrees with everyone's).
        case syncView(with: String, address: String)
    }

    /// One node's view of the cluster and its probe protocol.
    public struct Instance: Sendable {
        public let settings: Settings
        public private(set) var myself: Update
        public private(set) var members: [String: Update] = [:]
        /// 0...maxLocalHealth: Lifeguard's local health; rises when our probes fail, falls when they succeed.
        public private(set) var localHealth = 0
        private var probeOrder: [String] = []
        private var probeIndex = 0
        private var periods = 0
        /// A member believed dead turned out alive, or this node learnt it had been declared dead:
        /// a partition has probably healed, so every member still believed dead is pinged next period.
        private var reconnectAll = false
        private var sequence: UInt64 = 0
        private var probes: [UInt64: Probe] = [:]
        private var relays: [UInt64: (requester: String, requesterSequence: UInt64)] = [:]
        private var suspicions: [String: Suspicion] = [:]
        /// Members this node declared dead itself while it saw at most half of the cluster alive
        /// (its suspicion timers running out one by one, cut off from everyone): verdicts of
        /// isolation. Forgotten once it sees a majority again.
        private var isolatedVerdicts = Set<String>()
        private var gossip: [String: (update: Update, sent: Int)] = [:]
        /// A death learnt or a refutation made since the last spread (`spreadIfDue`).
        private var spreadPending = false
        /// When this node last asked for another's view (`syncView`): at most once a suspicion's
        /// minimum, however many members tell it it was declared dead.
        private var syncedAt: UInt64? = nil
        /// Members asked for their view since the last one that answered, that did not answer
        /// (`viewRequestFailed`): the next is asked among the others.
        private var viewUnanswered = Set<String>()
        /// When `periodTick` last ran (nil before the first).
        private var lastTickAt: UInt64? = nil
        /// When another member last reached this node (any message from it: a probe, an answer,
        /// a join), nil before the first.
        private var lastHeardAt: UInt64? = nil
        /// Since when this node, holding verdicts of isolation, sees a majority again.
        private var majoritySince: UInt64? = nil
        private var rng: SplitMix64

        struct Probe: Sendable {
            let target: String
            var indirect: Bool
        }

        struct Suspicion: Sendable {
            let since: UInt64
            let incarnation: UInt64
            var confirmations: Set<String>
        }

        public init(id: String, address: String, settings: Settings = Settings(), seed: UInt64 = 1, boot: UInt64 = 0) {
            self.settings = settings
            myself = Update(id: id, address: address, status: .alive, incarnation: 0, boot: boot)
            members[id] = myself
            rng = SplitMix64(seed: seed)
        }

        /// Members other than this node that are alive or suspect.
        public var liveMembers: [Update] {
            members.values.filter { $0.id != myself.id && ($0.status == .alive || $0.status == .suspect) }.sorted { $0.id < $1.id }
        }

        private var scale: UInt64 { UInt64(1 + localHealth) }

        // MARK: Gossip

        private mutating func enqueue(_ u: Update) {
            gossip[u.id] = (u, 0)
        }

        /// Updates to piggy-back on the next message, least-sent first. A node that sees only a
        /// minority keeps its accusations of others to itself: it is most likely the one cut off,
        /// and the first messages it sends once the partition heals would carry them to healthy
        /// members before it learns it was declared dead (found by Cluster/chaos, netns seeds
        /// 67-69: every member refuted, each then held its keys back for the handoff limit, calls
        /// were refused for over 5 s and the views took 3.25 s to agree). Its own refutations go out.
        private mutating func takeGossip() -> [Update] {
            let n = members.count
            var log2 = 0
            while (1 << log2) < n + 1 { log2 += 1 }
            let limit = settings.retransmitMultiplier * max(1, log2)
            let withhold = seesOnlyAMinority
            let chosen = gossip.values
                .filter { !withhold || $0.update.id == myself.id || !($0.update.status == .suspect || $0.update.status == .dead) }
                .filter { !($0.update.status == .dead && isolatedVerdicts.contains($0.update.id)) }
                .sorted { $0.sent != $1.sent ? $0.sent < $1.sent : $0.update.id < $1.update.id }
                .prefix(settings.gossipPerMessage)
            for c in chosen {
                let sent = c.sent + 1
                if sent >= limit { gossip[c.update.id] = nil } else { gossip[c.update.id] = (c.update, sent) }
            }
            return chosen.map(\.update)
        }

        /// `gossip` for a message to `id`, with what this node holds against `id` when it suspects
        /// it (Lifeguard's "buddy system"): the suspect hears of the suspicion from every member
        /// that probes it or that it pings, and refutes before it is declared dead. Left to the
        /// piggy-backed gossip, whose budget goes to random members, a live member may never hear
        /// it, and is declared dead while it keeps serving its keys. Not while this node sees only
        /// a minority: its accusations stay its own (`takeGossip`).
        private func withSuspicion(of id: String, _ gossip: [Update]) -> [Update] {
            guard let m = members[id], m.status == .suspect, !seesOnlyAMinority, !gossip.contains(where: { $0.id == id }) else { return gossip }
            return gossip + [m]
        }

        /// Applies what a message carried (`from`: the sender, a confirmation for suspicions).
        public mutating func merge(_ updates: [Update], from: String?, now: UInt64) -> [Directive] {
            var out: [Directive] = []
            if let from, from != myself.id {
                if let last = lastHeardAt, now &- last > settings.probeInterval &+ settings.suspicionMax, myself.status == .alive {
                    heardAfterASilence(from: from, now: now, into: &out)
                }
                lastHeardAt = now
            }
            // A sender we hold dead has been out of touch (the far side of a partition, a paused
            // process): what it concluded about others meanwhile is a product of its isolation, not
            // news. Take what it says of itself and of us (so that it, or we, refute), not its
            // accusations; otherwise a healed partition makes healthy members dead here.
            let senderHeldDead = from.flatMap { members[$0] }.map { $0.status == .dead } ?? false
            for u in updates {
                if senderHeldDead, u.id != from, u.id != myself.id, u.status == .suspect || u.status == .dead { continue }
                apply(u, from: from, now: now, into: &out, accuserHeldDead: senderHeldDead)
            }
            spreadIfDue(into: &out)
            return out
        }

        /// Whether this node sees at most half of the members it knows alive: it is most likely
        /// the one cut off (or paused), not the others.
        var seesOnlyAMinority: Bool {
            let known = members.values.filter { $0.status != .left }.count
            let live = members.values.filter { $0.status == .alive || $0.status == .suspect }.count
            return live * 2 <= known
        }

        /// This node learnt it had been declared dead: it was the one cut off or paused, so what it
        /// concluded of others meanwhile is stale. Its queued accusations are not spread, its
        /// pending suspicions are dropped (the suspect, who never heard them, could not refute), and
        /// so are the deaths it declared itself while it saw at most half of the cluster alive (the
        /// members it lost one by one as it was cut off: held dead, they would leave its ring the
        /// moment it sees a majority again, and come back as they refute — two ring changes and
        /// handoffs for nothing; found by Cluster/chaos, netns seed 77, calls refused for 6 s after
        /// a heal). Whoever is really gone its probes find again; it tells each member it still
        /// holds dead directly when it pings it (`reconnect`).
        private mutating func forgetOwnAccusations(into out: inout [Directive]) {
            gossip = gossip.filter { $0.key == myself.id || !($0.value.update.status == .suspect || $0.value.update.status == .dead) }
            for id in suspicions.keys.sorted() {
                suspicions[id] = nil
                guard var m = members[id], m.status == .suspect else { continue }
                m.status = .alive
                members[id] = m
                out.append(.memberChanged(m))
            }
            reviveVerdictsOfIsolation(into: &out)
        }

        /// No member reached this node for longer than the others take to declare it dead (a
        /// period and a suspicion's longest): cut off or frozen, it most likely was declared dead,
        /// and the first word from a member can come before that news does. It acts as told so (its
        /// keys wait for their handoff back, a live member's view is asked for) rather than serve
        /// its keys from its stale view until the news arrives.
        private mutating func heardAfterASilence(from: String, now: UInt64, into out: inout [Directive]) {
            out.append(.declaredDead(incarnation: myself.incarnation))
            if let teller = members[from], teller.status != .dead {
                requestView(from: from, address: teller.address, now: now, into: &out)
            } else {
                out += syncViewAfterFreeze(now: now)
            }
        }

        /// No member reached this node for longer than a suspicion's shortest: it is cut off.
        private func unheard(now: UInt64) -> Bool {
            lastHeardAt.map { now &- $0 > settings.suspicionMin } ?? false
        }

        /// Undoes the deaths this node declared while it saw at most half of the cluster (it was
        /// the one cut off): alive again here, probed again, not gossiped.
        private mutating func reviveVerdictsOfIsolation(into out: inout [Directive]) {
            for id in isolatedVerdicts.sorted() {
                gossip[id] = nil
                guard var m = members[id], m.status == .dead else { continue }
                m.status = .alive
                members[id] = m
                addToProbeOrder(id)
                out.append(.memberChanged(m))
            }
            isolatedVerdicts = []
            majoritySince = nil
        }

        /// Asks `id` for its whole view (`syncView`), at most once a suspicion's minimum.
        private mutating func requestView(from id: String, address: String, now: UInt64, into out: inout [Directive]) {
            guard syncedAt.map({ now &- $0 >= settings.suspicionMin }) ?? true else { return }
            syncedAt = now
            viewUnanswered = []
            out.append(.syncView(with: id, address: address))
        }

        /// The member asked for its view (`syncView`) did not answer: it may have died while this
        /// node was frozen or cut off, which its stale view cannot tell. Another live member it
        /// has not asked since the last answer is asked at once (no rate limit: this is the same
        /// request); none left, the sync ends. Without it, a frozen node that asked a member dead
        /// meanwhile kept that member as one it waits for to hand back, refusing its keys.
        public mutating func viewRequestFailed(with id: String, now: UInt64) -> [Directive] {
            viewUnanswered.insert(id)
            let others = liveMembers.filter { $0.status == .alive && !viewUnanswered.contains($0.id) }
            guard !others.isEmpty else {
                viewUnanswered = []
                return []
            }
            let teller = others[Int(rng.next() % UInt64(others.count))]
            syncedAt = now
            return [.syncView(with: teller.id, address: teller.address)]
        }

        private mutating func apply(_ u: Update, from: String?, now: UInt64, into out: inout [Directive], accuserHeldDead: Bool = false) {
            if u.id == myself.id {
                if u.boot > myself.boot && myself.status == .alive {
                    // the cluster knows a later instance of this id than this process (its clock
                    // was behind the previous one's): take a boot above it, or never be admitted
                    myself.boot = u.boot &+ 1
                    myself.incarnation = 0
                    members[myself.id] = myself
                    enqueue(myself)
                    out.append(.memberChanged(myself))
                    return
                }
                if u.boot < myself.boot {
                    // news of this id's previous process: tell the sender about this one
                    if myself.status == .alive { enqueue(myself) }
                    return
                }
                // Someone thinks we are suspect or dead: refute with a higher incarnation.
                if (u.status == .suspect || u.status == .dead) && myself.status == .alive {
                    // declared dead (even if a suspicion was refuted first): the others have
                    // taken this node's keys over meanwhile
                    // (from a node this one holds dead while it sees a majority alive: the far side
                    // of a partition talking, which took no keys from here; refuted, nothing more)
                    if u.status == .dead, !accuserHeldDead || seesOnlyAMinority {
                        out.append(.declaredDead(incarnation: u.incarnation))
                        reconnectAll = true
                        forgetOwnAccusations(into: &out)
                        if let from, let teller = members[from], teller.status != .dead {
                            requestView(from: from, address: teller.address, now: now, into: &out)
                        }
                    }
                    let refutes = u.incarnation >= myself.incarnation
                    if refutes {
                        // (an incarnation at the top of the range cannot be refuted by counting
                        // up; a new boot can: this process takes one, as if it had restarted)
                        if u.incarnation == .max {
                            myself.boot &+= 1
                            myself.incarnation = 0
                            out.append(.memberChanged(myself))
                        } else {
                            myself.incarnation = u.incarnation + 1
                        }
                        members[myself.id] = myself
                    }
                    // refute, or repeat an earlier refutation to a node that missed it (its
                    // gossip may have been lost with a connection): our reply carries it
                    enqueue(myself)
                    if refutes { spreadPending = true }
                }
                return
            }
            guard let old = members[u.id] else {
                members[u.id] = u
                if u.status == .alive || u.status == .suspect { addToProbeOrder(u.id) }
                if u.status == .suspect { startSuspicion(u, from: from, now: now, into: &out) }
                enqueue(u)
                out.append(.memberChanged(u))
                return
            }
            if u.status == .suspect, old.status == .suspect, u.incarnation == old.incarnation {
                // another node independently suspects it: Lifeguard shortens the timeout, and the
                // confirmation is passed on (the member's first accuser is not one)
                if let witness = u.witness(sentBy: from), witness != myself.id,
                   suspicions[u.id]?.confirmations.insert(witness).inserted == true {
                    enqueue(u)
                    out.append(.scheduleSuspicionCheck(at: suspicionDeadline(u.id)))
                }
                return
            }
            guard u.supersedes(old) else { return }
            members[u.id] = u
            let refutedAVerdictOfIsolation = isolatedVerdicts.remove(u.id) != nil && u.status == .alive
            if refutedAVerdictOfIsolation {
                // a member this node declared dead while it saw at most half of the cluster is
                // alive: this node was the one cut off, and its other such verdicts are as stale.
                // They are undone, and the refuter's view tells which of them the others hold
                // dead (left standing, they spread with the heal and made the others declare a
                // healthy member dead, and this node took its keys over from a stale copy)
                reviveVerdictsOfIsolation(into: &out)
                requestView(from: u.id, address: u.address, now: now, into: &out)
            }
            enqueue(u)
            if old.status == .dead && u.status == .alive { reconnectAll = true }
            switch u.status {
            case .alive:
                suspicions[u.id] = nil
                addToProbeOrder(u.id)
            case .suspect:
                startSuspicion(u, from: from, now: now, into: &out)
            case .dead, .left:
                suspicions[u.id] = nil
                if u.status == .dead && old.status != .dead { spreadPending = true }
            }
            if old.status != u.status || old.address != u.address || old.boot != u.boot { out.append(.memberChanged(u)) }
        }

        private mutating func startSuspicion(_ u: Update, from: String?, now: UInt64, into out: inout [Directive]) {
            var s = Suspicion(since: now, incarnation: u.incarnation, confirmations: [])
            if let witness = u.witness(sentBy: from), witness != myself.id { s.confirmations.insert(witness) }
            suspicions[u.id] = s
            out.append(.scheduleSuspicionCheck(at: suspicionDeadline(u.id)))
        }

        /// Lifeguard: max − (max − min)·log(C + 1)/log(K + 1), K = expected confirmations.
        func suspicionDeadline(_ id: String) -> UInt64 {
            guard let s = suspicions[id] else { return .max }
            // Lifeguard's K: the confirmations to expect. No more can come than there are other
            // live members (a small cluster would otherwise always wait the longest timeout).
            let others = members.values.filter { $0.status == .alive || $0.status == .suspect }.count - 2
            let expected = max(1, min(settings.indirectProbes, others))
            let k = Double(expected)
            let c = Double(min(s.confirmations.count, expected))
            let span = Double(settings.suspicionMax - settings.suspicionMin)
            let timeout = Double(settings.suspicionMax) - span * log(c + 1) / log(k + 1)
            return s.since + UInt64(max(Double(settings.suspicionMin), timeout))
        }

        /// Suspects whose time is up become dead.
        public mutating func suspicionsDue(now: UInt64) -> [Directive] {
            var out: [Directive] = []
            if frozenSinceLastTick(now: now) != nil {
                // (this timer fired late: the process was frozen, and its suspicions are from
                // before; the period tick that follows finds the freeze and forgets them,
                // `syncViewAfterFreeze`. Checked again after it)
                out.append(.scheduleSuspicionCheck(at: now &+ settings.probeInterval))
                return out
            }
            for id in suspicions.keys.sorted() where now >= suspicionDeadline(id) {
                guard let s = suspicions[id], var m = members[id], m.status == .suspect, m.incarnation == s.incarnation else {
                    suspicions[id] = nil
                    continue
                }
                suspicions[id] = nil
                let alive = members.values.filter { $0.status == .alive }.count
                let known = members.values.filter { $0.status != .left }.count
                // (unheard for a suspicion's length, this node is cut off whatever it counts: its
                // probes found the first members gone before any other member was suspected)
                if alive * 2 <= known || unheard(now: now) { isolatedVerdicts.insert(id) } else { isolatedVerdicts.remove(id) }
                m.status = .dead
                members[id] = m
                enqueue(m)
                out.append(.memberChanged(m))
                spreadPending = true
            }
            spreadIfDue(into: &out)
            return out
        }

        /// Sends what is queued to be gossiped to a few live members now, not only on the next
        /// probes: a death and a refutation are news every member needs at once (a refutation
        /// races the suspicion timers of the members that heard the accusation). Their acks
        /// answer no probe.
        private mutating func spreadIfDue(into out: inout [Directive]) {
            guard spreadPending else { return }
            spreadPending = false
            let targets = liveMembers.filter { $0.status == .alive }.shuffled(using: &rng).prefix(settings.indirectProbes)
            for t in targets {
                sequence += 1
                out.append(.sendPing(to: t.id, address: t.address, sequence: sequence, gossip: takeGossip()))
            }
        }

        private mutating func addToProbeOrder(_ id: String) {
            guard id != myself.id, !probeOrder.contains(id) else { return }
            // insert at a random place so that every node probes in a different order
            let at = probeOrder.isEmpty ? 0 : Int(rng.next() % UInt64(probeOrder.count + 1))
            probeOrder.insert(id, at: at)
        }

        // MARK: Probing

        /// How long since the last period tick, when that is longer than a period and a
        /// suspicion's longest: this process was frozen (a paused VM, SIGSTOP) long enough to be
        /// declared dead, and others may hold its keys now (nil otherwise). The node checks it
        /// before each tick; a suspicion timer that fires before that tick checks it too.
        public func frozenSinceLastTick(now: UInt64) -> UInt64? {
            guard let last = lastTickAt, now &- last > settings.probeInterval &+ settings.suspicionMax else { return nil }
            return now &- last
        }

        /// The protocol period elapsed: probe the next member.
        public mutating func periodTick(now: UInt64) -> [Directive] {
            var out: [Directive] = []
            periods += 1
            lastTickAt = now
            // Heard from and seeing a majority again, the node was not the one cut off, or is
            // back: members still dead a suspicion's longest after that are not refuting, and
            // their deaths are not its isolation's. Not at once: the first member heard at a heal
            // comes before the others could refute.
            if isolatedVerdicts.isEmpty || seesOnlyAMinority || unheard(now: now) {
                majoritySince = nil
            } else if let since = majoritySince {
                if now &- since >= settings.suspicionMax {
                    majoritySince = nil
                    isolatedVerdicts = []
                }
            } else {
                majoritySince = now
            }
            if reconnectAll {
                reconnectAll = false
                reconnect(into: &out, all: true)
            } else if settings.reconnectEvery > 0, periods % settings.reconnectEvery == 0 {
                reconnect(into: &out)
            }
            probeOrder.removeAll { members[$0].map { $0.status == .dead || $0.status == .left } ?? true }
            guard !probeOrder.isEmpty else { return out }
            if probeIndex >= probeOrder.count {
                probeIndex = 0
                probeOrder.shuffle(using: &rng)
            }
            let target = probeOrder[probeIndex]
            probeIndex += 1
            guard let t = members[target] else { return out }
            sequence += 1
            probes[sequence] = Probe(target: target, indirect: false)
            out.append(.sendPing(to: target, address: t.address, sequence: sequence, gossip: withSuspicion(of: target, takeGossip())))
            out.append(.scheduleProbeTimeout(sequence: sequence, at: now + settings.probeTimeout * scale))
            return out
        }

        /// Pings one member believed dead, telling it so (and who we are): if it is alive (a healed
        /// partition, or a node wrongly declared dead that no one probes any more) it refutes, and
        /// its ack tells us. Nothing is concluded from silence.
        private mutating func reconnect(into out: inout [Directive], all: Bool = false) {
            let dead = members.values.filter { $0.status == .dead && $0.id != myself.id }.sorted { $0.id < $1.id }
            guard !dead.isEmpty else { return }
            let targets = all ? Array(dead.prefix(Self.maxReconnectBurst)) : [dead[Int(rng.next() % UInt64(dead.count))]]
            for target in targets {
                sequence += 1
                out.append(.sendPing(to: target.id, address: target.address, sequence: sequence, gossip: [target, myself] + takeGossip()))
            }
        }

        /// (a bound on one period's reconnect pings, whatever the size of the cluster)
        static let maxReconnectBurst = 16

        /// A probe's timer fired: after the direct wait, ask others; after the indirect wait, suspect.
        public mutating func probeTimedOut(sequence seq: UInt64, now: UInt64) -> [Directive] {
            if relays.removeValue(forKey: seq) != nil { return [] }  // a relayed probe went unanswered
            guard var p = probes[seq], let target = members[p.target] else { return [] }
            var out: [Directive] = []
            if !p.indirect {
                p.indirect = true
                probes[seq] = p
                let helpers = liveMembers.filter { $0.id != target.id && $0.status == .alive }.shuffled(using: &rng).prefix(settings.indirectProbes)
                for h in helpers {
                    out.append(.sendPingRequest(to: h.id, address: h.address, target: target.id, targetAddress: target.address,
                                                sequence: seq, gossip: takeGossip()))
                }
                let rest = settings.probeInterval > settings.probeTimeout ? settings.probeInterval - settings.probeTimeout : settings.probeTimeout
                out.append(.scheduleProbeTimeout(sequence: seq, at: now + rest * scale))
                return out
            }
            probes[seq] = nil
            localHealth = min(settings.maxLocalHealth, localHealth + 1)
            if target.status == .alive {
                var s = target
                s.status = .suspect
                s.accuser = myself.id
                apply(s, from: nil, now: now, into: &out)
            } else if target.status == .suspect, target.accuser != myself.id,
                      suspicions[target.id]?.confirmations.insert(myself.id).inserted == true {
                // suspected already by another: this probe's failure is an independent confirmation,
                // here and (passed on under this node's name) everywhere
                var s = target
                s.accuser = myself.id
                enqueue(s)
                out.append(.scheduleSuspicionCheck(at: suspicionDeadline(target.id)))
            }
            return out
        }

        /// A ping arrived: answer it. `boot` is the sender's process instance.
        public mutating func receivedPing(from: String, address: String, boot: UInt64 = 0, sequence seq: UInt64, gossip g: [Update], now: UInt64) -> [Directive] {
            var out = merge(g, from: from, now: now)
            if members[from].map({ $0.boot < boot }) ?? true {
                // a member we did not know, or a later process of one we did
                apply(Update(id: from, address: address, status: .alive, incarnation: 0, boot: boot), from: nil, now: now, into: &out)
            }
            var reply = withSuspicion(of: from, takeGossip())
            // a member we hold dead is talking to us: tell it, so it refutes and we learn it is back
            if let sender = members[from], sender.status == .dead { reply.append(sender) }
            out.append(.sendAck(to: from, address: address, sequence: seq, gossip: reply))
            return out
        }

        /// Someone asks us to probe `target` for them.
        public mutating func receivedPingRequest(from: String, address: String, target: String, targetAddress: String,
                                                 sequence seq: UInt64, gossip g: [Update], now: UInt64) -> [Directive] {
            var out = merge(g, from: from, now: now)
            sequence += 1
            relays[sequence] = (from, seq)
            out.append(.sendPing(to: target, address: targetAddress, sequence: sequence, gossip: withSuspicion(of: target, takeGossip())))
            out.append(.scheduleProbeTimeout(sequence: sequence, at: now + settings.probeTimeout * scale))
            return out
        }

        /// An ack arrived (for our probe, or for one we relay).
        public mutating func receivedAck(from: String, sequence seq: UInt64, gossip g: [Update], now: UInt64) -> [Directive] {
            var out = merge(g, from: from, now: now)
            if let relay = relays.removeValue(forKey: seq), let requester = members[relay.requester] {
                out.append(.sendAck(to: requester.id, address: requester.address, sequence: relay.requesterSequence, gossip: takeGossip()))
            } else if probes.removeValue(forKey: seq) != nil {
                localHealth = max(0, localHealth - 1)
            }
            return out
        }

        // MARK: Joining and leaving

        /// A node joins through us: add it; the shell answers with `fullState()`.
        public mutating func receivedJoin(_ joiner: Update, now: UInt64) -> [Directive] {
            var out: [Directive] = []
            lastHeardAt = now
            apply(joiner, from: nil, now: now, into: &out)
            return out
        }

        /// Everything we know.
        public var fullState: [Update] { members.values.sorted { $0.id < $1.id } }

        /// What this node tells a joining node, or one that asks for its view (`syncView`): its
        /// members, but its own accusations not yet settled — a suspicion it raised, a death it
        /// declared while cut off (a verdict of isolation, not spread) — as the member was before.
        /// A node back from a pause or a partition would otherwise hand its stale accusations to
        /// another that asks, which would take them as the cluster's: the asker's own probes
        /// find whoever is really failing.
        public var sharedView: [Update] {
            fullState.map { u in
                let unsettled = (u.status == .dead && isolatedVerdicts.contains(u.id)) || (u.status == .suspect && u.accuser == myself.id)
                guard unsettled else { return u }
                var before = u
                before.status = .alive
                before.accuser = ""
                return before
            }
        }

        /// Another member's whole view, asked for by `syncView`: merged as gossip from it, except
        /// what it says of this node (which this node has refuted already: taken again, it would
        /// be "declared dead" once more, and ask again).
        public mutating func receivedView(_ view: [Update], from: String, now: UInt64) -> [Directive] {
            viewUnanswered = []
            return merge(view.filter { $0.id != myself.id }, from: from, now: now)
        }

        /// This node was declared dead (or frozen long enough to be) and is back: it announces a
        /// new incarnation, above every word about it from before, and returns it. What the others
        /// decided while they knew it at a lower one is told apart by it (`HandoffGate`).
        public mutating func announceReturn() -> UInt64 {
            guard myself.status == .alive, myself.incarnation < .max else { return myself.incarnation }
            myself.incarnation += 1
            members[myself.id] = myself
            enqueue(myself)
            spreadPending = true
            return myself.incarnation
        }

        /// This node found it was frozen long enough to be declared dead (its own clock says so,
        /// before any member's word): it asks a live member for its whole view, as news of its
        /// death would have made it (`requestView`). Without it, a member that died during the
        /// freeze stays, in the node's stale view, one it waits for to hand back, and the node
        /// refuses its keys for the whole handoff limit.
        public mutating func syncViewAfterFreeze(now: UInt64) -> [Directive] {
            var out: [Directive] = []
            // (the suspicions it raised before the freeze are as stale as the rest of its view: the
            // suspects could not refute to a frozen process. Left running, their timers declared a
            // member dead the moment it thawed, and it took that member's keys from its stale copy)
            forgetOwnAccusations(into: &out)
            let alive = liveMembers.filter { $0.status == .alive }
            guard !alive.isEmpty else { return out }
            let teller = alive[Int(rng.next() % UInt64(alive.count))]
            requestView(from: teller.id, address: teller.address, now: now, into: &out)
            return out
        }

        /// Restarting with the same id: start above any incarnation the cluster may remember.
        public mutating func rejoin(withIncarnation incarnation: UInt64) {
            myself.incarnation = incarnation
            members[myself.id] = myself
            enqueue(myself)
        }

        /// Graceful leave: say so to every live member at once. Not to a few, leaving the rest to
        /// gossip: a member that still has this node on its ring hands keys off to it, and in a
        /// rolling restart the next node leaves a moment later, handing off by that stale ring.
        public mutating func leave() -> [Directive] {
            myself.status = .left
            myself.incarnation &+= 1
            members[myself.id] = myself
            enqueue(myself)
            return liveMembers.map { .sendPing(to: $0.id, address: $0.address, sequence: 0, gossip: [myself]) }
        }
    }
}
