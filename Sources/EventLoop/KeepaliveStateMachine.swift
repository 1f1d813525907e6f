/// Decides when to PING a connection's peer and when to give it up as dead.
///
/// After `interval` with nothing read from the peer, send a PING; if nothing at all (the ACK or any
/// other bytes) arrives within `timeout` after it, the peer is dead: close the connection.
/// Pure: the caller feeds it clock readings and carries out what it returns.
public struct KeepaliveStateMachine: Sendable {
    public enum Action: Equatable, Sendable {
        case none
        case sendPing
        case closeConnection
    }

    public let interval: UInt64
    public let timeout: UInt64
    private var lastReadAt: UInt64
    private var pingSentAt: UInt64? = nil

    public init(interval: UInt64, timeout: UInt64, now: UInt64) {
        self.interval = interval
        self.timeout = timeout
        self.lastReadAt = now
    }

    /// Bytes arrived from the peer: it is alive.
    public mutating func bytesRead(now: UInt64) {
        lastReadAt = now
        pingSentAt = nil
    }

    /// When the caller should next call `timerFired`.
    public var nextDeadline: UInt64 {
        if let p = pingSentAt { return p &+ timeout }
        return lastReadAt &+ interval
    }

    public mutating func timerFired(now: UInt64) -> Action {
        if let p = pingSentAt {
            return now >= p &+ timeout ? .closeConnection : .none
        }
        if now >= lastReadAt &+ interval {
            pingSentAt = now
            return .sendPing
        }
        return .none
    }
}
