import PresenceWire
import Testing

@Suite struct JSONTests {
    @Test func theWebSocketExampleReadsIntoTheRequestType() throws {
        let v = try JSONParser.parse(#"{"id": 7, "method": "Join", "request": {"channelName": "lobby", "channelType": "CHANNEL_TYPE_MESSAGE", "withPresence": true}}"#)
        #expect(v["id"] == .number("7") && v["method"]?.stringValue == "Join")
        let r = try JoinRequest(json: try #require(v["request"]))
        #expect(r.channelName == "lobby" && r.channelType == .message && r.withPresence && r.sessionID.isEmpty)
        // the .proto's own field names and enum numbers are read too
        let same = try JoinRequest(json: try JSONParser.parse(#"{"channel_name": "lobby", "channel_type": 1, "with_presence": true, "unknownField": [1, {"a": null}]}"#))
        #expect(same == r)
    }

    @Test func eventsWriteTheCanonicalForm() throws {
        var e = PresenceEvent()
        e.type = .remoteJoin
        e.channelName = "lobby"
        e.channelType = .message
        e.publisher = "ann"
        e.states = [StateItem(key: "mic", value: "on")]
        e.sequence = 18_446_744_073_709_551_615
        e.timestampMs = 1_700_000_000_000
        let text = SessionEvent(event: .presence(e)).json().text
        #expect(text == #"{"presence":{"type":"PRESENCE_EVENT_TYPE_REMOTE_JOIN","channelType":"CHANNEL_TYPE_MESSAGE","channelName":"lobby","publisher":"ann","states":[{"key":"mic","value":"on"}],"timestampMs":"1700000000000","sequence":"18446744073709551615"}}"#)
        // and read back to the same value (64-bit integers travel as strings)
        #expect(try SessionEvent(json: try JSONParser.parse(text)) == SessionEvent(event: .presence(e)))
    }

    @Test func wrappersAreAValueOrNull() throws {
        var r = try GetOnlineUsersRequest(json: try JSONParser.parse(#"{"channelName": "c", "includeUserId": false}"#))
        #expect(r.includeUserID == false)
        r = try GetOnlineUsersRequest(json: try JSONParser.parse(#"{"channelName": "c", "includeUserId": null}"#))
        #expect(r.includeUserID == nil)
        r.includeUserID = true
        #expect(r.json()["includeUserId"] == .bool(true))
    }

    @Test func wrongTypesAreErrorsThatNameTheField() throws {
        for (text, field) in [(#"{"channelName": 5}"#, "JoinRequest.channelName"), (#"{"channelType": "CHANNEL_TYPE_NOPE"}"#, "JoinRequest.channelType"),
                              (#"{"withPresence": "yes"}"#, "JoinRequest.withPresence"), (#"[1]"#, "JoinRequest")] {
            do {
                _ = try JoinRequest(json: try JSONParser.parse(text))
                Issue.record("\(text) was read")
            } catch {
                #expect(error.message.hasPrefix(field), "\(error.message)")
            }
        }
        #expect(throws: JSONError.self) { try PresenceEvent(json: try JSONParser.parse(#"{"sequence": "-1"}"#)) }
        #expect(throws: JSONError.self) { try PresenceEvent(json: try JSONParser.parse(#"{"sequence": 1.5}"#)) }
        #expect(throws: JSONError.self) { try PresenceEvent(json: try JSONParser.parse(#"{"sequence": "9007199254740993.0"}"#)) }
        #expect(try PresenceEvent(json: try JSONParser.parse(#"{"sequence": "9007199254740993"}"#)).sequence == 9_007_199_254_740_993)
        #expect(try PresenceEvent(json: try JSONParser.parse(#"{"sequence": 1e3}"#)).sequence == 1000)
    }

    @Test func theParserIsStrictAndBounded() throws {
        for bad in ["", "{", "[1,]", "{\"a\" 1}", "01", "1.", "\"\u{01}\"", "\"\\x\"", "\"\\ud800\"", "nul", "[1] 2", "{\"a\":1,}", "'a'"] {
            #expect(throws: JSONError.self, "\(bad.debugDescription) was read") { try JSONParser.parse(bad) }
        }
        #expect(throws: JSONError.self) { try JSONParser.parse(String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000)) }
        #expect(throws: JSONError.self) { try JSONParser.parse([0x22, 0xff, 0xfe, 0x22]) }   // not UTF-8
        #expect(try JSONParser.parse(String(repeating: "[", count: 31) + String(repeating: "]", count: 31)) != .null)
        #expect(try JSONParser.parse(#""a\"b\\c\u00e9\ud83d\ude00""#) == .string("a\"b\\cé😀"))
        #expect(try JSONParser.parse("-0.5e+3") == .number("-0.5e+3"))
        #expect(JSONValue.string("a\"\n\u{1}\u{2028}").text == #""a\"\n\u0001\u2028""#)
    }

    @Test func base64RoundTrips() {
        for n in 0..<10 {
            let bytes = (0..<n).map { UInt8(truncatingIfNeeded: $0 * 37 + 250) }
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.encode(Array("hello".utf8)) == "aGVsbG8=")
        #expect(Base64.decode("a!b") == nil)
    }
}
