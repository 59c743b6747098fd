"""The fused worker: one Ray actor per device, holding every role colocated on its pool.
The local runtime runs the same class in-process, one per simulated rank
(`FusedWorker.in_process`), so both executors run a task with the same code.

The driver sends small task descriptions (`ShardTask`, as bytes: `encode_task`) and
passes the ObjectRefs of
the input shards (or, for small batches the driver holds, the batches themselves)
as top-level arguments, so Ray moves the shards worker to worker and the actor
receives ready Batches. A task names its node by digest: each worker learns a
node's pickled bytes once (`learn_node`, sent by the runtime before the first task
that uses it; Ray runs one caller's tasks to an actor in order) and unpickles them
on first use. A task returns two objects (`num_returns=2`): the output shard, which
stays in the object store, and a small meta dict (rows, estimated bytes, metrics,
start/end on `time.time()`, pid) that the driver fetches.

Worker state: `roles` (constructed once), `nodes` (digest -> pickled node, then
the PlanNode once a task used it), `prepared` (digest -> the node, its `NodeIO`
and its bound method, worked out on the node's first task) and `tasks` (a task's
bytes, `encode_task`, -> the ShardTask, at most `TASK_CACHE`); only the worker's
own methods change them.

An exception inside a task is re-raised as `WorkerError` carrying the formatted
traceback, so the driver can name node, role and rank and show where it failed.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from hybridflow.core.batch import Batch
from hybridflow.core.failure_text import cause_line
from hybridflow.core.layout import RoleLayout
from hybridflow.core.origin import construct_role
from hybridflow.plan.compiler import PlanNode
from hybridflow.core.kinds import Op
from hybridflow.runtime.common import NodeIO, finish_gather, metrics_of, run_fn_node
from hybridflow.runtime.worker_errors import (WorkerError, failure_cause, failure_detail,
                                              shipped)

__all__ = ["FusedWorker", "ShardTask", "ShippedNode", "DepInput", "Piece", "WorkerError",
           "encode_task",
           "payload_bytes", "estimated_bytes", "group_hashes", "default_context",
           "failure_detail", "failure_cause"]


class Piece(NamedTuple):  # tuples: several are made for every task
    arg: Any                          # index into the task's positional arguments
                                      # (in the scheduler's plans: a shard handle)
    rows: slice | None = None         # None: the whole shard


class DepInput(NamedTuple):
    """This rank's rows of one input node: pieces concatenated, then `index` taken."""
    pieces: tuple[Piece, ...]
    index: np.ndarray | None = None


class ShippedNode:
    """A PlanNode pickled once on the driver (its fn by value); workers receive the
    bytes once (`FusedWorker.learn_node`) and tasks name the node by `digest`."""

    def __init__(self, node: PlanNode):
        from ray import cloudpickle

        from hybridflow.core.user_code import register_with_ray
        register_with_ray()  # the user's graph file and its helpers travel by value
        self.name = node.name
        self.blob = cloudpickle.dumps(node)
        self.digest = hashlib.blake2b(self.blob, digest_size=16).digest()


@dataclass
class ShardTask:
    node: bytes                       # ShippedNode.digest: the worker learnt the node
    inputs: dict[str, DepInput] = field(default_factory=dict)
    group_keys: tuple[str, ...] = ()  # report per-row group hashes of these columns

    def __reduce__(self):
        """Plain tuples on the wire: a quarter of the dataclasses' pickle."""
        inputs = {dep: (tuple((p.arg, p.rows) for p in spec.pieces), spec.index)
                  for dep, spec in self.inputs.items()}
        return (_rebuild_task, (self.node, inputs, self.group_keys))


def _rebuild_task(node, inputs, group_keys) -> ShardTask:
    specs = {dep: DepInput(tuple(Piece(arg, rows) for arg, rows in pieces), index)
             for dep, (pieces, index) in inputs.items()}
    return ShardTask(node, specs, group_keys)


def encode_task(task: ShardTask) -> bytes:
    """A task as the Ray runtime sends it: pickled once with the C pickler (it holds
    only bytes, str, ints, slices and index arrays). Ray moves `bytes` as they are,
    where a Python object costs a cloudpickle pass per task on the driver and its
    unpickling on the worker, which decodes each distinct blob once (a step's tasks
    repeat from step to step)."""
    return pickle.dumps(task, protocol=5)


