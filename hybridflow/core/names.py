"""The one resolver of objects a config names: "package.module:NAME" or
"path/to/file.py:NAME" (worker classes in `workers.<role>`, the data_source -> scorer
table, the toy data maker, agent environments, rollout engine factories). The
task-specific defaults live in `algorithms/` and reach the engine only this way, so
`hybridflow/` imports nothing from `algorithms/` and a user can name their own.
A file is imported by `core/user_code.py` (pickled by value for Ray workers).
Stateless (imported modules are cached by Python).
"""
from __future__ import annotations

import importlib
from typing import Any

from hybridflow.core.constraints import Rule

__all__ = ["resolve_name", "import_named", "named_object"]


def resolve_name(spec: str, key: str, error: type[Exception] = ValueError,
                 what: str = "an object", file_what: str = "file") -> Any:
    """The object `spec` names ("package.module:NAME" or "file.py:NAME"; the last ':'
    splits, so a path may hold one); `error` naming the config `key`, the spec and
    what went wrong."""
    target, _, attr = str(spec).rpartition(":")
    if not target or not attr:
        raise error(f"{key}={spec!r} must name {what} as 'package.module:NAME' or "
                    f"'path/to/file.py:NAME'")
    if target.endswith(".py"):
        from hybridflow.core.user_code import import_user_file
        module = import_user_file(target, f"{key}: {file_what}", error)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise error(f"{key}={spec!r}: cannot import module {target!r}: {err}") from None
        except Exception as err:  # the module's own code failed
            raise error(f"{key}={spec!r}: importing module {target!r} failed: "
                        f"{type(err).__name__}: {' '.join(str(err).split())}") from err
    if not hasattr(module, attr):
        defined = sorted(n for n, v in vars(module).items() if not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise error(f"{key}={spec!r}: {target!r} defines no {attr!r}; it defines "
                    f"{', '.join(defined[:12]) or 'nothing importable'}")
    return getattr(module, attr)


def import_named(spec: str, key: str) -> Any:
    """`resolve_name` raising ValueError."""
    return resolve_name(spec, key)


def _import_problem(spec: Any, key: str = "value", want_callable: bool = False) -> str | None:
    try:
        found = import_named(str(spec), key)
    except ValueError as err:
        return str(err)
    if want_callable and not callable(found):
        return (f"{key}={spec!r} names a {type(found).__name__}, not a function; name a "
                f"callable")
    return None


def named_object(what: str, want_callable: bool = False) -> Rule:
    """A config rule: the value names an importable object ("package.module:NAME"), a
    callable one with `want_callable`; checked before launch, so a typo fails with the
    key, not mid-run."""
    return Rule(lambda v: _import_problem(v, want_callable=want_callable) is None,
                f"name {what} as 'package.module:NAME'",
                message=lambda key, value: _import_problem(value, key, want_callable))
