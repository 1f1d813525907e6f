// libFuzzer target: the gRPC message deframer, fed a body split at points the input chooses. The
// messages it finds must not depend on the split, nothing longer than the limit is buffered, and
// a failure is final. Built by Scripts/fuzz.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzDeframer(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 1 else { return 0 }
    let limit = 64 + Int(data[0])  // small limits reach the too-large path often
    let body = UnsafeBufferPointer(start: data + 1, count: size - 1)
    var whole = MessageDeframer(maxMessageSize: limit)
    var all: [[UInt8]] = []
    let failure = whole.append(body) { all.append($0) }
    // the same bytes in pieces whose sizes come from the bytes themselves
    var pieces = MessageDeframer(maxMessageSize: limit)
    var again: [[UInt8]] = []
    var i = 0
    var pieceFailure: MessageDeframer.Failure? = nil
    while i < body.count {
        let n = min(body.count - i, 1 + Int(body[i] % 7))
        pieceFailure = pieces.append(UnsafeBufferPointer(rebasing: body[i..<(i + n)])) { again.append($0) }
        precondition(pieces.bufferedBytes <= limit + 5, "buffered more than the limit")
        i += n
    }
    precondition(again == all, "messages depend on how the body was split")
    precondition((failure == nil) == (pieceFailure == nil), "a failure depends on how the body was split")
    precondition(all.allSatisfy { $0.count <= limit }, "a message over the limit came out")
    return 0
}