TASK_CACHE = 4096  # decoded task blobs a worker keeps (a pass sends a few per node)


_NO_COLUMNS = Batch()  # a dep that supplies no column to a node (read only)


def payload_bytes(batch: Batch | None) -> int:
    """Tensor bytes plus the pickled size of the non-tensor columns: what a batch
    costs to cross a process (the driver counts its own traffic with this)."""
    if batch is None:
        return 0
    obj = sum(len(pickle.dumps(v, protocol=5)) for v in batch.non_tensors.values())
    return batch.nbytes + obj


def estimated_bytes(batch: Batch | None) -> int:
    """`payload_bytes` without pickling: tensor bytes, numpy buffers as they are, and
    for object columns 8 bytes a row plus the length of str/bytes values (workers
    report this for every output; nothing is serialised twice to count it)."""
    if batch is None:
        return 0
    total = batch.nbytes
    for value in batch.non_tensors.values():
        if isinstance(value, np.ndarray) and value.dtype != object:
            total += value.nbytes
            continue
        for item in value:
            total += 8 + (len(item) if isinstance(item, (str, bytes)) else 8)
    return total


def group_hashes(column) -> np.ndarray:
    """A stable 64-bit hash per row of a group-id column (equal ids, equal hashes in
    every process; Python's hash() of str is salted per process)."""
    values = column.tolist() if hasattr(column, "tolist") else list(column)
    cache: dict[Any, int] = {}
    out = np.empty(len(values), dtype=np.uint64)
    for i, value in enumerate(values):
        if value not in cache:
            digest = hashlib.blake2b(str(value).encode(), digest_size=8).digest()
            cache[value] = int.from_bytes(digest, "little")
        out[i] = cache[value]
    return out


def sp_size(cfg, role: str) -> int:
    """`placement.parallel.<role>.sp` of the run's config (1 where unset); the compiler
    checked it (core/layout.py), and the rollout role never has one."""
    if isinstance(cfg, dict):  # a plain mapping (tests, the local runtime's dict form)
        parallel = (cfg.get("placement") or {}).get("parallel") or {}
        return int((parallel.get(role) or {}).get("sp", 1))
    layout = cfg.placement.parallel.get(role)  # the typed RunConfig: no mapping reads
    if layout is None:
        return 1
    return int(layout.get("sp", 1) if isinstance(layout, dict) else layout.sp)


def seed_process(seed: int) -> None:
    import random

    import numpy as np
    import torch
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_context(rank: int, world_size: int, local_rank: int, device: str, seed: int,
                    colocated: dict):
    from hybridflow.core.context import WorkerContext
    return WorkerContext(rank=rank, world_size=world_size, local_rank=local_rank,
                         device=device, seed=seed, colocated=colocated)


