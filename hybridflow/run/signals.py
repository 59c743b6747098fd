"""Stopping a run on a signal, at a point where its state is consistent.

SIGINT (Ctrl-C), SIGTERM (what schedulers and preemption send) and SIGHUP (the
terminal closed) are handled alike. While a step or a checkpoint runs, stopping at
once would leave weights, the data loader and the RNGs out of step with each other,
so the first signal is only recorded: the step finishes, the loop saves a checkpoint
and raises `Interrupted`. A second signal raises `Interrupted` at once (the last
checkpoint stays the one to resume from). Outside a step (start-up, validation
between steps is inside one) a signal raises at once.

The wait for the step is bounded (`grace_s`, the loop sets `trainer.stop_timeout_s`):
a step that cannot end (it waits for rows that never come, a call that hangs) must
not keep a run alive past its scheduler's kill. The first signal arms a timer; if the
step and its save have not ended when it fires, the timer sends the same signal to
the main thread, which stops the run at once as a second signal does (`Interrupted`
with `timed_out`), keeping the last completed checkpoint.

State kept by a `SignalGuard`: `deferring` (a step or save is running), `pending`
(the signal received while deferring, or None), `grace_s` and the timer the first
signal armed (`expired` once it fired), and the handlers it replaced, which
it puts back on exit (`reclaim()` takes the signals back from a library that
installed its own, as `ray.init` does for SIGTERM). Only the main thread can install
handlers; elsewhere the guard installs nothing and signals keep their default
behaviour.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Self

__all__ = ["Interrupted", "SignalGuard", "HANDLED"]

HANDLED = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None))
                if s is not None)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; `exit_code` follows the shell's 128 + signal number."""

    def __init__(self, signum: int, saved: str | None = None,
                 timed_out: float | None = None):
        self.signum, self.saved, self.timed_out = signum, saved, timed_out
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        super().__init__(self.signal_name)


class SignalGuard:
    def __init__(self, say=None, grace_s: float = 60.0):
        from hybridflow.core.printable import echo
        self.say = say or (lambda text: echo(text, file=sys.stderr, flush=True))
        self.deferring = False
        self.pending: int | None = None
        self.grace_s = grace_s
        self.expired = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def holds(self, signum: int) -> bool:
        """Whether this guard's handler is the one installed for `signum` now."""
        return signum in self._previous and signal.getsignal(signum) == self._handle

    def reclaim(self) -> None:
        """Install the handlers again: `ray.init` replaces the driver's SIGTERM handler
        with one that exits at once (call this once the runtime has started)."""
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def __exit__(self, *exc) -> None:
        self.disarm()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.deferring and self.pending is None:
            self.pending = signum
            self.say(f"\n{signal.Signals(signum).name}: stopping after this step, with a "
                     f"checkpoint (at once if the step has not ended within "
                     f"trainer.stop_timeout_s={self.grace_s:g}s); send it again to stop "
                     f"at once")
            self._arm(signum)
            return
        if self.expired:
            self.say(f"\n{signal.Signals(signum).name}: the step did not end within "
                     f"trainer.stop_timeout_s={self.grace_s:g}s; stopping at once")
            raise Interrupted(signum, timed_out=self.grace_s)
        self.disarm()
        raise Interrupted(signum)

    def disarm(self) -> None:
        """The run stops on its own: the timer must not cut its shutdown short."""
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self, signum: int) -> None:
        """After `grace_s`, the signal again, to the main thread (whose blocking waits
        it interrupts): the run stops at once if it has not stopped by then."""
        main = threading.main_thread().ident

        def fire() -> None:
            self.expired = True
            signal.pthread_kill(main, signum)
        # a longer wait than the platform's time_t holds kills the timer's thread
        # (OverflowError) and with it the bound: a grace past it waits the longest it can
        self._timer = threading.Timer(min(self.grace_s, threading.TIMEOUT_MAX / 2), fire)
        self._timer.daemon = True
        self._timer.start()

    @contextlib.contextmanager
    def deferred(self):
        """A block a signal does not cut short (unless sent twice)."""
        outer, self.deferring = self.deferring, True
        try:
            yield
        finally:
            self.deferring = outer


class NoSignals:
    """The guard of a loop run without one (tests, notebooks): defers nothing."""
    pending = None
    grace_s = None

    def disarm(self) -> None:
        pass

    @contextlib.contextmanager
    def deferred(self):
        yield
