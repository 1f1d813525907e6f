// swift-tools-version:6.0
// presenced: a clustered presence service. Layout:
//   C bridges      CNGHTTP2, CProtobufC, CCrypto, CTLS (Debian libraries), CSystemShim (epoll/eventfd/timerfd),
//                  CPresenceProto (protoc-c output of Protos/)
//   PresenceWire   Swift value types for the protobuf messages
//   EventLoop      epoll loops, timers, cross-thread wake-ups
//   GRPCTransport  HTTP/2 (nghttp2) + gRPC server and client
//   HTTPFrontDoor  HTTP/1.1 (http-parser) and WebSocket (wslay) server for browsers, Prometheus and probes (WEB.md)
//   Metrics        counters, gauges, histograms in Prometheus's text format
//   PresenceCore   the presence rules as plain state machines (channel, sessions, user home)
//   ClusterCore    the cluster rules as plain values: consistent-hash ring, SWIM membership
//   PresenceNode   a node: configuration, shard actors, services, lifecycle
//   PresenceClient the Swift client library (sessions, events, reconnect with resume)
//   presenced, presencectl   the executables
import PackageDescription

let package = Package(
    name: "presenced",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "presenced", targets: ["presenced"]),
        .executable(name: "presencectl", targets: ["presencectl"]),
        .library(name: "PresenceClient", targets: ["PresenceClient"]),
        .library(name: "GRPCTransport", targets: ["GRPCTransport"]),
        .library(name: "PresenceWire", targets: ["PresenceWire"]),
    ],
    targets: [
        .systemLibrary(name: "CNGHTTP2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(name: "CProtobufC", pkgConfig: "libprotobuf-c", providers: [.apt(["libprotobuf-c-dev"])]),
        .target(name: "CSystemShim"),
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CTLS", pkgConfig: "libssl", providers: [.apt(["libssl-dev"])]),
        .target(name: "CPresenceProto", dependencies: ["CProtobufC"]),
        .systemLibrary(name: "CHTTPParser", providers: [.apt(["libhttp-parser-dev"])]),
        .systemLibrary(name: "CWSLay", providers: [.apt(["libwslay-dev"])]),

        .target(name: "PresenceWire", dependencies: ["CPresenceProto", "CProtobufC"]),
        .target(name: "EventLoop", dependencies: ["CSystemShim"]),
        .target(name: "GRPCTransport", dependencies: ["EventLoop", "CNGHTTP2", "PresenceWire", "CSystemShim", "CTLS"]),
        .target(name: "HTTPFrontDoor", dependencies: ["EventLoop", "CHTTPParser", "CWSLay", "CCrypto", "CSystemShim"]),
        .target(name: "Metrics"),
        .target(name: "PresenceCore", dependencies: ["PresenceWire"]),
        .target(name: "ClusterCore", dependencies: ["PresenceCore", "PresenceWire"]),
        .target(name: "PresenceNode", dependencies: ["GRPCTransport", "HTTPFrontDoor", "Metrics", "PresenceWire", "PresenceCore", "ClusterCore", "EventLoop", "CCrypto"]),
        .executableTarget(name: "presenced", dependencies: ["PresenceNode"]),
        .target(name: "PresenceClient", dependencies: ["GRPCTransport", "PresenceWire", "EventLoop"]),
        .target(name: "PresenceCtl", dependencies: ["PresenceClient", "GRPCTransport", "PresenceWire", "EventLoop", "HTTPFrontDoor"]),
        .executableTarget(name: "presencectl", dependencies: ["PresenceCtl", "EventLoop"]),
        .executableTarget(name: "presence-bench", dependencies: ["PresenceNode", "PresenceCore", "PresenceWire", "EventLoop", "ClusterCore"]),

        // waits with deadlines shared by the test targets (no test may hang)
        .target(name: "TestSupport", dependencies: ["EventLoop"], path: "Tests/TestSupport"),
        .testTarget(name: "PresenceWireTests", dependencies: ["PresenceWire", "PresenceCore"]),
        .testTarget(name: "EventLoopTests", dependencies: ["EventLoop"]),
        .testTarget(name: "HTTPFrontDoorTests", dependencies: ["HTTPFrontDoor", "Metrics", "EventLoop"]),
        .testTarget(name: "GRPCTransportTests", dependencies: ["GRPCTransport", "PresenceWire", "EventLoop", "CSystemShim", "TestSupport"]),
        .testTarget(name: "PresenceCoreTests", dependencies: ["PresenceCore", "PresenceWire"]),
        .testTarget(name: "ClusterCoreTests", dependencies: ["ClusterCore", "PresenceCore", "PresenceWire"]),
        .testTarget(name: "PresenceNodeTests", dependencies: ["PresenceNode", "PresenceClient", "PresenceCtl", "GRPCTransport", "PresenceWire", "PresenceCore", "ClusterCore", "EventLoop", "TestSupport"]),
    ]
)
