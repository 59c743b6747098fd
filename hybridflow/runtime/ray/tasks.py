"""The worker tasks of one Ray step in flight: their records, per-actor queues, the
hang clock, and collecting their metas (the Ray executor's tracker; the local one
is `local.Ran`).

State (one `InFlight` per `scheduler.StepScheduler`, changed only by its own methods):
- `running`: meta ref -> TaskRecord for every task not yet reported.
- `records`: node -> its tasks' records, in submission order.
- `meta_of`: shard ref -> the meta ref of the task that makes it.
- `queues`: (pool, rank) -> the records submitted to that actor, in order; Ray runs
  them in that order, so the head's clock (from when its actor went idle and its
  inputs were done) is what `call_timeout_s` bounds.
- `done_at`, `idle_since`: when each meta arrived, when each actor went idle.
- `busy_s`: the driver's seconds collecting metas (the scheduler adds it to its own
  busy time, `runtime/driver_busy_s`).
"""
from __future__ import annotations

import collections
import pickle
import time
from typing import Any

import ray

from hybridflow.core.batch import Batch
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.runtime.common import NodeFailure
from hybridflow.runtime.executor import TaskRecord
from hybridflow.runtime.worker_shell import failure_cause, failure_detail, payload_bytes

__all__ = ["TaskRecord", "InFlight", "resolve", "POLL_S"]

POLL_S = 1.0  # longest wait for metas before looking at the ones that arrived


def resolve(refs: list, timeout: float) -> tuple[list, int]:
    """The values of `refs` (ObjectRefs fetched in one `ray.get`, by-value Batches as
    they are) and the bytes that crossed to the driver to get them."""
    wanted = [r for r in refs if isinstance(r, ray.ObjectRef)]
    got = iter(ray.get(wanted, timeout=timeout) if wanted else [])
    values = [next(got) if isinstance(r, ray.ObjectRef) else r for r in refs]
    fetched = sum(payload_bytes(v) if isinstance(v, Batch) else
                  len(pickle.dumps(v, protocol=5)) for v, r in zip(values, refs)
                  if isinstance(r, ray.ObjectRef))  # a shard, or a small reply
    return values, fetched


class InFlight:
    def __init__(self, runtime, plan: ExecutionPlan):
        self.rt, self.plan = runtime, plan
        self.timeout = runtime.settings.call_timeout_s
        self.order = {n.name: i for i, n in enumerate(plan.nodes)}
        self.running: dict[Any, TaskRecord] = {}
        self.records: dict[str, list[TaskRecord]] = collections.defaultdict(list)
        self.meta_of: dict[Any, Any] = {}
        self.done_at: dict[Any, float] = {}
        self.queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self.idle_since: dict[tuple, float] = {}
        self.busy_s = 0.0

    def add(self, node: str, pool: str, rank: int, meta, slot, refs: list) -> None:
        """A submitted task; `refs` its ObjectRef arguments (for its hang clock)."""
        after = [self.meta_of.get(r, r) for r in refs
                 if r in self.meta_of or r in self.running or r in self.done_at]
        record = TaskRecord(node, pool, rank, slot, after, time.time(), ref=meta)
        self.running[meta] = record
        self.records[node].append(record)
        self.queues[(pool, rank)].append(record)

    def mark_done(self, ref, record: TaskRecord) -> None:
        now = time.time()
        record.done = now
        self.done_at[ref] = now
        self.idle_since[(record.pool, record.rank)] = now

    def wait(self, first: bool) -> tuple[list, list]:
        """Wait for the first meta (`first`: a node waits on its inputs being done) or
        for all, at most `POLL_S`; returns (arrived (ref, record) pairs, failures).
        Raises NodeFailure when a task that could run has not reported within
        `call_timeout_s`."""
        deadline, head = self._next_deadline()
        pending = list(self.running)
        wanted = 1 if first else len(pending)
        timeout = max(0.0, min(deadline, time.time() + POLL_S) - time.time())
        ready, rest = ray.wait(pending, num_returns=wanted, timeout=timeout)
        if not ready:
            if time.time() < deadline:
                return [], []
            self._timed_out(head)
        t0 = time.perf_counter()
        if rest and wanted < len(pending):  # take every meta that is in already
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        arrived, failures = [], []
        for ref, meta, err in self._get_metas(ready):
            record = self.running.pop(ref)
            if err is not None:
                failures.append((self.order[record.node], record.rank, record, err))
            else:
                record.meta = meta
                arrived.append((ref, record))
        self.busy_s += time.perf_counter() - t0
        return arrived, failures

    def raise_first(self, failures: list) -> None:
        _, rank, record, err = min(failures, key=lambda f: (f[0], f[1]))
        detail, cause = failure_detail(err), failure_cause(err)
        if isinstance(err, (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)):
            # every task queued on a dead actor fails at once, in any order: name the
            # one it was running (an actor runs its tasks in submission order)
            record = next((r for r in self.queues[(record.pool, record.rank)]
                           if r.done is None), record)
            self.rt.broken = f"the worker of pool '{record.pool}' rank {rank} died"
            cause = (f"the worker process of pool '{record.pool}' rank {rank} died; the "
                     f"runtime must be restarted ({cause})")
            detail = f"{cause}\n{detail}"
        raise NodeFailure(self.plan.node(record.node), rank, detail, record.pool,
                          cause) from None

    def _timed_out(self, head: TaskRecord | None) -> None:
        if head is None:  # no task could start: name the first one still running
            head = min(self.running.values(), key=lambda r: (self.order[r.node], r.rank))
        self.rt.broken = f"node '{head.node}' timed out on rank {head.rank}"
        detail = (f"no result from rank {head.rank} of pool '{head.pool}' within "
                  f"runtime.call_timeout_s={self.timeout:g}s: the worker hangs or its "
                  f"process died")
        raise NodeFailure(self.plan.node(head.node), head.rank, detail, head.pool)

    def _get_metas(self, ready: list) -> list:
        """(ref, meta, error) for every ready meta ref: one `ray.get` unless one failed."""
        try:
            return [(ref, meta, None)
                    for ref, meta in zip(ready, ray.get(ready, timeout=self.timeout))]
        except ray.exceptions.RayError:
            pass
        out = []
        for ref in ready:
            try:
                out.append((ref, ray.get(ref, timeout=self.timeout), None))
            except ray.exceptions.RayError as err:
                out.append((ref, None, err))
        return out

    def _next_deadline(self) -> tuple[float, TaskRecord | None]:
        """Earliest deadline among the tasks at the head of their actor's queue whose
        inputs are done (the only ones that can be running)."""
        best, head = time.time() + self.timeout, None
        for key, queue in self.queues.items():
            while queue and queue[0].done is not None:
                queue.popleft()
            if not queue:
                continue
            task = queue[0]
            if any(ref not in self.done_at for ref in task.after):
                continue
            start = max([task.submitted, self.idle_since.get(key, 0.0),
                         *(self.done_at[r] for r in task.after)])
            if start + self.timeout < best:
                best, head = start + self.timeout, task
        return best, head
