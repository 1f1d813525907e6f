import Glibc

/// The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), read from /proc at
/// scrape time, under the node's prefix as WEB.md asks.
public enum ProcessMetrics {
    public static func register(in registry: MetricsRegistry, prefix: String) {
        registry.computed(prefix + "process_cpu_seconds_total", "CPU time the process used (user and system), seconds", kind: .counter) {
            guard let s = stat() else { return [] }
            return [Sample([], Double(s.utime + s.stime) / ticksPerSecond)]
        }
        registry.computed(prefix + "process_resident_memory_bytes", "Resident memory, bytes") {
            guard let text = read("/proc/self/statm"), let rss = text.split(separator: " ").dropFirst().first.flatMap({ Double($0) }) else { return [] }
            return [Sample([], rss * Double(sysconf(Int32(_SC_PAGESIZE))))]
        }
        registry.computed(prefix + "process_open_fds", "Open file descriptors") {
            [Sample([], Double(openDescriptors()))]
        }
        registry.computed(prefix + "process_max_fds", "Most file descriptors the process may open") {
            var l = rlimit()
            guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &l) == 0 else { return [] }
            return [Sample([], Double(l.rlim_cur))]
        }
        let start = startTime()
        registry.computed(prefix + "process_start_time_seconds", "When the process started, seconds since the Unix epoch") {
            start.map { [Sample([], $0)] } ?? []
        }
    }

    static var ticksPerSecond: Double { Double(sysconf(Int32(_SC_CLK_TCK))) }

    /// A whole small file from /proc (they report a size of 0, so read until the end).
    static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 4096)
        while out.count < 1 << 20 {
            let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            out += buf[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Fields of /proc/self/stat after the command name (which may hold spaces and parentheses).
    static func stat() -> (utime: UInt64, stime: UInt64, starttime: UInt64)? {
        guard let text = read("/proc/self/stat"), let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // (after the name: state is field 3, utime 14, stime 15, starttime 22; here index = field - 3)
        guard fields.count > 19, let u = UInt64(fields[11]), let s = UInt64(fields[12]), let st = UInt64(fields[19]) else { return nil }
        return (u, s, st)
    }

    static func startTime() -> Double? {
        guard let s = stat(), let text = read("/proc/stat"),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("btime ") }),
              let boot = Double(line.dropFirst(6)) else { return nil }
        return boot + Double(s.starttime) / ticksPerSecond
    }

    static func openDescriptors() -> Int {
        guard let dir = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(dir) }
        var n = 0
        while let e = readdir(dir) {
            if e.pointee.d_name.0 != 46 { n += 1 }   // (not "." or "..")
        }
        return n - 1   // (the directory stream's own descriptor)
    }
}
