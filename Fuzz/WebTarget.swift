// libFuzzer target: what the HTTP/1.1 front door reads from the network. The first input byte picks
// the HTTP/1.1 request parser (http-parser with our limits: the outcome must not depend on how the
// bytes are split, and no request over the limits comes out) or the JSON parser of the WebSocket API
// (a value it reads must write out and read back the same). Built by Scripts/fuzz.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWeb(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 1 else { return 0 }
    let body = UnsafeRawBufferPointer(start: data + 1, count: size - 1)
    if data[0] & 1 == 0 {
        var limits = HTTPLimits()
        limits.maxHeaderBytes = 256 + Int(data[0])
        limits.maxHeaders = 8
        limits.maxBodyBytes = 512
        let whole = HTTPRequestParser(limits: limits)
        let a = whole.parse(body)
        let first = whole.takeRequest()
        // the same bytes fed in pieces whose sizes come from the bytes themselves
        let pieces = HTTPRequestParser(limits: limits)
        var offset = 0
        var b = HTTPRequestParser.Outcome.needMore
        while offset < body.count {
            let n = min(body.count - offset, 1 + Int(body[offset] % 13))
            b = pieces.parse(UnsafeRawBufferPointer(rebasing: body[offset..<(offset + n)]))
            if case .request(let used) = b { b = .request(consumed: offset + used); break }
            if case .failed = b { break }
            offset += n
        }
        switch (a, b) {
        case (.request(let x), .request(let y)):
            precondition(x == y, "a request's end depends on how the bytes were split")
            let second = pieces.takeRequest()
            precondition(first?.target == second?.target && first?.body == second?.body && first?.method == second?.method,
                         "a request depends on how the bytes were split")
        case (.failed, .failed):
            break  // (which limit or error is met first may depend on the split: both refuse)
        case (.needMore, .needMore):
            break
        default:
            preconditionFailure("the outcome depends on how the bytes were split: \(a) vs \(b)")
        }
        if let r = first {
            precondition(r.headers.count <= limits.maxHeaders && r.body.count <= limits.maxBodyBytes, "a request over the limits came out")
        }
    } else {
        let bytes = Array(body)
        guard let v = try? JSONParser.parse(bytes) else { return 0 }
        let again = try? JSONParser.parse(v.text)
        precondition(again == v, "a JSON value does not survive write + read")
    }
    return 0
}
