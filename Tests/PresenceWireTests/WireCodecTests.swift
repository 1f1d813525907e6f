import PresenceCore
import Testing
@testable import PresenceWire

@Suite struct WireCodecTests {
    @Test func roundTripsEveryKindOfField() throws {
        let event = SessionEvent(event: .presence(PresenceEvent(
            type: .remoteStateChanged, channelType: .stream, channelName: "lobby", publisher: "ann",
            states: [StateItem(key: "mic", value: "on"), StateItem(key: "score", value: "ünïcødé")],
            interval: IntervalInfo(joinUserIDs: ["a", "b"], leaveUserIDs: [], timeoutUserIDs: ["c"],
                                   userStates: [UserState(userID: "a", states: [StateItem(key: "k", value: "")])]),
            snapshot: [], timestampMs: 1_764_000_000_123, sequence: UInt64.max)))
        let bytes = event.serializedBytes()
        #expect(try SessionEvent(serializedBytes: bytes) == event)
    }

    /// A decode's C structs come from an arena that starts with 1 KiB on the stack: a message
    /// whose structs need many times that spills to heap chunks, and still decodes whole (and a
    /// malformed one, abandoned half-built, leaks nothing: the arena frees it all at once).
    @Test func aMessageLargerThanTheDecodeArenasFirstBlockRoundTrips() throws {
        let users = (0..<2_000).map { i in
            UserState(userID: "user-\(i)", states: (0..<3).map { StateItem(key: "k\($0)", value: String(repeating: "v", count: i % 40)) })
        }
        let event = SessionEvent(event: .presence(PresenceEvent(
            type: .snapshot, channelType: .message, channelName: "big", publisher: "",
            states: [], interval: nil, snapshot: users, timestampMs: 1, sequence: 2)))
        let bytes = event.serializedBytes()
        #expect(bytes.count > 64 * 1024)
        #expect(try SessionEvent(serializedBytes: bytes) == event)
        #expect(throws: WireError.malformed(type: "SessionEvent")) {
            try SessionEvent(serializedBytes: Array(bytes.dropLast(3)))
        }
    }

    @Test func emptyMessagesRoundTrip() throws {
        #expect(JoinResponse().serializedBytes().isEmpty)
        #expect(try JoinResponse(serializedBytes: []) == JoinResponse())
        #expect(try SessionEvent(serializedBytes: []).event == nil)
    }

    @Test func wrapperFieldKeepsPresence() throws {
        let unset = GetOnlineUsersRequest(channelName: "c", channelType: .message)
        #expect(try GetOnlineUsersRequest(serializedBytes: unset.serializedBytes()).includeUserID == nil)
        let no = GetOnlineUsersRequest(channelName: "c", channelType: .message, includeUserID: false)
        #expect(try GetOnlineUsersRequest(serializedBytes: no.serializedBytes()).includeUserID == false)
        let yes = GetOnlineUsersRequest(includeUserID: true)
        #expect(try GetOnlineUsersRequest(serializedBytes: yes.serializedBytes()).includeUserID == true)
    }

    @Test func unknownEnumValuesAreKept() throws {
        // field 3 (channel_type) = 9: a value this build does not know
        let decoded = try JoinRequest(serializedBytes: [0x18, 0x09])
        #expect(decoded.channelType == .unrecognized(9))
        #expect(decoded.serializedBytes() == [0x18, 0x09])
    }

    @Test func prefixLeavesRoomForAFrameHeader() {
        let bytes = StateItem(key: "k", value: "v").serializedBytes(prefix: 5)
        #expect(Array(bytes.prefix(5)) == [0, 0, 0, 0, 0])
        #expect(Array(bytes.dropFirst(5)) == StateItem(key: "k", value: "v").serializedBytes())
    }

    @Test func truncatedBytesAreAnError() {
        let bytes = UserState(userID: "someone", states: [StateItem(key: "k", value: "v")]).serializedBytes()
        // 9 is the boundary between the two fields: that prefix is a valid, shorter message
        for cut in 1..<bytes.count where cut != 9 {
            #expect(throws: WireError.self) { try UserState(serializedBytes: Array(bytes.prefix(cut))) }
        }
    }

    @Test func garbageIsAnError() {
        #expect(throws: WireError.malformed(type: "JoinRequest")) { try JoinRequest(serializedBytes: [0xff, 0xff, 0xff]) }
        // length-delimited field claiming more bytes than there are
        #expect(throws: WireError.self) { try JoinRequest(serializedBytes: [0x0a, 0x7f, 0x41]) }
    }

    @Test func embeddedNulIsRejectedNotTruncated() {
        // session_id = "ab\0cd": protobuf-c would silently cut it to "ab"
        #expect(throws: WireError.nonCanonical(type: "JoinRequest")) {
            try JoinRequest(serializedBytes: [0x0a, 0x05, 0x61, 0x62, 0x00, 0x63, 0x64])
        }
    }

    @Test func invalidUTF8IsRejected() {
        #expect(throws: WireError.invalidUTF8(type: "JoinRequest")) {
            try JoinRequest(serializedBytes: [0x0a, 0x02, 0xc3, 0x28])
        }
    }

    @Test func randomBytesNeverCrash() {
        var rng = SplitMix64(seed: 42)
        var decoded = 0
        for _ in 0..<20_000 {
            let count = Int(rng.next() % 64)
            let bytes = (0..<count).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            if (try? SessionEvent(serializedBytes: bytes)) != nil { decoded += 1 }
            _ = try? GetOnlineUsersRequest(serializedBytes: bytes)
        }
        #expect(decoded < 20_000)
    }

    @Test func healthMessages() throws {
        let r = HealthCheckResponse(status: .serving)
        #expect(r.serializedBytes() == [0x08, 0x01])
        #expect(try HealthCheckResponse(serializedBytes: [0x08, 0x02]).status == .notServing)
        #expect(HealthMethods.check.path == "/grpc.health.v1.Health/Check")
        #expect(PresenceMethods.openSession.kind == .serverStreaming)
    }
}
