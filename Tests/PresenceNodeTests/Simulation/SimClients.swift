import EventLoop
import GRPCTransport
@testable import PresenceNode
import PresenceWire

/// A value a closure can change (used from the driver's thread only).
final class Box<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// Model clients that behave as `Cluster/chaos`'s do (RELIABILITY.md, "The fault model"): each
/// user holds one session and its stream; on a broken stream it resumes the session on another
/// node; a stream to a node it cannot reach is given up after 2.5 s (keepalive); a call is retried
/// (2.5 s per attempt) once on the same node, then the session moves and the call is retried,
/// until a definite answer or 30 s; a session that could not be resumed is recovered (new session,
/// channels, state and status again). Every call, resume and event goes to `SimRecords`.
/// `@unchecked Sendable`: used from the driver's thread only (see `SimWorld`).
final class SimClients: @unchecked Sendable {
    static let attemptDeadline: UInt64 = 2_500_000_000
    /// A keepalive ping every second, answered within 1.5 s (as the chaos clients' channels).
    static let keepaliveTime: UInt64 = 1_000_000_000
    static let keepaliveTimeout: UInt64 = 1_500_000_000
    static let callCap: UInt64 = 30_000_000_000
    static let channels = (0..<5).map { "ch\($0)" }

    final class User: @unchecked Sendable {
        let name: String
        var sid: String?
        var node: String?
        /// The gateway the session was on before `node`.
        var before: String?
        /// A roam under way: the node its resume tries first.
        var roamingTo: String?
        /// Actions until the device's network changes back (a roam that flips back and forth).
        var roamsBackIn: Int?
        var stream: SimStream?
        var connected = false
        /// Bumped on every new stream.
        var gen = 0
        var resuming = false
        var closing = false
        /// What the server acknowledged (the SDK's view): channel -> state.
        var channels: [String: [String: String]] = [:]
        var status = UserStatus.online
        /// The status of the SetStatus in flight, if any: a resume restores the status the user
        /// wants, as an SDK does (it carries the acknowledged one otherwise).
        var wanted: UserStatus?
        /// A status chosen while the stream was down (an app sent to the background): the resume
        /// carries it as its initial status, which sets it as the session opens whichever path
        /// the resume takes (API.md, `initial_status`).
        var chosenWhileDown: UserStatus?
        /// Users the session watches, as acknowledged (a Watch answered; the home keeps the list
        /// across resumes, and a recovered session watches them again).
        var watching: Set<String> = []
        /// A Watch without a definite answer: what the session watches is not known exactly.
        var watchUncertain = false
        var waiters: [OneShot<Void>] = []
        /// What fails each call in flight on a node's connection when its keepalive gives up.
        var inFlight: [String: [() -> Void]] = [:]

        init(name: String) { self.name = name }

        func wake() {
            let w = waiters
            waiters = []
            for x in w { x.complete(()) }
        }
    }

    let cluster: SimCluster
    let records = SimRecords()
    let door: SimClientDoor
    private(set) var users: [User]
    var stopped = false
    private var counter = 0
    var timeout: UInt64 { UInt64(cluster.presenceTimeout * 1e9) }
    var world: SimWorld { cluster.world }

    /// Whether the clients Watch other users too (`SimScenario.Options.clientsWatch`).
    let watches: Bool
    /// Whether the clients' networks change now and then (`SimScenario.Options.clientsRoam`).
    let roams: Bool

    init(cluster: SimCluster, count: Int, watching: Bool = false, roaming: Bool = false) {
        self.cluster = cluster
        watches = watching
        roams = roaming
        door = SimClientDoor(cluster: cluster)
        users = (1...count).map { User(name: "u\($0)") }
        cluster.onUnreachable = { [unowned self] in unreachable($0) }
    }

    // MARK: running

    func start() {
        for u in users {
            let loop = cluster.clients
            loop.execute { Task(executorPreference: loop) { await self.work(u) } }
        }
    }

    func sleep(_ ns: UInt64) async {
        let done = OneShot<Void>()
        cluster.clients.after(ns) { done.complete(()) }
        await done.value
    }

    private func random(_ n: UInt64) -> UInt64 { world.random(below: n) }

