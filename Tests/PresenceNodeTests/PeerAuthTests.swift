@testable import PresenceNode
import PresenceCore
import Testing

@Suite struct PeerAuthTests {
    let auth = PeerRequestAuth(secret: Array("s3cret".utf8), windowMilliseconds: 30_000)
    let message: [UInt8] = [8, 1, 18, 5, 108, 111, 98, 98, 121]

    @Test func aSignatureFitsOnlyItsMethodMessageAndTime() {
        let h = auth.sign(method: "/p.Peer/Channel", message: message[...], now: 1_000_000)
        #expect((try? auth.check(h, method: "/p.Peer/Channel", message: message[...], now: 1_000_500).get()) != nil)
        // another method, another message, another secret
        #expect((try? auth.check(h, method: "/p.Peer/Push", message: message[...], now: 1_000_500).get()) == nil)
        #expect((try? auth.check(h, method: "/p.Peer/Channel", message: message.dropLast(), now: 1_000_500).get()) == nil)
        let other = PeerRequestAuth(secret: Array("other".utf8))
        #expect((try? other.check(h, method: "/p.Peer/Channel", message: message[...], now: 1_000_500).get()) == nil)
        // too old, too far ahead, missing, malformed: refused before the body is looked at
        #expect(auth.refusesEarly(h, now: 1_000_000 + 30_001) != nil)
        #expect(auth.refusesEarly(h, now: 1_000_000 - 30_001) != nil)
        #expect(auth.refusesEarly(h, now: 1_000_000 + 30_000) == nil)
        #expect(auth.refusesEarly(nil, now: 0) != nil)
        for bad in ["", "v1", "v2.1.\(String(repeating: "a", count: 64))", "v1.x.\(String(repeating: "a", count: 64))", "v1.1.abc",
                    "v1.-9223372036854775808.\(String(repeating: "a", count: 64))", String(repeating: "v", count: 500)] {
            #expect(auth.refusesEarly(bad, now: 9_223_372_036_854_775_807) != nil, "\(bad)")
        }
    }

    @Test func aReplayWithinTheWindowIsRefusedAndTheMemoryIsBounded() {
        var w = ReplayWindow(windowMilliseconds: 1_000, capacity: 3)
        let first = w.admit("a", now: 0)
        let again = w.admit("a", now: 10)
        let b = w.admit("b", now: 20), c = w.admit("c", now: 30)
        #expect(first && !again && b && c)
        // past twice the window "a" is forgotten (its request is refused as too old anyway)
        let later = w.admit("a", now: 2_100)
        #expect(later)
        // capacity: the oldest go first
        let d = w.admit("d", now: 2_110), e = w.admit("e", now: 2_120)
        #expect(d && e && w.count <= 3)
    }
}

/// API.md, "Security": the app's HMAC tokens, checked at a given time (no clock to wait for).
@Suite struct TokenVerifierTests {
    let verifier = TokenVerifier(secret: Array("app-secret".utf8))

    @Test func aTokenIsValidUntilTheSecondBeforeItsExpiry() throws {
        let token = verifier.sign(userID: "ann", expires: 1_000)
        #expect(try verifier.user(of: token, now: 999) == "ann")
        // `exp` is the first second it is no longer valid
        #expect(throws: PresenceError.self) { try verifier.user(of: token, now: 1_000) }
        #expect(throws: PresenceError.self) { try verifier.user(of: token, now: 5_000) }
    }

    @Test func aTokenIsForItsUserAndItsSecretOnly() throws {
        let token = verifier.sign(userID: "ann", expires: 1_000)
        try verifier.verify(token, userID: "ann", now: 10)
        #expect(throws: PresenceError.self) { try verifier.verify(token, userID: "bob", now: 10) }
        let forged = TokenVerifier(secret: Array("guess".utf8)).sign(userID: "ann", expires: 1_000)
        #expect(throws: PresenceError.self) { try verifier.user(of: forged, now: 10) }
        // the payload of one token with the MAC of another
        let other = verifier.sign(userID: "bob", expires: 1_000)
        let spliced = String(other.split(separator: ".")[0]) + "." + String(token.split(separator: ".")[1])
        #expect(throws: PresenceError.self) { try verifier.user(of: spliced, now: 10) }
    }
}
