"""Finding the environment a config names, and checking it before any worker starts.

An environment is named like a worker class: `"path/to/file.py:Name"` (only that
file is imported) or `"package.module:Name"`, where `Name` is a class or a function
of no arguments that returns a fresh environment (one per episode). `check_environment`
imports it, builds one and checks it has `reset` and `step`, so `hybridflow check`
can report a missing file, a failing import, a missing name or a wrong shape with
the spec in the message.

State: each file is imported once, under a private module name kept in `sys.modules`
(its functions are pickled by value for Ray workers, which cannot import that name).
"""
from __future__ import annotations

from typing import Any, Callable

from hybridflow.core.names import resolve_name

__all__ = ["EnvironmentSpecError", "load_environment_factory", "check_environment"]


class EnvironmentSpecError(ValueError):
    """The configured environment cannot be found, imported or built."""


def load_environment_factory(spec: str) -> Callable[[], Any]:
    """The class or factory function `spec` names ('file.py:Name' or 'module:Name')."""
    factory = resolve_name(spec, "environment", EnvironmentSpecError, "an environment",
                           "environment file")
    if not callable(factory):
        raise EnvironmentSpecError(f"environment {spec!r} is a {type(factory).__name__}, not "
                                   "a class or a function that returns an environment")
    return factory


def check_environment(spec: str, timeout_s: float | None = None) -> Callable[[], Any]:
    """Load the factory, build one environment (within `timeout_s`, the episode's step
    bound) and check its shape; returns the factory. Whatever building raises — sys.exit
    and KeyboardInterrupt too — or a build that does not return is this error."""
    from hybridflow.core.deadline import CallTimeout, call_with_deadline
    from hybridflow.core.origin import contain
    factory = load_environment_factory(spec)
    try:
        env = call_with_deadline(factory, timeout_s, f"building environment {spec!r}",
                                 "agent.step_timeout_s")
    except CallTimeout as err:
        raise EnvironmentSpecError(f"environment {spec!r}: {err}") from None
    except BaseException as raised:  # the user's constructor: contained
        err = contain(raised, f"building environment {spec!r}")
        raise EnvironmentSpecError(f"environment {spec!r}: building one with no arguments "
                                   f"raised {type(err).__name__}: {err}") from raised
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing:
        raise EnvironmentSpecError(f"environment {spec!r} built a {type(env).__name__} "
                                   f"without {' and '.join(missing)}; an environment needs "
                                   "reset(row) -> str and step(turn) -> StepResult")
    return factory