    /// The keepalive: clients of a node that stopped answering give its stream up when the next
    /// ping goes unanswered (1.5 to 2.5 s after), if it still does not answer, and resume elsewhere.
    func unreachable(_ node: String) {
        let since = world.now
        for u in users where u.connected && u.node == node {
            let gen = u.gen
            cluster.clients.after(Self.keepaliveTimeout + random(Self.keepaliveTime)) { [self] in
                guard u.gen == gen, u.connected, !cluster.clientReachable(node) else { return }
                broke(u, origin: since, why: "keepalive")
                // (the connection is closed: every call in flight on it fails at once)
                for fail in u.inFlight.removeValue(forKey: node) ?? [] { fail() }
            }
        }
    }

    private func work(_ u: User) async {
        await openFresh(u)
        while !stopped {
            await sleep(300_000_000 + random(1_200_000_000))
            if stopped { break }
            if let n = u.roamsBackIn {
                u.roamsBackIn = n > 0 ? n - 1 : nil
                if n == 0, let back = u.before { roam(u, to: back); continue }
            }
            let r = random(100)
            let joined = u.channels.keys.sorted()
            if r < 35 || joined.isEmpty {
                let ch = Self.channels[Int(random(UInt64(Self.channels.count)))]
                if u.channels[ch] == nil { await join(u, ch) }
            } else if r < 55 {
                await leave(u, joined[Int(random(UInt64(joined.count)))])
            } else if r < 85 {
                counter += 1
                await setState(u, joined[Int(random(UInt64(joined.count)))], key: "k\(random(3))", value: "v\(counter)")
            } else if r < (watches ? 93 : 96) {
                await setStatus(u, [UserStatus.online, .away, .busy][Int(random(3))])
            } else if watches && r < 97 {
                // (as the chaos clients: watch one more user, and now and then stop watching one)
                let others = users.map(\.name).filter { $0 != u.name }
                let remove = u.watching.isEmpty || random(2) == 0 ? [] : [u.watching.sorted()[Int(random(UInt64(u.watching.count)))]]
                let add = [others[Int(random(UInt64(others.count)))]].filter { !remove.contains($0) }
                await watch(u, add: add, remove: remove)
            } else if roams && random(2) == 0 {
                // (to any node, the one it is on included; half the time it flips back after
                // an action or two, as a phone on the edge of its Wi-Fi does)
                roam(u, to: cluster.ids[Int(random(UInt64(cluster.ids.count)))])
                if random(2) == 0 { u.roamsBackIn = Int(random(2)) }
            } else {
                await close(u)
                await sleep(500_000_000 + random(1_500_000_000))
                if !stopped { await openFresh(u) }
            }
        }
    }

    // MARK: sessions and streams

    enum Opened { case opened(sid: String, resumed: Bool), failed(GRPCStatus) }

    /// Opens a stream on `node` (resuming `resume` when given); answers when `opened` arrives, the
    /// stream fails, or the attempt's deadline passes.
    private func openOn(_ u: User, _ node: String, resume: String, status: UserStatus) async -> Opened {
        let first = OneShot<Opened>()
        u.gen += 1
        let gen = u.gen
        var req = OpenSessionRequest(userID: u.name, resumeSessionID: resume)
        req.initialStatus = status
        let streamSid = Box<String?>(nil)
        let stream = door.open(node, req, event: { [self] e in
            switch e.event {
            case .opened(let o)?:
                streamSid.value = o.sessionID
                first.complete(.opened(sid: o.sessionID, resumed: o.resumed))
            case .presence(let p)?:
                if u.gen == gen, let sid = streamSid.value {
                    records.received.append(.init(t: world.now, sid: sid, node: node, event: p))
                    world.detail("\(u.name) s=\(sid.prefix(6)) via \(node) got \(p.type) \(p.channelName) seq \(p.sequence) \(p.publisher) "
                                 + "\(p.snapshot.count) listed\(p.snapshotContinues ? " (continues)" : "")")
                }
            case .status(let s)?:
                if u.gen == gen, let sid = streamSid.value {
                    records.sawStatus(sid, of: s.userID, s.status, at: world.now, how: "a status event via \(node)")
                    world.detail("\(u.name) s=\(sid.prefix(6)) via \(node) got status \(s.userID) \(s.status)")
                }
            default: break
            }
        }, ended: { [self] status in
            first.complete(.failed(status))
            // (as the chaos clients: a stream ended OK while closing is the close; any other end,
            // a close under way included, is a break, and the session is resumed elsewhere)
            if u.gen == gen && u.connected && !(u.closing && status.code == .ok) { broke(u, origin: world.now, why: "stream ended: \(status.code)") }
        })
        cluster.clients.after(Self.attemptDeadline) { first.complete(.failed(GRPCStatus(.deadlineExceeded, "no opened"))) }
        let outcome = await first.value
        world.detail("\(u.name) open on \(node) resume=\(resume.prefix(6)): \(outcome)")
        if case .opened(let sid, _) = outcome, u.gen == gen {
            if u.node != node { u.before = u.node }
            u.sid = sid
            u.node = node
            u.stream = stream
            u.connected = true
            records.attachments[sid, default: []].append((world.now, node))
            u.wake()
        } else {
            stream.cancel()
        }
        return outcome
    }

