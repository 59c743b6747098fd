"""Moving a policy's weights from the actor to a rollout engine, bucket by bucket
(`hybridflow/workers/parallel/gather.py` gathers them): never one whole-model buffer.

Colocated (`refresh_engine`): each bucket is gathered, loaded into the engine in this
process and dropped before the next; then `finish_weight_update(version)` stamps the
version and resets the engine's prefix cache.

On its own pool (the weight-sync edge of a plan, `actor.export_weights` ->
`rollout.load_weights`): the export is a one-row Batch of two columns, moving like
any node output (on Ray: from the actor's rank 0 to every rollout rank as an object
reference, never through the driver):
- `weight_index`: a `WeightIndex` (names, dtypes, shapes, buckets, bytes, version);
- `weights`: where the buckets are, one of
  - `StoredBuckets` (in a Ray worker): every rank of the actor gathers (a collective
    under FSDP2/TP), rank 0 `ray.put`s each bucket as it is gathered and drops its
    own copy, and the receivers `ray.get`, load and drop one bucket at a time. The
    trade-off: the object store holds all of the buckets until the export is
    released (after the sync), so the model's bytes sit once in the node's shared
    memory (not in any worker's private memory); a process group between the
    trainer's rank 0 and the rollout ranks would not need that room, but needs both
    sides in one collective call, which two plan stages are not;
  - `LiveBuckets` (one process, the local runtime): the actor's module itself,
    gathered bucket by bucket when the receiver iterates; refused if the actor has
    trained since the export (its version moved), so a receiver never loads
    weights newer than the version it stamps.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.parallel.gather import gathered_buckets, plain_weight_name, weight_plan

__all__ = ["WEIGHT_KEYS", "WeightIndex", "plain_weight_name", "policy_weights",
           "export_policy", "RayStore", "StoredBuckets", "LiveBuckets", "refresh_engine",
           "load_export", "in_ray_worker"]

WEIGHT_KEYS = ("weights", "weight_index")
Bucket = list[tuple[str, torch.Tensor]]


@dataclass
class WeightIndex:
    version: int
    names: list[str] = field(default_factory=list)
    dtypes: list[torch.dtype] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    buckets: list[tuple[int, int]] = field(default_factory=list)  # [first, end) tensors
    nbytes: int = 0


def policy_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy `module` computes as one dict of plain names -> tensors, every name
    (tied ones twice), LoRA merged: a whole copy, for building a fresh engine's
    initial weights; syncs go through `gathered_buckets` instead. Collective when
    the module is sharded."""
    plan = weight_plan(module, 1 << 62)
    out = {name: t for bucket in gathered_buckets(module, plan) for name, t in bucket}
    state = module.state_dict(keep_vars=True)
    by_id = {id(state[e.key]): e.name for e in plan.entries}
    for key, tensor in state.items():  # the tied names the plan sends once
        name = plain_weight_name(key)
        if name is not None and name not in out and id(tensor) in by_id:
            out[name] = out[by_id[id(tensor)]]
    return out


def _index(plan, version: int) -> WeightIndex:
    return WeightIndex(version, [e.name for e in plan.entries], [e.dtype for e in plan.entries],
                       [e.shape for e in plan.entries], list(plan.buckets), plan.nbytes)


def in_ray_worker() -> bool:
    """Whether this process is a Ray actor (its exports go to the object store)."""
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


# ----------------------------------------------------------------- sources
class RayStore:
    """The Ray object store: `put` in the sender, `get` in any receiver."""

    def put(self, value):
        import ray
        return ray.put(value)

    def get(self, ref):
        import ray
        return ray.get(ref)


class StoredBuckets:
    """Buckets in a store (the Ray object store), one reference each (see the module
    docstring); each holds [(name, uint8 numpy bytes, dtype, shape)]."""

    def __init__(self, refs: list, store):
        self.refs, self.store = refs, store

    def __iter__(self) -> Iterator[Bucket]:
        for ref in self.refs:
            stored = self.store.get(ref)
            with warnings.catch_warnings():  # read-only store memory: engines copy out
                warnings.simplefilter("ignore", UserWarning)
                yield [(name, torch.from_numpy(raw).view(dtype).view(shape))
                       for name, raw, dtype, shape in stored]
            del stored


