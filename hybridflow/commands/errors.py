"""Turning an error a user can cause into one line and an exit code.

`report(command, err)` is the one place that knows the error classes users meet:
the checks' own errors (graph file, config, graph, data, checkpoint, lock, resume),
file-system errors (named by their file), an interrupt, and `SystemExit` raised by
user code (a graph file, a scorer, a function node calling `sys.exit`), which must
not end the process silently. Anything else is a bug in hybridflow and keeps its
traceback.
"""
from __future__ import annotations

import sys

from hybridflow.core.failure_text import cause_line, strip_ansi
from hybridflow.core.origin import user_origin as exit_origin
from hybridflow.core.printable import echo

__all__ = ["user_errors", "report", "one_line", "exit_origin", "failure_reason"]


def user_errors() -> tuple[type[BaseException], ...]:
    """The error classes whose message is written for the user."""
    from hybridflow.run.checkpoint import CheckpointError
    from hybridflow.plan.compiler import GraphError
    from hybridflow.program.config import ConfigError
    from hybridflow.core.data import DataError
    from hybridflow.run.lifecycle import ResumeError
    from hybridflow.run.lock import RunLockError
    from hybridflow.run.tracking import RunDirError
    from hybridflow.program.user_files import GraphFileError
    from hybridflow.core.loading import UserFileError
    from hybridflow.planner.problem import PlanningError
    return (GraphError, ConfigError, GraphFileError, DataError, CheckpointError,
            RunLockError, RunDirError, ResumeError, UserFileError, PlanningError, OSError)


def one_line(err: BaseException) -> str:
    """The message of a known error, on one line where it was written on one."""
    if isinstance(err, SystemExit):
        where = exit_origin(err)
        if not where:
            return f"a library called sys.exit({err.code!r}) (its traceback is in the log)"
        return (f"{where} called sys.exit({err.code!r}); user code must raise an "
                f"exception to stop a run, not end the process")
    if isinstance(err, OSError) and err.filename is not None:
        target = f"{err.filename!r}" + (f" -> {err.filename2!r}" if err.filename2 else "")
        return f"{target}: {err.strerror or type(err).__name__}"
    text = str(err).strip()
    return text or type(err).__name__


def failure_reason(err: BaseException) -> str:
    """One line a user can act on: a node failure's summary, or the error's first line."""
    summary = getattr(err, "summary", None)
    if summary:
        return summary
    if isinstance(err, (SystemExit, OSError)):
        return one_line(err)
    lines = strip_ansi(str(err)).strip().splitlines()
    text = lines[0].strip() if lines else ""
    ours = type(err).__module__.split(".")[0] in ("hybridflow", "algorithms")
    known = ours or isinstance(err, (FileNotFoundError, ValueError))
    # a library's error (Ray's, torch's wrappers): its root cause's `Type: message`
    return text if known and text else cause_line(err)


def report(command: str, err: BaseException) -> int:
    """Print `hybridflow COMMAND: message` and return the exit code; re-raise errors
    that are hybridflow's own bugs (their traceback is what a fix needs)."""
    if isinstance(err, KeyboardInterrupt):
        name = getattr(err, "signal_name", "SIGINT")
        echo(f"\nhybridflow {command}: interrupted ({name})", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    if not isinstance(err, Exception) and not isinstance(err, SystemExit):
        # a library's BaseException (torch's DCP raises one): its root cause, no traceback
        echo(f"hybridflow {command}: {cause_line(err)}", file=sys.stderr)
        return 1
    if not isinstance(err, (SystemExit, *user_errors())):
        raise err
    echo(f"hybridflow {command}: {one_line(err)}", file=sys.stderr)
    return 1
