"""A pool: colocated roles sharing n devices, one process per device.

Colocated roles keep their static state (weights, optimizer shards) resident
side by side and run one node at a time, so a pool fits when the sum of static
state plus the largest transient (one node's activations or KV cache) fits in
usable device memory. The generate node takes whatever memory is left for its
KV cache, so its speed depends on its pool mates' layouts.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass


from .cost import CostModel, Layout, RoleCost, tp_options
from .devices import GIB


@dataclass(frozen=True)
class MemoryUse:
    """Bytes per device of one pool at its peak."""

    static: dict[str, float]  # role -> resident bytes
    peak_transient: float
    peak_node: str | None
    usable: float
    capacity: float

    @property
    def total(self) -> float:
        return sum(self.static.values()) + self.peak_transient

    def to_json(self) -> dict:
        return {
            "static_gib": {role: round(b / GIB, 2) for role, b in self.static.items()},
            "peak_transient_gib": round(self.peak_transient / GIB, 2),
            "peak_node": self.peak_node,
            "total_gib": round(self.total / GIB, 2),
            "usable_gib": round(self.usable / GIB, 2),
            "capacity_gib": round(self.capacity / GIB, 2),
        }


@dataclass(frozen=True)
class PoolEval:
    """A feasible pool: its roles' layouts, node times and memory."""

    roles: tuple[str, ...]
    devices: int
    layouts: dict[str, Layout]
    node_seconds: dict[str, float]
    memory: MemoryUse
    decode_batch: dict[str, int]  # generating role -> sequences decoded at once per replica

    @property
    def busy_seconds(self) -> float:
        return sum(self.node_seconds.values())


@dataclass(frozen=True)
class Shortfall:
    """A pool that does not fit, with the numbers of its least hungry layout."""

    roles: tuple[str, ...]
    devices: int
    need: float
    usable: float
    capacity: float
    detail: str

    def reason(self, device_label: str) -> str:
        return (f"{'+'.join(self.roles)} on {self.devices} x {device_label} needs "
                f"{self.need / GIB:.1f} GiB per device > {self.usable / GIB:.1f} GiB usable "
                f"(of {self.capacity / GIB:.0f} GiB): {self.detail}")


def evaluate_pool(cost: CostModel, roles: tuple[str, ...], devices: int,
                  tps: tuple[int, ...]) -> PoolEval | Shortfall:
    """Roles colocated on `devices` devices with tensor-parallel sizes `tps` (one per role)."""
    parts = tuple(cost.role_cost(role, devices, tp) for role, tp in zip(roles, tps))
    return _combine(cost, roles, devices, parts)


def _combine(cost: CostModel, roles, devices, parts: tuple[RoleCost, ...]) -> PoolEval | Shortfall:
    static = {p.role: p.static_bytes for p in parts}
    resident = sum(static.values())
    peak = max(parts, key=lambda p: p.transient_bytes)
    peak_bytes, peak_node = peak.transient_bytes, peak.transient_node
    seconds: dict[str, float] = {}
    decode_batch: dict[str, int] = {}
    for part in parts:
        seconds.update(part.node_seconds)
        for node in cost.problem.role_nodes(part.role):
            if not node.kind.generates:
                continue
            gen = cost.generate_cost(part.role, devices, part.layout.tp, cost.usable - resident)
            if gen is None:
                return _generate_shortfall(cost, roles, devices, parts, part)
            seconds[node.name] = gen.seconds
            decode_batch[part.role] = gen.batch
            if gen.transient_bytes > peak_bytes:
                peak_bytes, peak_node = gen.transient_bytes, node.name
    if resident + peak_bytes > cost.usable:
        return _shortfall(cost, roles, devices, static, peak_bytes, f"peak {peak_node}")
    capacity = cost.device.memory_bytes
    memory = MemoryUse(static, peak_bytes, peak_node, cost.usable, capacity)
    ordered = {n.name: seconds[n.name] for n in cost.problem.nodes if n.name in seconds}
    return PoolEval(roles, devices, {p.role: p.layout for p in parts}, ordered, memory,
                    decode_batch)


def _generate_shortfall(cost, roles, devices, parts, gen_part: RoleCost) -> Shortfall:
    role, tp = gen_part.role, gen_part.layout.tp
    fixed = cost.generate_fixed_bytes(role, tp)
    kv = cost.kv_bytes_per_sequence(role, tp)
    static = {p.role: p.static_bytes for p in parts}
    detail = (f"{role} rollout weights+workspace {fixed / GIB:.1f} GiB + KV cache of one "
              f"sequence {kv / GIB:.2f} GiB")
    return _shortfall(cost, roles, devices, static, fixed + kv, detail)


def _shortfall(cost, roles, devices, static: dict, transient: float, what: str) -> Shortfall:
    parts = ", ".join(f"{role} {b / GIB:.1f}" for role, b in static.items())
    detail = f"static {parts} GiB; transient {transient / GIB:.1f} GiB ({what})"
    need = sum(static.values()) + transient
    return Shortfall(tuple(roles), devices, need, cost.usable, cost.device.memory_bytes, detail)


def pool_options(cost: CostModel, roles: tuple[str, ...],
                 devices: int) -> list[PoolEval] | Shortfall:
    """The Pareto-optimal layouts of a pool (no other layout is as fast on every node).

    Step time only grows with any node's time, and a pool's layouts change only
    its own nodes' times, so dropping dominated layouts loses no optimum.
    """
    per_role = [_role_choices(cost, role, devices) for role in roles]
    feasible: list[PoolEval] = []
    closest: Shortfall | None = None
    for parts in itertools.product(*per_role):
        result = _combine(cost, roles, devices, parts)
        if isinstance(result, Shortfall):
            if closest is None or result.need < closest.need:
                closest = result
        else:
            feasible.append(result)
    if not feasible:
        assert closest is not None  # at least one combination was tried
        return closest
    return _pareto(feasible)


def _role_choices(cost: CostModel, role: str, devices: int) -> list[RoleCost]:
    """A role's layouts, minus those beaten on time and memory by another.

    A generating role keeps all of its layouts: its speed depends on the
    memory its pool mates leave, which is not known role by role.
    """
    model = cost.problem.models[role]
    generates = cost.problem.generates(role)
    tps = tp_options(cost.cluster, model, devices, generates)
    if generates and cost.problem.rollout_tp in tps:  # a fixed rollout tp, where the pool allows
        tps = [cost.problem.rollout_tp]
    options = [cost.role_cost(role, devices, tp, sp) for tp in tps
               for sp in cost.sp_options(role, devices, tp)]
    if generates:
        return options

    def beats(a: RoleCost, b: RoleCost) -> bool:
        return (a.static_bytes <= b.static_bytes and a.transient_bytes <= b.transient_bytes
                and all(a.node_seconds[k] <= b.node_seconds[k] for k in b.node_seconds))

    kept: list[RoleCost] = []
    for option in options:  # earlier (smaller tp, then sp) wins ties
        if not any(beats(k, option) for k in kept):
            kept = [k for k in kept if not beats(option, k)] + [option]
    return kept


def _pareto(evals: list[PoolEval]) -> list[PoolEval]:
    def dominates(a: PoolEval, b: PoolEval) -> bool:
        return all(a.node_seconds[k] <= b.node_seconds[k] for k in b.node_seconds)

    kept: list[PoolEval] = []
    for ev in sorted(evals, key=lambda e: e.busy_seconds):
        if not any(dominates(k, ev) for k in kept):
            kept.append(ev)
    return kept
