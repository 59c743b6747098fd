"""The schema of a checkpoint's `trainer_state.json`: what a resume reads is checked,
field by field, not only its checksum.

A manifest's sha256 proves the file is the one written with it, not that it is one
hybridflow wrote: a hand-edited state whose manifest was rewritten to match, or a
checkpoint migrated by a tool, must pass the same checks as a fresh one. Each field
has a type and a range, and ids must exist: the prompt ids a streaming run must not
draw again (`stream_skip`) are ids of this run's loader (`u<N>`, drawn after the
saved loader position), the stateful nodes named are nodes of the graph, the step is
the checkpoint directory's. A bad field is one `UserFileError` naming the file, the
field (`stream_skip[0]`) and its value, and what to do.

`check_trainer_state(state, path)` checks what the file alone can tell;
`check_against_run(state, path, dataset_rows, nodes)` what needs the run (the data's
size, the graph's stateful nodes). Stateless.
"""
from __future__ import annotations

import os
import re

from hybridflow.core.loading import UserFileError

__all__ = ["check_trainer_state", "check_against_run", "FIELDS"]

# field -> (required, what it holds): the whole state a checkpoint writes
FIELDS = {"step": (True, "the step saved (an integer >= 1, the directory's step)"),
          "loader": (True, "the prompt loader's position {epoch, cursor, served}"),
          "stream_skip": (False, "prompt ids a streaming run must not draw again"),
          "nodes": (False, "stateful function nodes' states, by node name"),
          "rng": (True, "the Python and NumPy random generators' states")}
_UID = re.compile(r"u(\d+)")
_MT_WORDS = 624  # the Mersenne Twister's state words (Python adds a position)


class _Bad(Exception):
    def __init__(self, field: str, value, why: str):
        self.field, self.value, self.why = field, value, why


def _fail(path: str, bad: _Bad) -> UserFileError:
    shown = repr(bad.value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    ckpt = os.path.dirname(path)
    return UserFileError(
        f"checkpoint state {path!r}: field '{bad.field}' is {shown}: {bad.why}; the "
        f"checkpoint was edited or damaged: delete {ckpt} to resume from the checkpoint "
        f"before it", path)


def _int(field: str, value, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(field, value, "not an integer")
    if value < low or (high is not None and value > high):
        where = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _Bad(field, value, f"out of range (must be {where})")
    return value


def _dict(field: str, value) -> dict:
    if not isinstance(value, dict):
        raise _Bad(field, value, f"not a mapping (it holds {type(value).__name__})")
    return value


def _list(field: str, value, length: int | None = None) -> list:
    if not isinstance(value, list):
        raise _Bad(field, value, f"not a list (it holds {type(value).__name__})")
    if length is not None and len(value) != length:
        raise _Bad(field, f"<{len(value)} items>", f"must hold {length} items")
    return value


def _words(field: str, values: list) -> None:
    for i, word in enumerate(values):
        _int(f"{field}[{i}]", word, 0, 2 ** 32 - 1)


def _rng(value) -> None:
    rng = _dict("rng", value)
    for key in ("python", "numpy"):
        if key not in rng:
            raise _Bad(f"rng.{key}", None, "missing")
    python = _list("rng.python", rng["python"], 3)
    _int("rng.python[0]", python[0], 3, 3)  # the state's version
    _words("rng.python[1]", _list("rng.python[1]", python[1], _MT_WORDS + 1)[:_MT_WORDS])
    _int(f"rng.python[1][{_MT_WORDS}]", python[1][_MT_WORDS], 0, _MT_WORDS)
    if python[2] is not None and not isinstance(python[2], float):
        raise _Bad("rng.python[2]", python[2], "not a float or null")
    numpy = _list("rng.numpy", rng["numpy"], 5)
    if numpy[0] != "MT19937":
        raise _Bad("rng.numpy[0]", numpy[0], "not 'MT19937'")
    _words("rng.numpy[1]", _list("rng.numpy[1]", numpy[1], _MT_WORDS))
    _int("rng.numpy[2]", numpy[2], 0, _MT_WORDS)
    _int("rng.numpy[3]", numpy[3], 0, 1)
    if not isinstance(numpy[4], (int, float)) or isinstance(numpy[4], bool):
        raise _Bad("rng.numpy[4]", numpy[4], "not a number")


def _fields(state: dict, path: str) -> None:
    unknown = sorted(set(state) - set(FIELDS))
    if unknown:
        raise _Bad(unknown[0], state[unknown[0]],
                   f"not a field of a trainer state (known: {', '.join(FIELDS)})")
    for name, (required, what) in FIELDS.items():
        if required and name not in state:
            raise _Bad(name, None, f"missing ({what})")
    step = _int("step", state["step"], 1)
    dirname = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if re.fullmatch(r"step_\d+", dirname) and int(dirname[5:]) != step:
        raise _Bad("step", step, f"not the step of its directory {dirname}")
    loader = _dict("loader", state["loader"])
    for key in ("epoch", "cursor", "served"):
        if key not in loader and key != "served":  # older checkpoints lack `served`
            raise _Bad(f"loader.{key}", None, "missing")
        _int(f"loader.{key}", loader.get(key, 0))
    extra = sorted(set(loader) - {"epoch", "cursor", "served"})
    if extra:
        raise _Bad(f"loader.{extra[0]}", loader[extra[0]], "not a field of the loader")
    _skip(state.get("stream_skip", []), loader.get("served", 0))
    for name, node_state in _dict("nodes", state.get("nodes", {})).items():
        _dict(f"nodes.{name}", node_state)
    _rng(state["rng"])


def _skip(value, served: int) -> None:
    seen = set()
    for i, uid in enumerate(_list("stream_skip", value)):
        field = f"stream_skip[{i}]"
        if not isinstance(uid, str):
            raise _Bad(field, uid, f"not a prompt id (a string u<N>; it holds "
                                   f"{type(uid).__name__})")
        match = _UID.fullmatch(uid)
        if match is None:
            raise _Bad(field, uid, "not a prompt id of the loader (u<N>)")
        if int(match[1]) < served:
            raise _Bad(field, uid, f"a prompt drawn before the saved loader position "
                                   f"(loader.served={served}): it cannot be skipped later")
        if uid in seen:
            raise _Bad(field, uid, "listed twice")
        seen.add(uid)


def check_trainer_state(state: dict, path: str) -> dict:
    """`state` when every field has its type and range; else a UserFileError naming
    the field."""
    try:
        _fields(_dict("<the state>", state), path)
    except _Bad as bad:
        raise _fail(path, bad) from None
    return state


def check_against_run(state: dict, path: str, dataset_rows: int, nodes: set[str]) -> None:
    """What the run knows: the loader's cursor within this data, the stateful nodes
    named are this graph's."""
    try:
        _int("loader.cursor", state["loader"]["cursor"], 0, dataset_rows)
        for name in state.get("nodes", {}):
            if name not in nodes:
                known = ", ".join(sorted(nodes)) or "none"
                raise _Bad(f"nodes.{name}", name, f"not a stateful node of this graph "
                                                  f"(stateful nodes: {known})")
    except _Bad as bad:
        raise _fail(path, bad) from None
