"""The `placement` section's names and pinned cores, checked before the plan is built
(by `placement_from_config`, so `check`, `run` and the validation graph share them):

- a key of `placement.roles` or `placement.parallel` names a role that exists: one the
  graph calls or one bound in `workers` (the built-in roles included); a misspelt role
  would otherwise be ignored and the run trained in another layout without a word;
- each `placement.roles.<role>` names a pool of `placement.pools`;
- `placement.pools.<name>.cores` (Ray pins each worker to its slice): no core is
  listed by two pools (two ranks on one core list run at half speed each and vLLM's
  thread binding would put two ranks on one list), and, where the workers run on
  this machine (no `runtime.address`), every core is one this process may run on
  (`os.sched_getaffinity`: a container's or taskset's mask, not the hardware count).
Each failure is a ConfigError naming the key, with the closest names. Stateless.
"""
from __future__ import annotations

import difflib
import os
from typing import Iterable

from hybridflow.core.constraints import ConfigError

__all__ = ["check_placement_names", "check_pool_cores", "allowed_cores"]


def _closest(name: str, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}(known: {', '.join(known) or 'none'})"


def check_placement_names(section: dict, roles: Iterable[str]) -> None:
    """`section`: the placement section as plain data; `roles`: every role that exists."""
    roles = set(roles)
    pools = dict(section.get("pools") or {})
    for kind in ("roles", "parallel"):
        for role in dict(section.get(kind) or {}):
            if str(role) not in roles:
                raise ConfigError(f"placement.{kind}.{role}: there is no role '{role}'; "
                                  f"{_closest(str(role), roles)}")
    for role, pool in dict(section.get("roles") or {}).items():
        if str(pool) not in pools:
            raise ConfigError(f"placement.roles.{role}={pool!r}: there is no pool '{pool}' "
                              f"in placement.pools; {_closest(str(pool), pools)}")


def allowed_cores() -> set[int]:
    """The cores this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def check_pool_cores(pools: dict, local: bool, allowed: set[int] | None = None) -> None:
    """`pools`: name -> PoolSpec; `local`: the workers run on this machine."""
    owner: dict[int, str] = {}
    for name, spec in pools.items():
        for core in spec.cores or ():
            if core in owner and owner[core] != name:
                mine = sorted(set(spec.cores) & set(pools[owner[core]].cores))
                raise ConfigError(
                    f"placement.pools.{name}.cores={list(spec.cores)} and placement.pools."
                    f"{owner[core]}.cores={list(pools[owner[core]].cores)} both list core(s) "
                    f"{mine}: two pools never share a core (each rank runs on cores of its "
                    f"own); give each pool its own cores")
            owner[core] = name
    if not local or not owner:
        return
    allowed = allowed_cores() if allowed is None else allowed
    for name, spec in pools.items():
        missing = sorted(set(spec.cores or ()) - allowed)
        if missing:
            raise ConfigError(
                f"placement.pools.{name}.cores={list(spec.cores)}: core(s) {missing} are not "
                f"among the cores this process may run on ({_ranges(allowed)}); list cores "
                f"of that set, or drop placement.pools.{name}.cores")


def _ranges(cores: set[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (as runtime/affinity.py says it in the worker)."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][-1] + 1:
            runs[-1][-1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