    private func nodesInOrder(avoiding: String?) -> [String] {
        var ids = cluster.ids
        for i in stride(from: ids.count - 1, to: 0, by: -1) { ids.swapAt(i, Int(random(UInt64(i + 1)))) }
        if let avoiding, let k = ids.firstIndex(of: avoiding) { ids.append(ids.remove(at: k)) }
        return ids
    }

    /// A new session, on the first node that answers (retried until the call cap).
    private func openFresh(_ u: User) async {
        let t0 = world.now
        let i = records.began(.init(user: u.name, sid: "", method: "OpenSession", channel: nil, t0: t0))
        while world.now - t0 < Self.callCap {
            for node in nodesInOrder(avoiding: nil) {
                records.calls[i].attempts += 1
                if case .opened(let sid, _) = await openOn(u, node, resume: "", status: u.status) {
                    records.calls[i].outcome = .ok
                    records.calls[i].t1 = world.now
                    _ = sid
                    return
                }
            }
            await sleep(200_000_000)
        }
        records.calls[i].outcome = .gaveUp
        records.calls[i].t1 = world.now
        records.tainted.insert(u.name)
    }

    /// The device's network changed: its stream drops (its gateway sees the connection end)
    /// and the session is resumed at once, on `node` first.
    private func roam(_ u: User, to node: String) {
        guard u.connected, !u.resuming, !u.closing else { return }
        u.roamingTo = node
        broke(u, origin: world.now, why: "roamed to \(node)")
    }

    /// The stream of `u` stopped working at `origin`: resume the session elsewhere.
    private func broke(_ u: User, origin: UInt64, why: String) {
        guard u.connected else { return }
        world.log("\(u.name) stream broke (\(why))")
        u.connected = false
        u.stream?.cancel()
        u.wake()
        guard !u.resuming else { return }
        u.resuming = true
        let loop = cluster.clients
        loop.execute { Task(executorPreference: loop) { await self.resume(u, origin: origin) } }
    }

    private func resume(_ u: User, origin: UInt64) async {
        defer { u.resuming = false }
        guard let sid = u.sid else { return }
        // (a CloseSession whose answer was lost may have ended the session: a refused resume then
        // confirms the close, as an SDK takes it, and nothing is recovered)
        func closedInDoubt() -> Bool {
            guard u.closing else { return false }
            u.sid = nil
            u.wake()
            return true
        }
        let from = u.node
        let first = u.roamingTo
        u.roamingTo = nil
        await sleep(100_000_000)
        if u.wanted == nil && random(3) == 0 { u.chosenWhileDown = [UserStatus.online, .away, .busy][Int(random(3))] }
        defer { u.chosenWhileDown = nil }
        // (a resume that did not keep the session: the status chosen meanwhile is the one the
        // recovery sets)
        func keepChosen() { if let c = u.chosenWhileDown { u.status = c } }
        while world.now - origin < timeout + 10_000_000_000 {
            var order = nodesInOrder(avoiding: from)
            if let first, let k = order.firstIndex(of: first) { order.insert(order.remove(at: k), at: 0) }
            for node in order {
                let t0 = world.now
                // (the resume sets the status it carries as the session's home takes it over: a
                // write of its own, acknowledged with `opened`)
                let status = u.wanted ?? u.chosenWhileDown ?? u.status
                switch await openOn(u, node, resume: sid, status: status) {
                case .opened(let got, let resumed):
                    if resumed && got == sid { u.status = status }
                    records.resumes.append(.init(user: u.name, sid: sid, node: node, t0: t0, origin: origin, outcome: resumed ? .resumed : .newSession))
                    if !resumed || got != sid {
                        keepChosen()
                        await recover(u, lost: sid, origin: origin, fresh: true)
                    }
                    return
                case .failed(let status) where status.code == .notFound || status.code == .permissionDenied:
                    if closedInDoubt() { return }
                    records.resumes.append(.init(user: u.name, sid: sid, node: node, t0: t0, origin: origin, outcome: .refused(status.code)))
                    keepChosen()
                    await recover(u, lost: sid, origin: origin, fresh: false)
                    return
                case .failed:
                    continue
                }
            }
            await sleep(200_000_000)
        }
        if closedInDoubt() { return }
        records.losses.append((u.name, sid, origin, world.now))
        keepChosen()
        await recover(u, lost: sid, origin: origin, fresh: false)
    }

