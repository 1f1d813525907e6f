/// A stream's response messages waiting for nghttp2 to take them, in order, and how much of the
/// first it has taken. A value held by its stream: nghttp2's read callback takes a frame's worth
/// in one change of it (through a class's fields, each message's bytes, head and offset were
/// separate accesses, every one checked for exclusivity at run time: 2% of a fan-out profile).
struct OutboundMessages {
    /// The message waiting first when it was appended to an empty queue (a unary call's one
    /// response, most often): kept here, not in `messages`, whose storage would be allocated
    /// for it on every call. Always before whatever `messages` holds.
    private var single: [UInt8]? = nil
    private var messages: [[UInt8]] = []
    private var head = 0
    /// How much of the first waiting message (`single`, else `messages[head]`) was taken.
    private var offset = 0

    var isEmpty: Bool { single == nil && head == messages.count }

    /// Bytes not taken yet.
    var remainingBytes: Int {
        var n = single?.count ?? 0
        for i in head..<messages.count { n += messages[i].count }
        return n - offset
    }

    mutating func append(_ framed: [UInt8]) {
        if isEmpty { single = framed } else { messages.append(framed) }
    }

    /// Appends what `writer` queued since its last drain; returns its bytes.
    mutating func take(from writer: ServerStreamWriter) -> Int { writer.takePending(appendingTo: &messages) }

    /// Copies up to `length` bytes of the messages, in order, to `buffer`; returns how many.
    mutating func copy(into buffer: UnsafeMutablePointer<UInt8>, length: Int) -> Int {
        var written = 0
        if let first = single {
            let take = min(length, first.count - offset)
            first.withUnsafeBufferPointer { src in buffer.update(from: src.baseAddress! + offset, count: take) }
            written = take
            offset += take
            guard offset == first.count else { return written }
            single = nil
            offset = 0
        }
        while written < length, head < messages.count {
            // (the message read in place: a copy of it would be a retain and a release each)
            let (take, whole) = messages[head].withUnsafeBufferPointer { src in
                let take = min(length - written, src.count - offset)
                (buffer + written).update(from: src.baseAddress! + offset, count: take)
                return (take, src.count)
            }
            written += take
            offset += take
            if offset == whole {
                messages[head] = []
                head += 1
                offset = 0
            }
        }
        if head == messages.count {
            messages.removeAll(keepingCapacity: messages.count <= 64)
            head = 0
        }
        return written
    }
}
