import ClusterCore

/// Every timing of the cluster's presence protocols, in one place (nanoseconds unless named
/// otherwise). They follow from the two settings an operator chooses: the SWIM protocol period
/// (`--probe-interval`, which sets how fast failures are detected) and `--presence-timeout` (how
/// long a disconnected session may resume). The defaults (0.2 s period, 10 s timeout) give the
/// figures in the comments.
public struct ClusterTimings: Sendable, Equatable {
    /// How long a disconnected session may resume; a gone gateway's sessions time out after it.
    public var presenceTimeout: UInt64
    /// How long a gateway keeps starting new attempts of a call whose owner is moving or
    /// unreachable before it answers UNAVAILABLE (1.4 s: about failure detection plus a handoff,
    /// and short enough that two attempts at one node leave 1.5 s of invariant 7's 5 s for a move).
    public var routingRetry: UInt64
    /// The last attempt of a call gets at least this long, even with less left of the retry window
    /// (0.3 s: a round trip over a slow link): a call to another node is answered within
    /// `routingRetry + routingLastAttempt`.
    public var routingLastAttempt: UInt64
    /// How long a change waits for its replica copies before it is answered anyway (a replica that
    /// does not acknowledge by then is stuck, and about to be declared dead): 1 s.
    public var replicationWait: UInt64
    /// Timeout of one call to another node (2 s).
    public var peerCallTimeout: UInt64
    /// An owner answering another node's call leaves this much of the call's deadline for its
    /// answer to travel back: it waits for its replicas only until then (100 ms: a wait for
    /// acknowledgements may end up to 50 ms late, `PushQueue.watch`, and the answer has its way
    /// back). Answering before the replica has the copy is what the replication wait does anyway
    /// when it runs out; the gateway keeps the acknowledged state (it is the authority on its
    /// sessions), and anti-entropy gives it to a new owner should this one fail first.
    public var answerMargin: UInt64
    /// The longest one attempt of a push to another node may take (5 s: the largest batch at the
    /// slowest link we allow for; see `pushAttemptTimeout`), and the pause between attempts
    /// (50 ms); after `pushAttempts` failures the push is given up (the receiver's followers get
    /// fresh SNAPSHOTs).
    public var pushTimeout: UInt64
    /// An attempt of a small push (0.7 s, within the replication wait, so a cut link or a lost
    /// message costs less than the wait): after the first, every other attempt goes through
    /// another member. Also the first attempt of a call another node routes (`routingWindow`).
    public var firstPushTimeout: UInt64
    public var pushRetryPause: UInt64
    public var pushAttempts: Int
    /// The slowest transfer a push attempt allows for, in bytes per second (2 MB/s).
    public var pushFloorBytesPerSecond: UInt64
    /// Bytes queued for one node at most before its oldest deliveries are shed (64 MiB).
    public var pushQueueBytes: Int
    /// How often each gateway sends each owner a digest of what it holds (1 s, at most a fifth of
    /// the presence timeout): with one exchange round after a mismatch, a divergence is repaired
    /// within about two of these.
    public var antiEntropyInterval: UInt64
    /// After its serving lease ran out (cut off), how long a node still waits at least before it
    /// times out a session of a process it counted gone (two anti-entropy rounds: what it missed
    /// while cut off reaches it, retried by the gateway or repaired by a digest).
    public var backFromCutGrace: UInt64
    /// The first anti-entropy round after a ring change waits this long for handoffs to land (0.3 s).
    public var antiEntropyAfterRingChange: UInt64
    /// How long after it last heard from another member a node may still serve its keys (0.6 s:
    /// less than others take to declare it dead), so a process frozen longer answers nothing from
    /// its stale view until it has heard again.
    public var lease: UInt64
    /// A node that heard from no other member for this long counts as cut off from the cluster
    /// (1 s: the lease and two probe periods more, past the longest gap between answered probes
    /// while one member is down): its calls are answered at their first failure (`RoutingWindow`).
    public var cutOffAfter: UInt64
    /// How long a new owner waits for a live previous owner's handoff before serving anyway (3 s).
    public var handoffLimit: UInt64
    /// While this node waits for a handoff, the members it waits for are asked again this often
    /// whether they have handed off (0.3 s: a "done" may have been lost, see
    /// `HandoffGate.membersToAsk`; the first "done"s come on their own, within a round trip and
    /// a handoff).
    public var handoffAskAgain: UInt64
    /// Followers owed fresh SNAPSHOTs of keys still waiting for their handoff are tried again this
    /// often (a probe interval) until the handoff lands or `handoffLimit` passes.
    public var heldBackRetry: UInt64
    /// A key taken over from a copy that may be stale (dropped by a passing ring, or restored and
    /// not confirmed) is not served for this long, unless another node's version of it is merged
    /// first: the first anti-entropy round after the ring change brings it up to date (1.3 s).
    public var staleTakeoverHold: UInt64
    /// A node whose seeds all stay silent this long serves as a cluster of one (3 s).
    public var aloneAfter: UInt64
    /// How long a gateway remembers where a session it held went (its client resumed it on another
    /// node), to tell owners that still place it here (ten presence timeouts).
    public var movedMemory: UInt64
    /// A session's end (or a resumed session's announce) that could not reach an owner is tried
    /// again this often, this many times (anti-entropy would repair it too, but later, and not
    /// across a cut link).
    public var endRetryPause: UInt64
    public var endRetryAttempts: Int
    /// A stopping node waits up to this long for its client streams to end before it says goodbye
    /// (1 s: a handler that has not let go by then is stuck, and the node stops anyway).
    public var streamsEndWait: UInt64
    /// ... and this long more (0.3 s, `routingLastAttempt`: a round trip over a slow link): the
    /// others start its sessions' presence timeout when they hear the goodbye, while each client
    /// counts from its stream's end as it reaches it, and its resume must still reach the
    /// session's home within the timeout.
    public var goodbyeMargin: UInt64
    /// SWIM's probe period (`--probe-interval`), which the others derive from.
    public var probeInterval: UInt64
    /// A connect to a peer still waiting after this long lost its SYN (a partition that healed
    /// since): it starts again rather than wait seconds for the kernel's retry.
    public var peerConnectTimeout: UInt64

