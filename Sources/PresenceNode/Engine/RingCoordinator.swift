import ClusterCore
import PresenceCore
import PresenceWire
import Synchronization

/// Carries out ring changes in the order membership saw them (ARCHITECTURE.md, "Failover" and
/// "Handoff"): every shard hands off what moved away and takes over what it now owns; then this
/// node tells every member it is done handing off, forgets the push queues of processes that are
/// gone, restarts the followers of nodes whose pushes were lost, and runs an anti-entropy round
/// soon. Also the graceful leave: hand everything off, then own nothing.
final class RingCoordinator: Sendable {
    let core: EngineCore
    let antiEntropy: AntiEntropy
    /// Nodes pushes to which were lost; their followers get fresh SNAPSHOTs once they are live.
    private let lossy = Mutex(LossyFollowers())
    /// Replicas whose copies were lost while the link could not reach them (`lostPushes`).
    private let copiesDue = Mutex<Set<String>>([])
    /// The loop releasing held-back fresh starts (`releaseHeldBackSoon`).
    private let releasing = Mutex(ReleaseLoop())
    /// Whether a loop asking for missing handoffs runs (`askForHandoffsWhileWaiting`).
    private let asking = Atomic<Bool>(false)

    init(core: EngineCore, antiEntropy: AntiEntropy) {
        self.core = core
        self.antiEntropy = antiEntropy
    }

    func ringChanged(from old: HashRing, to new: HashRing) async {
        // (read before the shards run: joined by then, they take in the copies held back for it)
        let ready = core.topology.isReady
        for s in core.channelShards { await s.ringChanged(to: new) }
        for s in core.userHomes { await s.ringChanged(to: new) }
        // A node not joined yet still holds back the copies sent to it, among them handoffs it must
        // pass on to their owners: it settles, and says it is done, once it has taken them in (see
        // `joined`). Said before, a member that waited for it served the keys those handoffs carry
        // from nothing (a user's only record among them: a live session's resume is refused).
        if ready { core.topology.settled(new.fingerprint) }
        guard let link = core.link else { return }
        if ready { sayHandedOff(for: new, link: link) }
        link.forgetAllBut(new)
        askForHandoffsWhileWaiting()
        await restartLossyFollowers()
        antiEntropy.runSoon()
    }

    /// While this node waits for previous owners to hand off, asks those it still waits for, every
    /// `handoffAskAgain`, whether they have (`HandoffGate.membersToAsk`: a "done" may have been
    /// lost). One such loop at a time; it ends with the wait.
    func askForHandoffsWhileWaiting() {
        guard core.link != nil, asking.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        let every = core.timings.handoffAskAgain
        core.background.run { [self] in
            while !Task.isCancelled, core.topology.waitsForHandoff() {
                await core.clock.sleep(nanoseconds: every)
                guard let link = core.link, let due = core.topology.handoffRequestsDue(every: every) else { continue }
                core.trace?("asking again for handoffs", ["ring": String(due.fingerprint), "members": due.members.map(\.id).joined(separator: ",")])
                requestHandoffs(from: due.members, fingerprint: due.fingerprint, link: link)
            }
            asking.store(false, ordering: .releasing)
            // (a wait that began as this loop ended gets one of its own)
            if !Task.isCancelled, core.topology.waitsForHandoff() { askForHandoffsWhileWaiting() }
        }
    }

    /// Tells every member of `ring` that this node has handed off all it owned that they own
    /// under it (each "done" stamped with the incarnation this node knows the member at).
    private func sayHandedOff(for ring: HashRing, link: PeerLink) {
        core.trace?("handoff done, telling the members", ["ring": String(ring.fingerprint), "pending": core.topology.handoffPending])
        for node in ring.members where node != core.topology.me {
            let incarnation = core.topology.incarnation(of: node)
            link.push(to: NodeInstance(node, boot: ring.boot(of: node))) { b in
                b.handoffDone = true
                b.ringFingerprint = ring.fingerprint
                b.toIncarnation = incarnation
            }
        }
    }

    /// This node has joined its cluster: it takes in the copies that arrived before (passing on
    /// the handoffs meant for others), then serves and says it is done.
    func joined() async {
        for s in core.channelShards { await s.receiveEarly() }
        for s in core.userHomes { await s.receiveEarly() }
        let ring = core.topology.ring
        guard await allShards(atRing: ring) else { return }  // (a later change is queued: it says so)
        core.topology.settled(ring.fingerprint)
        if let link = core.link { sayHandedOff(for: ring, link: link) }
    }

    /// Whether every shard has carried out the change to `ring` (a later one may still be queued).
    private func allShards(atRing ring: HashRing) async -> Bool {
        for s in core.channelShards where await s.ring != ring { return false }
        for s in core.userHomes where await s.ring != ring { return false }
        return true
    }

    /// This node was declared dead and is back: it stops serving its keys (the others took them
    /// over and hold later versions) and asks every member to say when it has handed back.
    func returnedFromDeath(incarnation: UInt64) {
        core.topology.returnedFromDeath(incarnation: incarnation)
        // (what it counted as gone while it was the one cut off counts for nothing: seed 52)
        let core = self.core
        core.background.run {
            for s in core.channelShards { await s.returnedFromDeath() }
            for s in core.userHomes { await s.returnedFromDeath() }
        }
        guard let link = core.link else { return }
        let ring = core.topology.ring
        let others = ring.members.filter { $0 != core.topology.me }.map { NodeInstance($0, boot: ring.boot(of: $0)) }
        requestHandoffs(from: others, fingerprint: ring.fingerprint, link: link)
        askForHandoffsWhileWaiting()
        antiEntropy.runSoon()
    }

