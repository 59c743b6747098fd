"""Resource pools and colocation: where each role runs.

A pool is a named set of devices on one or more nodes. Roles mapped to the same pool
are colocated: one worker process per device holds all of them (actor, rollout and
reference share a process, so weights move in memory). The mapping comes from
configuration, never from the graph, so one graph runs under many placements.
A folded role has no model of its own: a colocated host role serves it (a LoRA
actor with its adapters off is the reference), so it must share the host's pool.
The automatic planner that chooses a placement lives in `hybridflow/planner/`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

from hybridflow.core.layout import RoleLayout, check_sp

__all__ = ["PoolSpec", "Placement"]


@dataclass(frozen=True)
class PoolSpec:
    name: str
    nodes: int = 1
    devices_per_node: int = 1
    cores: tuple[int, ...] | None = None  # CPU cores its workers run on (Ray; affinity.py)

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass
class Placement:
    pools: dict[str, PoolSpec]
    roles: dict[str, str]                          # role -> pool name
    parallel: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> {dp, tp, sp}
    folded: dict[str, str] = field(default_factory=dict)  # role -> host role serving it

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Placement":
        """From the `placement` config section; a misspelt field is a ValueError."""
        pools = {name: _pool(name, p) for name, p in dict(cfg.get("pools") or {}).items()}
        roles = {str(r): str(p) for r, p in dict(cfg.get("roles") or {}).items()}
        parallel = {str(r): _fields(p, ("dp", "tp", "sp"), f"placement.parallel.{r}")
                    for r, p in dict(cfg.get("parallel") or {}).items()}
        for role, entry in parallel.items():  # core/layout.py
            check_sp(role, entry.get("sp", 1))
        return cls(pools, roles, parallel)

    @classmethod
    def single_pool(cls, roles, devices: int = 1, name: str = "main") -> "Placement":
        """Every role colocated in one pool: the default placement."""
        return cls({name: PoolSpec(name, 1, devices)}, {r: name for r in roles})

    def colocated(self) -> dict[str, list[str]]:
        """pool -> roles living in it (one process per device holds them all)."""
        out: dict[str, list[str]] = {name: [] for name in self.pools}
        for role, pool in self.roles.items():
            out.setdefault(pool, []).append(role)
        return out

    def fold_problems(self) -> list[str]:
        """Why a folded role cannot be served by its host under this placement."""
        problems = []
        for role, host in self.folded.items():
            pool, host_pool = self.roles.get(role), self.roles.get(host)
            if role in self.roles and host_pool is None:
                problems.append(f"role '{role}' is served by role '{host}', which the graph "
                                f"does not use and no pool holds")
            elif role in self.roles and pool != host_pool:
                problems.append(
                    f"role '{role}' is served by role '{host}' in the same process, but "
                    f"placement.roles puts '{role}' on pool '{pool}' and '{host}' on pool "
                    f"'{host_pool}': place them on one pool (or drop placement.roles.{role}), "
                    f"or give '{role}' its own model (a LoRA actor's reference: set ref.path)")
        return problems

    def tp_size(self, role: str) -> int:
        """The role's tensor-parallel size; a folded role without an entry of its own
        runs in its host's processes, on the host's layout."""
        entry = self.parallel.get(role)
        if entry is None and role in self.folded:
            entry = self.parallel.get(self.folded[role])
        return int((entry or {}).get("tp", 1))

    def sp_size(self, role: str) -> int:
        """The role's sequence-parallel size: its own entry's (a folded role, the rollout
        served by the actor, generates and never splits rows)."""
        return int((self.parallel.get(role) or {}).get("sp", 1))

    def layout(self, role: str, world: int | None = None,
               generating: bool = False) -> RoleLayout:
        """The role's layout on its pool (`world`: the pool's ranks as the runtime
        counts them, else the placement's; 1 for a role on no pool; `generating`: the
        layout of a generate call, without sp). A ValueError naming role, key and
        numbers where tp (x sp) does not divide the pool."""
        pool = self.pools.get(self.roles.get(role, ""))
        if world is None:
            world = pool.world_size if pool else 1
        layout = RoleLayout(int(world), self.tp_size(role), self.sp_size(role), role=role,
                            pool=pool.name if pool else None)
        return layout.without_sp() if generating else layout

    def layout_lines(self, roles) -> list[str]:
        """The layout each sharded role's workers build, for summaries: its dp x sp x tp
        and the ranks of each tp and sp group (a dp call splits over the row groups)."""
        lines = []
        for role in roles:
            pool = self.pools.get(self.roles.get(role, ""))
            try:
                layout = self.layout(role)
            except ValueError:
                continue  # the compiler says why
            if pool is None or not layout.sharded:
                continue
            shape = f"dp {layout.dp} x sp {layout.sp} x tp {layout.tp}"
            groups = ", ".join(f"{kind} groups {[list(g) for g in ranks]}" for kind, ranks in
                               (("tp", layout.tp_groups), ("sp", layout.sp_groups))
                               if getattr(layout, kind) > 1)
            line = f"  layout: {role} on pool {pool.name}: {shape}, {groups}"
            if layout.sp > 1:  # generate calls run on the layout without sp
                line += f"; generation ignores sp (dp {layout.without_sp().dp})"
            lines.append(line)
        return lines


def _pool(name: str, section) -> PoolSpec:
    """One pool; its `cores` list (a slice of it for each device of a node) must divide
    evenly among the node's devices."""
    section = dict(section or {})
    cores = section.pop("cores", None)
    spec = PoolSpec(name, **_fields(section, ("nodes", "devices_per_node", "cores"),
                                    f"placement.pools.{name}"))
    if cores is None:
        return spec
    cores = tuple(int(c) for c in cores)
    if not cores or len(cores) % spec.devices_per_node:
        raise ValueError(
            f"placement.pools.{name}.cores lists {len(cores)} core(s) for "
            f"devices_per_node={spec.devices_per_node}: list a multiple of it (each worker "
            f"of a node runs on an equal slice, in local-rank order)")
    return PoolSpec(name, spec.nodes, spec.devices_per_node, cores)


def _fields(section, known: tuple[str, ...], where: str) -> dict[str, int]:
    """Integer fields of a pool or parallel entry, rejecting unknown names."""
    out = {}
    for key, value in dict(section or {}).items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {list(known)}"
            raise ValueError(f"{where} has no field '{key}'{hint}")
        out[str(key)] = int(value)
    return out
