"""One rank of each pool, and each host: what shares one device, and what shares one
machine's RAM.

A **pool**'s rank holds its colocated roles in one process: every role's resident
bytes, plus the largest pass of any of them (its calls run one at a time), plus, on a
CPU host, the process itself (`engines.PROCESS_BYTES`: interpreter and libraries).

A **host** (a CPU run: its processes share the machine's RAM, which is every rank's
"device") holds every process placed on it:
- runtimes with a process per rank (Ray): `devices_per_node` ranks of each pool (a
  pool over several nodes puts that many on each; the planner packs every pool onto
  each node it uses, the worst case for one host), each at its pool's per-rank peak,
  and the driver's process; Ray's own daemons (GCS, raylet, object store: shared
  memory, filled as objects are put) are not counted;
- the local runtime: one process holding every role of every simulated rank (their
  resident bytes) and the largest pass of any of them.
A GPU rank's peak is device memory; its host's RAM is not modeled. Stateless.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PoolMemory", "HostMemory", "pools_memory", "host_memory"]


@dataclass
class PoolMemory:
    """Colocated roles on one device (one rank) of a pool: resident bytes summed, plus
    the largest pass of any of them, plus the process on a CPU host."""
    pool: str
    roles: list  # RoleMemory
    capacity: float | None  # bytes per device, when the device is known
    process: int = 0        # a CPU rank's own process (engines.PROCESS_BYTES); GPU: 0

    @property
    def resident(self) -> int:
        return sum(r.resident_bytes for r in self.roles)

    @property
    def largest_pass(self) -> int:
        return max((r.largest_pass()[1] for r in self.roles), default=0)

    @property
    def peak(self) -> int:
        return self.process + self.resident + self.largest_pass

    def peak_pass(self) -> str:
        passes = [r.largest_pass() for r in self.roles]
        return max(passes, key=lambda p: p[1], default=("-", 0))[0]

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak <= self.capacity


@dataclass
class HostMemory:
    """The processes one host runs, each `(what, how many, bytes each)`, against its
    RAM."""
    capacity: float
    processes: list[tuple[str, int, int]]

    @property
    def total(self) -> int:
        return sum(count * each for _, count, each in self.processes)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def pools_memory(roles: list, capacity: float | None, process: int = 0) -> list[PoolMemory]:
    """Colocated roles grouped by pool (one device of each); `process`: the bytes of a
    rank's process on a CPU host."""
    pools: dict[str, list] = {}
    for memory in roles:
        pools.setdefault(memory.pool, []).append(memory)
    return [PoolMemory(name, members, capacity, process) for name, members in pools.items()]


def host_memory(pools: list[PoolMemory], placement, process_per_rank: bool,
                capacity: float, process: int) -> HostMemory:
    """The busiest host of a CPU run (see the module docstring)."""
    specs = placement.pools
    if process_per_rank:
        ranks = [(f"rank(s) of pool '{p.pool}'", _per_host(specs, p.pool), p.peak)
                 for p in pools]
        return HostMemory(capacity, [*ranks, ("driver", 1, process)])
    resident = sum(_world(specs, p.pool) * p.resident for p in pools)
    largest = max((p.largest_pass for p in pools), default=0)
    return HostMemory(capacity, [("process (local runtime: every role of every rank)", 1,
                                  process + resident + largest)])


def _per_host(specs, pool: str) -> int:
    spec = specs.get(pool)
    return spec.devices_per_node if spec is not None else 1


def _world(specs, pool: str) -> int:
    spec = specs.get(pool)
    return spec.world_size if spec is not None else 1