    /// The session `lost` is gone: a new one (unless `fresh` is one already) with the same
    /// channels, state and status, as an SDK restores them.
    private func recover(_ u: User, lost: String, origin: UInt64, fresh: Bool) async {
        records.left(lost, nil, at: origin, periodsAt: world.now)
        if !fresh { await openFresh(u) }
        let want = u.channels
        u.channels = [:]
        for (ch, state) in want.sorted(by: { $0.key < $1.key }) {
            await join(u, ch)
            for (k, v) in state.sorted(by: { $0.key < $1.key }) { await setState(u, ch, key: k, value: v) }
        }
        await setStatus(u, u.status)
        if !u.watching.isEmpty {
            let again = u.watching.sorted()
            u.watching = []
            await watch(u, add: again, remove: [])
        }
    }

    /// Waits up to `ns` for `u` to be connected; its (sid, node, gen) then.
    private func connected(_ u: User, within ns: UInt64) async -> (String, String, Int)? {
        let deadline = world.now + ns
        while !u.connected || u.sid == nil {
            guard world.now < deadline else { return nil }
            let w = OneShot<Void>()
            u.waiters.append(w)
            cluster.clients.after(deadline - world.now) { w.complete(()) }
            await w.value
        }
        return (u.sid!, u.node!, u.gen)
    }

    // MARK: calls

    /// One session call, retried to a definite answer (see the type's comment); its outcome.
    private func call<Req: ProtoMessage, Resp: ProtoMessage>(_ u: User, _ method: MethodDescriptor<Req, Resp>, channel: String?,
                                                             answered: ((Resp) -> Void)? = nil,
                                                             _ build: (String) -> Req) async -> SimRecords.Outcome {
        let t0 = world.now
        let sid0 = u.sid ?? ""
        let name = String(method.path.split(separator: "/").last ?? "")
        let i = records.began(.init(user: u.name, sid: sid0, method: name, channel: channel, t0: t0))
        if name == "Join", let channel { records.joinStarted(u.name, sid0, channel, at: t0) }
        if name == "Leave", let channel { records.left(sid0, channel, at: t0) }
        var sameNodeFailures = 0
        var lastNode: String?
        var outcome = SimRecords.Outcome.pending
        while outcome == .pending {
            guard world.now - t0 < Self.callCap else { outcome = .gaveUp; break }
            let got = await connected(u, within: 5_000_000_000)
            if u.sid != sid0 { outcome = .sessionLost; break }
            guard let (sid, node, gen) = got else { continue }
            if node != lastNode { sameNodeFailures = 0; lastNode = node }
            records.calls[i].attempts += 1
            let sent = world.now
            let result = await door.unary(node, method, build(sid), timeout: Self.attemptDeadline) { u.inFlight[node, default: []].append($0) }
            records.calls[i].tries.append((node, sent, world.now))
            world.detail("\(u.name) \(name)\(channel.map { " " + $0 } ?? "") attempt \(records.calls[i].attempts) on \(node): \(result.map { _ in "ok" })")
            switch result {
            case .success(let response):
                answered?(response)
                outcome = .ok
            case .failure(let s) where s.code == .unavailable || s.code == .deadlineExceeded:
                if u.gen != gen { continue }
                sameNodeFailures += 1
                if sameNodeFailures >= 2 {
                    broke(u, origin: world.now, why: "calls fail: move")
                    sameNodeFailures = 0
                } else {
                    await sleep(100_000_000)
                }
            case .failure(let s) where s.code == .notFound:
                // the stream may be breaking (the node died and came back): wait for the resume
                let before = u.gen
                await sleep(1_000_000_000)
                if u.gen != before || !u.connected { continue }
                if name == "CloseSession" {
                    // the session is gone either way: an SDK takes it as closed (as the chaos
                    // clients do); after an attempt without an answer, the retry must not fail
                    outcome = .ok
                    records.calls[i].notes.append(records.calls[i].attempts > 1
                        ? "not idempotent: the retried CloseSession answered NOT_FOUND"
                        : "vanished: \(node) answered CloseSession of a connected session with \(s.message)")
                    break
                }
                records.calls[i].notes.append("vanished: \(node) answered \(name) with \(s.message) while the stream was up")
                outcome = .error(s.code, s.message)
            case .failure(let s):
                outcome = .error(s.code, s.message)
            }
        }
        records.calls[i].outcome = outcome
        records.calls[i].t1 = world.now
        if outcome == .gaveUp { records.tainted.insert(u.name) }
        return outcome
    }

