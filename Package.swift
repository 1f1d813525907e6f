// swift-tools-version:6.0
// presenced: a clustered presence service. Layout:
//   C bridges      CNGHTTP2, CProtobufC (Debian libraries), CSystemShim (epoll/eventfd/timerfd),
//                  CPresenceProto (protoc-c output of Protos/)
//   PresenceWire   Swift value types for the protobuf messages
//   EventLoop      epoll loops, timers, cross-thread wake-ups
//   GRPCTransport  HTTP/2 (nghttp2) + gRPC server and client
//   PresenceNode   a node: configuration, services, lifecycle
//   presenced, presencectl   the executables
import PackageDescription

let package = Package(
    name: "presenced",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "presenced", targets: ["presenced"]),
        .executable(name: "presencectl", targets: ["presencectl"]),
        .library(name: "GRPCTransport", targets: ["GRPCTransport"]),
        .library(name: "PresenceWire", targets: ["PresenceWire"]),
    ],
    targets: [
        .systemLibrary(name: "CNGHTTP2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(name: "CProtobufC", pkgConfig: "libprotobuf-c", providers: [.apt(["libprotobuf-c-dev"])]),
        .target(name: "CSystemShim"),
        .target(name: "CPresenceProto", dependencies: ["CProtobufC"]),

        .target(name: "PresenceWire", dependencies: ["CPresenceProto", "CProtobufC"]),
        .target(name: "EventLoop", dependencies: ["CSystemShim"]),
        .target(name: "GRPCTransport", dependencies: ["EventLoop", "CNGHTTP2", "PresenceWire", "CSystemShim"]),
        .target(name: "PresenceNode", dependencies: ["GRPCTransport", "PresenceWire", "EventLoop"]),
        .executableTarget(name: "presenced", dependencies: ["PresenceNode"]),
        .executableTarget(name: "presencectl", dependencies: ["GRPCTransport", "PresenceWire"]),

        .testTarget(name: "PresenceWireTests", dependencies: ["PresenceWire"]),
        .testTarget(name: "EventLoopTests", dependencies: ["EventLoop"]),
        .testTarget(name: "GRPCTransportTests", dependencies: ["GRPCTransport", "PresenceWire", "EventLoop", "CSystemShim"]),
        .testTarget(name: "PresenceNodeTests", dependencies: ["PresenceNode", "GRPCTransport", "PresenceWire"]),
    ]
)
