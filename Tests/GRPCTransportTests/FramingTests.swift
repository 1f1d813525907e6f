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

/// A stream's queued response messages, taken by nghttp2 a frame at a time (`OutboundMessages`).
@Suite struct OutboundMessagesTests {
    @Test func framesOfAnySizeTakeTheMessagesWholeAndInOrder() {
        var q = OutboundMessages()
        #expect(q.isEmpty && q.remainingBytes == 0)
        let messages: [[UInt8]] = [Array(0..<7), Array(100..<103), Array(200..<213)]
        for m in messages { q.append(m) }
        #expect(!q.isEmpty && q.remainingBytes == 23)
        var out: [UInt8] = []
        var frame = [UInt8](repeating: 0, count: 5)
        var sizes: [Int] = []
        while !q.isEmpty {
            let n = frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 5) }
            sizes.append(n)
            out += frame[0..<n]
        }
        #expect(out == messages.flatMap { $0 })
        #expect(sizes == [5, 5, 5, 5, 3])
        #expect(q.remainingBytes == 0)
        // (emptied, it takes more, and a frame larger than what waits takes all of it)
        q.append([9, 9])
        var big = [UInt8](repeating: 0, count: 64)
        #expect(big.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 64) } == 2)
        #expect(big[0] == 9 && big[1] == 9 && q.isEmpty)
    }

    /// A message appended to an empty queue waits in a slot of its own: what comes after it,
    /// appended or drained from a writer while it is half taken, still follows it.
    @Test func theFirstMessageKeptApartStillGoesFirst() {
        let writer = ServerStreamWriter(scheduleDrain: {})
        var q = OutboundMessages()
        q.append([1, 2, 3, 4])
        var frame = [UInt8](repeating: 0, count: 16)
        #expect(frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 3) } == 3)
        #expect(writer.trySend(framed: [5, 6]))
        #expect(q.take(from: writer) == 2)
        q.append([7])
        #expect(q.remainingBytes == 4)
        #expect(frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 16) } == 4)
        #expect(Array(frame[0..<4]) == [4, 5, 6, 7])
        #expect(q.isEmpty)
        q.append([8])  // (emptied, the next one is kept apart again)
        #expect(frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 16) } == 1)
        #expect(frame[0] == 8 && q.isEmpty)
        // the slot taken, messages after it still waiting: a new one goes behind them
        q.append([1])
        #expect(writer.trySend(framed: [2]))
        #expect(q.take(from: writer) == 1)
        #expect(frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 1) } == 1)
        q.append([3])
        #expect(frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 16) } == 2)
        #expect(Array(frame[0..<2]) == [2, 3])
    }

    @Test func aDrainTakesWhatTheWriterQueuedSinceTheLastOne() throws {
        let writer = ServerStreamWriter(scheduleDrain: {})
        var q = OutboundMessages()
        #expect(writer.trySend(framed: [1, 2, 3]) && writer.trySend(framed: [4]))
        #expect(q.take(from: writer) == 4)
        #expect(q.take(from: writer) == 0)
        #expect(writer.trySend(framed: [5, 6]))
        #expect(q.take(from: writer) == 2)
        var frame = [UInt8](repeating: 0, count: 16)
        #expect(frame.withUnsafeMutableBufferPointer { q.copy(into: $0.baseAddress!, length: 16) } == 6)
        #expect(Array(frame[0..<6]) == [1, 2, 3, 4, 5, 6])
    }

    /// A coalescing writer (an HTTP/2 stream's) hands over one copy of what it queued per drain,
    /// none of it sharing storage with the messages sent, and keeps a small buffer for the next.
    @Test func aCoalescingWriterHandsOverOneCopyOfItsMessagesPerDrain() throws {
        let writer = ServerStreamWriter(coalescing: true, scheduleDrain: {})
        let event: [UInt8] = [1, 2, 3]
        #expect(writer.trySend(framed: event) && writer.trySend(framed: [4]) && writer.trySend(framed: event))
        #expect(writer.queuedBytes == 7)
        var taken: [[UInt8]] = []
        #expect(writer.takePending(appendingTo: &taken) == 7)
        #expect(taken == [[1, 2, 3, 4, 1, 2, 3]])
        // (the copy is the connection's: the sent message's storage is not in it)
        let shared = taken[0].withUnsafeBufferPointer { t in event.withUnsafeBufferPointer { $0.baseAddress == t.baseAddress } }
        #expect(!shared)
        #expect(writer.takePending(appendingTo: &taken) == 0 && taken.count == 1)
        #expect(writer.trySend(framed: [5, 6]))
        #expect(writer.takePending() == [[5, 6]])
        // (what was taken stays counted until the connection says it wrote it)
        #expect(writer.queuedBytes == 9)
        writer.drained(9)
        #expect(writer.queuedBytes == 0)
        // (the hard limit holds as for any writer, and a closed writer drops what waits)
        let limited = ServerStreamWriter(hardLimit: 4, coalescing: true, scheduleDrain: {})
        #expect(limited.trySend(framed: [UInt8](repeating: 7, count: 5)))
        #expect(!limited.trySend(framed: [8]))
        limited.close(GRPCStatus(.cancelled, "gone"))
        #expect(limited.takePending().isEmpty)
        #expect(!limited.trySend(framed: [9]))
    }

    /// A writer that does not coalesce (the WebSocket door's) hands over each message as sent.
    @Test func aWriterThatDoesNotCoalesceHandsOverEachMessageAsSent() {
        let writer = ServerStreamWriter(scheduleDrain: {})
        let event: [UInt8] = [1, 2, 3]
        #expect(writer.trySend(framed: event) && writer.trySend(framed: [4]))
        let taken = writer.takePending()
        #expect(taken == [[1, 2, 3], [4]])
        #expect(taken[0].withUnsafeBufferPointer { t in event.withUnsafeBufferPointer { $0.baseAddress == t.baseAddress } })
    }
}
