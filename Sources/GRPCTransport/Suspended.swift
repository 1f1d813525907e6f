/// A suspended task's continuation, boxed, for the state of a queue that is touched on every
/// message (a stream's writer, its requests, a session's outbox).
///
/// `CheckedContinuation` is a type whose layout the Concurrency library keeps to itself: a struct
/// that holds one, even as an optional, has a layout known only at run time, and every access to
/// any of its fields went through the runtime's value witnesses (copying the optional, asking
/// whether it is nil) while the lock was held: 2% of a fan-out profile. Boxed, the field is one
/// reference, and the struct's layout is fixed again.
public final class Suspended<T, E: Error>: Sendable {
    public let continuation: CheckedContinuation<T, E>

    public init(_ continuation: CheckedContinuation<T, E>) {
        self.continuation = continuation
    }
}
