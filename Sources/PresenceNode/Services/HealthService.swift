import GRPCTransport
import PresenceWire
import Synchronization

/// `grpc.health.v1.Health`: SERVING while the node runs and has joined its cluster (a readiness
/// probe can wait for it), NOT_SERVING before that and once it starts shutting down.
public final class HealthService: Sendable {
    private let serving = Atomic<Bool>(true)
    private let joining = Atomic<Bool>(false)
    /// Watch streams waiting for the status to change, by ticket (event-driven: no polling).
    private let waiters = Mutex<(next: Int, byTicket: [Int: CheckedContinuation<Void, Never>])>((0, [:]))

    public init() {}

    public func setNotServing() {
        serving.store(false, ordering: .relaxed)
        wakeWatchers()
    }

    /// While true (a node with seeds that has not joined yet) the node reads NOT_SERVING.
    public func setJoining(_ joining: Bool) {
        self.joining.store(joining, ordering: .relaxed)
        wakeWatchers()
    }

    /// Watch streams parked until the status changes (for tests and metrics).
    public var waitingWatchers: Int { waiters.withLock { $0.byTicket.count } }

    private func wakeWatchers() {
        let all = waiters.withLock { w -> [CheckedContinuation<Void, Never>] in
            defer { w.byTicket = [:] }
            return Array(w.byTicket.values)
        }
        for c in all { c.resume() }
    }

    /// Returns once the status may differ from `last` (at once if it already does), or when the
    /// calling task is cancelled.
    private func waitForChange(from last: HealthCheckResponse.ServingStatus) async {
        let ticket = waiters.withLock { w -> Int in
            w.next += 1
            return w.next
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let now = waiters.withLock { w -> Bool in
                    // (checked under the lock: a change between the caller's read and this is not missed)
                    if status != last || Task.isCancelled { return true }
                    w.byTicket[ticket] = c
                    return false
                }
                if now { c.resume() }
            }
        } onCancel: {
            let c = waiters.withLock { $0.byTicket.removeValue(forKey: ticket) }
            c?.resume()
        }
    }

    /// Whether the node has joined and serves (`/readyz`).
    public var isServing: Bool { status == .serving }

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
                await waitForChange(from: last)
                if status != last {
                    last = status
                    try await writer.send(HealthCheckResponse(status: last))
                }
            }
        }
    }
}
