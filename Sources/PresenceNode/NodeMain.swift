import Dispatch
import Foundation

/// The `presenced` program: parse flags, start the node, stop gracefully on SIGTERM or SIGINT.
public enum NodeMain {
    public static func run() -> Never {
        signal(SIGPIPE, SIG_IGN)
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
        let sources = [SIGTERM, SIGINT].map { sig -> DispatchSourceSignal in
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { @Sendable in
                Task.detached {
                    await node.shutdown()
                    exit(0)
                }
            }
            source.resume()
            return source
        }
        withExtendedLifetime(sources) { dispatchMain() }
    }
}