    private func join(_ u: User, _ ch: String) async {
        let o = await call(u, PresenceMethods.join, channel: ch) { JoinRequest(sessionID: $0, channelName: ch, channelType: .message, withPresence: true) }
        if o == .ok, let sid = u.sid {
            u.channels[ch] = u.channels[ch] ?? [:]
            records.joined(u.name, sid, ch, at: world.now)
        } else if o != .sessionLost {
            records.periods.indices.filter { records.periods[$0].sid == u.sid && records.periods[$0].channel == ch }.forEach { records.periods[$0].uncertain = true }
        }
    }

    private func leave(_ u: User, _ ch: String) async {
        let o = await call(u, PresenceMethods.leave, channel: ch) { LeaveRequest(sessionID: $0, channelName: ch, channelType: .message) }
        if o == .ok { u.channels[ch] = nil }
    }

    private func setState(_ u: User, _ ch: String, key: String, value: String) async {
        let o = await call(u, PresenceMethods.setState, channel: ch) {
            SetStateRequest(sessionID: $0, channelName: ch, channelType: .message, items: [StateItem(key: key, value: value)])
        }
        if o == .ok, u.channels[ch] != nil { u.channels[ch]![key] = value }
    }

    private func setStatus(_ u: User, _ status: UserStatus) async {
        u.wanted = status
        let o = await call(u, PresenceMethods.setStatus, channel: nil) { SetStatusRequest(sessionID: $0, status: status) }
        u.wanted = nil
        if o == .ok { u.status = status }
    }

    private func watch(_ u: User, add: [String], remove: [String]) async {
        let sid = u.sid
        let o = await call(u, PresenceMethods.watch, channel: nil, answered: { [self] r in
            guard let sid, u.sid == sid else { return }
            for e in r.statuses { records.sawStatus(sid, of: e.userID, e.status, at: world.now, how: "the Watch answer") }
        }) { WatchRequest(sessionID: $0, userIDs: add, unwatchUserIDs: remove) }
        if o == .ok {
            u.watching.subtract(remove)
            u.watching.formUnion(add)
        } else if o != .sessionLost {
            u.watchUncertain = true
        }
    }

    private func close(_ u: User) async {
        guard let sid = u.sid else { return }
        records.left(sid, nil, at: world.now)
        u.closing = true
        defer { u.closing = false }
        let o = await call(u, PresenceMethods.closeSession, channel: nil) { CloseSessionRequest(sessionID: $0) }
        if o != .ok && o != .sessionLost { records.tainted.insert(u.name) }
        u.connected = false
        u.gen += 1
        u.stream?.cancel()
        u.sid = nil
        u.node = nil
        u.before = nil
        u.roamsBackIn = nil
        u.channels = [:]
        u.watching = []
        u.watchUncertain = false
    }
}
