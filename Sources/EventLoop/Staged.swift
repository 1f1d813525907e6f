/// A call's outcome as far as it could go on the calling thread: its value, when it never had to
/// wait; the call to try again on another loop, where what it needs runs; or the rest of the call,
/// to be awaited.
///
/// A call that can finish at once (its shard runs on the caller's loop, nothing to wait for) is
/// answered without starting a task or suspending; one whose shard runs on another of the node's
/// loops is handed to that loop as a plain job (no task, no actor hop); one that must wait for
/// another node or a replica's acknowledgement hands over the rest as `later`.
public enum Staged<Value: Sendable, Failure: Error>: Sendable {
    /// The call is done.
    case now(Value)
    /// The call is to be tried again on `loop`: run the closure there, once, and carry on with
    /// what it returns (which may not be `onLoop` again: it is made to give `now` or `later`).
    case onLoop(EventLoop, @Sendable () throws(Failure) -> Staged<Value, Failure>)
    /// What is left of the call; run it once.
    case later(@Sendable () async throws(Failure) -> Value)

    /// The value, awaiting the rest when there is one.
    @inlinable public var value: Value {
        get async throws(Failure) {
            switch self {
            case .now(let v):
                return v
            case .later(let rest):
                return try await rest()
            case .onLoop(let loop, let attempt):
                let outcome = await Self.run(attempt, on: loop)
                return try await outcome.get().value
            }
        }
    }

    /// Runs `attempt` on `loop`, or here when that loop has stopped (so the caller is not left
    /// waiting on a job that will never run; what the attempt then gives is its own affair: a
    /// rest that waits on that loop waits as any call to it would).
    @usableFromInline static func run(_ attempt: @escaping @Sendable () throws(Failure) -> Staged<Value, Failure>,
                                      on loop: EventLoop) async -> Result<Staged<Value, Failure>, Failure> {
        await withUnsafeContinuation { (c: UnsafeContinuation<Result<Staged<Value, Failure>, Failure>, Never>) in
            if !loop.execute({ c.resume(returning: Result(catching: attempt)) }) {
                c.resume(returning: Result(catching: attempt))
            }
        }
    }

    /// The same outcome, with `done` run once when it ends, whichever way (at once, there, or
    /// after the rest; succeeding or failing).
    @inlinable public func finally(_ done: @escaping @Sendable () -> Void) -> Staged<Value, Failure> {
        switch self {
        case .now:
            done()
            return self
        case .onLoop(let loop, let attempt):
            return .onLoop(loop) { () throws(Failure) -> Staged<Value, Failure> in
                let next: Staged<Value, Failure>
                do throws(Failure) { next = try attempt() } catch { done(); throw error }
                return next.finally(done)
            }
        case .later(let rest):
            return .later { () async throws(Failure) -> Value in
                defer { done() }
                return try await rest()
            }
        }
    }

    /// The same outcome with its value transformed (at once, there, or after the rest).
    ///
    /// (Inlinable, as `value`: specialised where it is used; called generically across modules it
    /// looked up the enum's type metadata on every call, 3% of a SetState profile.)
    @inlinable public func map<T: Sendable>(_ transform: @escaping @Sendable (Value) -> T) -> Staged<T, Failure> {
        switch self {
        case .now(let v): return .now(transform(v))
        case .onLoop(let loop, let attempt): return .onLoop(loop) { () throws(Failure) -> Staged<T, Failure> in try attempt().map(transform) }
        case .later(let rest): return .later { () async throws(Failure) -> T in transform(try await rest()) }
        }
    }
}
