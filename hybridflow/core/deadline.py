"""Deadlines on calls into user code (reward scorers, function nodes, worker methods).

`call_with_deadline(fn, timeout_s, what, setting)` runs `fn()` and, once it has run
`timeout_s` seconds, raises `CallTimeout` inside it, naming `what` and the setting
that bounds it. A Python thread cannot be killed, so the bound is an exception
raised in the running code:

- in the main thread, by a SIGALRM timer: it also interrupts `time.sleep` and
  blocking system calls;
- in another thread (a Ray actor's executor thread, say), by an asynchronous
  exception (`PyThreadState_SetAsyncExc`), delivered at the next Python bytecode.

Code that swallows the exception (`except Exception: pass` in a loop) gets it again
every second until the call ends. What no bound here can stop is native code that
never returns to Python (a C extension holding the GIL): the runtimes' other bounds
(Ray's `runtime.call_timeout_s`, the reward process pool's budget) cover that.

State: `_ACTIVE`, the deadlines armed in the main thread (outermost first),
`_HOLDERS`, how many of those calls and `handler_held` scopes are open, and the
SIGALRM handler (installed while any is) and timer (while a deadline is armed);
only `call_with_deadline`, `handler_held` (and the handler) change them.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallTimeout", "call_with_deadline", "handler_held"]

REPEAT_S = 1.0  # a swallowed timeout is raised again after this long


class CallTimeout(TimeoutError):
    """A call into user code ran past its bound. Each deadline raises its own
    subclass (so nested deadlines tell theirs apart); `what` names the call."""

    what: str = "a call"
    timeout_s: float = 0.0
    setting: str = "timeout"

    def __init__(self, *args):
        message = (f"{self.what} did not return within {self.setting}={self.timeout_s:g}s; "
                   f"it was interrupted and the run stops")
        super().__init__(*(args or (message,)))


@dataclass(eq=False)
class _Deadline:
    kind: type[CallTimeout]
    at: float                                     # time.monotonic() of the deadline
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False


_ACTIVE: list[_Deadline] = []
_PREVIOUS_HANDLER: list[Any] = []
_HOLDERS = [0]  # armed calls and `handler_held` scopes open in the main thread


def call_with_deadline(fn: Callable[[], Any], timeout_s: float | None, what: str,
                       setting: str = "timeout") -> Any:
    """`fn()`, raising a `CallTimeout` in it after `timeout_s` seconds (no bound
    when `timeout_s` is None or not positive)."""
    if not timeout_s or timeout_s <= 0:
        return fn()
    kind = _timeout_kind(what, float(timeout_s), setting)
    deadline = _Deadline(kind, time.monotonic() + float(timeout_s))
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _in_main_thread(fn, deadline)
    return _in_other_thread(fn, deadline, float(timeout_s))


@functools.lru_cache(maxsize=1024)
def _timeout_kind(what: str, timeout_s: float, setting: str) -> type[CallTimeout]:
    """The CallTimeout subclass of one bounded call site, made once: making a class
    costs ~10 µs, and the local runtime bounds every task of every step."""
    return type("CallTimeout", (CallTimeout,),
                {"what": what, "timeout_s": timeout_s, "setting": setting})


# ---------------------------------------------------------------- main thread
def _in_main_thread(fn, deadline: _Deadline):
    _hold_handler()
    _ACTIVE.append(deadline)
    _arm()
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _ACTIVE.remove(deadline)
        if _ACTIVE:
            _arm()
        _release_handler()


@contextlib.contextmanager
def handler_held():
    """Keep the SIGALRM handler installed across the bounded calls made inside (a
    local step's tasks, one after another), so each only sets and clears its timer:
    installing and restoring the handler for every call cost a few µs a call."""
    if threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return
    _hold_handler()
    try:
        yield
    finally:
        _release_handler()


def _hold_handler() -> None:
    """Install the handler for the first holder (an armed call or `handler_held`)."""
    if not _HOLDERS[0]:
        _PREVIOUS_HANDLER[:] = [signal.signal(signal.SIGALRM, _on_alarm)]
    _HOLDERS[0] += 1


def _release_handler() -> None:
    _HOLDERS[0] -= 1
    if not _HOLDERS[0]:
        signal.signal(signal.SIGALRM, _PREVIOUS_HANDLER.pop() or signal.SIG_DFL)


def _arm() -> None:
    """The timer at the earliest deadline still ahead (or in a second, when one has
    passed and its call still runs)."""
    now = time.monotonic()
    delay = min(max(d.at - now, 0.0) for d in _ACTIVE) or REPEAT_S
    signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-3))


def _on_alarm(signum, frame) -> None:
    now = time.monotonic()
    expired = [d for d in _ACTIVE if d.at <= now]
    if not expired:
        _arm()
        return
    signal.setitimer(signal.ITIMER_REAL, REPEAT_S)  # again, should the code swallow it
    raise min(expired, key=lambda d: d.at).kind()


# --------------------------------------------------------------- other threads
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)


def _in_other_thread(fn, deadline: _Deadline, timeout_s: float):
    target = threading.get_ident()
    stop = threading.Event()

    def watch():
        wait = timeout_s
        while not stop.wait(wait):
            with deadline.lock:
                if deadline.done:
                    return
                _set_async_exc(target, deadline.kind)
            wait = REPEAT_S

    threading.Thread(target=watch, name=f"deadline: {deadline.kind.what}",
                     daemon=True).start()
    try:
        return fn()
    finally:
        with deadline.lock:
            deadline.done = True
            stop.set()
