"""Ways to damage a file a user gives the project, for the sweeps of the file boundary
(hybridflow/core/loading.py): each turns a valid file into one kind of bad one."""
from __future__ import annotations

import os
import random
import shutil

CORRUPTIONS = ("missing", "empty", "truncated", "random", "non_utf8", "wrong_type",
               "directory", "fifo")


def _clear(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def random_bytes(n: int = 256, seed: int = 0) -> bytes:
    """Bytes no reader accepts: a 0xff first (never UTF-8) and a NUL (never source)."""
    rng = random.Random(seed)
    return b"\xff\x00" + bytes(rng.randrange(256) for _ in range(n))


def truncated(valid: bytes) -> bytes:
    """The first two thirds of `valid`, cut inside a record (not just after one, where
    what is left could be whole)."""
    cut = max(1, len(valid) * 2 // 3)
    while cut > 1 and valid[cut - 1:cut] in (b"\n", b"}", b"]", b" "):
        cut -= 1
    return valid[:cut]


def corrupt(path: str, how: str, valid: bytes, wrong_type: bytes | None = None) -> None:
    """Replace `path` by the damage `how` names (CORRUPTIONS) of its `valid` content;
    `wrong_type` is content of the right syntax but the wrong type (a JSON list)."""
    _clear(path)
    if how == "missing":
        return
    if how == "directory":
        os.makedirs(path)
        return
    if how == "fifo":
        os.mkfifo(path)
        return
    data = {"empty": b"", "random": random_bytes(), "truncated": truncated(valid),
            "non_utf8": valid[:len(valid) // 2] + b"\xff\xfe" + valid[len(valid) // 2:],
            "wrong_type": wrong_type}[how]
    with open(path, "wb") as handle:
        handle.write(data)
