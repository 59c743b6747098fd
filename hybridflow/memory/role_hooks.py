"""Which function sizes a role's memory: a registry, role name -> hook, that
`roles.roles_memory` reads instead of a chain of `if role == ...`. The built-in roles
(actor, rollout, ref, critic, reward) register theirs in `memory/roles.py`; a role of
a user's worker class registers its own:

    from hybridflow.memory.role_hooks import register_role_memory
    register_role_memory("teacher", size_teacher, worker=TeacherWorker)

A hook is `hook(memory: RoleMemory, job: RoleSizing) -> None`: it fills
`memory.resident` (bytes held for the run) and `memory.passes` (each call's transient
bytes, keyed "role.method") and may append to `memory.notes`. It applies when the role
is bound to `worker` (None: the role's built-in class, `workers.DEFAULT_ROLES`), so a
role rebound to a class of its own is "not modeled" rather than sized as the class it
replaced.

State: `_HOOKS` (role -> `_Entry`), filled at import of `memory/roles.py` and by
`register_role_memory`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["RoleSizing", "MemoryHook", "register_role_memory", "role_memory_hook",
           "sized_roles", "models_binding"]


@dataclass(frozen=True)
class RoleSizing:
    """What a hook is given to size one role on one device of its pool."""
    cfg: Any                   # the run's config (DictConfig, RunConfig or dict)
    sections: dict             # the workers' typed sections by name (model, actor, ...)
    nodes: list                # the role's call nodes in the plan
    rows: int                  # rows per data-parallel rank in a step
    prompt: int                # prompt width (data.max_prompt_length)
    capacity: float | None     # the device's bytes, None when unknown
    folded: bool               # served by another role's worker in the same process
    state: dict                # how a trained role keeps its state (cuda, shards, buckets)
    tp: int = 1
    sp: int = 1


MemoryHook = Callable[[Any, RoleSizing], None]  # (RoleMemory, RoleSizing) -> None


@dataclass(frozen=True)
class _Entry:
    hook: MemoryHook
    worker: type | None        # the class it sizes; None: the role's built-in class


_HOOKS: dict[str, _Entry] = {}


def register_role_memory(role: str, hook: MemoryHook, worker: type | None = None,
                         replace: bool = False) -> None:
    """Make `check --memory` size `role` with `hook` when the role is bound to
    `worker` (None: its built-in class)."""
    if not isinstance(role, str) or not role:
        raise TypeError(f"register_role_memory: the role must be a non-empty name, "
                        f"not {role!r}")
    if not callable(hook):
        raise TypeError(f"register_role_memory({role!r}, ...): the hook must be callable, "
                        f"not {type(hook).__name__}")
    if role in _HOOKS and not replace:
        raise ValueError(f"role {role!r} already has a memory hook; pass replace=True to "
                         "override it")
    _HOOKS[role] = _Entry(hook, worker)


def role_memory_hook(role: str) -> MemoryHook:
    """The hook registered for `role`; a ValueError naming the registered roles."""
    entry = _HOOKS.get(role)
    if entry is None:
        raise ValueError(f"no memory hook for role {role!r} (roles with one: "
                         f"{', '.join(sized_roles()) or 'none'}); register one with "
                         f"hybridflow.memory.role_hooks.register_role_memory({role!r}, hook)")
    return entry.hook


def sized_roles() -> tuple[str, ...]:
    """The roles with a memory hook, sorted."""
    return tuple(sorted(_HOOKS))


def models_binding(role: str, bound: type | None) -> bool:
    """Whether `role`'s hook sizes the class `bound` that the plan binds it to."""
    entry = _HOOKS.get(role)
    if entry is None:
        return False
    if entry.worker is not None:
        return bound is entry.worker
    from hybridflow.workers import DEFAULT_ROLES
    return bound is DEFAULT_ROLES.get(role)
