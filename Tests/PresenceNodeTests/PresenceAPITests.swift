import EventLoop
import Foundation
import GRPCTransport
@testable import PresenceClient
import PresenceCore
@testable import PresenceNode
import PresenceWire
import Synchronization
import TestSupport
import Testing

@Suite(.serialized) struct PresenceAPITests {
    @Test func watcherSeesSnapshotJoinStateChangesAndLeave() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), tony = n.client("tony")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await ann.join("lobby", withPresence: true)
        let snap = try await inbox.waitFor(.snapshot)
        #expect(snap.snapshot.map(\.userID) == ["ann"])
        try await tony.connect()
        try await tony.setState("lobby", ["mic": "on"])          // before joining: kept, applied on join
        try await tony.join("lobby", withPresence: false)
        #expect(try await inbox.waitFor(.remoteJoin, publisher: "tony").sequence > snap.sequence)
        let st = try await inbox.waitFor(.remoteStateChanged, publisher: "tony")
        #expect(st.states == [StateItem(key: "mic", value: "on")])
        try await tony.setState("lobby", ["cam": "off"])
        let full = try await inbox.waitFor(.remoteStateChanged, publisher: "tony", count: 2)
        #expect(full.states == [StateItem(key: "cam", value: "off"), StateItem(key: "mic", value: "on")])
        try await tony.leave("lobby")
        try await inbox.waitFor(.remoteLeave, publisher: "tony")
        // sequence order within the channel
        let seqs = inbox.presence.map(\.sequence)
        #expect(seqs == seqs.sorted())
        #expect(inbox.presence.allSatisfy { $0.timestampMs > 1_700_000_000_000 })
        await tony.close(); await ann.close()
        await n.stop()
    }

    /// A state write answered at once (the test node has one loop, so every channel's shard runs on
    /// the caller's connection's loop) is noted at the session's gateway as acknowledged, as one
    /// answered later is: the gateway re-announces it to a new owner after a failover.
    @Test func aStateWriteAnsweredAtOnceIsNotedAtTheGateway() async throws {
        let n = try TestNode()
        let tony = n.client("tony")
        try await tony.connect()
        try await tony.join("lobby", withPresence: false)
        let text = try #require(tony.sessionID)
        let id = try #require(SessionID(text: text))
        let key = ChannelKey(name: "lobby", type: .message)
        let gateway = n.node.engine.core.gatewayShard(id)
        try await tony.setState("lobby", ["mic": "on", "cam": "off"])
        #expect(gateway.held(id)?.channels[key]?.state == [StateItem(key: "cam", value: "off"), StateItem(key: "mic", value: "on")])
        try await tony.removeState("lobby", keys: ["cam"])
        #expect(gateway.held(id)?.channels[key]?.state == [StateItem(key: "mic", value: "on")])
        await tony.close()
        await n.stop()
    }

    /// With two loops, a call whose channel's shard runs on the other loop than its connection's
    /// is handed to that loop (no task); one on the same loop is answered at once. Either way the
    /// writes land, are noted at the gateway, and reads see them.
    @Test func callsWhoseShardRunsOnAnotherLoopAreHandedToIt() async throws {
        let n = try TestNode(threads: 2)
        let users = ["ann", "bob", "cat", "dan"]
        let clients = users.map { n.client($0) }
        for c in clients { try await c.connect() }
        let key = ChannelKey(name: "lobby", type: .message)
        for (i, c) in clients.enumerated() {
            try await c.join("lobby", withPresence: false)
            try await c.setState("lobby", ["seat": String(i), "mic": "on"])
            try await c.removeState("lobby", keys: ["mic"])
        }
        for (i, c) in clients.enumerated() {
            let text = try #require(c.sessionID)
            let id = try #require(SessionID(text: text))
            #expect(n.node.engine.core.gatewayShard(id).held(id)?.channels[key]?.state == [StateItem(key: "seat", value: String(i))])
            for (j, user) in users.enumerated() {
                #expect(try await c.getState("lobby", user: user) == [StateItem(key: "seat", value: String(j))])
            }
            let page = try await c.onlineUsers("lobby", includeState: true)
            #expect(page.users.map(\.userID) == users)
            #expect(page.users.map(\.states) == users.indices.map { [StateItem(key: "seat", value: String($0))] })
        }
        for c in clients { await c.close() }
        await n.stop()
    }

    @Test func ownCallsCauseNoEventToTheCaller() async throws {
        let n = try TestNode()
        let ann = n.client("ann")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await ann.join("room", withPresence: true)
        try await ann.setState("room", ["typing": "yes"])
        try await ann.removeState("room", keys: ["typing"])
        let bob = n.client("bob")
        try await bob.connect()
        try await bob.join("room", withPresence: false)
        try await inbox.waitFor(.remoteJoin, publisher: "bob")
        #expect(inbox.presence.map(\.type) == [.snapshot, .remoteJoin])
        await ann.close(); await bob.close()
        await n.stop()
    }

    @Test func multiDeviceUserJoinsOnceAndLeavesWithItsLastSession() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), phone = n.client("tony"), laptop = n.client("tony")
        let inbox = Inbox(ann)
        try await ann.connect(); try await phone.connect(); try await laptop.connect()
        try await ann.join("c", withPresence: true)
        try await phone.join("c")
        try await laptop.join("c")
        try await inbox.waitFor(.remoteJoin, publisher: "tony")
        try await phone.leave("c")
        let online = try await ann.onlineUsers("c")
        #expect(online.totalOccupancy == 2)
        try await laptop.leave("c")
        try await inbox.waitFor(.remoteLeave, publisher: "tony")
        #expect(inbox.presence.filter { $0.publisher == "tony" }.map(\.type) == [.remoteJoin, .remoteLeave])
        await ann.close(); await phone.close(); await laptop.close()
        await n.stop()
    }

    @Test func closeSessionLeavesEverywhereAndReadsOffline() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), tony = n.client("tony")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await tony.connect(initialStatus: .busy)
        try await ann.join("a", withPresence: true)
        let watched = try await ann.watch(["tony"])
        #expect(watched == [UserStatusEntry(userID: "tony", status: .busy)])
        try await tony.join("a"); try await tony.join("b", type: .stream)
        #expect(Set(try await ann.userChannels("tony").map(\.channelName)) == ["a", "b"])
        await tony.close()
        try await inbox.waitFor(.remoteLeave, publisher: "tony")
        try await inbox.waitForStatus("tony", .offline)
        #expect(try await ann.userChannels("tony").isEmpty)
        #expect(try await ann.statuses(["tony", "never"]) == [UserStatusEntry(userID: "tony", status: .offline), UserStatusEntry(userID: "never", status: .unknown)])
        await ann.close()
        await n.stop()
    }

    @Test func brokenStreamTimesOutAfterThePresenceTimeout() async throws {
        let n = try TestNode(presenceTimeout: 0.4)
        let ann = n.client("ann")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await ann.join("lobby", withPresence: true)
        try await ann.watch(["ghost"])
        // a raw client opens a session, joins, then drops its stream without CloseSession
        let raw = n.raw()
        let stream = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "ghost"))
        guard case .opened(let o)? = try await next(stream)?.event else { Issue.record("no opened"); return }
        _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: "lobby", channelType: .message))
        _ = try await raw.unary(PresenceMethods.setState, SetStateRequest(sessionID: o.sessionID, channelName: "lobby", channelType: .message, items: [StateItem(key: "k", value: "v")]))
        try await inbox.waitFor(.remoteJoin, publisher: "ghost")
        let t0 = MonotonicClock.now()
        stream.cancel()
        try await inbox.waitFor(.remoteTimeout, publisher: "ghost", within: 3)
        let waited = Double(MonotonicClock.now() - t0) / 1e9
        #expect(waited >= 0.35 && waited < 1.5, "timed out after \(waited) s")
        try await inbox.waitForStatus("ghost", .offline)
        await expectError(.notFound, "PRESENCE_USER_NOT_EXIST") { _ = try await ann.getState("lobby", user: "ghost") }
        await expectError(.notFound, "SESSION_NOT_FOUND") {
            _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: "x", channelType: .message))
        }
        raw.close()
        await ann.close()
        await n.stop()
    }

    /// Found by Cluster/chaos (rolling restart): a resume that was still in flight when the
    /// shutdown ended every stream attached its stream afterwards, and it stayed open for the whole
    /// grace period while the others already timed the session out. It must end at once.
    @Test func aStreamOpenedAfterTheShutdownEndedStreamsEndsAtOnce() async throws {
        let n = try TestNode(presenceTimeout: 2)
        await n.node.engine.endAllStreams()
        let raw = n.raw()
        let ended = Mutex<GRPCStatus?>(nil)
        let reader = Task {
            let stream = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "late"))
            do {
                for try await _ in stream {}
            } catch let s as GRPCStatus {
                ended.withLock { $0 = s }
            } catch {}
        }
        try await waitUntil("the stream ended", within: 2) { ended.withLock { $0 != nil } }
        let status = ended.withLock { $0 }
        #expect(status?.code == .unavailable && status?.message.hasPrefix("SHUTTING_DOWN") == true, "\(String(describing: status))")
        reader.cancel()
        raw.close()
        await n.stop()
    }

    @Test func resumeWithinTheTimeoutKeepsPresenceWithNoEvent() async throws {
        let n = try TestNode(presenceTimeout: 2)
        let ann = n.client("ann")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await ann.join("lobby", withPresence: true)
        let raw = n.raw()
        let first = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "tony"))
        guard case .opened(let o)? = try await next(first)?.event else { Issue.record("no opened"); return }
        _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: "lobby", channelType: .message, withPresence: true))
        _ = try await raw.unary(PresenceMethods.setState, SetStateRequest(sessionID: o.sessionID, channelName: "lobby", channelType: .message, items: [StateItem(key: "mic", value: "on")]))
        try await inbox.waitFor(.remoteStateChanged, publisher: "tony")
        first.cancel()
        try await waitUntil("tony's session disconnected") { n.node.engine.sessionCountsByLiveness().disconnected == 1 }
        // events while disconnected are buffered for the session
        try await ann.setState("lobby", ["hand": "up"])
        let second = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "tony", resumeSessionID: o.sessionID))
        guard case .opened(let again)? = try await next(second)?.event else { Issue.record("no opened"); return }
        #expect(again.sessionID == o.sessionID && again.resumed)
        guard case .presence(let missed)? = try await next(second)?.event else { Issue.record("no buffered event"); return }
        #expect(missed.type == .remoteStateChanged && missed.publisher == "ann")
        try await Task.sleep(nanoseconds: 2_300_000_000)  // past the original timeout
        #expect(!inbox.presence.contains { $0.publisher == "tony" && ($0.type == .remoteTimeout || $0.type == .remoteLeave) })
        #expect(try await ann.getState("lobby", user: "tony") == [StateItem(key: "mic", value: "on")])
        second.cancel()
        raw.close()
        await ann.close()
        await n.stop()
    }

    /// API.md, "Security": a resume by another user, or of an unknown or expired session, is
    /// refused and changes nothing (issue 9: it used to hand the session over, or leave a ghost).
    @Test func aResumeByAnotherUserOrOfAnUnknownOrExpiredSessionIsRefused() async throws {
        let n = try TestNode(presenceTimeout: 0.4)
        let raw = n.raw()
        let ann = n.client("ann")
        try await ann.connect()
        try await ann.join("lobby", withPresence: true)
        let annSession = try #require(ann.sessionID)
        func firstError(_ req: OpenSessionRequest) async throws -> GRPCStatus? {
            try await within(5, "the first answer to \(req)") {
                let stream = raw.serverStreaming(PresenceMethods.openSession, req)
                defer { stream.cancel() }
                do {
                    for try await e in stream { if case .opened = e.event { return nil } }
                } catch let s as GRPCStatus { return s }
                return nil
            }
        }
        let stolen = try await firstError(OpenSessionRequest(userID: "mallory", resumeSessionID: annSession))
        #expect(stolen?.code == .permissionDenied && stolen?.message.hasPrefix("NOT_YOUR_SESSION") == true, "\(String(describing: stolen))")
        // ann's session is still hers, and works
        try await ann.setState("lobby", ["mic": "on"])
        #expect(try await ann.getState("lobby", user: "ann") == [StateItem(key: "mic", value: "on")])
        for bad in ["0123456789abcdef", "not-a-session"] {
            let unknown = try await firstError(OpenSessionRequest(userID: "mallory", resumeSessionID: bad))
            #expect(unknown?.code == .notFound && unknown?.message.hasPrefix("SESSION_NOT_FOUND") == true, "\(String(describing: unknown))")
        }
        // an expired session: refused, and it does not come back (as a session nobody holds)
        let stream = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "gone"))
        guard case .opened(let o)? = try await next(stream)?.event else { Issue.record("no opened"); return }
        _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: "lobby", channelType: .message))
        stream.cancel()
        try await waitUntil("gone timed out", within: 3) { (try? await ann.onlineUsers("lobby").users.map(\.userID)) == ["ann"] }
        let late = try await firstError(OpenSessionRequest(userID: "gone", resumeSessionID: o.sessionID))
        #expect(late?.code == .notFound, "\(String(describing: late))")
        #expect(try await ann.statuses(["gone"]).first?.status == .offline)
        #expect(await n.node.engine.sessionCount() == 1)
        raw.close()
        await ann.close()
        await n.stop()
    }

    /// Issue 9: OpenSession calls cancelled at once left sessions nobody held, ONLINE for good
    /// (the session existed before `opened` was sent; when that send failed nothing broke it).
    @Test func openSessionsCancelledAtOnceLeaveNoSessionBehind() async throws {
        let n = try TestNode(presenceTimeout: 0.3)
        let raw = n.raw()
        let users = (0..<200).map { "c\($0)" }
        // cancelled at every point of the open: some before the server sees them, some while the
        // session is being created, some after `opened`
        for batch in stride(from: 0, to: users.count, by: 20) {
            let streams = users[batch..<batch + 20].map { raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: $0)) }
            try await Task.sleep(nanoseconds: UInt64(batch / 20) * 100_000)
            for s in streams { s.cancel() }
        }
        try await waitUntil("every session ended", within: 5) { await n.node.engine.sessionCount() == 0 }
        let probe = n.client("probe")
        try await probe.connect()
        let statuses = try await probe.statuses(users)
        #expect(statuses.allSatisfy { $0.status == .offline || $0.status == .unknown }, "\(statuses.filter { $0.status != .offline && $0.status != .unknown })")
        await probe.close()
        raw.close()
        await n.stop()
    }

    /// Issue 9: no cap on sessions per user (each holds memory at its gateway and its home).
    @Test func aUserMayHaveAtMost64SessionsOpen() async throws {
        let n = try TestNode(presenceTimeout: 2)
        let raw = n.raw()
        var open: [(ServerStreamingCall<SessionEvent>, String)] = []
        for _ in 0..<Limits.maxSessionsPerUser {
            let call = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "many"))
            guard case .opened(let o)? = try await next(call)?.event else { Issue.record("no opened"); return }
            open.append((call, o.sessionID))
        }
        let extra = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "many"))
        await expectStreamRefused(extra, .resourceExhausted, "SESSION_LIMIT")
        #expect(await n.node.engine.sessionCount() == Limits.maxSessionsPerUser)
        // closing one makes room
        _ = try await raw.unary(PresenceMethods.closeSession, CloseSessionRequest(sessionID: open[0].1))
        let again = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "many"))
        guard case .opened? = try await next(again)?.event else { Issue.record("no opened after a close"); return }
        again.cancel()
        for (c, _) in open { c.cancel() }
        raw.close()
        await n.stop()
    }

    /// Issue 9: no per-node cap on sessions (`--max-sessions`).
    @Test func aNodeHoldsAtMostMaxSessions() async throws {
        let n = try TestNode(maxSessions: 3)
        let raw = n.raw()
        var streams: [ServerStreamingCall<SessionEvent>] = []
        for i in 0..<3 {
            let call = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "u\(i)"))
            guard case .opened? = try await next(call)?.event else { Issue.record("no opened"); return }
            streams.append(call)
        }
        let fourth = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "u3"))
        await expectStreamRefused(fourth, .resourceExhausted, "NODE_SESSION_LIMIT")
        #expect(await n.node.engine.sessionCount() == 3)
        for s in streams { s.cancel() }
        raw.close()
        await n.stop()
    }

    /// API.md: only sessions that joined with presence get a channel's events, and a re-join may
    /// change `with_presence`: re-joined without it, a session gets nothing more from the channel.
    @Test func reJoiningWithoutPresenceStopsTheChannelsEvents() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), bob = n.client("bob"), cy = n.client("cy")
        let annInbox = Inbox(ann), cyInbox = Inbox(cy)
        for c in [ann, bob, cy] { try await c.connect() }
        try await ann.join("lobby", withPresence: true)
        try await cy.join("lobby", withPresence: true)
        try await bob.join("lobby", withPresence: false)
        try await annInbox.waitFor(.remoteJoin, publisher: "bob")
        try await ann.join("lobby", withPresence: false)   // the re-join
        try await bob.setState("lobby", ["mic": "on"])
        try await bob.leave("lobby")
        try await cyInbox.waitFor(.remoteLeave, publisher: "bob")
        // following the channel again brings a SNAPSHOT, after anything sent to ann before it
        // (a session gets a channel's events in sequence order)
        try await ann.join("lobby", withPresence: true)
        try await annInbox.waitFor(.snapshot, count: 2)
        let afterRejoin = annInbox.presence.filter { $0.publisher == "bob" && $0.type != .remoteJoin }
        #expect(afterRejoin.isEmpty, "\(afterRejoin.map(\.type))")
        for c in [ann, bob, cy] { await c.close() }
        await n.stop()
    }

    @Test func clientLibraryReconnectsAndResumes() async throws {
        let n = try TestNode(presenceTimeout: 3)
        let ann = n.client("ann"), tony = n.client("tony")
        let inbox = Inbox(ann)
        try await ann.connect(); try await tony.connect()
        try await ann.join("lobby", withPresence: true)
        try await tony.join("lobby")
        try await inbox.waitFor(.remoteJoin, publisher: "tony")
        let id = tony.sessionID
        let states = Task { var seen: [ConnectionState] = []; for await s in tony.connectionStates { seen.append(s); if seen.count >= 5 { break } }; return seen }
        tony.dropConnection()
        try await waitUntil("tony reconnected") { tony.connectionState == .connected && tony.sessionID == id && tony._reconnects > 0 }
        try await tony.setState("lobby", ["back": "yes"])
        try await inbox.waitFor(.remoteStateChanged, publisher: "tony")
        #expect(!inbox.presence.contains { $0.publisher == "tony" && $0.type == .remoteLeave })
        states.cancel()
        await tony.close(); await ann.close()
        await n.stop()
    }

    @Test func statusRulesAndWatchEvents() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), tony = n.client("tony")
        let inbox = Inbox(ann)
        try await ann.connect()
        #expect(try await ann.watch(["tony"]) == [UserStatusEntry(userID: "tony", status: .unknown)])
        try await tony.setStatus(.away)   // chosen before connecting: sent with the opening
        try await tony.connect()
        try await inbox.waitForStatus("tony", .away)
        try await tony.setStatus(.busy)
        try await inbox.waitForStatus("tony", .busy)
        try await tony.setStatus(.offline)  // invisible
        try await inbox.waitForStatus("tony", .offline)
        #expect(try await ann.statuses(["tony"]).first?.status == .offline)
        try await tony.join("lobby")  // still in its channels while invisible
        #expect(try await ann.onlineUsers("lobby").totalOccupancy == 1)
        try await tony.setStatus(.online)
        try await inbox.waitForStatus("tony", .online)
        try await ann.watch([], unwatch: ["tony"])
        let before = inbox.statuses.count
        try await tony.setStatus(.away)
        try await Task.sleep(nanoseconds: 100_000_000)
        #expect(inbox.statuses.count == before)  // unwatched: no more events
        await tony.close(); await ann.close()
        await n.stop()
    }

    @Test func pagesOf100WithOpaqueBookmarks() async throws {
        let n = try TestNode(maxInstantEvents: 1000)
        let raw = n.raw()
        var streams: [ServerStreamingCall<SessionEvent>] = []
        for i in 0..<250 {
            let s = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: String(format: "u%03d", i)))
            guard case .opened(let o)? = try await next(s)?.event else { Issue.record("no opened"); return }
            _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: "big", channelType: .stream))
            streams.append(s)
        }
        let first = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "big", channelType: .stream))
        #expect(first.totalOccupancy == 250 && first.users.count == 100 && !first.nextPage.isEmpty)
        #expect(first.users.first?.userID == "u000" && first.users.last?.userID == "u099")
        let second = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "big", channelType: .stream, page: first.nextPage))
        let third = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "big", channelType: .stream, page: second.nextPage))
        #expect(second.users.count == 100 && third.users.count == 50 && third.nextPage.isEmpty)
        #expect(third.totalOccupancy == 250)
        let countOnly = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "big", channelType: .stream, includeUserID: false))
        #expect(countOnly.totalOccupancy == 250 && countOnly.users.isEmpty && countOnly.nextPage.isEmpty)
        await expectError(.invalidArgument, "INVALID_PAGE") {
            _ = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "big", channelType: .stream, page: "garbage"))
        }
        let other = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "big", channelType: .message))
        #expect(other.totalOccupancy == 0)  // same name, other type: another channel
        streams.forEach { $0.cancel() }
        raw.close()
        await n.stop()
    }

    /// The owner keeps encoded pages until their channel changes (`ListingCache`): every change
    /// shows in the next listing, with or without state, on the first page and past it.
    @Test func aListingShowsEveryChangeMadeAfterThePageWasKept() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), bob = n.client("bob"), cy = n.client("cy")
        for c in [ann, bob, cy] { try await c.connect() }
        func listed(_ includeState: Bool = true, page: String = "") async throws -> [String] {
            try await cy.onlineUsers("lobby", includeState: includeState, page: page).users.map { u in
                u.userID + u.states.map { ":\($0.key)=\($0.value)" }.joined()
            }
        }
        try await ann.join("lobby")
        #expect(try await listed() == ["ann"])
        #expect(try await listed() == ["ann"])  // (served as kept)
        try await bob.join("lobby")
        #expect(try await listed() == ["ann", "bob"])
        try await ann.setState("lobby", ["mic": "on"])
        #expect(try await listed() == ["ann:mic=on", "bob"])
        #expect(try await listed(false) == ["ann", "bob"])
        #expect(try await listed(page: PageBookmark.make(after: "ann")) == ["bob"])
        try await bob.setState("lobby", ["mic": "off"])
        #expect(try await listed(page: PageBookmark.make(after: "ann")) == ["bob:mic=off"])
        try await ann.removeState("lobby")
        #expect(try await listed() == ["ann", "bob:mic=off"])
        try await bob.leave("lobby")
        #expect(try await listed() == ["ann"])
        #expect(try await cy.onlineUsers("lobby").totalOccupancy == 1)
        try await ann.leave("lobby")
        #expect(try await listed() == [])
        #expect(try await cy.onlineUsers("lobby").totalOccupancy == 0)
        await ann.close(); await bob.close(); await cy.close()
        await n.stop()
    }

    @Test func intervalModeThroughTheNode() async throws {
        let n = try TestNode(maxInstantEvents: 2, presenceInterval: 0.2)
        let ann = n.client("ann")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await ann.join("crowd", withPresence: true)
        var others: [PresenceClient] = []
        for u in ["b", "c", "d"] {
            let c = n.client(u)
            try await c.connect()
            try await c.join("crowd")
            others.append(c)
        }
        let interval = try await inbox.waitFor(.interval, within: 3)
        #expect(interval.interval?.joinUserIDs.contains("d") == true)   // the 3rd user made occupancy 4 > 2... d at least
        #expect(!inbox.presence.contains { $0.type == .remoteJoin && $0.publisher == "d" })
        await others[2].close()
        await others[1].close()  // occupancy back to 2: real time again
        try await inbox.waitFor(.remoteLeave, publisher: "c")
        for c in others { await c.close() }
        await ann.close()
        await n.stop()
    }

    @Test func errorsAreClearAndChangeNothing() async throws {
        let n = try TestNode()
        let ann = n.client("ann")
        try await ann.connect()
        let raw = n.raw()
        let sid = ann.sessionID!
        await expectError(.notFound, "SESSION_NOT_FOUND") { _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: "0123456789abcdef", channelName: "x", channelType: .message)) }
        await expectError(.notFound, "SESSION_NOT_FOUND") { _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: "nope", channelName: "x", channelType: .message)) }
        await expectError(.invalidArgument, "INVALID_CHANNEL_NAME") { _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: sid, channelName: "a b", channelType: .message)) }
        await expectError(.invalidArgument, "INVALID_CHANNEL_TYPE") { _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: sid, channelName: "ok", channelType: .unspecified)) }
        await expectError(.invalidArgument, "INVALID_USER_ID") { _ = try await raw.unary(PresenceMethods.getUserChannels, GetUserChannelsRequest(userID: "")) }
        await expectError(.invalidArgument, "INVALID_INCLUDE_FLAGS") {
            _ = try await raw.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "x", channelType: .message, includeUserID: false, includeState: true))
        }
        await expectError(.invalidArgument, "INVALID_STATUS") { _ = try await raw.unary(PresenceMethods.setStatus, SetStatusRequest(sessionID: sid, status: .unknown)) }
        try await ann.join("s")
        try await ann.setState("s", Dictionary(uniqueKeysWithValues: (0..<32).map { ("k\($0)", "v") }))
        await expectError(.resourceExhausted, "STATE_KEY_LIMIT") { try await ann.setState("s", ["one-more": "x"]) }
        #expect(try await ann.getState("s", user: "ann").count == 32)
        await expectError(.invalidArgument, "INVALID_STATE_VALUE") { try await ann.setState("s", ["k0": String(repeating: "v", count: 1025)]) }
        await expectError(.invalidArgument, "INVALID_STATE_KEY") { try await ann.setState("s", ["": "v"]) }
        #expect(try await ann.getState("s", user: "ann").first?.value == "v")
        await expectError(.notFound, "PRESENCE_USER_NOT_EXIST") { _ = try await ann.getState("s", user: "bob") }
        #expect(try await ann.userChannels("nobody").isEmpty)
        #expect(try await ann.onlineUsers("empty").totalOccupancy == 0)
        await expectError(.invalidArgument, "TOO_MANY_USERS") { _ = try await ann.statuses((0..<1001).map { "u\($0)" }) }
        raw.close()
        await ann.close()
        await n.stop()
    }

    /// API.md: a call that names another user's session is PERMISSION_DENIED, one that names an
    /// unknown session NOT_FOUND — and neither changes anything (membership, state, status, watches).
    @Test func callsOnAnotherUsersOrAnUnknownSessionChangeNothing() async throws {
        let (n, signer) = try TestNode.inTokenMode()
        let now = Int64(Date().timeIntervalSince1970)
        let ann = n.client("ann", token: signer.sign(userID: "ann", expires: now + 60))
        try await ann.connect()
        try await ann.join("lobby", withPresence: false)
        try await ann.setState("lobby", ["mic": "on"])
        try await ann.setStatus(.away)
        _ = try await ann.watch(["carol"])
        let session = try #require(ann.sessionID)
        let id = try #require(SessionID(text: session))
        func unchanged() async throws {
            #expect(try await ann.onlineUsers("lobby").users.map(\.userID) == ["ann"])
            #expect(try await ann.getState("lobby", user: "ann") == [StateItem(key: "mic", value: "on")])
            #expect(try await ann.statuses(["ann"]).first?.status == .away)
            #expect(n.node.engine.core.gatewayShard(id).held(id)?.watching == ["carol"])
        }
        var bobConfig = ClientConfiguration(target: n.address)
        bobConfig.metadata = [("authorization", "Bearer " + signer.sign(userID: "bob", expires: now + 60))]
        let bob = GRPCClient(configuration: bobConfig, group: n.group)
        for (target, code, name) in [(session, GRPCStatus.Code.permissionDenied, "NOT_YOUR_SESSION"),
                                      ("00000000000000ab", .notFound, "SESSION_NOT_FOUND")] {
            await expectError(code, name) {
                _ = try await bob.unary(PresenceMethods.leave, LeaveRequest(sessionID: target, channelName: "lobby", channelType: .message))
            }
            await expectError(code, name) {
                _ = try await bob.unary(PresenceMethods.setState, SetStateRequest(sessionID: target, channelName: "lobby", channelType: .message,
                                                                                  items: [StateItem(key: "mic", value: "off")]))
            }
            await expectError(code, name) {
                _ = try await bob.unary(PresenceMethods.removeState, RemoveStateRequest(sessionID: target, channelName: "lobby", channelType: .message, keys: ["mic"]))
            }
            await expectError(code, name) {
                _ = try await bob.unary(PresenceMethods.setStatus, SetStatusRequest(sessionID: target, status: .busy))
            }
            await expectError(code, name) {
                _ = try await bob.unary(PresenceMethods.watch, WatchRequest(sessionID: target, userIDs: ["dave"], unwatchUserIDs: ["carol"]))
            }
            try await unchanged()
        }
        bob.close()
        await ann.close()
        await n.stop()
    }

    /// API.md: a user's first session joining sends REMOTE_JOIN, and only the last one's going
    /// sends an event: closing one of two sessions, or one timing out, says nothing.
    @Test func aUsersOtherSessionGoingSaysNothingWhileOneIsLive() async throws {
        let n = try TestNode(presenceTimeout: 0.5)
        let ann = n.client("ann")
        let inbox = Inbox(ann)
        try await ann.connect()
        try await ann.join("lobby", withPresence: true)
        let raw = n.raw()
        var calls: [ServerStreamingCall<SessionEvent>] = []
        var ids: [String] = []
        for _ in 0..<3 {
            let call = raw.serverStreaming(PresenceMethods.openSession, OpenSessionRequest(userID: "multi"))
            guard case .opened(let o)? = try await next(call)?.event else { Issue.record("no opened"); return }
            _ = try await raw.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: "lobby", channelType: .message))
            calls.append(call)
            ids.append(o.sessionID)
        }
        try await inbox.waitFor(.remoteJoin, publisher: "multi")
        // one closes, one times out (its stream broken past the presence timeout): nothing
        _ = try await raw.unary(PresenceMethods.closeSession, CloseSessionRequest(sessionID: ids[0]))
        calls[1].cancel()
        try await waitUntil("the broken session timed out") { await n.node.engine.sessionCount() == 2 }
        #expect(try await ann.onlineUsers("lobby").users.map(\.userID) == ["ann", "multi"])
        // the last one leaving is the one event after the join
        _ = try await raw.unary(PresenceMethods.leave, LeaveRequest(sessionID: ids[2], channelName: "lobby", channelType: .message))
        try await inbox.waitFor(.remoteLeave, publisher: "multi")
        #expect(inbox.presence.filter { $0.publisher == "multi" }.map(\.type) == [.remoteJoin, .remoteLeave])
        calls[2].cancel()
        raw.close()
        await ann.close()
        await n.stop()
    }

    /// API.md: only sessions that joined with presence receive a channel's events.
    @Test func aSessionJoinedWithoutPresenceGetsNoEvents() async throws {
        let n = try TestNode()
        let ann = n.client("ann"), bob = n.client("bob"), cy = n.client("cy")
        let annInbox = Inbox(ann), cyInbox = Inbox(cy)
        for c in [ann, bob, cy] { try await c.connect() }
        try await ann.join("lobby", withPresence: false)
        try await cy.join("lobby", withPresence: true)
        try await bob.join("lobby", withPresence: false)
        try await bob.setState("lobby", ["mic": "on"])
        try await bob.leave("lobby")
        try await cyInbox.waitFor(.remoteLeave, publisher: "bob")
        // following the channel now brings its SNAPSHOT, after anything sent to ann before it
        try await ann.join("lobby", withPresence: true)
        try await annInbox.waitFor(.snapshot)
        #expect(annInbox.presence.map(\.type) == [.snapshot], "\(annInbox.presence.map(\.type))")
        for c in [ann, bob, cy] { await c.close() }
        await n.stop()
    }

    @Test func tokenMode() async throws {
        let (n, signer) = try TestNode.inTokenMode()
        let now = Int64(Date().timeIntervalSince1970)
        let good = n.client("ann", token: signer.sign(userID: "ann", expires: now + 60))
        try await good.connect()
        for (token, why) in [("", "missing"), (signer.sign(userID: "ann", expires: now - 1), "expired"),
                             (signer.sign(userID: "bob", expires: now + 60), "other user"),
                             (TokenVerifier(secret: Array("wrong".utf8)).sign(userID: "ann", expires: now + 60), "forged"),
                             ("abc.def", "garbage")] {
            let c = n.client("ann", token: token)
            await expectError(.unauthenticated, "INVALID_TOKEN") { try await c.connect() }
            #expect(c.connectionState == .disconnected, "\(why)")
        }
        // the client library sends its token on every call: it can act and read
        try await good.join("lobby", withPresence: false)
        try await good.setState("lobby", ["mic": "on"])
        #expect(try await good.onlineUsers("lobby").users.map(\.userID) == ["ann"])
        // issue 9: without a token nothing answers, reads included (they would defeat the
        // invisible status, and tell which accounts exist)
        let anon = n.raw()
        let session = try #require(good.sessionID)
        await expectError(.unauthenticated, "INVALID_TOKEN") {
            _ = try await anon.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "lobby", channelType: .message))
        }
        await expectError(.unauthenticated, "INVALID_TOKEN") { _ = try await anon.unary(PresenceMethods.getUserChannels, GetUserChannelsRequest(userID: "ann")) }
        await expectError(.unauthenticated, "INVALID_TOKEN") {
            _ = try await anon.unary(PresenceMethods.getState, GetStateRequest(channelName: "lobby", channelType: .message, userID: "ann"))
        }
        await expectError(.unauthenticated, "INVALID_TOKEN") { _ = try await anon.unary(PresenceMethods.getUserStatuses, GetUserStatusesRequest(userIDs: ["ann"])) }
        await expectError(.unauthenticated, "INVALID_TOKEN") {
            _ = try await anon.unary(PresenceMethods.leave, LeaveRequest(sessionID: session, channelName: "lobby", channelType: .message))
        }
        // any valid user's token may read; only ann's may act on her session
        var bobConfig = ClientConfiguration(target: n.address)
        bobConfig.metadata = [("authorization", "Bearer " + signer.sign(userID: "bob", expires: now + 60))]
        let bob = GRPCClient(configuration: bobConfig, group: n.group)
        #expect(try await bob.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: "lobby", channelType: .message)).users.map(\.userID) == ["ann"])
        await expectError(.permissionDenied, "NOT_YOUR_SESSION") {
            _ = try await bob.unary(PresenceMethods.leave, LeaveRequest(sessionID: session, channelName: "lobby", channelType: .message))
        }
        #expect(try await good.onlineUsers("lobby").users.map(\.userID) == ["ann"])
        // Admin (members, peer addresses) is not on the client port in token mode; the peer port has it
        await expectError(.permissionDenied, "ADMIN_NOT_HERE") { _ = try await bob.unary(AdminMethods.members, AdminMembersRequest()) }
        let peer = GRPCClient(target: HostPort(host: "127.0.0.1", port: n.node.peerPort), group: n.group)
        #expect(try await peer.unary(AdminMethods.members, AdminMembersRequest()).members.count == 1)
        peer.close()
        anon.close()
        bob.close()
        await good.close()
        await n.stop()
    }
}