class FusedWorker:
    """Every role of one pool on one device. Wrapped by `ray.remote` in runtime/ray/pools.py."""

    def __init__(self, pool: str, rank: int, world_size: int, local_rank: int,
                 torch_threads: int | None = 1):
        if torch_threads is not None:  # None: in the driver's process, leave it be
            import torch
            torch.set_num_threads(max(1, int(torch_threads)))
        self.pool, self.rank, self.world_size, self.local_rank = pool, rank, world_size, local_rank
        self.roles: dict[str, Any] = {}
        self.nodes: dict[Any, bytes | PlanNode] = {}  # digest -> pickled, then unpickled
        self.prepared: dict[Any, tuple[PlanNode, NodeIO, Callable | None]] = {}
        self.tasks: dict[bytes, ShardTask] = {}  # encode_task blob -> the task
        self.pid = os.getpid()
        self.counts_bytes = True  # Ray's driver reads each output's size; in-process, no

    @classmethod
    def in_process(cls, pool: str, rank: int, world_size: int,
                   roles: dict[str, Any]) -> "FusedWorker":
        """A worker in this process over roles already built (the local runtime)."""
        worker = cls(pool, rank, world_size, rank, torch_threads=None)
        worker.roles = roles
        worker.counts_bytes = False
        return worker

    # ------------------------------------------------------------------ setup
    def address(self) -> dict:
        """Where this worker runs, and a free port on its node (for rank 0)."""
        import ray
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        ctx = ray.get_runtime_context()
        return {"ip": ray.util.get_node_ip_address(), "port": port, "pid": os.getpid(),
                "node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def pin(self, cores: tuple[int, ...], key: str, torch_threads: int | None) -> list[int]:
        """Run on `cores` only, before the roles are built (runtime/affinity.py)."""
        from hybridflow.runtime.affinity import pin_process
        try:
            return pin_process(cores, key, torch_threads)
        except ValueError as err:  # the driver's headline is the message, no traceback
            raise WorkerError(str(err), f"{type(err).__name__}: {err}") from None

    def start(self, env: dict[str, str], cfg, roles: list[str], bindings: dict[str, type],
              seed: int, make_context: Callable, tp: dict[str, int] | None = None) -> int:
        """Set the torch.distributed env and construct the roles in placement order;
        `tp`: role -> its tensor-parallel size, given to the role's context."""
        os.environ.update(env)
        import torch
        device = f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"
        with shipped():
            try:
                for role in roles:
                    ctx = make_context(self.rank, self.world_size, self.local_rank, device,
                                       seed, self.roles)
                    ctx.tp = (tp or {}).get(role, 1)
                    ctx.sp = sp_size(cfg, role)
                    self.roles[role] = construct_role(role, bindings[role], cfg, ctx)
            except Exception as err:  # noqa: BLE001 - its message first, then the traceback
                raise WorkerError(f"{err}\n{traceback.format_exc()}", cause_line(err)) \
                    from None
        # sampling follows trainer.seed, a stream per data-parallel rank: the ranks of a
        # tp group generate the same rows in lockstep and must draw the same tokens
        widest = max([1, *((tp or {}).get(r, 1) for r in roles)])
        seed_process(seed + RoleLayout(self.world_size, widest).dp_rank(self.rank))
        return os.getpid()

    def info(self) -> dict:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES")
        return {**self.address(), "rank": self.rank, "roles": sorted(self.roles),
                "env": {k: os.environ.get(k) for k in keys}}

    def learn_node(self, digest, blob: bytes | PlanNode) -> None:
        """Keep a node's pickled bytes (or, in-process, the node itself); the first
        task that names it unpickles them."""
        self.nodes.setdefault(digest, blob)

    # ------------------------------------------------------------------ tasks
    def run(self, task: ShardTask | bytes, *args):
        """Assemble this rank's input, run the node's method (or fn), finish it."""
        start = time.time()
        task = self._decode(task)
        with shipped():
            node, io, call = self._prepare(task.node)
            batch = self._assemble(io, task, args)
            out = run_fn_node(node, batch) if call is None else call(batch, **node.kwargs)
            out = io.finish(out)
        return out, self._meta(task, out, start)

    def gather(self, task: ShardTask | bytes, rounds: int, *shards):
        """A gather node: the rounds' shards concatenated, the first `until` rows kept."""
        start = time.time()
        task = self._decode(task)
        with shipped():
            out = finish_gather(self._node(task.node), list(shards), rounds)
        return out, self._meta(task, out, start)

    def stream_take(self, task: ShardTask | bytes, role: str, uids: list, leave: bool = False,
                    producer: str | None = None):
        """A streaming buffer node's shard (the task `StreamCall.TAKE` names:
        graph/streams.py): `producer`'s rows (None: the samples) of the whole groups
        `uids` that the role's stream holds here (workers/rollout/stream_store.py),
        with the buffer's columns; the rows go from here to the train side worker to
        worker."""
        start = time.time()
        task = self._decode(task)
        with shipped():
            node = self._node(task.node)
            rows = self._role(role).stream_take(uids, leave, producer)
            keys = node.output_keys
            out = rows.select(*[k for k in rows.keys() if k in keys])
            out.meta = {"metrics": {}, "_writers": {k: keys[k] for k in out.keys()}}
        return out, self._meta(task, out, start)

    def stream_keep(self, task: ShardTask | bytes, role: str, uids: list, dropped: list,
                    how: dict, *shards):
        """An entrance pass's verdict (the task `StreamCall.KEEP` names), sent to the
        worker holding the groups: a node's output shards (worker to worker) replace
        the kept groups' samples (a filter's) or are held beside them (`how`:
        producer, layout, drop_samples: StreamStore.keep)."""
        start = time.time()
        task = self._decode(task)
        with shipped():
            self._node(task.node)
            parts = [s for s in shards if s is not None and len(s)]
            kept = Batch.concat(parts) if len(parts) > 1 else (parts[0] if parts else None)
            held = self._role(role).stream_keep(kept, uids, dropped, **how)
        return held, {**self._meta(task, None, start), "held": held}

    def select(self, keys: tuple[str, ...], shard: Batch) -> Batch:
        return shard.select(*keys)

    def call(self, role: str, method: str, args: tuple, kwargs: dict):
        with shipped():
            return getattr(self._role(role), method)(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()

    # ---------------------------------------------------------------- helpers
    def _role(self, role: str):
        if role not in self.roles:
            raise KeyError(f"role '{role}' does not run on pool '{self.pool}' "
                           f"(it holds {sorted(self.roles)})")
        return self.roles[role]

    def _decode(self, task: ShardTask | bytes) -> ShardTask:
        """A task as sent (`encode_task`'s bytes on Ray, the ShardTask in-process)."""
        if type(task) is not bytes:
            return task
        known = self.tasks.get(task)
        if known is None:
            if len(self.tasks) >= TASK_CACHE:
                self.tasks.clear()
            known = self.tasks[task] = pickle.loads(task)
        return known

    def _node(self, digest: bytes) -> PlanNode:
        node = self.nodes.get(digest)
        if node is None:
            raise KeyError(f"pool '{self.pool}' rank {self.rank} was never sent node "
                           f"{digest.hex()} (the runtime sends each node before its "
                           f"first task)")
        if isinstance(node, bytes):
            node = self.nodes[digest] = pickle.loads(node)
        return node

    def _prepare(self, digest) -> tuple[PlanNode, NodeIO, Callable | None]:
        """The node, its NodeIO and its bound method (None: a function node), once."""
        known = self.prepared.get(digest)
        if known is None or known[0] is not self.nodes.get(digest):
            node = self._node(digest)
            call = None if node.op is Op.FN else getattr(self._role(node.role), node.method)
            known = self.prepared[digest] = (node, NodeIO(node), call)
        return known

    @staticmethod
    def _assemble(io: NodeIO, task: ShardTask, args) -> Batch:
        inputs = {}
        for dep, spec in task.inputs.items():
            pieces = spec.pieces
            if len(pieces) == 1 and pieces[0].rows is None:  # a whole shard, as it is
                batch = args[pieces[0].arg]
            else:
                parts = [args[p.arg] if p.rows is None else args[p.arg].take(p.rows)
                         for p in pieces]
                batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
            inputs[dep] = batch if spec.index is None else batch.take(np.array(spec.index))
        if len(inputs) < len(io.deps):
            inputs.update({dep: _NO_COLUMNS for dep in io.deps if dep not in inputs})
        return io.assemble(inputs)

    def _meta(self, task: ShardTask, out, start: float) -> dict:
        groups = {}
        for key in task.group_keys:
            if out is not None and key in out:
                groups[key] = group_hashes(out[key])
        batch = isinstance(out, Batch)
        return {"rows": len(out) if batch else 0,
                "keys": out.keys() if batch else [],
                "nbytes": estimated_bytes(out) if batch and self.counts_bytes else 0,
                "metrics": dict(out.meta.get("metrics", {})) if batch else metrics_of(out),
                "groups": groups, "versions": _versions(out),
                "start": start, "end": time.time(), "pid": self.pid, "rank": self.rank}


def _versions(out) -> dict:
    """{policy_version: rows} of an output that carries the column (a generation's):
    what the run-long scheduler admits rows by and reports staleness from, a few
    integers per task."""
    if not isinstance(out, Batch) or "policy_version" not in out:
        return {}
    values, counts = np.unique(np.asarray(out["policy_version"]), return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}
