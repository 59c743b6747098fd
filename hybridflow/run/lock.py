"""The owner of a run directory: RUN_DIR/lock.json while a process trains in it.

State kept: the lock file itself, {"pid", "host", "started", "proc_start"}, created
atomically (O_EXCL) by the process that trains in the directory and removed by it on
every exit it lives through. A `RunLock` object remembers only whether it holds the
file. After a SIGKILL (or a power cut) the file stays; it is *stale* when its host is
this host and its pid is gone (or now belongs to a process that started later, a
reused pid), and the next owner takes it over with a message. A lock from another
host cannot be checked from here: it is reported, never taken. A lock is judged and
taken over under an flock of the run directory, so two processes resuming one dead
run get one owner.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Self

__all__ = ["RunLock", "RunLockError", "LockOwner", "read_owner"]

LOCK_FILE = "lock.json"


class RunLockError(RuntimeError):
    """Another live process owns the run directory."""


@dataclass
class LockOwner:
    pid: int
    host: str
    started: float
    proc_start: int | None = None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host}, since {when}"

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool | None:
        """True/False on this host; None when the owner is on another host."""
        if not self.on_this_host():
            return None
        if not _pid_exists(self.pid):
            return False
        now = _process_start(self.pid)  # a reused pid started after the lock was taken
        return self.proc_start is None or now is None or now == self.proc_start


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        state = fields[0]
        return None if state == "Z" else int(fields[19])  # a zombie has exited
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def _directory_guard(run_path: str):
    """An flock on the run directory while a lock is judged and taken over, so two
    processes resuming one dead run cannot both remove the stale lock and each take
    one (takeover happens on this host only, where flock holds)."""
    fd = os.open(run_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def read_owner(run_path: str, strict: bool = False) -> LockOwner | None:
    """The lock's owner, or None when the directory has no lock. An unreadable lock
    is None too (a torn write that `acquire` takes over), or, with `strict` (what
    `hybridflow status` reports), a UserFileError naming it. A FIFO or a directory
    in its place is never opened (opening a FIFO blocks)."""
    from hybridflow.core.loading import UserFileError, read_json
    path = os.path.join(run_path, LOCK_FILE)
    if not os.path.lexists(path):
        return None
    fix = "the run directory is damaged: delete it if no run is using the directory"
    try:
        record = read_json(path, "run lock", fix=fix)
        return LockOwner(int(record["pid"]), str(record["host"]), float(record["started"]),
                         record.get("proc_start"))
    except UserFileError:
        if strict:
            raise
        return None
    except (ValueError, KeyError, TypeError) as err:
        if strict:
            raise UserFileError(f"run lock {path!r} lacks a valid {err} field; {fix}",
                                path) from None
        return None


class RunLock:
    """`acquire()` before writing anything else in the directory; `release()` on exit."""

    def __init__(self, run_path: str):
        self.run_path = run_path
        self.path = os.path.join(run_path, LOCK_FILE)
        self.held = False

    def acquire(self, say=print) -> None:
        """Take the lock, taking over a stale one (with a message through `say`);
        RunLockError when a live process (or one on another host) owns it."""
        with _directory_guard(self.run_path):
            self._acquire(say)

    def _acquire(self, say) -> None:
        for _ in range(3):  # another process may take or drop it between our looks
            if self._create():
                return
            owner = read_owner(self.run_path)
            if owner is None and os.path.exists(self.path):
                if not self._young(self.path):  # unreadable and old: a torn write
                    self._remove_stale(say, "an unreadable lock file")
                continue
            if owner is None:
                continue
            alive = owner.alive()
            if alive is False:
                self._remove_stale(say, f"a lock of {owner.describe()}, which is gone")
                continue
            where = "still running" if alive else "locked by another host"
            advice = ("stop it first, or wait for it to end" if alive else
                      f"if that run is dead, delete {self.path}")
            raise RunLockError(f"run directory {self.run_path} is {where} ({owner.describe()}); "
                               f"{advice}")
        raise RunLockError(f"could not lock run directory {self.run_path}: the lock file "
                           f"{self.path} keeps changing; is another process starting there?")

    def _create(self) -> bool:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                  "proc_start": _process_start(os.getpid())}
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh)
        except BaseException:
            os.remove(self.path)
            raise
        self.held = True
        return True

    @staticmethod
    def _young(path: str) -> bool:
        try:
            return time.time() - os.path.getmtime(path) < 5.0
        except OSError:
            return False

    def _remove_stale(self, say, what: str) -> None:
        say(f"run directory {self.run_path}: taking over {what} (the process died "
            f"without releasing it)")
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        """Remove the lock if this object holds it; never raises (runs in `finally`)."""
        if not self.held:
            return
        self.held = False
        owner = read_owner(self.run_path)
        if owner is not None and owner.pid != os.getpid():
            return  # taken over by another process meanwhile: not ours to remove
        try:
            os.remove(self.path)
        except OSError:
            pass

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
