import EventLoop
@testable import GRPCTransport
import PresenceWire
import Testing

/// RFC 7540's stream priority tree is off on a server unless asked for: it announces
/// SETTINGS_NO_RFC7540_PRIORITIES = 1 (RFC 9218), priority information a client sends anyway is
/// not an error, and unary answers go before streamed messages.
@Suite(.serialized) struct PrioritySettingsTests {
    /// SETTINGS_NO_RFC7540_PRIORITIES (RFC 9218, section 2.1).
    static let noRFC7540Priorities: UInt16 = 0x9

    /// The entries of the first SETTINGS frame a server configured by `configure` sends a raw peer.
    static func serverSettings(_ configure: (inout ServerConfiguration) -> Void = { _ in }) async throws -> [UInt16: UInt32]? {
        let h = try Harness(configure: configure)
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        let settings = peer.readSettings(until: MonotonicClock.now() + 3_000_000_000)
        peer.close()
        await h.stop()
        return settings
    }

    @Test func theServerAnnouncesThatItKeepsNoPriorityTree() async throws {
        let settings = try await Self.serverSettings()
        #expect(settings?[Self.noRFC7540Priorities] == 1, "the server's SETTINGS: \(String(describing: settings))")
        // the other settings are still sent alongside it
        #expect(settings?[0x3] == HTTP2Settings().maxConcurrentStreams)
    }

    @Test func aServerAskedToKeepTheTreeDoesNotAnnounceIt() async throws {
        let settings = try await Self.serverSettings { $0.http2.rfc7540Priorities = true }
        #expect(settings != nil)
        #expect(settings?[Self.noRFC7540Priorities] == nil, "the server's SETTINGS: \(String(describing: settings))")
    }

    /// A client that sends priorities anyway (HEADERS with the PRIORITY flag, each stream made to
    /// depend exclusively on the one before, and PRIORITY frames for streams it never opens) gets
    /// every call answered: the information is ignored, not an error.
    @Test func prioritiesAPeerSendsAnywayAreIgnored() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        let framed = RawPeer.framed(StateItem(key: "k", value: "v").serializedBytes(prefix: 0))
        var streams: [UInt32] = []
        for i in 0..<20 {
            let stream = UInt32(2 * i + 1)
            streams.append(stream)
            // exclusive dependency on the stream before, weight 255
            let dependsOn = i == 0 ? 0 : stream - 2
            let priority: [UInt8] = [UInt8(dependsOn >> 24 & 0x7f) | 0x80, UInt8(dependsOn >> 16 & 0xff), UInt8(dependsOn >> 8 & 0xff), UInt8(dependsOn & 0xff), 255]
            peer.send(RawPeer.frame(type: 1, flags: 0x4 | 0x20, stream: stream, priority + RawPeer.requestHeaders(path: TestMethods.echo.path))
                + RawPeer.frame(type: 2, flags: 0, stream: stream + 1000, [0, 0, 0, UInt8(stream), 16])  // PRIORITY for an idle stream
                + RawPeer.frame(type: 0, flags: 0x1, stream: stream, framed))
        }
        let allEnded: ([(UInt8, UInt8, UInt32)]) -> Bool = { fs in streams.allSatisfy { RawPeer.ended(stream: $0)(fs) } }
        let (frames, closed) = peer.readFrames(until: MonotonicClock.now() + 5_000_000_000, stopWhen: allEnded)
        #expect(allEnded(frames), "calls not answered: \(streams.filter { !RawPeer.ended(stream: $0)(frames) })")
        #expect(!closed && !frames.contains { $0.0 == 7 || $0.0 == 3 }, "GOAWAY or RST_STREAM: \(frames)")
        peer.close()
        await h.stop()
    }

    /// On a congested connection (its flow-control window spent by a streaming call's backlog),
    /// a unary answer made later goes out first once the window opens: first come, first served
    /// would send the whole backlog before it.
    @Test func aUnaryAnswerGoesBeforeAStreamsBacklogWhenTheWindowOpens() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        // 200 messages of 1,000 bytes: more than the default 65,535-byte windows let through
        peer.request(stream: 1, path: TestMethods.stream.path, message: StateItem(key: "200", value: "1000").serializedBytes(prefix: 0))
        // until the stream has spent the connection's whole window (65,535 bytes of DATA)
        var sent = 0
        let (before, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: { _ in sent >= 65_535 },
                                          onFrame: { type, stream, length in if type == 0 && stream == 1 { sent += length } })
        #expect(sent >= 65_535, "the stream sent \(sent) bytes in \(before.count) frames")
        peer.request(stream: 3, path: TestMethods.echo.path, message: StateItem(key: "k", value: "v").serializedBytes(prefix: 0))
        // the answer's HEADERS are not flow-controlled: once they are here, its DATA waits for the window
        let answerStarted: ([(UInt8, UInt8, UInt32)]) -> Bool = { fs in fs.contains { $0.0 == 1 && $0.2 == 3 } }
        let (waiting, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: answerStarted)
        #expect(answerStarted(waiting), "no answer started: \(waiting)")
        #expect(!waiting.contains { $0.0 == 0 && $0.2 == 3 }, "the answer's DATA went out before the window opened")
        let increment: [UInt8] = [0, 0x10, 0, 0]  // 1 MiB
        peer.send(RawPeer.frame(type: 8, flags: 0, stream: 0, increment) + RawPeer.frame(type: 8, flags: 0, stream: 1, increment)
            + RawPeer.frame(type: 8, flags: 0, stream: 3, increment))
        let bothSent: ([(UInt8, UInt8, UInt32)]) -> Bool = { fs in RawPeer.ended(stream: 3)(fs) && fs.contains { $0.0 == 0 && $0.2 == 1 } }
        let (after, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: bothSent)
        let data = after.filter { $0.0 == 0 }
        #expect(data.first?.2 == 3, "DATA after the window opened, by stream: \(data.map(\.2))")
        #expect(data.contains { $0.2 == 1 }, "the stream's backlog was not sent")
        peer.close()
        await h.stop()
    }
}
