"""One clock for the whole run: seconds since the start (monotonic), and the conversion of the
servers' wall-clock event timestamps (`timestamp_ms`) onto it. Every process runs on this machine,
so the wall clock is shared.

The wall clock is not steady, though: a VM's clock is stepped and slewed by its host's time sync
(seen on this project's VM: +3.6 s in one step in the middle of a run, netns seed 93, then +0.8 s
more by slewing). Mapped with the offset of the run's start, every later server timestamp came out
seconds ahead of when it was made, and the checker judged events against the wrong moment (586
false violations of invariants 3 and 8). So the offset between the wall clock and the monotonic
one is noted whenever the harness reads the time (each event it receives does), and a timestamp is
mapped with the offset that held when the wall clock read it."""
import bisect
import time

_T0 = time.monotonic()
_WALL0 = time.time()
# The offsets (wall - monotonic) noted, each with the wall time from which it held; kept short by
# noting a new one only when the offset moved by more than _NOTE_ABOVE.
_SINCE = [float("-inf")]
_OFFSET = [_WALL0 - _T0]
_NOTE_ABOVE = 0.005


def _note_offset():
    wall, mono = time.time(), time.monotonic()
    off = wall - mono
    # (a step back leaves the wall times unordered: that offset is then not noted)
    if abs(off - _OFFSET[-1]) > _NOTE_ABOVE and wall > _SINCE[-1]:
        # (appends from several threads: a list's append is atomic; an offset noted out of order
        # by a few microseconds changes nothing that matters here)
        _SINCE.append(wall)
        _OFFSET.append(off)


def now():
    """Seconds since the harness started."""
    _note_offset()
    return time.monotonic() - _T0


def from_wall_ms(ms):
    """A server timestamp (Unix epoch milliseconds) in run seconds."""
    wall = ms / 1000.0
    i = bisect.bisect_right(_SINCE, wall) - 1
    return wall - _OFFSET[max(0, i)] - _T0


def fmt(t):
    return f"{t:8.2f}s"


def reset():
    """Starts the run clock again (each run of `--ci` counts from its own start)."""
    global _T0, _WALL0
    _T0 = time.monotonic()
    _WALL0 = time.time()
    _SINCE[:] = [float("-inf")]
    _OFFSET[:] = [_WALL0 - _T0]
