"""The table `hybridflow check --memory` prints: each role's peak on one device of its
pool, each pool's peak per rank (colocated roles summed as `roles.py` models it, the
process on a CPU host) against the device's memory and, on a CPU host, the busiest
host's total (every process placed on it, `hosts.py`) against its RAM;
`MemoryReport.problems()` gives a "does not fit" line per pool or host over capacity
(the command prints them as its error). Stateless."""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.memory.hosts import HostMemory, PoolMemory, host_memory, pools_memory
from hybridflow.memory.roles import RoleMemory, roles_memory

__all__ = ["MemoryReport", "plan_memory", "format_report", "gib", "pass_keys",
           "machine_memory_bytes", "launch_memory_problems"]

GIB = 1024 ** 3


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= 0.01 * GIB else f"{nbytes / 2**20:.1f} MiB"


@dataclass
class MemoryReport:
    device: str               # the planner's device name (placement.cluster.device)
    capacity: float | None    # bytes per device
    roles: list[RoleMemory]
    pools: list[PoolMemory]
    cpu: bool = False         # a CPU entry: capacity is this machine's memory
    host: HostMemory | None = None  # a CPU run: the busiest host's processes

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.pools) and (self.host is None or self.host.fits)

    def problems(self) -> list[str]:
        """One line per pool that does not fit, naming its largest role, the pass of
        its peak and the keys that size that pass."""
        lines = []
        for pool in self.pools:
            if pool.fits:
                continue
            worst = max(pool.roles, key=lambda r: r.peak)
            peak_pass = pool.peak_pass()
            lines.append(
                f"does not fit: pool '{pool.pool}' needs {gib(pool.peak)} of "
                f"{gib(pool.capacity)} per {self.device} device (role '{worst.role}' needs "
                f"{gib(worst.peak)}, peak in {peak_pass}); lower "
                f"{' or '.join(pass_keys(peak_pass))}, shorten data.max_prompt_length / "
                f"rollout.max_new_tokens, train LoRA adapters, use more devices (fsdp2), "
                f"or place roles on separate pools")
        if self.host is not None and not self.host.fits:
            lines.append(
                f"does not fit: this host needs {gib(self.host.total)} of "
                f"{gib(self.host.capacity)} ({_processes(self.host)}): CPU processes share "
                f"the machine's RAM; lower rollout.kv_cache_gib or the micro-batch sizes, "
                f"place fewer ranks on a host (placement.pools.<name>.devices_per_node), "
                f"or use more nodes")
        return lines


def pass_keys(pass_name: str) -> list[str]:
    """The config keys that size a pass's micro-batches ("actor.update" ->
    actor.micro_batch_size, actor.max_tokens_per_micro_batch)."""
    role, _, method = pass_name.partition(".")
    if method == "generate":
        return ["rollout.micro_batch_size"]
    if role == "actor" and method == "logprob":
        return ["rollout.log_prob_micro_batch_size",
                "rollout.log_prob_max_tokens_per_micro_batch (a token budget)"]
    if role in ("actor", "critic", "ref"):
        return [f"{role}.micro_batch_size",
                f"{role}.max_tokens_per_micro_batch (a token budget)"]
    return ["the micro-batch sizes"]


def machine_memory_bytes() -> int:
    """The memory this machine has (psutil): a CPU pool's capacity, since the local
    runtime's CPU workers share it."""
    import psutil
    return int(psutil.virtual_memory().total)


def plan_memory(cfg, plan) -> MemoryReport:
    """The memory report of a compiled plan under its config."""
    from hybridflow.planner.devices import get_device
    device = str(_cluster_device(cfg))
    spec = get_device(device)
    # a CPU entry ("cpu", or one measured or calibrated from a CPU run) sizes a CPU of a
    # cluster being planned; the pool of a run on this machine has this machine's
    # memory (a 24 GiB box is not 256 GiB)
    capacity = float(machine_memory_bytes() if spec.cpu else spec.memory_bytes)
    roles = roles_memory(cfg, plan, capacity, cuda=not spec.cpu)
    if not spec.cpu:
        return MemoryReport(spec.name, capacity, roles, pools_memory(roles, capacity))
    from hybridflow.core.modes import RuntimeName
    from hybridflow.memory.engines import PROCESS_BYTES
    pools = pools_memory(roles, capacity, PROCESS_BYTES)
    per_rank = RuntimeName.of(_runtime_name(cfg)).process_per_rank
    host = host_memory(pools, plan.placement, per_rank, capacity, PROCESS_BYTES)
    return MemoryReport(spec.name, capacity, roles, pools, True, host)


def _runtime_name(cfg) -> str:
    runtime = cfg.get("runtime") if isinstance(cfg, dict) else getattr(cfg, "runtime", None)
    if runtime is None:
        return "local"
    return str(runtime.get("name", "local") if isinstance(runtime, dict) else runtime.name)


def _processes(host: HostMemory) -> str:
    return " + ".join(f"{count} {what} x {gib(each)}"
                      for what, count, each in host.processes if count)


def _cluster_device(cfg) -> str:
    placement = cfg.get("placement") if isinstance(cfg, dict) else cfg.placement
    cluster = placement.get("cluster") if isinstance(placement, dict) else placement.cluster
    return cluster.get("device", "cpu") if isinstance(cluster, dict) else cluster.device


def _parts(parts: dict[str, int]) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in parts.items() if v) or "-"


def format_report(report: MemoryReport) -> str:
    cap = gib(report.capacity) if report.capacity else "unknown"
    where = " (this machine, psutil)" if report.cpu else ""
    lines = [f"memory per device (device {report.device}: {cap}{where}; peaks assume every row "
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
        process = f"process {gib(pool.process)} + " if pool.process else ""
        lines.append(f"  pool {pool.pool} ({names}): {gib(pool.peak)} per rank of {cap} -> "
                     f"{verdict} ({process}resident summed + largest pass, "
                     f"{pool.peak_pass()})")
    if report.host is not None:
        verdict = "fits" if report.host.fits else "DOES NOT FIT"
        lines.append(f"  host (every process on one machine): {_processes(report.host)} = "
                     f"{gib(report.host.total)} of {gib(report.host.capacity)} -> {verdict}")
    return "\n".join(lines)


def launch_memory_problems(cfg, plan) -> list[str]:
    """What `hybridflow run` refuses to start with (`trainer.check_memory`): the
    "does not fit" lines of the plan's memory report, for a run whose workers run on
    this machine's CPU (a GPU run's device memory is not this machine's RAM)."""
    from hybridflow.planner.devices import get_device
    if not get_device(str(_cluster_device(cfg))).cpu or not _runs_on_cpu(cfg):
        return []
    report = plan_memory(cfg, plan)
    return [] if report.fits else report.problems()


def _runs_on_cpu(cfg) -> bool:
    device = str(cfg.model.device)
    if device not in ("auto", ""):
        return device == "cpu"
    import torch
    return not torch.cuda.is_available()
