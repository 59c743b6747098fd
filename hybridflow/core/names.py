"""Objects the config names as "package.module:NAME" and the engine imports by name
when a run starts: the task-specific defaults (the data_source -> scorer table, the
toy data maker) live in `algorithms/` and reach the engine only this way, so
`hybridflow/` imports nothing from `algorithms/` and a user can name their own.
Stateless (imported modules are cached by Python).
"""
from __future__ import annotations

import importlib
from typing import Any

from hybridflow.core.constraints import Rule

__all__ = ["import_named", "named_object"]


def import_named(spec: str, key: str) -> Any:
    """The object `spec` = "package.module:NAME" names; ValueError naming the config
    `key`, the spec and what went wrong."""
    target, _, attr = str(spec).partition(":")
    if not target or not attr:
        raise ValueError(f"{key}={spec!r} must name an object as 'package.module:NAME'")
    try:
        module = importlib.import_module(target)
    except ImportError as err:
        raise ValueError(f"{key}={spec!r}: cannot import module {target!r}: {err}") from None
    if not hasattr(module, attr):
        raise ValueError(f"{key}={spec!r}: module {target!r} has no {attr!r}")
    return getattr(module, attr)


def _import_problem(spec: Any, key: str = "value") -> str | None:
    try:
        import_named(str(spec), key)
    except ValueError as err:
        return str(err)
    return None


def named_object(what: str) -> Rule:
    """A config rule: the value names an importable object ("package.module:NAME");
    checked before launch, so a typo fails with the key, not mid-run."""
    return Rule(lambda v: _import_problem(v) is None,
                f"name {what} as 'package.module:NAME'",
                message=lambda key, value: _import_problem(value, key))
