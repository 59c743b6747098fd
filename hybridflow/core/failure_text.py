"""An exception as the one line a console shows: `Type: message` of its root cause.

Exceptions reach the driver wrapped: Ray wraps a task's exception in a
`RayTaskError` whose text is a traceback coloured with ANSI codes; torch's
distributed checkpoint raises a `CheckpointException` whose text is every rank's
traceback; a worker ships its exception as a `WorkerError` holding the formatted
traceback. The first or last line of such a text is a fragment (a frame's source
line, a colour code, a cut message). `cause_line(err)` unwraps those wrappers to the
exception that was raised first, and returns its type and the first line of its own
message, whole: the full traceback belongs in the run's error.log, never on the
console. `strip_ansi` removes the terminal colour codes Ray puts in messages.
`traceback_cause(text)` finds that line in a traceback already formatted as text
(what a worker of an older release, or a library, sends).

Stateless.
"""
from __future__ import annotations

import re

__all__ = ["cause_line", "strip_ansi", "traceback_cause", "root_exception"]

# CSI sequences (colour, cursor) and OSC sequences (titles, links), as terminals read them
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def root_exception(err: BaseException) -> BaseException:
    """The exception a wrapper carries: Ray's task error's `cause`, each failed rank
    of a DCP `CheckpointException` (the first), followed until none wraps another."""
    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        inner = _wrapped(err)
        if inner is None:
            return err
        err = inner
    return err


def _wrapped(err: BaseException) -> BaseException | None:
    cause = getattr(err, "cause", None)  # ray.exceptions.RayTaskError (and subclasses)
    if isinstance(cause, BaseException) and type(err).__name__.startswith("RayTaskError"):
        return cause
    failures = getattr(err, "failures", None)  # torch.distributed.checkpoint's
    if type(err).__name__ == "CheckpointException" and isinstance(failures, dict):
        for failure in failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                return inner
    return None


def cause_line(err: BaseException) -> str:
    """`Type: message` of the root cause, on one line, with no colour codes; a
    file-system error names its file; an exception that already carries a line
    (a worker's `WorkerError`, a `NodeFailure`'s `summary`) keeps it."""
    err = root_exception(err)
    carried = getattr(err, "cause", None)
    if isinstance(carried, str) and carried:  # WorkerError: made where err was raised
        return carried
    name = type(err).__name__
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename is not None else ""
        if err.filename2 is not None:
            where += f" -> {err.filename2}"
        return f"{name}: {err.strerror}{where}"
    message = _first_line(strip_ansi(str(err)))
    if message.startswith("Traceback (most recent call last)"):  # a library's text
        return traceback_cause(strip_ansi(str(err))) or name
    return f"{name}: {message}" if message else name


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def traceback_cause(text: str) -> str:
    """The exception line of the last traceback in `text` (`Type: message`, the
    message's first line); a text that is no traceback: its first line."""
    lines = strip_ansi(text).rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if not frames:
        return _first_line(strip_ansi(text))
    for line in lines[frames[-1] + 1:]:  # after the frame: its source and carets, indented
        if line and not line[0].isspace():
            return _short_type(line.strip())
    return _first_line(strip_ansi(text))


def _short_type(line: str) -> str:
    """`a.b.ScoringError: text` -> `ScoringError: text` (the module path is noise)."""
    return re.sub(r"^(?:\w+\.)+(\w+(?::|$))", r"\1", line)
