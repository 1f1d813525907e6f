import EventLoop
import Foundation
import Synchronization

/// The `presenced` program: parse flags, start the node, stop gracefully on SIGTERM or SIGINT, reload certificates on SIGHUP.
public enum NodeMain {
    public static func run() -> Never {
        MallocTuning.reexecIfNeeded()
        signal(SIGPIPE, SIG_IGN)
        SignalWaiter.blockTermination()  // before any thread exists
        let parsed: NodeConfiguration.ParseResult
        do {
            parsed = try NodeConfiguration.parse(arguments: Array(CommandLine.arguments.dropFirst()),
                                                 environment: ProcessInfo.processInfo.environment,
                                                 hostName: ProcessInfo.processInfo.hostName)
        } catch {
            FileHandle.standardError.write(Data("presenced: \(error)\n".utf8))
            exit(2)
        }
        guard case .run(let configuration) = parsed else {
            FileHandle.standardOutput.write(Data(NodeConfiguration.usage.utf8))
            exit(0)
        }
        let node: Node
        do {
            node = try Node(configuration: configuration)
            try node.start()
        } catch {
            FileHandle.standardError.write(Data("presenced: cannot start: \(error)\n".utf8))
            exit(1)
        }
        let stopping = Atomic<Bool>(false)
        SignalWaiter.start { sig in
            if sig == SIGHUP {
                _ = node.reloadCertificates()
                return
            }
            guard !stopping.exchange(true, ordering: .relaxed) else {
                // a second signal while shutting down: stop now
                exit(sig == SIGINT ? 130 : 143)
            }
            Task.detached {
                await node.shutdown()
                exit(0)
            }
        }
        while true { sleep(3600) }
    }
}
