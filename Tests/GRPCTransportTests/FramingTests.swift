@testable import GRPCTransport
import Testing

@Suite struct FramingTests {
    func feed(_ d: inout MessageDeframer, _ bytes: [UInt8]) -> ([[UInt8]], MessageDeframer.Failure?) {
        var out: [[UInt8]] = []
        let f = bytes.withUnsafeBufferPointer { d.append($0) { out.append($0) } }
        return (out, f)
    }

    @Test func messagesSplitAnywhereReassemble() {
        let stream = MessageDeframer.frame([1, 2, 3]) + MessageDeframer.frame([]) + MessageDeframer.frame(Array(repeating: 7, count: 300))
        for split in 1..<stream.count {
            var d = MessageDeframer(maxMessageSize: 1000)
            let (a, f1) = feed(&d, Array(stream[..<split]))
            let (b, f2) = feed(&d, Array(stream[split...]))
            #expect(f1 == nil && f2 == nil)
            #expect(a + b == [[1, 2, 3], [], Array(repeating: 7, count: 300)])
            #expect(d.isIdle)
        }
    }

    @Test func byteAtATime() {
        let stream = MessageDeframer.frame([9, 8]) + MessageDeframer.frame([7])
        var d = MessageDeframer(maxMessageSize: 10)
        var all: [[UInt8]] = []
        for b in stream { all += feed(&d, [b]).0 }
        #expect(all == [[9, 8], [7]])
    }

    @Test func oversizedIsRefusedFromTheHeaderAlone() {
        var d = MessageDeframer(maxMessageSize: 100)
        let (msgs, f) = feed(&d, [0, 0, 0, 0, 101])
        #expect(msgs.isEmpty)
        #expect(f == .tooLarge(length: 101, limit: 100))
        #expect(d.bufferedBytes == 0)
        #expect(feed(&d, [0, 0, 0, 0, 1, 1]).1 == .tooLarge(length: 101, limit: 100)) // stays failed
    }

    /// The limit is the largest message accepted: exactly that many bytes pass, one more is refused.
    @Test func aMessageOfExactlyTheLimitIsAccepted() {
        var d = MessageDeframer(maxMessageSize: 100)
        let (msgs, f) = feed(&d, MessageDeframer.frame(Array(repeating: 5, count: 100)))
        #expect(f == nil && msgs == [Array(repeating: 5, count: 100)])
        var e = MessageDeframer(maxMessageSize: 100)
        #expect(feed(&e, MessageDeframer.frame(Array(repeating: 5, count: 101))).1 == .tooLarge(length: 101, limit: 100))
    }

    @Test func compressedAndBadFlags() {
        var d = MessageDeframer(maxMessageSize: 100)
        #expect(feed(&d, [1, 0, 0, 0, 1, 5]).1 == .compressed)
        var e = MessageDeframer(maxMessageSize: 100)
        #expect(feed(&e, [2, 0, 0, 0, 0]).1 == .badFlag(2))
    }

    @Test func partialMessageIsNotIdle() {
        var d = MessageDeframer(maxMessageSize: 100)
        _ = feed(&d, [0, 0, 0, 0, 3, 1])
        #expect(!d.isIdle)
    }

    @Test func timeoutHeader() {
        #expect(GRPCTimeout.parse("100m") == 100_000_000)
        #expect(GRPCTimeout.parse("1S") == 1_000_000_000)
        #expect(GRPCTimeout.parse("2H") == 7_200_000_000_000)
        #expect(GRPCTimeout.parse("5u") == 5_000)
        #expect(GRPCTimeout.parse("7n") == 7)
        #expect(GRPCTimeout.parse("1M") == 60_000_000_000)
        #expect(GRPCTimeout.parse("") == nil)
        #expect(GRPCTimeout.parse("m") == nil)
        #expect(GRPCTimeout.parse("123456789S") == nil) // more than 8 digits
        #expect(GRPCTimeout.parse("10x") == nil)
        #expect(GRPCTimeout.parse("-1S") == nil)
        #expect(GRPCTimeout.encode(nanoseconds: 100_000_000) == "100000u")
        #expect(GRPCTimeout.parse(GRPCTimeout.encode(nanoseconds: 3_000_000_000_000)) == 3_000_000_000_000)
    }

    @Test func percentEncoding() {
        let encoded = PercentEncoding.encode("a%b ü\n")
        #expect(String(decoding: encoded, as: UTF8.self) == "a%25b %C3%BC%0A")
        #expect(encoded.withUnsafeBufferPointer { PercentEncoding.decode($0) } == "a%b ü\n")
        let bad = Array("50%zz%".utf8)
        #expect(bad.withUnsafeBufferPointer { PercentEncoding.decode($0) } == "50%zz%")
    }

    /// Issue 9: a paged SNAPSHOT of a big channel is one delivery larger than the stream's limit.
    @Test func aStreamTakesOneDeliveryLargerThanItsLimitButNotMoreOnceTheClientFallsBehind() {
        let writer = ServerStreamWriter(hardLimit: 1000) {}
        #expect(writer.trySend(framed: [UInt8](repeating: 0, count: 5000)))   // a paged SNAPSHOT, say
        #expect(!writer.trySend(framed: [1]))                                   // 5000 already waiting
    }
}
