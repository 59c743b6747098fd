"""The table `hybridflow check --memory` prints: each role's peak on one device of its
pool, each pool's peak (colocated roles summed as `roles.py` models it) against the
device's memory; `MemoryReport.problems()` gives a "does not fit" line per pool over
capacity (the command prints them as its error). Stateless."""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.memory.roles import PoolMemory, RoleMemory, pools_memory, roles_memory

__all__ = ["MemoryReport", "plan_memory", "format_report", "gib"]

GIB = 1024 ** 3


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= 0.01 * GIB else f"{nbytes / 2**20:.1f} MiB"


@dataclass
class MemoryReport:
    device: str               # the planner's device name (placement.cluster.device)
    capacity: float | None    # bytes per device
    roles: list[RoleMemory]
    pools: list[PoolMemory]

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.pools)

    def problems(self) -> list[str]:
        """One line per pool that does not fit, naming its largest role."""
        lines = []
        for pool in self.pools:
            if pool.fits:
                continue
            worst = max(pool.roles, key=lambda r: r.peak)
            lines.append(
                f"does not fit: pool '{pool.pool}' needs {gib(pool.peak)} of "
                f"{gib(pool.capacity)} per {self.device} device (role '{worst.role}' needs "
                f"{gib(worst.peak)}, peak in {pool.peak_pass()}); lower the micro-batch "
                f"sizes or rollout.micro_batch_size, shorten data.max_prompt_length / "
                f"rollout.max_new_tokens, train LoRA adapters, use more devices (fsdp2), "
                f"or place roles on separate pools")
        return lines


def plan_memory(cfg, plan) -> MemoryReport:
    """The memory report of a compiled plan under its config."""
    from hybridflow.planner.devices import get_device
    device = str(_cluster_device(cfg))
    spec = get_device(device)
    capacity = float(spec.memory_bytes)
    roles = roles_memory(cfg, plan, capacity, cuda=spec.name != "cpu")
    return MemoryReport(spec.name, capacity, roles, pools_memory(roles, capacity))


def _cluster_device(cfg) -> str:
    placement = cfg.get("placement") if isinstance(cfg, dict) else cfg.placement
    cluster = placement.get("cluster") if isinstance(placement, dict) else placement.cluster
    return cluster.get("device", "cpu") if isinstance(cluster, dict) else cluster.device


def _parts(parts: dict[str, int]) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if v) or "-"


def format_report(report: MemoryReport) -> str:
    cap = gib(report.capacity) if report.capacity else "unknown"
    lines = [f"memory per device (device {report.device}: {cap}; peaks assume every row "
             "padded to data.max_prompt_length + rollout.max_new_tokens)"]
    for role in report.roles:
        name, transient = role.largest_pass()
        lines.append(f"  {role.role}@{role.pool}: peak {gib(role.peak)} in {name}")
        lines.append(f"    resident: {_parts(role.resident)}")
        for pass_name, parts in role.passes.items():
            lines.append(f"    {pass_name}: +{gib(sum(parts.values()))} ({_parts(parts)})")
        lines.extend(f"    note: {note}" for note in role.notes)
    for pool in report.pools:
        verdict = "fits" if pool.fits else "DOES NOT FIT"
        names = ", ".join(r.role for r in pool.roles)
        lines.append(f"  pool {pool.pool} ({names}): {gib(pool.peak)} of {cap} -> {verdict} "
                     f"(resident summed + largest pass, {pool.peak_pass()})")
    return "\n".join(lines)
