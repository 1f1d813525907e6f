/// A call's outcome as far as it could go on the calling thread: its value, when it never had to
/// wait, or the rest of the call, to be awaited.
///
/// A call that can finish at once (its shard runs on the caller's loop, nothing to wait for) is
/// answered without starting a task or suspending; one that must wait for an actor on another
/// thread, another node or a replica's acknowledgement hands over the rest as `later`.
public enum Staged<Value: Sendable, Failure: Error>: Sendable {
    /// The call is done.
    case now(Value)
    /// What is left of the call; run it once.
    case later(@Sendable () async throws(Failure) -> Value)

    /// The value, awaiting the rest when there is one.
    @inlinable public var value: Value {
        get async throws(Failure) {
            switch self {
            case .now(let v): return v
            case .later(let rest): return try await rest()
            }
        }
    }

    /// The same outcome with its value transformed (at once, or after the rest).
    ///
    /// (Inlinable, as `value`: specialised where it is used; called generically across modules it
    /// looked up the enum's type metadata on every call, 3% of a SetState profile.)
    @inlinable public func map<T: Sendable>(_ transform: @escaping @Sendable (Value) -> T) -> Staged<T, Failure> {
        switch self {
        case .now(let v): return .now(transform(v))
        case .later(let rest): return .later { () async throws(Failure) -> T in transform(try await rest()) }
        }
    }
}
