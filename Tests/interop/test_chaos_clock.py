"""The chaos harness's clock (Cluster/chaos.d/clock.py): a server's wall-clock timestamp maps onto
the run's monotonic seconds even when the machine's wall clock is stepped during the run (a VM's
time sync did, by 3.6 s, in the middle of netns seed 93: every later event was judged seconds late)."""
import importlib.util
import os
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _load_clock():
    spec = importlib.util.spec_from_file_location("chaos_clock", os.path.join(ROOT, "Cluster", "chaos.d", "clock.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_of_the_wall_clock_does_not_move_the_events_made_after_it(monkeypatch):
    clock = _load_clock()
    real = time.time
    before = real() * 1000
    t_before = clock.now()
    monkeypatch.setattr(time, "time", lambda: real() + 3.6)   # the host steps the clock forward
    t_after = clock.now()                                      # the harness reads the time (an event)
    after = time.time() * 1000
    assert abs(clock.from_wall_ms(before) - t_before) < 0.05
    assert abs(clock.from_wall_ms(after) - t_after) < 0.05
    # (with the start's offset alone, the event after the step came out 3.6 s ahead)
    assert clock.from_wall_ms(after) - t_after < 1.0


def test_a_clock_that_does_not_move_maps_as_before():
    clock = _load_clock()
    t = clock.now()
    assert abs(clock.from_wall_ms(time.time() * 1000) - t) < 0.05
    clock.reset()
    assert abs(clock.from_wall_ms(time.time() * 1000) - clock.now()) < 0.05
