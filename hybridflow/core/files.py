"""Writing a file so that a reader never sees half of it: the run directory's records
(`run/tracking.py`) and the plan record (`program/run_record.py`) both write this way,
so it lives below both. Stateless."""
from __future__ import annotations

import contextlib
import os

__all__ = ["write_atomic"]


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
