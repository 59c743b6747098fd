"""How an exception inside a worker reaches the driver: as a `WorkerError` holding the
worker's traceback (`detail`, for error.log) and its one line (`cause`, the root
cause's `Type: message`: core/failure_text.py), made on the worker while the
exception object exists; the driver only gets what pickles.

`shipped()` is the one wrapper of a worker method's body: everything raised inside
it, a library's BaseException too (torch's DCP raises `CheckpointException`, a
BaseException), leaves as a WorkerError, except a signal's `Interrupted` (run/signals.py),
which must stop the process. `sys.exit` or a bare KeyboardInterrupt from user code
is contained with a line saying what did it (it would end a Ray actor, or be taken
for Ctrl-C). Stateless.
"""
from __future__ import annotations

import contextlib
import traceback

from hybridflow.core.failure_text import cause_line, strip_ansi, traceback_cause
from hybridflow.core.origin import describe_exit

__all__ = ["WorkerError", "failure_detail", "failure_cause", "shipped"]


class WorkerError(RuntimeError):
    """An exception raised inside a worker task: `detail` is the worker's traceback,
    `cause` its one line."""

    def __init__(self, detail: str, cause: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.cause = cause or traceback_cause(detail)

    def __reduce__(self):  # Ray pickles it to the driver: both fields travel
        return type(self), (self.detail, self.cause)

    @classmethod
    def of(cls, err: BaseException, extra: str = "") -> "WorkerError":
        """The exception being handled, with its traceback (call inside `except`)."""
        return cls(traceback.format_exc() + extra, cause_line(err))


@contextlib.contextmanager
def shipped(what: str = "user code"):
    """Re-raise what the block raises as a WorkerError (a signal's as it is)."""
    try:
        yield
    except BaseException as err:  # shipped to the driver with its traceback
        if isinstance(err, WorkerError) or getattr(err, "signum", None) is not None:
            raise  # made inside the block already; a signal's (run/signals.py)
        if isinstance(err, (SystemExit, KeyboardInterrupt)):
            line = describe_exit(err, what)
            raise WorkerError(traceback.format_exc() + line, line) from None
        raise WorkerError.of(err) from None


def failure_detail(err: BaseException) -> str:
    """The worker's traceback for a task error; Ray's own message otherwise."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, WorkerError):
        return cause.detail
    if isinstance(err, WorkerError):
        return err.detail
    return strip_ansi(f"{type(err).__name__}: {err}")


def failure_cause(err: BaseException) -> str:
    """The one line of a task error: the worker's, or Ray's own error's first line."""
    return cause_line(err)
