"""Joining or starting Ray (`connect`: an existing cluster at `runtime.address`, or a
Ray of the run's own through `session.start_local_ray`) and the worker groups: one
placement group per node of a pool, one fused actor per device, ranks stable
(rank = node_index * devices_per_node + local index); a pool that lists `cores` has
each rank pinned to its slice before its roles are built. Keeps no state of its own: a
`WorkerGroup` is the executor's.

A pool's ranks form one torch.distributed world: before any role is constructed
every actor gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (a free
port on rank 0's node) and, on GPUs, CUDA_VISIBLE_DEVICES listing its node's devices
of the pool in local-rank order, so `cuda:{local_rank}` is its own device.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.core.runtime_section import RuntimeConfig
from hybridflow.plan.placement import Placement, PoolSpec
from hybridflow.runtime.worker_shell import FusedWorker, failure_cause, failure_detail
from hybridflow.core.sections import read_section

__all__ = ["RayConnectError", "RuntimeSettings", "WorkerGroup", "connect", "launch_group",
           "start_groups", "stop_group"]


@dataclass
class RuntimeSettings(RuntimeConfig):
    """The `runtime` section, read once: the fields and defaults of
    `hybridflow.core.runtime_section.RuntimeConfig`, and what the Ray runtime derives from
    them."""

    @classmethod
    def from_config(cls, cfg) -> "RuntimeSettings":
        """From the run's typed values, a DictConfig or a dict; a missing section or
        key keeps RuntimeConfig's default."""
        section = read_section(cfg, "runtime", RuntimeConfig)
        return cls(**{f.name: getattr(section, f.name) for f in fields(RuntimeConfig)})

    @property
    def start_timeout(self) -> float:
        """Starting actors and building roles (loading models)."""
        return float(self.start_timeout_s)


def connect(settings: RuntimeSettings, placement: Placement) -> bool:
    """Join or start a Ray session; True when this call started it."""
    from hybridflow.core.user_code import register_with_ray
    register_with_ray()  # worker classes from the user's files travel by value
    # a step's first failure is reported by the run (NodeFailure: one line, the traceback
    # in error.log); the refs of the step's other failed tasks, dropped unread, would
    # each print Ray's raw coloured traceback ("Unhandled error") on the console
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if ray.is_initialized():
        return False
    if settings.address:
        _check_reachable(settings.address, settings.connect_timeout_s)
        from hybridflow.runtime.ray.start_bound import bounded_start
        with bounded_start(settings.start_timeout):  # Ray's retries are bounded too
            ray.init(address=settings.address, log_to_driver=True)
        return False
    devices = sum(p.world_size for p in placement.pools.values())
    num_gpus = settings.num_gpus
    if num_gpus is None and not _has_cuda():
        num_gpus = devices  # logical GPUs: workers use them as CPU devices
    num_cpus = settings.num_cpus or max(devices + 2, os.cpu_count() or 1)
    from hybridflow.runtime.ray.session import start_local_ray
    start_local_ray(settings.listen_all, settings.start_timeout, num_cpus=num_cpus,
                    num_gpus=num_gpus, include_dashboard=False)
    return True


class RayConnectError(ConnectionError):
    """runtime.address names no Ray cluster this machine can reach."""


def _check_reachable(address: str, timeout_s: float) -> None:
    """Ray retries an unreachable address for minutes without a word: try the GCS
    port first, within `timeout_s`, and say what was tried. 'auto' (the cluster
    started on this machine by `ray start`) is Ray's own quick check."""
    import socket
    if address == "auto":
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise RayConnectError(f"runtime.address={address!r} is not 'auto', 'HOST:PORT' "
                              f"or 'ray://HOST:PORT'")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise RayConnectError(
            f"cannot reach the Ray cluster at runtime.address={address!r}: a TCP "
            f"connection to {host}:{port} failed within runtime.connect_timeout_s="
            f"{timeout_s:g}s ({err.strerror or err}). Is `ray start --head` running "
            f"there, and is the port open from here? Without --address the run starts "
            f"its own Ray") from None


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@dataclass
class WorkerGroup:
    """The fused actors of one pool, in rank order."""
    spec: PoolSpec
    roles: list[str]
    actors: list = field(default_factory=list)
    groups: list = field(default_factory=list)   # placement groups, one per node
    info: list[dict] = field(default_factory=list)  # address() of each rank

    @property
    def size(self) -> int:
        return len(self.actors)


