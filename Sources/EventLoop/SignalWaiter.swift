import Foundation
import Glibc

/// Delivers SIGTERM/SIGINT (stop) and SIGHUP (reload) to a callback reliably. Call `blockTermination()` first thing in `main`,
/// before any thread starts, so that every thread inherits the blocked mask; then `start` waits for
/// the signals with `sigwait` on a thread of its own. (A dispatch signal source is not reliable on
/// Linux when other threads leave the signal unblocked: the kernel may deliver it to one of them.)
public enum SignalWaiter {
    private static func terminationSet() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGHUP)
        return set
    }

    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and in threads it creates later). Call it
    /// from the main thread before anything else. Also undoes an inherited SIG_IGN (a shell starts
    /// background jobs with SIGINT ignored), since an ignored signal never reaches `sigwait`.
    public static func blockTermination() {
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
        signal(SIGHUP, SIG_DFL)
        var set = terminationSet()
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Calls `handler` with the signal number each time SIGTERM, SIGINT or SIGHUP arrives.
    public static func start(_ handler: @escaping @Sendable (Int32) -> Void) {
        let t = Thread {
            var set = terminationSet()
            while true {
                var sig: Int32 = 0
                if sigwait(&set, &sig) == 0 { handler(sig) }
            }
        }
        t.name = "signals"
        t.start()
    }
}
