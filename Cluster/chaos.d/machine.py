"""How busy the machine was during a run, and how much of that was someone else.

Timing faults (a node declared dead because it could not answer a probe in 80 ms) also appear when
other programs take the CPU, so every run reports the load average and the share of the machine's
CPU that processes other than this run's (nodes, proxy, harness) used. Linux /proc only."""
import os
import threading


def _cpu_total():
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def _proc_cpu(pid):
    """utime + stime jiffies of a process (its threads included), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


class MachineLoad:
    def __init__(self, pids_of, period=2.0):
        """`pids_of()` returns the pids of this run's processes (nodes, proxy) right now."""
        self.pids_of = pids_of
        self.period = period
        self.stop = threading.Event()
        self.ours = {}           # pid -> [jiffies at its first sample (0 for our children), last]
        self.loads = []
        self.start = None
        self.end = None
        self.thread = threading.Thread(target=self._run, name="machine", daemon=True)

    def begin(self):
        self.start = _cpu_total()
        self._sample()
        self.thread.start()

    def _sample(self):
        me = os.getpid()
        for pid in [me, *self.pids_of()]:
            v = _proc_cpu(pid)
            if v is None:
                continue
            if pid not in self.ours:
                # the harness counts from now on; nodes and the proxy start after begin()
                self.ours[pid] = [v if pid == me else 0, v]
            self.ours[pid][1] = v
        try:
            self.loads.append(os.getloadavg()[0])
        except OSError:
            pass

    def _run(self):
        while not self.stop.wait(self.period):
            self._sample()

    def finish(self):
        self.stop.set()
        self._sample()
        self.end = _cpu_total()

    def summary(self):
        if not self.start or not self.end:
            return {}
        busy = self.end[0] - self.start[0]
        total = max(1, self.end[1] - self.start[1])
        ours = sum(last - first for first, last in self.ours.values())
        other = max(0, busy - ours)
        return {"load_avg_mean": round(sum(self.loads) / len(self.loads), 2) if self.loads else None,
                "load_avg_max": round(max(self.loads), 2) if self.loads else None,
                "cpu_busy_pct": round(100.0 * busy / total, 1),
                "cpu_this_run_pct": round(100.0 * ours / total, 1),
                "cpu_others_pct": round(100.0 * other / total, 1)}
