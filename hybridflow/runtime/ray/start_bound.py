"""`ray.init` within `runtime.start_timeout_s`, stoppable by the first signal, and
ending every process it started when it fails.

Why it needs its own bound: `ray.init` starts Ray's processes (GCS, raylet, monitor,
log monitor, dashboard) as children of the driver and waits for them, partly in
Python and partly inside gRPC's C code. A Python signal handler (the run's
`SignalGuard`, or the timer here) runs only when the main thread is back in the
interpreter; a raylet that died while the driver waited in C left the driver deaf
to SIGTERM, and a start that failed left Ray's processes running beside a driver
that did not end. And `ray.init` replaces the driver's SIGTERM handler with its own
(`sys.exit`) as it begins.

`bounded_start(timeout_s)`, around `ray.init`, on the main thread:
- the run's SIGTERM handler stays in place while Ray starts (Ray's is not installed);
- an interval timer (SIGALRM) raises `RayStartError` in the main thread at the
  deadline; a signal raises what the run's handler raises (`Interrupted`);
- a watchdog thread hears every signal through `signal.set_wakeup_fd` (which CPython
  writes to even while the main thread is blocked in C). If the main thread has not
  left `ray.init` within `grace_s` after a signal or the deadline, the watchdog ends
  the processes started during the block and, if the main thread still does not
  return, ends this process (`os._exit`) with one line;
- the watchdog also watches Ray's core processes (GCS, raylet) that the block
  started: one that dies fails the start at once (a raylet killed during `ray.init`
  left the driver waiting out the whole start timeout, 300 s by default): the timer
  fires at once and the error names the process that died; a `ray.init` still
  blocked `grace_s` later has Ray's other processes ended (its waits on them fail)
  and, `DEATH_GRACE_S` after that, the process ends, as after a deadline;
- when the block raises, every process started during it (this process's new
  descendants: Ray's) is ended, SIGTERM then SIGKILL, before the error goes on.

So a start that fails ends within timeout_s + grace_s + the kill wait (about 10 s),
with nothing left running. Off the main thread (tests, notebooks) only the cleanup
on failure applies. State: none between calls; during a call, the watchdog thread,
the wakeup socket pair and the handlers it replaced (put back when it ends).
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time

from hybridflow.core.printable import echo

__all__ = ["RayStartError", "bounded_start", "end_started"]

GRACE_S = 5.0  # after a signal or the deadline, how long the main thread may take
CORE_PROCESSES = ("gcs_server", "raylet")  # a start cannot succeed without them
# after a core process died and Ray's other processes were ended: how long ray.init
# may take to see them gone and return (its GCS connection retries time out after
# ~15 s; under load its waits sleep longer) before the process ends
DEATH_GRACE_S = 30.0


class RayStartError(RuntimeError):
    """Ray did not start within runtime.start_timeout_s."""


@contextlib.contextmanager
def bounded_start(timeout_s: float, grace_s: float = GRACE_S):
    import psutil
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    if threading.current_thread() is not threading.main_thread():
        with _ending_on_failure(me, before):
            yield
        return
    # exits in reverse: the timer is off before the watchdog stops, and the cleanup
    # of a failed start comes last
    died: list[str] = []  # a core process the watchdog saw die: why the start failed
    with _ray_keeps_our_sigterm(), _ending_on_failure(me, before), \
            _watchdog(me, before, timeout_s, grace_s, died), _deadline(timeout_s, died):
        yield


@contextlib.contextmanager
def _ending_on_failure(me, before: set[int]):
    try:
        yield
    except BaseException:
        end_started(me, before)
        _shutdown_ray()
        raise


class _Expired(BaseException):
    """Raised by the timer inside ray.init: not an Exception, which Ray's start-up
    code catches and logs (a RuntimeError raised there was swallowed, and the start
    went on)."""


@contextlib.contextmanager
def _deadline(timeout_s: float, died: list[str] | None = None):
    """The timer's `_Expired` can land where Python cannot raise it (a fork's after-fork
    hook in `subprocess`, a `__del__`): the interpreter then prints it as "Exception
    ignored" and goes on, and `ray.init` with it. So the deadline is also recorded,
    and a block that ends after it fails the same way; an `_Expired` that was ignored
    is not printed (it is this module's own)."""
    fired = []

    def expired(signum, frame):
        fired.append(True)
        raise _Expired()

    hook = sys.unraisablehook

    def unraisable(info):
        if not isinstance(info.exc_value, _Expired):
            hook(info)
    def message() -> str:
        if died:  # the watchdog saw a core process die and fired the timer early
            return (f"Ray's {died[0]} died while ray.init waited for it (killed, or out "
                    f"of memory?); its processes were ended")
        return (f"Ray did not start within runtime.start_timeout_s={timeout_s:g}s "
                f"(ray.init); its processes were ended")
    previous = signal.signal(signal.SIGALRM, expired)
    sys.unraisablehook = unraisable
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    except _Expired:
        raise RayStartError(message()) from None
    except Exception as err:
        if died:  # Ray's own error once its processes were gone: say why they went
            raise RayStartError(message()) from err
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = hook
    if fired:  # the timer fired and its exception was swallowed on the way
        raise RayStartError(message())


@contextlib.contextmanager
def _ray_keeps_our_sigterm():
    """`ray.init` installs `sys.exit` as SIGTERM's handler when it begins: keep the
    run's (it stops the run at once outside a step, recording why)."""
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        yield
        return
    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


@contextlib.contextmanager
def _watchdog(me, before: set[int], timeout_s: float, grace_s: float, died: list[str]):
    reader, writer = socket.socketpair()
    for end in (reader, writer):
        end.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    done = threading.Event()
    thread = threading.Thread(target=_watch, args=(reader, done, me, before,
                                                   time.monotonic() + timeout_s, grace_s,
                                                   died),
                              name="ray-start-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous_fd)
        thread.join(timeout=1.0)
        reader.close()
        writer.close()


def _watch(reader, done: threading.Event, me, before: set[int], deadline: float,
           grace_s: float, died: list[str]) -> None:
    """Until the block ends: after the first signal, the deadline or a core process's
    death, give the main thread `grace_s`; then end Ray's processes; then, if still
    stuck, the process."""
    give_up, signum, core = deadline + grace_s, None, CoreProcesses(me, before)
    while not done.is_set():
        wait = max(0.0, min(0.2, give_up - time.monotonic()))
        ready, _, _ = select.select([reader], [], [], wait)
        if ready:
            data = _drain(reader)
            if died:  # not the SIGALRM this thread sent the main thread below
                data = bytes(b for b in data if b != signal.SIGALRM)
            if data and signum is None:
                signum = data[0]
                give_up = min(give_up, time.monotonic() + grace_s)
        if signum is None and not died and not done.is_set():
            gone = core.gone()
            if gone:  # fail the start now, as the deadline does (the timer's handler)
                died.append(gone)
                give_up = min(give_up, time.monotonic() + grace_s)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
        if time.monotonic() >= give_up and not done.is_set():
            end_started(me, before)  # the blocked wait usually fails now, and returns
            if not done.wait(DEATH_GRACE_S if died else grace_s):  # GCS timeouts: ~15 s
                _exit_stuck(signum, died)
            return


class CoreProcesses:
    """Ray's GCS and raylet among the processes started since `before`, as they
    appear; `gone()` names the first one seen that is no longer running."""

    def __init__(self, me, before: set[int]):
        self.me, self.before, self.seen = me, before, {}

    def gone(self) -> str | None:
        import psutil
        try:
            if len(self.seen) < len(CORE_PROCESSES):  # once both are seen, only watch
                for proc in self.me.children(recursive=True):
                    if proc.pid not in self.before and proc.pid not in self.seen:
                        with contextlib.suppress(psutil.Error):
                            if proc.name() in CORE_PROCESSES:
                                self.seen[proc.pid] = proc
        except psutil.Error:
            return None
        for pid, proc in self.seen.items():
            try:
                running = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                running = False
            if not running:
                return f"{_last_name(proc)} (pid {pid})"
        return None


def _last_name(proc) -> str:
    """The name of a process that is gone (psutil keeps the one it read)."""
    try:
        return proc.name()
    except Exception:  # noqa: BLE001 - gone: psutil may not have cached it
        return "core process"


def _drain(reader) -> bytes:
    try:
        return reader.recv(64)
    except OSError:
        return b""


def _exit_stuck(signum: int | None, died: list[str]) -> None:
    why = (f"Ray's {died[0]} died while ray.init waited for it" if died else
           f"{signal.Signals(signum).name}" if signum and signum != signal.SIGALRM
           else "runtime.start_timeout_s passed")
    echo(f"hybridflow: Ray did not start ({why}) and ray.init did not return; its "
         f"processes were ended; ending this process", file=sys.stderr, flush=True)
    os._exit(128 + signum if signum and signum != signal.SIGALRM else 1)


def end_started(me, before: set[int], wait_s: float = 3.0) -> list[int]:
    """End this process's descendants that were not there `before` (the processes a
    Ray start made): SIGTERM, then SIGKILL after `wait_s`; returns their pids."""
    import psutil
    try:
        started = [p for p in me.children(recursive=True) if p.pid not in before]
    except psutil.Error:
        return []
    for proc in started:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(started, timeout=wait_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=wait_s)
    return [p.pid for p in started]


def _shutdown_ray() -> None:
    """`ray.shutdown()` after a failed start, bounded: its processes are gone, and a
    shutdown that waits on them must not hold the driver."""
    try:
        import ray
    except ImportError:
        return
    if not ray.is_initialized():
        return
    thread = threading.Thread(target=_quiet_shutdown, args=(ray,), daemon=True)
    thread.start()
    thread.join(timeout=GRACE_S)


def _quiet_shutdown(ray) -> None:
    with contextlib.suppress(Exception):
        ray.shutdown()
