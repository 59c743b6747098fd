"""The optional members of a worker class that the engine reads, declared in one place.

A role is any class built as `cls(cfg, ctx)` whose methods carry `@method`
declarations; it inherits nothing. Beyond its methods the engine looks for seven
optional members, each with a default that means "this role does nothing special".
`WorkerHooks` declares them with those defaults (`hybridflow.workers.Worker` derives
from it; a user's class may too, or declare only what it needs), and the engine reads
every one through the functions below, which give the default for a class that does
not declare it. A new hook is added here, with its default and its reader.

- `HOST_ROLE` (default None), read by `plan/weight_sync.py`: the role whose weights
  this one generates with, or loads when it has a `load_weights` method.
- `served_by(cfg)` (default None), read by `program/assemble.py`: the colocated role
  that serves this one; the role then folds onto its host's pool and process.
- `config_schema` (default None: a free-form section), read by `program/assemble.py`
  for `program/config.py`: the dataclass typing the role's own config section.
- `check_section(section)` (default: no check), read by `program/preflight.py`: the
  role's own check of its section before launch, raising `ConfigError`.
- `held_tensors()` (default None: not asked), read by `run/loop.py`: the storages a
  worker holds, for `engine/weight_bytes` and `engine/optimizer_bytes`.
- `optimizer_steps(cfg, method, kwargs, rows)` (default None: not known), read by
  `plan/unneeded.py` through `program/assemble.py`: how many optimizer steps a call
  of the training `method` with `kwargs` makes on a batch of at most `rows` rows.
- `input_sources(cfg, method)` (default {}), read the same way: keys a call of
  `method` takes from another column of its input under `cfg` (key -> column), so the
  node that would write them is not needed.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

__all__ = ["WorkerHooks", "HOOKS", "host_role", "served_by", "config_schema",
           "check_section", "reports_held_tensors", "optimizer_steps", "input_sources"]

HOOKS = ("HOST_ROLE", "served_by", "config_schema", "check_section", "held_tensors",
         "optimizer_steps", "input_sources")


class WorkerHooks:
    """The optional hooks of a worker class, with their defaults (see the module)."""

    HOST_ROLE: ClassVar[str | None] = None
    config_schema: ClassVar[type | None] = None
    # A method `held_tensors(self) -> {"process": str, "weights": {ptr: bytes},
    # "optimizer": {ptr: bytes}}`; None: the role holds nothing the run counts, and the
    # run does not call it.
    held_tensors: ClassVar[Callable[..., dict[str, Any]] | None] = None

    @classmethod
    def served_by(cls, cfg) -> str | None:
        """The colocated role that serves this one under `cfg`, or None: its own."""
        return None

    @classmethod
    def check_section(cls, section) -> None:
        """Check the role's config section before launch; raise ConfigError to refuse."""
        return None

    @classmethod
    def optimizer_steps(cls, cfg, method: str, kwargs: dict, rows: int) -> int | None:
        """Optimizer steps a call of `method` (with `kwargs`) makes on at most `rows`
        rows under the run config `cfg`; None: not known (nothing is assumed)."""
        return None

    @classmethod
    def input_sources(cls, cfg, method: str) -> dict[str, str]:
        """Keys a call of `method` takes from another column of its input under `cfg`
        (key -> column); {}: it reads each key it declares as it is."""
        return {}


def host_role(cls: type) -> str | None:
    return getattr(cls, "HOST_ROLE", None)


def served_by(cls: type, cfg) -> str | None:
    hook = getattr(cls, "served_by", None)
    return hook(cfg) if callable(hook) else None


def config_schema(cls: type) -> type | None:
    return getattr(cls, "config_schema", None)


def check_section(cls: type, section) -> None:
    hook = getattr(cls, "check_section", None)
    if callable(hook):
        hook(section)


def reports_held_tensors(cls: type) -> bool:
    return callable(getattr(cls, "held_tensors", None))


def optimizer_steps(cls: type, cfg, method: str, kwargs: dict, rows: int) -> int | None:
    hook = getattr(cls, "optimizer_steps", None)
    return hook(cfg, method, kwargs, rows) if callable(hook) else None


def input_sources(cls: type, cfg, method: str) -> dict[str, str]:
    hook = getattr(cls, "input_sources", None)
    return dict(hook(cfg, method)) if callable(hook) else {}
