"""The one boundary where a user's file is read: data (JSONL, parquet), YAML configs,
a model's `config.json`, safetensors, tokenizer and model directories, graph files,
and a run directory's records (status.json, graph.json, plan.json, lock.json,
metrics.jsonl, timeline.jsonl, checkpoint manifests), and every `torch.save` file
(`read_torch`: `weights_only=True`, whose refusal is said in the project's words).

Every failure -- a missing path, a directory or a FIFO where a file is expected, a
byte that is not UTF-8, truncated or garbage content, JSON of the wrong type, a
library's own error while parsing -- becomes one `UserFileError` whose one-line
message names the file (and the line where known) and what to do. Libraries name no
file in their errors ("'utf-8' codec can't decode byte 0xff in position 976"), so
nothing user-given is opened anywhere else. A file that holds a Python object other
than tensors and plain values is a `RefusedFileError`: nothing in it ran, and the
message never advises loading it unsafely (as torch's own text does). Stateless.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["UserFileError", "RefusedFileError", "refused", "read_torch", "torch_refusal",
           "check_file", "check_dir", "read_bytes", "read_text", "read_json",
           "read_jsonl", "parse_json", "read_yaml", "read_safetensors", "check_safetensors",
           "library_read", "yaml_problem",
           "describe_path"]


class UserFileError(ValueError):
    """A user's file that cannot be read or is not what it should be; one line naming
    the file (`path`) and what to do."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(" ".join(str(message).split()))  # one line, whatever a library said
        self.path = path


class RefusedFileError(UserFileError):
    """A file holding a Python object it should not (a global outside what its reader
    admits): refused before anything in it ran."""


def refused(what: str, path: str, expected: str, name: str, fix: str = "") -> RefusedFileError:
    """The one message of a refused load: the file, what it should hold, the global."""
    fix = fix or "the file is damaged or was tampered with: restore it or save it again"
    return RefusedFileError(f"{what} {path!r} holds a Python object that is not "
                            f"{expected} ({name}): refused, nothing from it was run; {fix}",
                            path)


_TORCH_REFUSAL = "Weights only load failed"


def torch_refusal(err: BaseException) -> str | None:
    """What `torch.load(weights_only=True)` refused (a global's dotted name, or the
    operation), or None when `err` is not such a refusal."""
    import re
    if _TORCH_REFUSAL not in str(err):
        return None
    found = re.search(r"GLOBAL (\S+) was not an allowed global", str(err))
    if found:
        return found.group(1) if "." in found.group(1) else f"builtins.{found.group(1)}"
    found = re.search(r"WeightsUnpickler error: \s*([^\n]+)", str(err))  # an operation
    return found.group(1).strip()[:80] if found else "an operation it refuses"


