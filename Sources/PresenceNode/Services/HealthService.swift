import GRPCTransport
import PresenceWire
import Synchronization

/// `grpc.health.v1.Health`: SERVING while the node runs and has joined its cluster (a readiness
/// probe can wait for it), NOT_SERVING before that and once it starts shutting down.
public final class HealthService: Sendable {
    private let serving = Atomic<Bool>(true)
    private let joining = Atomic<Bool>(false)

    public init() {}

    public func setNotServing() { serving.store(false, ordering: .relaxed) }

    /// While true (a node with seeds that has not joined yet) the node reads NOT_SERVING.
    public func setJoining(_ joining: Bool) { self.joining.store(joining, ordering: .relaxed) }

    private var status: HealthCheckResponse.ServingStatus {
        serving.load(ordering: .relaxed) && !joining.load(ordering: .relaxed) ? .serving : .notServing
    }

    /// Services this node knows: the whole node ("") and each gRPC service name.
    static let knownServices: Set<String> = ["", HealthMethods.serviceName, PresenceMethods.serviceName]

    public func register(in registry: inout ServiceRegistry) {
        // Check is answered on the loop thread: it never waits, so it should not pay for a task.
        registry.unaryInline(HealthMethods.check) { [self] request, _ in
            guard Self.knownServices.contains(request.service) else {
                throw GRPCStatus(.notFound, "SERVICE_UNKNOWN: no service named '\(request.service)'")
            }
            return HealthCheckResponse(status: status)
        }
        registry.serverStreaming(HealthMethods.watch) { [self] request, _, writer in
            guard Self.knownServices.contains(request.service) else {
                try await writer.send(HealthCheckResponse(status: .serviceUnknown))
                return
            }
            var last = status
            try await writer.send(HealthCheckResponse(status: last))
            while !Task.isCancelled {
                try await Task.sleep(nanoseconds: 100_000_000)
                if status != last {
                    last = status
                    try await writer.send(HealthCheckResponse(status: last))
                }
            }
        }
    }
}
