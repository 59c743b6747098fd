"""Which executor runs a plan: one factory per `RuntimeName`, registered here, so the
step loop builds `make_runtime(plan, cfg, seed)` and no caller switches on
`runtime.name`. What differs between the runtimes lives in their factories: the Ray
one first registers the user's graph and worker files with Ray's pickler (their
functions and classes travel by value to the actors).

A factory is `factory(plan, cfg, seed, extra_plans) -> runtime`; it imports its
executor when called, so a local run never imports Ray.

State: `_FACTORIES` (`RuntimeName` -> factory), filled at import by the built-in
runtimes and changed only by `register_runtime`.
"""
from __future__ import annotations

from typing import Any, Callable

from hybridflow.core.modes import RuntimeName, run_modes

__all__ = ["RuntimeFactory", "register_runtime", "runtime_factory", "make_runtime"]

RuntimeFactory = Callable[..., Any]  # (plan, cfg, seed, extra_plans) -> an Executor

_FACTORIES: dict[RuntimeName, RuntimeFactory] = {}


def register_runtime(name: RuntimeName, factory: RuntimeFactory,
                     replace: bool = False) -> None:
    """Make `runtime.name=<name>` build its executor with `factory`; `name` is a
    `RuntimeName` member (the config's schema lists them)."""
    if not isinstance(name, RuntimeName):
        raise TypeError(f"register_runtime: the name must be a RuntimeName member "
                        f"({', '.join(RuntimeName.names())}), not {name!r}")
    if name in _FACTORIES and not replace:
        raise ValueError(f"runtime '{name}' already has a factory; pass replace=True to "
                         "override it")
    _FACTORIES[name] = factory


def runtime_factory(name: RuntimeName) -> RuntimeFactory:
    """The factory registered for `name`; a ValueError naming the registered ones."""
    try:
        return _FACTORIES[name]
    except KeyError:
        known = ", ".join(sorted(str(n) for n in _FACTORIES)) or "none"
        raise ValueError(f"runtime.name='{name}' has no runtime factory (registered: "
                         f"{known}); register one with hybridflow.runtime.factories."
                         f"register_runtime(name, factory)") from None


def make_runtime(plan, cfg, seed: int = 0, extra_plans=()):
    """The executor `cfg`'s `runtime.name` names, with workers for every role of `plan`
    and `extra_plans`; `cfg` is what the workers receive (the run's typed values)."""
    return runtime_factory(run_modes(cfg).runtime)(plan, cfg, seed, tuple(extra_plans))


def _local(plan, cfg, seed: int, extra_plans):
    from hybridflow.runtime.local import LocalRuntime
    return LocalRuntime(plan, cfg, seed=seed, extra_plans=extra_plans)


def _ray(plan, cfg, seed: int, extra_plans):
    from hybridflow.core.user_code import register_with_ray
    from hybridflow.runtime.ray.executor import RayRuntime
    register_with_ray()  # fn nodes and classes of the user's files travel by value
    return RayRuntime(plan, cfg, seed=seed, extra_plans=extra_plans)


register_runtime(RuntimeName.LOCAL, _local)
register_runtime(RuntimeName.RAY, _ray)
