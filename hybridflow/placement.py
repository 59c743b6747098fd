"""Resource pools and colocation: where each role runs.

A pool is a named set of devices on one or more nodes. Roles mapped to the same pool
are colocated: one worker process per device holds all of them (actor, rollout and
reference share a process, so weights move in memory). The mapping comes from
configuration, never from the graph, so one graph runs under many placements.
The automatic planner that chooses a placement lives in `hybridflow/planner/`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["PoolSpec", "Placement"]


@dataclass(frozen=True)
class PoolSpec:
    name: str
    nodes: int = 1
    devices_per_node: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass
class Placement:
    pools: dict[str, PoolSpec]
    roles: dict[str, str]                          # role -> pool name
    parallel: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> {dp, tp}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Placement":
        """From the `placement` config section; a misspelt field is a ValueError."""
        pools = {name: PoolSpec(name, **_fields(p, ("nodes", "devices_per_node"),
                                                f"placement.pools.{name}"))
                 for name, p in dict(cfg.get("pools") or {}).items()}
        roles = {str(r): str(p) for r, p in dict(cfg.get("roles") or {}).items()}
        parallel = {str(r): _fields(p, ("dp", "tp"), f"placement.parallel.{r}")
                    for r, p in dict(cfg.get("parallel") or {}).items()}
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

    def tp_size(self, role: str) -> int:
        return int(self.parallel.get(role, {}).get("tp", 1))

    def to_config(self) -> dict:
        return {"pools": {n: {"nodes": p.nodes, "devices_per_node": p.devices_per_node}
                          for n, p in self.pools.items()},
                "roles": dict(self.roles), "parallel": {r: dict(p) for r, p in self.parallel.items()}}


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
