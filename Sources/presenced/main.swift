import Dispatch
import Foundation
import PresenceNode

// presenced: parse flags, start the node, stop gracefully on SIGTERM or SIGINT.
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
    print(NodeConfiguration.usage, terminator: "")
    exit(0)
}

let node = Node(configuration: configuration)
do {
    try node.start()
} catch {
    FileHandle.standardError.write(Data("presenced: cannot start: \(error)\n".utf8))
    exit(1)
}

var signalSources: [DispatchSourceSignal] = []
for sig in [SIGTERM, SIGINT] {
    signal(sig, SIG_IGN)
    let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
    source.setEventHandler {
        Task {
            await node.shutdown()
            exit(0)
        }
    }
    source.resume()
    signalSources.append(source)
}
dispatchMain()
