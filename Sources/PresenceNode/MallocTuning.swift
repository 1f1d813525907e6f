import Foundation

/// The one allocator setting the node runs with: a deeper glibc per-thread cache of freed blocks.
///
/// glibc's tcache keeps 7 freed blocks of each size per thread by default. A call's small
/// allocations (the task, its frames, the decoded request, the answer) are freed in bursts, often
/// on another loop's thread than the one that made them, so the 8th block of a size falls through to
/// the fastbins and the arena lock, and the next allocation of a kilobyte or more consolidates the
/// fastbins. With 64 per size the churn stays in the thread's cache: `Scripts/ab` puts SetState at
/// 8% less node CPU per call, and `presence-bench memory` is unchanged (the cache holds at most
/// 64 blocks of each of its 64 sizes up to 1 KiB: 2 MiB per thread at the very worst). jemalloc and mimalloc,
/// tried in the same A/B, saved as much or less and cost 9-18% more memory per membership.
///
/// glibc reads its tunables once, when the program is loaded, so the node re-executes itself with
/// `GLIBC_TUNABLES` extended before it does anything else. A `GLIBC_TUNABLES` that already sets
/// `glibc.malloc.tcache_count` is left as it is: that is also how to opt out
/// (`GLIBC_TUNABLES=glibc.malloc.tcache_count=7` is glibc's default).
public enum MallocTuning {
    /// The tunable's name, as glibc spells it.
    public static let tunable = "glibc.malloc.tcache_count"
    /// Freed blocks kept per size and thread.
    public static let cachedBlocksPerSize = 64

    /// The `GLIBC_TUNABLES` value the node should run with, or nil when `current` already settles the
    /// cache depth (so a node that re-executed itself, or one an operator tuned, runs on as it is).
    public static func tunables(current: String?) -> String? {
        let ours = "\(tunable)=\(cachedBlocksPerSize)"
        guard let current, !current.isEmpty else { return ours }
        let settings = current.split(separator: ":")
        if settings.contains(where: { $0.hasPrefix(tunable + "=") }) { return nil }
        return current + ":" + ours
    }

    /// Re-executes the running program with the tunable set, when it is not yet. Returns only when
    /// nothing needs doing or the exec failed (the node then runs with glibc's default, which is
    /// slower but correct). Call it first thing in `main`, before any thread or descriptor exists.
    public static func reexecIfNeeded() {
        let current = getenv("GLIBC_TUNABLES").map { String(cString: $0) }
        guard let wanted = tunables(current: current) else { return }
        setenv("GLIBC_TUNABLES", wanted, 1)
        // The binary's own path (from /proc/self/exe, so a relative path or a PATH lookup does not
        // matter), not /proc/self/exe itself: the kernel names a process after the file it executes,
        // and `ps`, `pgrep` and `top` should go on seeing "presenced", not "exe".
        var path = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &path, path.count - 1)
        if length > 0 {
            execv(path, CommandLine.unsafeArgv)
        }
        // Still here: no /proc, or the binary is gone. Run untuned rather than not at all.
        if let current { setenv("GLIBC_TUNABLES", current, 1) } else { unsetenv("GLIBC_TUNABLES") }
    }
}