def launch_group(spec: PoolSpec, roles: list[str], settings: RuntimeSettings) -> WorkerGroup:
    """Reserve the pool's devices (one placement group per node) and start its actors;
    returns at once, the actors start in the background."""
    timeout = settings.start_timeout
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    group = WorkerGroup(spec, list(roles))
    for _ in range(spec.nodes):
        pg = placement_group([dict(bundle)] * spec.devices_per_node, strategy="STRICT_PACK")
        group.groups.append(pg)
        ready, _ = ray.wait([pg.ready()], timeout=timeout)
        if not ready:
            stop_group(group)
            raise RuntimeError(
                f"pool '{spec.name}' needs {spec.nodes} node(s) with {spec.devices_per_node} "
                f"x {bundle} free each; the cluster has {ray.available_resources()} "
                f"available (waited {timeout:.0f}s)")
    actor_cls = ray.remote(FusedWorker)
    for node, pg in enumerate(group.groups):
        for local in range(spec.devices_per_node):
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=local)
            group.actors.append(actor_cls.options(
                num_cpus=1, num_gpus=1 if use_gpu else 0, scheduling_strategy=strategy,
                max_restarts=0).remote(
                    spec.name, node * spec.devices_per_node + local, spec.world_size, local,
                    settings.torch_threads or 1))  # None: one per worker
    return group


def start_groups(groups: list[WorkerGroup], cfg, bindings: dict[str, type], seed: int,
                 settings: RuntimeSettings, make_context: Callable,
                 tp: dict[str, int] | None = None) -> None:
    """Give every rank its torch.distributed env, then construct the roles of all
    pools at once (each pool's ranks must join their process group together);
    `tp`: role -> its tensor-parallel size (placement.parallel.<role>.tp)."""
    timeout = settings.start_timeout
    for group in groups:
        group.info = _get_all([a.address.remote() for a in group.actors], timeout,
                              f"pool '{group.spec.name}'", "starting")
    for group in groups:
        _pin(group, settings)
    pending = []
    for group in groups:
        refs = [actor.start.remote(_rank_env(group, rank), cfg, group.roles, bindings, seed,
                                   make_context, tp)
                for rank, actor in enumerate(group.actors)]
        pending.append((group, refs))
    for group, refs in pending:
        _get_all(refs, timeout, f"pool '{group.spec.name}' roles {group.roles}",
                 "constructing")


def _pin(group: WorkerGroup, settings: RuntimeSettings) -> None:
    """Each rank onto its slice of `placement.pools.<name>.cores`, when listed."""
    spec = group.spec
    if not spec.cores:
        return
    from hybridflow.runtime.affinity import cores_for
    key = f"placement.pools.{spec.name}.cores"
    refs = [actor.pin.remote(cores_for(spec.cores, spec.devices_per_node,
                                       rank % spec.devices_per_node),
                             key, settings.torch_threads)
            for rank, actor in enumerate(group.actors)]
    _get_all(refs, settings.start_timeout, f"pool '{spec.name}'", "pinning to cores")


def _rank_env(group: WorkerGroup, rank: int) -> dict[str, str]:
    dpn = group.spec.devices_per_node
    master = group.info[0]
    env = {"RANK": str(rank), "WORLD_SIZE": str(group.size), "LOCAL_RANK": str(rank % dpn),
           "LOCAL_WORLD_SIZE": str(dpn), "MASTER_ADDR": master["ip"],
           "MASTER_PORT": str(master["port"])}
    first = (rank // dpn) * dpn
    node_gpus = [g for info in group.info[first:first + dpn] for g in info["gpu_ids"]]
    if len(node_gpus) == dpn:  # one GPU id per rank of this node
        env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus)
    return env


def _get_all(refs: list, timeout: float, what: str, doing: str) -> list[Any]:
    """ray.get of every ref, failing on the first error or after `timeout`."""
    deadline, pending = time.time() + timeout, list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1,
                                  timeout=max(0.0, deadline - time.time()))
        if not ready:
            raise RuntimeError(f"{what}: {doing} took more than {timeout:.0f}s "
                               f"(runtime.start_timeout_s)")
        try:
            ray.get(ready[0])
        except ray.exceptions.RayError as err:
            rank, detail = refs.index(ready[0]), failure_detail(err)
            raise RuntimeError(f"{what}: {doing} failed on rank {rank}: "
                               f"{failure_cause(err)}\n{detail}") from None
    return ray.get(refs)


def stop_group(group: WorkerGroup) -> None:
    for actor in group.actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass
    for pg in group.groups:
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001
            pass
    group.actors.clear()
    group.groups.clear()
