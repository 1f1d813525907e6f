"""One clock for the whole run: seconds since the start (monotonic), and the conversion of the
servers' wall-clock event timestamps (`timestamp_ms`) onto it. Every process runs on this machine,
so the wall clock is shared; the offset is taken once."""
import time

_T0 = time.monotonic()
_WALL0 = time.time()


def now():
    """Seconds since the harness started."""
    return time.monotonic() - _T0


def from_wall_ms(ms):
    """A server timestamp (Unix epoch milliseconds) in run seconds."""
    return ms / 1000.0 - _WALL0


def fmt(t):
    return f"{t:8.2f}s"


def reset():
    """Starts the run clock again (each run of `--ci` counts from its own start)."""
    global _T0, _WALL0
    _T0 = time.monotonic()
    _WALL0 = time.time()
