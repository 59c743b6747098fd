"""Writing a file so that a reader never sees half of it: the run directory's records
(`run/tracking.py`) and the plan record (`program/run_record.py`) both write this way,
so it lives below both. And checking a path a command will write before the work
starts (`check_output`): a command that would fail on its output after minutes of
work (a conversion, a dataset) fails at once, naming the path. Stateless."""
from __future__ import annotations

import contextlib
import os

__all__ = ["write_atomic", "check_output"]


def write_atomic(path: str, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it into place;
    on failure (a full disk) the temporary file is removed and the old file stays."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_output(path: str, what: str, kind: str = "directory", inputs=()) -> str:
    """`path` can be written as a `kind` ("directory": created if missing, or "file");
    UserFileError naming it otherwise: a file where a directory goes (or the reverse),
    a file on the way to it, a place this process may not write, or a place inside
    (or the same as) one of `inputs` -- the files and directories the command reads."""
    from hybridflow.core.loading import UserFileError, describe_path

    def refuse(problem: str, fix: str):
        return UserFileError(f"{what} {path!r} {problem}; {fix}", path)
    found = describe_path(path) if os.path.lexists(path) else "missing"  # ENOTDIR too
    if kind == "directory" and found not in ("missing", "a directory"):
        raise refuse(f"is {found or 'a file'}", "give a directory (it is created if missing)")
    if kind == "file" and found not in ("missing", None):
        raise refuse(f"is {found}, not a file", "give the path of a file to write")
    for given in inputs:
        if given and os.path.lexists(given) and _inside(path, given) and (
                os.path.isdir(given) or os.path.realpath(path) == os.path.realpath(given)):
            raise refuse(f"is the input {given!r} or lies inside it",
                         "write somewhere else, so the input is never overwritten")
    parent = path
    while not os.path.lexists(parent):  # the nearest part that exists
        parent = os.path.dirname(os.path.abspath(parent))
    if describe_path(parent) != "a directory" and parent != path:
        raise refuse(f"cannot be made: {parent!r} is not a directory",
                     "give a path under a directory")
    if not os.access(parent, os.W_OK):
        raise refuse(f"cannot be written ({parent!r} is not writable)",
                     "give a writable place")
    return path
