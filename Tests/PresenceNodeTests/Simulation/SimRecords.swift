import GRPCTransport
import PresenceWire

/// What the model clients did and saw (every call, resume, stay in a channel and event), kept for
/// the checker: the same records `Cluster/chaos`'s model keeps. Times are virtual nanoseconds.
/// `@unchecked Sendable`: used from the driver's thread only (see `SimWorld`).
final class SimRecords: @unchecked Sendable {
    enum Outcome: Equatable {
        case pending, ok, gaveUp, sessionLost
        case error(GRPCStatus.Code, String)
    }

    struct Call {
        let user: String
        let sid: String
        let method: String
        let channel: String?
        let t0: UInt64
        var t1: UInt64 = 0
        var attempts = 0
        /// Each attempt: the node it went to, when it was sent and when its answer (or the
        /// client's deadline) came.
        var tries: [(node: String, t0: UInt64, t1: UInt64)] = []
        var outcome = Outcome.pending
        var notes: [String] = []
    }

    enum ResumeOutcome: Equatable { case resumed, newSession, refused(GRPCStatus.Code) }

    struct Resume {
        let user: String
        let sid: String
        let node: String
        let t0: UInt64
        /// The session's last sign of life: when its stream stopped working.
        let origin: UInt64
        var outcome: ResumeOutcome
    }

    /// A session certainly in a channel (its Join answered, its Leave not yet sent), for the flap check.
    struct Stay {
        let user: String
        let sid: String
        let channel: String
        let from: UInt64
        var to: UInt64 = .max
    }

    /// A subscription (Join with presence sent .. Leave sent or the session gone), for invariant 5.
    struct Period {
        let user: String
        let sid: String
        let channel: String
        let start: UInt64
        var end: UInt64 = .max
        var uncertain = false
    }

    struct Received {
        let t: UInt64
        let sid: String
        let node: String
        let event: PresenceEvent
    }

    var calls: [Call] = []
    var resumes: [Resume] = []
    /// Sessions no node would resume within the presence timeout (user, sid, origin, given up at).
    var losses: [(user: String, sid: String, origin: UInt64, t: UInt64)] = []
    var stays: [Stay] = []
    var periods: [Period] = []
    var received: [Received] = []
    /// Where each session's stream was attached, in time order.
    var attachments: [String: [(t: UInt64, node: String)]] = [:]
    /// When clients could not reach a node (paused, cut off): (node, from, to).
    var unreachable: [(node: String, from: UInt64, to: UInt64)] = []
    /// When a node was cut off from every other node while its clients still reached it.
    var cutOff: [(node: String, from: UInt64, to: UInt64)] = []
    /// Each fault's window: from its start to the membership's convergence after it ended (two
    /// faults started at once have the same window). Invariant 7 promises 5 s during a single
    /// fault: a call whose first 5 s overlap the windows of two faults is held to 5 s for each.
    var faultWindows: [(from: UInt64, to: UInt64)] = []
    /// Users whose model is not exact (a call gave up): left out of the listing checks.
    var tainted: Set<String> = []
    /// The last status each session received for each user (a Watch answer or a status event).
    var statusSeen: [String: [String: (t: UInt64, status: UserStatus, how: String)]] = [:]

    func sawStatus(_ sid: String, of user: String, _ status: UserStatus, at t: UInt64, how: String) {
        if let last = statusSeen[sid]?[user], last.t > t { return }
        statusSeen[sid, default: [:]][user] = (t, status, how)
    }

    func began(_ call: Call) -> Int {
        calls.append(call)
        return calls.count - 1
    }

    func joinStarted(_ user: String, _ sid: String, _ channel: String, at t: UInt64) {
        guard !periods.contains(where: { $0.sid == sid && $0.channel == channel && $0.end == .max }) else { return }
        periods.append(Period(user: user, sid: sid, channel: channel, start: t))
    }

    func joined(_ user: String, _ sid: String, _ channel: String, at t: UInt64) {
        guard !stays.contains(where: { $0.sid == sid && $0.channel == channel && $0.to == .max }) else { return }
        stays.append(Stay(user: user, sid: sid, channel: channel, from: t))
    }

    /// The session leaves `channel` (nil: every channel) from `t` on.
    func left(_ sid: String, _ channel: String?, at t: UInt64, periodsAt: UInt64? = nil) {
        for i in stays.indices where stays[i].sid == sid && stays[i].to == .max && (channel == nil || stays[i].channel == channel) {
            stays[i].to = t
        }
        for i in periods.indices where periods[i].sid == sid && periods[i].end == .max && (channel == nil || periods[i].channel == channel) {
            periods[i].end = periodsAt ?? t
        }
    }

    /// True when some session of `user` was in `channel` for all of [a, b].
    func certainlyIn(_ user: String, _ channel: String, _ a: UInt64, _ b: UInt64) -> [String] {
        stays.filter { $0.user == user && $0.channel == channel && $0.from <= a && $0.to >= b }.map(\.sid)
    }

    /// The window, if any, in which `sid`'s stream sat at least `atLeast` on a node clients could
    /// not reach, or that was cut off from every other node, without the client moving, around
    /// time `t`: then the session was effectively disconnected and its timeout is legitimate
    /// (RELIABILITY.md invariant 3: its gateway cut off for longer than the timeout).
    func stall(_ sid: String, at t: UInt64, atLeast: UInt64) -> Int? {
        guard let (node, next) = attachment(of: sid, at: t) else { return nil }
        let windows = unreachable + cutOff
        return windows.indices.first { k in
            let w = windows[k]
            return w.node == node && w.from <= t && min(w.to, next) - w.from >= atLeast
        }
    }

    /// When the cluster last heard of `sid` if its stream sat at `t` on a node cut off from every
    /// other node (its clients still reaching it), or had until less than `afterHeal` before: the
    /// start of that cut. Nil otherwise. (Just after the heal, the node answers NO_LEASE until a
    /// probe is answered, and its sessions reach their homes again with the next anti-entropy
    /// round: a client that moves then finds its session as the cluster last knew it.)
    func cutOffSince(_ sid: String, at t: UInt64, afterHeal: UInt64 = 0) -> UInt64? {
        guard let (node, _) = attachment(of: sid, at: t) else { return nil }
        return cutOff.filter { $0.node == node && $0.from <= t && $0.to &+ afterHeal >= t }.map(\.from).min()
    }

    /// The node `sid`'s stream was attached to at `t`, and when it next moved (`.max`: never).
    private func attachment(of sid: String, at t: UInt64) -> (node: String, next: UInt64)? {
        let att = attachments[sid] ?? []
        guard let i = att.lastIndex(where: { $0.t <= t }) else { return nil }
        return (att[i].node, i + 1 < att.count ? att[i + 1].t : .max)
    }
}
