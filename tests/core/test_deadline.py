"""Deadlines on user code (hybridflow/core/deadline.py): a call that runs past its bound
raises CallTimeout naming what was called and the bound, in the main thread (a
SIGALRM timer, which also interrupts sleeps) and in other threads; nested deadlines
each report their own; a call that returns in time leaves no timer behind."""
import signal
import threading
import time

import pytest

from hybridflow.core.deadline import CallTimeout, call_with_deadline


def _spin():
    while True:
        pass


@pytest.mark.parametrize("body", [lambda: time.sleep(30), _spin])
def test_a_call_past_its_deadline_raises_naming_it(body):
    with pytest.raises(CallTimeout) as info:
        call_with_deadline(body, 0.3, "node 'slow' (g.py:3)", "runtime.call_timeout_s")
    message = str(info.value)
    assert "node 'slow' (g.py:3)" in message and "runtime.call_timeout_s=0.3" in message


def test_a_call_in_time_returns_its_value_and_disarms_the_timer():
    assert call_with_deadline(lambda: 7, 5.0, "x") == 7
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_nested_deadlines_each_report_their_own():
    def inner_times_out():
        with pytest.raises(CallTimeout) as inner:
            call_with_deadline(lambda: time.sleep(30), 0.2, "inner")
        assert inner.value.what == "inner"
        return "outer went on"
    assert call_with_deadline(inner_times_out, 5.0, "outer") == "outer went on"
    with pytest.raises(CallTimeout) as outer:
        call_with_deadline(lambda: call_with_deadline(lambda: time.sleep(30), 20.0, "inner"),
                           0.3, "outer")
    assert outer.value.what == "outer"


def test_a_call_outside_the_main_thread_is_bounded_too():
    caught = []

    def worker():
        try:
            call_with_deadline(_spin, 0.3, "in a thread")
        except CallTimeout as err:
            caught.append(err)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert caught and caught[0].what == "in a thread"


def test_no_bound_when_the_timeout_is_zero_or_none():
    assert call_with_deadline(lambda: 1, None, "x") == 1
    assert call_with_deadline(lambda: 2, 0, "x") == 2
