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

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable

__all__ = ["EnvironmentSpecError", "load_environment_factory", "check_environment"]


class EnvironmentSpecError(ValueError):
    """The configured environment cannot be found, imported or built."""


def _import_file(path: str, spec: str) -> ModuleType:
    if not os.path.isfile(path):
        raise EnvironmentSpecError(f"environment {spec!r}: file {path!r} does not exist "
                                   f"(resolved: {os.path.abspath(path)})")
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:10]
    name = f"hybridflow_user_env_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise EnvironmentSpecError(f"environment {spec!r}: importing {path!r} failed: "
                                   f"{type(err).__name__}: {err}") from err
    try:
        import cloudpickle
        cloudpickle.register_pickle_by_value(module)
    except (ImportError, ValueError):
        pass
    return module


def load_environment_factory(spec: str) -> Callable[[], Any]:
    """The class or factory function `spec` names ('file.py:Name' or 'module:Name')."""
    target, _, attr = str(spec).rpartition(":")
    if not target or not attr:
        raise EnvironmentSpecError(f"environment {spec!r} must be 'path/to/file.py:Name' or "
                                   "'package.module:Name'")
    if target.endswith(".py"):
        module = _import_file(target, spec)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise EnvironmentSpecError(f"environment {spec!r}: cannot import module "
                                       f"{target!r}: {err}") from None
    if not hasattr(module, attr):
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and getattr(v, "__module__", None) == module.__name__)
        raise EnvironmentSpecError(f"environment {spec!r}: {target!r} defines no {attr!r}; "
                                   f"it defines {', '.join(defined) or 'nothing callable'}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise EnvironmentSpecError(f"environment {spec!r} is a {type(factory).__name__}, not "
                                   "a class or a function that returns an environment")
    return factory


def check_environment(spec: str) -> Callable[[], Any]:
    """Load the factory, build one environment and check its shape; returns the factory."""
    factory = load_environment_factory(spec)
    try:
        env = factory()
    except Exception as err:
        raise EnvironmentSpecError(f"environment {spec!r}: building one with no arguments "
                                   f"raised {type(err).__name__}: {err}") from err
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing:
        raise EnvironmentSpecError(f"environment {spec!r} built a {type(env).__name__} "
                                   f"without {' and '.join(missing)}; an environment needs "
                                   "reset(row) -> str and step(turn) -> StepResult")
    return factory
