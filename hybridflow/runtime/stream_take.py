"""A streaming buffer node's tasks, for the step scheduler (`scheduler.StepScheduler`):
its feed is a `StreamTake` (which whole groups each rollout worker holds,
runtime/run_long/stream_client.py), and each slot becomes a task of the buffer node on
the worker holding those groups (`FusedWorker.stream_take`), so the rows go from the
rollout worker to the train side worker to worker; only the uids cross the driver.
It changes only the scheduler state it is handed (outputs, result)."""
from __future__ import annotations

from hybridflow.plan.compiler import PlanNode
from hybridflow.runtime.executor import TaskArgs
from hybridflow.runtime.outputs import NodeOutput, StreamTake
from hybridflow.runtime.worker_shell import ShardTask

__all__ = ["submit_stream_take"]


def submit_stream_take(sched, node: PlanNode, feed: StreamTake) -> bool:
    """One task per rollout worker holding taken groups (one output slot each)."""
    refs, homes = [], []
    for slot, (rank, uids) in enumerate(feed.shards):
        args = TaskArgs(sched.ex)
        task = ShardTask(sched.ex.node_id(sched.plan, node, feed.pool, rank), {},
                         group_keys=sched.group_keys.get(node.name, ()))
        extra = (feed.role, list(uids), feed.leave, feed.producer)
        sched.result.driver_bytes += sched.ex.value_bytes(list(uids))
        refs.append(sched._submit(node, "stream_take", feed.pool, rank, task, args, slot,
                                  extra=extra))
        homes.append((feed.pool, rank))
    sched.outputs[node.name] = NodeOutput(node.name, refs, homes, node.name)
    return True