    /// Asks each of `nodes` to say whether it has handed off for the ring `fingerprint`
    /// (answered by `handoffRequested` there), with the incarnation this node returned as.
    private func requestHandoffs(from nodes: [NodeInstance], fingerprint: UInt64, link: PeerLink) {
        let incarnation = core.topology.returnIncarnation
        for node in nodes {
            link.push(to: node) { b in
                b.handoffRequest = fingerprint
                b.fromIncarnation = incarnation
            }
        }
    }

    /// A member back from death (as `incarnation`) asks whether this node has handed back for the
    /// ring `fingerprint`: if this node has carried out that ring, it has (its handoffs went out
    /// before this answer), and says so to that incarnation — after sending it again the copies
    /// handed here whose keys it owns (`Keyspace.handOn`), which travel before the "done".
    func handoffRequested(by node: NodeInstance, fingerprint: UInt64, incarnation: UInt64) {
        guard core.link != nil, core.topology.ring.fingerprint == fingerprint, core.topology.isSettled else { return }
        let core = self.core
        core.background.run {
            for s in core.channelShards { await s.handOn(to: node.id) }
            for s in core.userHomes { await s.handOn(to: node.id) }
            guard let link = core.link, core.topology.ring.fingerprint == fingerprint else { return }
            let known = core.topology.incarnation(of: node.id)
            link.push(to: node) { b in
                b.handoffDone = true
                b.ringFingerprint = fingerprint
                b.toIncarnation = max(known, incarnation)
            }
        }
    }

    /// Pushes to `node` were lost (shed, given up, or dropped with a gone process's queue).
    /// A replica that missed changes would take over from a stale copy: it gets whole ones, now
    /// if the link reaches it, else when it is a live member again (`memberAlive`). Copies sent to
    /// a node the link drops at once are lost too and come straight back here: resent at once,
    /// they made a loop that took no time, and a node cut off in a minority (which keeps its ring)
    /// spun on it for the whole partition.
    func lostPushes(to node: String, copies: Bool) {
        lossy.withLock { $0.lost(node) }
        let resyncNow = copies && (core.link?.canReach(node) ?? false)
        if copies && !resyncNow { copiesDue.withLock { _ = $0.insert(node) } }
        core.background.run { [self] in
            await restartLossyFollowers()
            if resyncNow { await resync(replica: node) }
        }
    }

    private func resync(replica node: String) async {
        guard core.topology.ring.members.contains(node) else { return }
        for s in core.channelShards { await s.resync(replica: node) }
        for s in core.userHomes { await s.resync(replica: node) }
    }

    /// Another member is believed alive again: followers there whose pushes were lost while it
    /// was not (it stayed on the ring: this node kept its ring in a minority) get fresh SNAPSHOTs,
    /// and it gets the whole copies it missed meanwhile.
    func memberAlive(_ node: String) {
        let copies = copiesDue.withLock { $0.remove(node) != nil }
        guard copies || lossy.withLock({ $0.contains(node) }) else { return }
        core.background.run { [self] in
            await restartLossyFollowers()
            if copies { await resync(replica: node) }
        }
    }

    /// Fresh SNAPSHOTs for everyone following an owned channel at a node whose pushes were lost,
    /// once that node is live (if it came back as a new process, it has no followers left). Not
    /// before: pushes to a node believed dead are dropped at once, and would be lost again.
    private func restartLossyFollowers() async {
        let ring = core.topology.ring
        let link = core.link
        let due = lossy.withLock { $0.due(ring: ring, reachable: { link?.canReach($0) != false }) }
        for node in due {
            for s in core.channelShards { await s.restart(followersAt: node) }
            for s in core.userHomes { await s.restart(followersAt: node) }
        }
        releaseHeldBackSoon()
    }

    /// Keys whose fresh start (SNAPSHOTs, current statuses) waits for their handoff get it once
    /// the handoff gate lets this node serve them: checked every `heldBackRetry` while any wait
    /// (the gate opens at the latest after its limit). One such loop at a time.
    /// (A call while the loop runs makes it look once more before it ends: `ReleaseLoop`.)
    func releaseHeldBackSoon() {
        guard releasing.withLock({ $0.ask() }) else { return }
        let retry = core.timings.heldBackRetry
        core.background.run { [self] in
            while !Task.isCancelled {
                releasing.withLock { $0.looking() }
                var waiting = false
                for s in core.channelShards where await s.releaseHeldBack() { waiting = true }
                for s in core.userHomes where await s.releaseHeldBack() { waiting = true }
                switch releasing.withLock({ $0.looked(waiting: waiting) }) {
                case .stop: return
                case .lookAgain: continue
                case .sleep: await core.clock.sleep(nanoseconds: retry)
                }
            }
            releasing.withLock { $0.cancelled() }
        }
    }

    /// Graceful leave: hands every channel and user home to the node that owns it once this one
    /// is gone, and waits (up to `timeout` ns) until that was received. From then on this node
    /// serves no key (a call that still reaches it is refused, retryable), so no acknowledged
    /// change can land only here.
    func handOffBeforeLeaving(timeout: UInt64) async {
        guard let link = core.link, !core.topology.isAlone else { return }
        core.topology.startLeaving()
        let without = core.topology.ring.removing(core.topology.me)
        for s in core.channelShards { await s.handOffAll(to: without) }
        for s in core.userHomes { await s.handOffAll(to: without) }
        await link.drain(timeout: timeout)
    }
}
