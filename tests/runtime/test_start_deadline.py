"""runtime/ray/start_bound.py's deadline on its own (no Ray started): a timer whose
exception was swallowed on the way still fails the start, and quietly."""
from __future__ import annotations

import time

import pytest


def test_a_deadline_whose_exception_was_swallowed_still_fails_the_start(capsys):
    """The timer's exception can land where Python cannot raise it (an after-fork hook,
    a `__del__`): the start still fails with the bound's message, and the ignored
    exception is not printed."""
    from hybridflow.runtime.ray.start_bound import RayStartError, _deadline, _Expired

    class Finalized:
        def __del__(self):
            raise _Expired()  # what the timer raises, inside a finalizer
    with pytest.raises(RayStartError, match=r"runtime.start_timeout_s=0.05s"):
        with _deadline(0.05):
            try:
                time.sleep(2)
            except BaseException:  # noqa: BLE001 - swallowed, as Ray's start-up code may
                pass
            thing = Finalized()
            del thing
    assert "Exception ignored" not in capsys.readouterr().err
