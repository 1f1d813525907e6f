import GRPCTransport
import PresenceWire

/// gRPC server reflection (`grpc.reflection.v1` and `v1alpha`, Protos/reflection.proto) on the
/// client port, so grpcurl, grpcui, Postman and any grpcio-reflection client can list the
/// services and call every method without the .proto files. The descriptors are the ones the
/// Swift types were generated from (`ServedDescriptors`, Scripts/descgen.py).
public enum ReflectionService {
    static let v1 = ServerReflectionMethods.serverReflectionInfo
    /// The same messages under the older package name (the wire is identical).
    static let v1alpha = MethodDescriptor<ReflectionServerReflectionRequest, ReflectionServerReflectionResponse>(
        path: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", kind: .bidiStreaming)

    public static func register(in registry: inout ServiceRegistry) {
        for method in [v1, v1alpha] {
            registry.bidiStreaming(method) { requests, _, writer in
                for try await request in requests {
                    try await writer.send(answer(request))
                }
            }
        }
    }

    /// The answer to one question (a plain function of the question and the served descriptors).
    public static func answer(_ request: ReflectionServerReflectionRequest) -> ReflectionServerReflectionResponse {
        var response = ReflectionServerReflectionResponse()
        response.validHost = request.host
        response.originalRequest = request
        switch request.messageRequest {
        case .listServices?:
            var list = ReflectionListServiceResponse()
            list.service = ServedDescriptors.services.map { name in
                var s = ReflectionServiceResponse()
                s.name = name
                return s
            }
            response.messageResponse = .listServicesResponse(list)
        case .fileByFilename(let name)?:
            response.messageResponse = files(from: name).map { .fileDescriptorResponse($0) }
                ?? error(.notFound, "no file named \(name.prefix(200)) is served here")
        case .fileContainingSymbol(let symbol)?:
            response.messageResponse = symbolFile(symbol).flatMap(files(from:)).map { .fileDescriptorResponse($0) }
                ?? error(.notFound, "no symbol named \(symbol.prefix(200)) is served here")
        case .fileContainingExtension?:
            response.messageResponse = error(.notFound, "the served files define no extensions")
        case .allExtensionNumbersOfType(let type)?:
            if symbolFile(type) != nil {
                var numbers = ReflectionExtensionNumberResponse()
                numbers.baseTypeName = type
                response.messageResponse = .allExtensionNumbersResponse(numbers)
            } else {
                response.messageResponse = error(.notFound, "no type named \(type.prefix(200)) is served here")
            }
        case nil:
            response.messageResponse = error(.invalidArgument, "the request asks nothing")
        }
        return response
    }

    /// The file defining a symbol; a field or enum value is found through its message or enum.
    static func symbolFile(_ symbol: String) -> String? {
        let s = symbol.hasPrefix(".") ? String(symbol.dropFirst()) : symbol
        if let f = ServedDescriptors.symbols[s] { return f }
        guard let dot = s.lastIndex(of: ".") else { return nil }
        return ServedDescriptors.symbols[String(s[..<dot])]
    }

    /// A file and everything it imports, the file first (clients resolve its imports from the rest).
    static func files(from name: String) -> ReflectionFileDescriptorResponse? {
        guard ServedDescriptors.files[name] != nil else { return nil }
        var order: [String] = []
        var todo = [name]
        while let next = todo.first {
            todo.removeFirst()
            guard !order.contains(next), let f = ServedDescriptors.files[next] else { continue }
            order.append(next)
            todo += f.dependencies
        }
        var r = ReflectionFileDescriptorResponse()
        r.fileDescriptorProto = order.compactMap { ServedDescriptors.files[$0]?.descriptor }
        return r
    }

    private static func error(_ code: GRPCStatus.Code, _ message: String) -> ReflectionServerReflectionResponse.MessageResponse {
        var e = ReflectionErrorResponse()
        e.errorCode = Int32(code.rawValue)
        e.errorMessage = message
        return .errorResponse(e)
    }
}