def read_torch(source, what: str, path: str | None = None, fix: str = ""):
    """`torch.load(source, weights_only=True)` on the CPU: tensors and plain values only.
    `source` is a path or a binary stream (then `path` names the file it came from).
    torch's refusal (which advises weights_only=False) becomes a `RefusedFileError`;
    any other failure a UserFileError naming the file."""
    import pickle
    import torch
    path = str(source) if path is None else path
    fix = fix or "the file is damaged: restore it or save it again"
    if isinstance(source, (str, os.PathLike)):
        check_file(str(source), what, fix)
    try:
        with warnings.catch_warnings():  # its protocol note on a foreign pickle: refused anyway
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(source, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        name = torch_refusal(err)
        if name is None:
            raise _fail(what, path, f"is not a torch.save file ({str(err)[:80]})", fix) from None
        raise refused(what, path, "tensors and plain values", name, fix) from None
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, ...
        lines = str(err).strip().splitlines()
        detail = f"{type(err).__name__}: {lines[0][:160]}" if lines else type(err).__name__
        raise _fail(what, path, f"cannot be read ({detail})", fix) from None


def _where(what: str, path: str, line: int | None = None) -> str:
    return f"{what} {path!r}" + (f" line {line}" if line else "")


def _fail(what: str, path: str, problem: str, fix: str = "", line: int | None = None):
    tail = f"; {fix}" if fix else ""
    return UserFileError(f"{_where(what, path, line)} {problem}{tail}", path)


def describe_path(path: str) -> str | None:
    """'a directory', 'a FIFO (named pipe)', ... for what is not a regular file; None
    for a regular file; 'missing' when nothing is there."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    for test, name in ((stat.S_ISREG, None), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_file(path: str, what: str, fix: str = "", empty_ok: bool = False) -> str:
    """`path` is a readable, regular (non-empty) file; UserFileError saying what it is
    otherwise. A FIFO is refused before it is opened (opening one blocks)."""
    kind = describe_path(str(path))
    if kind == "missing":
        raise _fail(what, path, "does not exist", fix)
    if kind is not None:
        raise _fail(what, path, f"is {kind}, not a file" if kind.startswith("a") else
                    f"is {kind}", fix or "give the path of a regular file")
    if not os.access(path, os.R_OK):
        raise _fail(what, path, "cannot be read (permission denied)", fix)
    if not empty_ok and os.path.getsize(path) == 0:
        raise _fail(what, path, "is empty", fix)
    return str(path)


def check_dir(path: str, what: str, fix: str = "") -> str:
    """`path` is a directory; UserFileError saying what it is otherwise."""
    kind = describe_path(str(path))
    if kind == "missing":
        raise _fail(what, path, "does not exist", fix)
    if kind != "a directory":
        raise _fail(what, path, f"is {kind or 'a file'}, not a directory", fix)
    return str(path)


def read_bytes(path: str, what: str, fix: str = "", empty_ok: bool = False) -> bytes:
    check_file(path, what, fix, empty_ok)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise _fail(what, path, f"cannot be read ({err.strerror})", fix) from None


def read_text(path: str, what: str, fix: str = "", empty_ok: bool = False) -> str:
    """The file as UTF-8 text; a byte that is not UTF-8 is named by its line."""
    data = read_bytes(path, what, fix, empty_ok)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise _fail(what, path, f"is not UTF-8 text (byte 0x{data[err.start]:02x} at "
                    f"offset {err.start})", fix or "save it as UTF-8", line) from None


def _type_name(expect) -> str:
    names = {dict: "an object {...}", list: "a list [...]"}
    return names.get(expect, getattr(expect, "__name__", str(expect)))


def parse_json(text: str, what: str, path: str, fix: str, expect, line: int | None = None):
    """`text` (the file's, or its line `line`) as JSON of type `expect` (None: any)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        where = line or err.lineno
        raise _fail(what, path, f"is not valid JSON ({err.msg}, column {err.colno})",
                    fix, where) from None
    if expect is not None and not isinstance(value, expect):
        raise _fail(what, path, f"holds {type(value).__name__} JSON where {_type_name(expect)} "
                    f"is expected", fix, line)
    return value


def read_json(path: str, what: str, expect: type | tuple | None = dict, fix: str = "") -> Any:
    """The JSON value of the file, of type `expect` (None: any)."""
    return parse_json(read_text(path, what, fix), what, path, fix, expect)


def read_jsonl(path: str, what: str, expect: type | None = dict, fix: str = "",
               empty_ok: bool = True) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line; a bad line is named by number."""
    text = read_text(path, what, fix, empty_ok)
    return [(number, parse_json(line, what, path, fix, expect, number))
            for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def read_yaml(path: str, what: str, fix: str = ""):
    """The file as an OmegaConf config (DictConfig or ListConfig; the caller checks).
    An empty file is refused: a config named on purpose holds something."""
    from omegaconf import OmegaConf
    text = read_text(path, what, fix)
    if not text.strip():
        raise _fail(what, path, "holds only blank lines", fix or "give its sections "
                    "(trainer:, data:, ...) or do not name it")
    try:
        return OmegaConf.create(text)
    except Exception as err:  # noqa: BLE001 - yaml and omegaconf raise many types
        raise _fail(what, path, f"is not valid YAML ({yaml_problem(err)})", fix,
                    _yaml_line(err)) from None


def _yaml_mark(err: Exception):
    return getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)


def _yaml_line(err: Exception) -> int | None:
    mark = _yaml_mark(err)
    return mark.line + 1 if mark is not None else None


def yaml_problem(err: Exception) -> str:
    """What a YAML parser found wrong and where: its problem ("expected ',' or ']', but
    got '<stream end>'") with the column, then its context ("while parsing a flow
    sequence" started at line 1, column 9); a parser's first line alone names neither."""
    mark, problem = _yaml_mark(err), getattr(err, "problem", None)
    if mark is None or not problem:
        lines = str(err).strip().splitlines()
        return lines[0] if lines else type(err).__name__
    text = f"{problem}, column {mark.column + 1}"
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and start is not None and start is not mark:
        text += f"; {context} started at line {start.line + 1}, column {start.column + 1}"
    return text


def read_safetensors(path: str, what: str = "weights file", fix: str = ""):
    """A safetensors file's tensors (on the CPU)."""
    check_file(path, what, fix)
    with library_read(path, what, fix or "the file is truncated or not safetensors: "
                      "save it again (model.save_pretrained)"):
        from safetensors.torch import load_file
        return load_file(path)


def check_safetensors(path: str, what: str = "weights file") -> None:
    """A safetensors file whose header parses and whose tensors all lie inside the file
    (a truncated download or copy fails here, naming the file, not deep in a loader)."""
    fix = "the file is truncated or not safetensors: copy or save it again"
    check_file(path, what, fix)  # a directory, a FIFO, an empty file
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if length < 2 or 8 + length > size:
            raise _fail(what, path, f"is not a complete safetensors file ({size} bytes; "
                        f"its header is cut short)", fix)
        head = handle.read(length)
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _fail(what, path, "is not a safetensors file (its header is not JSON)",
                    fix) from None
    if not isinstance(header, dict):
        raise _fail(what, path, "is not a safetensors file (its header is not a table)", fix)
    ends = [entry.get("data_offsets", [0, 0])[-1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict)]
    need = 8 + length + max((e for e in ends if isinstance(e, int)), default=0)
    if need != size:  # the format has no slack: any other size is a damaged file
        problem = "is truncated" if need > size else "has bytes its tensors do not account for"
        raise _fail(what, path, f"{problem}: its header gives {need} bytes, the file has "
                    f"{size}", fix)


@contextlib.contextmanager
def library_read(path: str, what: str, fix: str = "") -> Iterator[None]:
    """Run a library's read of `path` (transformers, safetensors, pyarrow): whatever it
    raises becomes a UserFileError naming the file and the library's first line."""
    try:
        yield
    except UserFileError:
        raise
    except Exception as err:  # libraries raise anything
        lines = str(err).strip().splitlines()
        detail = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
        raise _fail(what, path, f"cannot be read ({detail})", fix) from err