class LiveBuckets:
    """The actor's module in this process, gathered when iterated (see the docstring)."""

    def __init__(self, module: torch.nn.Module, plan, version: int,
                 current_version: Callable[[], int]):
        self.module, self.plan, self.version = module, plan, version
        self.current_version = current_version

    def __iter__(self) -> Iterator[Bucket]:
        now = self.current_version()
        if now != self.version:
            raise RuntimeError(f"the weight export of policy version {self.version} is "
                               f"stale: the actor has trained to version {now} since; load "
                               f"an export right after actor.export_weights")
        return gathered_buckets(self.module, self.plan)


class NoBuckets:
    """What a rank other than 0 returns from an export: its gather fed rank 0's."""

    def __init__(self, rank: int):
        self.rank = rank

    def __iter__(self):
        raise RuntimeError(f"rank {self.rank}'s weight export holds no buckets: only rank "
                           f"0's export is collected (dispatch broadcast)")


def _stored(bucket: Bucket) -> list:
    return [(name, t.contiguous().reshape(-1).view(torch.uint8).numpy(), t.dtype,
             tuple(t.shape)) for name, t in bucket]


def export_policy(module: torch.nn.Module, version: int, bucket_bytes: int, *, rank: int = 0,
                  world_size: int = 1, current_version: Callable[[], int] | None = None,
                  store=None) -> Batch:
    """The export Batch of `module` at `version` (see the module docstring). Every
    rank of a sharded module calls it (the gather is collective); rank 0's is the one
    to send. `store` (put/get): where the buckets go, by default the Ray object store
    in a Ray worker, else none (the receiver gathers from the live module)."""
    plan = weight_plan(module, bucket_bytes)
    index = _index(plan, version)
    store = store if store is not None else RayStore() if in_ray_worker() else None
    if store is not None:
        refs = []
        for bucket in gathered_buckets(module, plan, keep=rank == 0, device="cpu"):
            if rank == 0:
                refs.append(store.put(_stored(bucket)))
            del bucket  # the store holds it now
        source = StoredBuckets(refs, store) if rank == 0 else NoBuckets(rank)
    else:
        if world_size > 1:
            raise RuntimeError("a weight export outside Ray gathers when the receiver "
                               "iterates, which a sharded actor on several ranks cannot do "
                               "(its gather is collective): run it on the ray runtime")
        source = LiveBuckets(module, plan, version,
                             current_version or (lambda: version))
    return Batch({}, {"weights": [source], "weight_index": [index]})


# ----------------------------------------------------------------- loading
def _load(engine, buckets, version: int) -> None:
    engine.wake_up()
    for bucket in buckets:
        engine.load_weights(bucket)
        del bucket  # before the next bucket is gathered or fetched
    engine.finish_weight_update(version)


def refresh_engine(engine, module: torch.nn.Module, version: int, bucket_bytes: int) -> float:
    """Make a colocated engine hold `module`'s weights at `version`, in this process,
    bucket by bucket; returns the seconds spent (0 for an engine that generates with
    `module` itself)."""
    if engine.shares_module:
        engine.policy_version = version
        return 0.0
    start = time.perf_counter()
    engine.wake_up()
    if engine.policy_version != version:
        _load(engine, gathered_buckets(module, weight_plan(module, bucket_bytes)), version)
    return time.perf_counter() - start


def load_export(engine, export: Batch) -> tuple[WeightIndex, float]:
    """Load a received export into `engine`, bucket by bucket; returns its index and
    the seconds the load took (the real load, synchronised by the engine)."""
    if len(export) != 1 or any(k not in export for k in WEIGHT_KEYS):
        raise ValueError("load_weights needs the one-row output of actor.export_weights "
                         f"(columns {list(WEIGHT_KEYS)}), got {len(export)} row(s) with "
                         f"columns {export.keys()}")
    start = time.perf_counter()
    index: WeightIndex = export["weight_index"][0]
    _load(engine, export["weights"][0], index.version)
    return index, time.perf_counter() - start