    public init(probeInterval: UInt64 = 200_000_000, presenceTimeout: UInt64 = 10_000_000_000) {
        self.presenceTimeout = presenceTimeout
        self.probeInterval = probeInterval
        peerConnectTimeout = max(500_000_000, probeInterval * 5 / 2)
        routingRetry = max(1_400_000_000, probeInterval * 7)
        routingLastAttempt = max(300_000_000, probeInterval * 3 / 2)
        replicationWait = max(1_000_000_000, probeInterval * 5)
        peerCallTimeout = max(2_000_000_000, probeInterval * 10)
        answerMargin = 100_000_000
        pushTimeout = max(5_000_000_000, probeInterval * 25)
        firstPushTimeout = max(700_000_000, probeInterval * 7 / 2)
        pushRetryPause = 50_000_000
        pushAttempts = 40
        pushFloorBytesPerSecond = 2_000_000
        pushQueueBytes = 64 << 20
        antiEntropyInterval = max(100_000_000, min(1_000_000_000, presenceTimeout / 5))
        antiEntropyAfterRingChange = max(300_000_000, probeInterval * 3 / 2)
        handoffLimit = max(3_000_000_000, probeInterval * 15)
        heldBackRetry = probeInterval
        handoffAskAgain = max(300_000_000, probeInterval * 3 / 2)
        staleTakeoverHold = antiEntropyAfterRingChange + antiEntropyInterval
        backFromCutGrace = antiEntropyInterval * 2
        lease = probeInterval * 3
        cutOffAfter = lease + probeInterval * 2
        aloneAfter = max(3_000_000_000, probeInterval * 15)
        movedMemory = presenceTimeout * 10
        endRetryPause = 1_000_000_000
        endRetryAttempts = 10
        streamsEndWait = 1_000_000_000
        goodbyeMargin = routingLastAttempt
    }

    /// Timeout of one attempt of a push of about `bytes`: the first attempt's time plus what the
    /// bytes take at `pushFloorBytesPerSecond`, at most `pushTimeout` (0.7 s for a small batch,
    /// 1.75 s for the largest, 2 MiB). A message lost on a lossy link holds the queue behind it
    /// only this long: with a whole `pushTimeout` per attempt, one loss held a replica's copies
    /// past the replication wait, and the writes answered meanwhile were lost with their owner.
    public func pushAttemptTimeout(bytes: Int) -> UInt64 {
        let (scaled, overflow) = UInt64(max(0, bytes)).multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else { return pushTimeout }
        return min(pushTimeout, firstPushTimeout &+ min(pushTimeout, scaled / max(1, pushFloorBytesPerSecond)))
    }

    /// How a gateway retries one call (`RoutingWindow`).
    public var routingWindow: RoutingWindow.Settings {
        RoutingWindow.Settings(window: routingRetry, firstAttempt: firstPushTimeout, callTimeout: peerCallTimeout,
                               minimumAttempt: routingLastAttempt)
    }
}
