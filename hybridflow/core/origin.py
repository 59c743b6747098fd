"""Where in the user's code an error came from, and constructing a role's worker so
that its failure names the role, the class, the file:line and the cause.

`user_origin(err)`: 'function() at file.py:12' of the innermost traceback frame that
lies outside hybridflow and the installed libraries (the user's own code), or ''.
`construct_role(role, cls, cfg, ctx)`: `cls(cfg, ctx)`, raising `RoleStartError`
(one line: role, class and its file:line, where it failed, the exception) — the
local runtime and the Ray worker shell both construct roles through it. Stateless.
"""
from __future__ import annotations

import inspect
import linecache
import os
import re
import sysconfig

__all__ = ["RoleStartError", "UserCodeExit", "construct_role", "contain", "describe_exit",
           "user_origin", "is_user_file"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARIES = tuple({os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib",
                                                                        "platlib")})


def is_user_file(path: str) -> bool:
    path = os.path.abspath(path)
    return (not path.startswith(_PACKAGE + os.sep) and not path.startswith(_LIBRARIES)
            and not path.startswith("<"))


def user_origin(err: BaseException) -> str:
    """'function() at file.py:12' of the innermost frame in user code, or ''."""
    found, tb = "", err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = f"{code.co_name}() at {code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


class RoleStartError(RuntimeError):
    """A role's worker class failed in its constructor; the message is one line."""

    def __init__(self, message: str, role: str):
        super().__init__(message)
        self.role = role


def _defined_at(cls) -> str:
    """'file.py:12' of the class statement. A class shipped to a Ray worker by value
    has no importable module, so the file comes from its methods' code objects."""
    codes = [f.__code__ for f in vars(cls).values() if hasattr(f, "__code__")]
    path = codes[0].co_filename if codes else None
    try:
        path = inspect.getsourcefile(cls) or path
    except (TypeError, OSError):
        pass
    if not path:
        return getattr(cls, "__module__", "?")
    pattern = re.compile(rf"\s*class\s+{re.escape(cls.__name__)}\b")
    lines = linecache.getlines(path)
    line = next((i for i, text in enumerate(lines, 1) if pattern.match(text)), None)
    return f"{path}:{line}" if line else path


_MIGRATION = {  # the cause of a worker written against the docs before the typed RunConfig
    "'RunConfig' object is not": "workers receive a typed RunConfig since the program layer: "
                                 "read a section with hybridflow.core.sections.read_section("
                                 "cfg, 'actor', ActorConfig) or cfg.<section> "
                                 "(docs/workers.md#migrating-a-worker-class)",
}


def construct_role(role: str, cls, cfg, ctx):
    """`cls(cfg, ctx)`; any exception (sys.exit too) becomes a `RoleStartError` naming
    the role, the class and where it is defined, the user's line that failed, the
    exception, and, for a known old-API mistake, what to write instead."""
    try:
        return cls(cfg, ctx)
    except (Exception, SystemExit) as err:  # named and re-raised
        name = getattr(cls, "__qualname__", repr(cls))
        where = user_origin(err)
        cause = (f"called sys.exit({err.code!r})" if isinstance(err, SystemExit)
                 else f"{type(err).__name__}: {err}".splitlines()[0])
        hint = next((h for key, h in _MIGRATION.items() if key in str(err)), "")
        raise RoleStartError(
            f"role '{role}' ({name}, {_defined_at(cls)}): constructing it failed"
            f"{' in ' + where if where else ''}: {cause}{'; ' + hint if hint else ''}",
            role) from err


class UserCodeExit(RuntimeError):
    """User code raised a BaseException that is not an error (`sys.exit`,
    `KeyboardInterrupt` raised by the code itself, ...): contained and reported as
    that code's failure, never taken for the end of the process or a Ctrl-C."""


def describe_exit(err: BaseException, what: str = "user code") -> str:
    """One line for a non-Exception raised by user code: what did it, where, and
    what to do instead."""
    where = user_origin(err) or what
    if isinstance(err, SystemExit):
        return (f"{where} called sys.exit({err.code!r}); user code must raise an exception "
                f"to stop a run, not end the process")
    done = f"raised {type(err).__name__}" + (f"({err})" if str(err) else "")
    return (f"{where} {done}; user code must raise an exception to stop a run, not "
            f"interrupt it")


def contain(err: BaseException, what: str = "user code") -> BaseException:
    """`err` as an Exception: an Exception as it is, anything else a `UserCodeExit`."""
    if isinstance(err, Exception):
        return err
    contained = UserCodeExit(describe_exit(err, what))
    contained.__cause__ = err
    return contained
