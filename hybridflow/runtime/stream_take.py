"""A streaming buffer node's tasks, for the step scheduler (`scheduler.StepScheduler`):
its feed is a `StreamTake` (which whole groups each rollout worker holds,
runtime/run_long/stream_client.py), and each slot becomes a task of the buffer node on
the worker holding those groups (the stream's `StreamCall.TAKE`: `FusedWorker`'s task
of that name calls the role's), so the rows go from the rollout worker to the train
side worker to worker; only the uids cross the driver. It uses the scheduler's public
surface only (`submit_task`, `set_output`) and adds to its `result`."""
from __future__ import annotations

from hybridflow.graph.streams import StreamCall
from hybridflow.plan.compiler import PlanNode
from hybridflow.runtime.executor import TaskArgs
from hybridflow.runtime.outputs import StreamTake

__all__ = ["submit_stream_take"]


def submit_stream_take(sched, node: PlanNode, feed: StreamTake) -> bool:
    """One task per rollout worker holding taken groups (one output slot each)."""
    refs, homes = [], []
    for slot, (rank, uids) in enumerate(feed.shards):
        extra = (feed.role, list(uids), feed.leave, feed.producer)
        sched.result.driver_bytes += sched.ex.value_bytes(list(uids))
        refs.append(sched.submit_task(node, StreamCall.TAKE, feed.pool, rank,
                                      TaskArgs(sched.ex), slot, extra=extra))
        homes.append((feed.pool, rank))
    sched.set_output(node, refs, homes)
    return True
