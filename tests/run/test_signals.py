"""The signal guard (hybridflow/run/signals.py): a first signal inside a step is only
recorded, a second one (or one outside a step) stops at once, handlers come back on
exit, and signals taken by a library (ray.init's SIGTERM handler) are taken back."""
from __future__ import annotations

import os
import signal

import pytest

from hybridflow.run.signals import Interrupted, SignalGuard


def test_a_signal_inside_a_step_is_deferred_and_a_second_one_stops_at_once():
    said = []
    with SignalGuard(say=said.append) as guard:
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.pending == signal.SIGTERM  # the step goes on
            with pytest.raises(Interrupted) as stop:
                os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.exit_code == 143 and stop.value.signal_name == "SIGTERM"
    assert "SIGTERM: stopping after this step" in said[0]


def test_a_signal_outside_a_step_stops_at_once_and_is_a_keyboard_interrupt():
    with SignalGuard(say=lambda text: None), pytest.raises(KeyboardInterrupt) as stop:
        os.kill(os.getpid(), signal.SIGHUP)
    assert stop.value.exit_code == 129


def test_handlers_are_restored_and_taken_back_from_a_library():
    before = signal.getsignal(signal.SIGTERM)
    with SignalGuard() as guard:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as ray.init does
        guard.reclaim()
        assert signal.getsignal(signal.SIGTERM) == guard._handle
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_grace_longer_than_a_timer_can_wait_still_arms_the_bound():
    """A grace past the platform's time_t (a guard built without the config's bound)
    must not kill the timer's thread with OverflowError: the bound stays armed."""
    with SignalGuard(say=lambda text: None, grace_s=1e12) as guard:
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.pending == signal.SIGTERM
            guard._timer.join(0.2)
            assert guard._timer.is_alive()  # still waiting, not dead of OverflowError
        guard.disarm()
