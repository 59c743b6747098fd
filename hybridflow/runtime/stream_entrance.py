"""The entrance filter of a streaming buffer (plan/stream_filter.py: DAPO's dynamic
sampling, streaming): each batch of whole groups, as they complete, runs through the
nodes between the generate node and the gather (the rule reward, the penalty, the
filter) in one *entrance pass* on the stream side. A group the filter keeps enters
the buffer with the columns the filter's output carries; a group it drops is
rejected (the streaming scheduler counts it and consumes its prompt).

State: the entrance plan (fixed), the scheduler's stream client (`client`: where the
groups wait; the kept groups' rows are replaced there by the filter's, worker to
worker), and what the passes since the last `drain()` reported: each entrance
node's metrics per pass, timings, the timeline and the driver bytes. Only its
methods change it; the streaming scheduler owns one.
"""
from __future__ import annotations

from hybridflow.core.kinds import Op
from hybridflow.core.metric_names import timing_key
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.plan.stream_filter import entrance_plan
from hybridflow.runtime.common import sum_round_metrics
from hybridflow.runtime.stream_buffer import GroupStats

__all__ = ["StreamEntrance"]


class StreamEntrance:
    def __init__(self, runtime, plan: ExecutionPlan, gen: PlanNode, gather: PlanNode,
                 staleness: int, unit: str = "uid"):
        self.runtime, self.unit = runtime, unit
        self.plan = entrance_plan(plan, gen, gather, staleness)
        if self.plan is None:
            raise ValueError(f"{gather.where()}: it reads '{gen.name}' directly, so "
                             f"there is nothing to screen at the buffer's entrance")
        self.feed = next(n.name for n in self.plan.nodes if n.op is Op.BUFFER)
        self.skip = frozenset(n.name for n in self.plan.nodes
                              if n.op is Op.SOURCE or n.name == gen.name)
        self.out = self.plan.node(gather.deps[0])
        self.keys = tuple(self.out.output_keys)
        self.names = [n.name for n in self.plan.nodes if n.name not in self.skip
                      and n.name != self.feed]
        self.client = None  # the scheduler's StreamClient: where the groups wait
        self._reset()

    def _reset(self) -> None:
        self.node_metrics: dict[str, list[dict]] = {n: [] for n in self.names}
        self.timing: dict[str, float] = {}
        self.timeline: list[dict] = []
        self.driver_bytes = 0

    def screen(self, groups: list[tuple[str, GroupStats]]) -> tuple[list, list[str]]:
        """(the groups the filter kept, in the order given; the uids it dropped). A
        filter keeps or drops a group whole. The groups' rows are read where they wait
        (the rollout workers) and the kept ones are replaced there by the filter's
        rows: only the kept rows' group ids reach the driver."""
        uids = [uid for uid, _ in groups]
        feed = self.client.take(uids, leave=True)
        result = self.runtime.run_step({self.feed: feed}, plan=self.plan, skip=self.skip)
        ids = self.runtime.fetch(result, self.out.name, (self.unit,))
        self._record(result)
        count: dict[str, int] = {}
        for uid in ids[self.unit]:
            count[str(uid)] = count.get(str(uid), 0) + 1
        passed, dropped = [], []
        for uid, stats in groups:
            if uid not in count:
                dropped.append(uid)
                continue
            if count[uid] != stats.rows:
                raise RuntimeError(
                    f"{self.out.where()}: streaming screens whole groups at the buffer's "
                    f"entrance, but this node kept {count[uid]} of the {stats.rows} "
                    f"samples of {self.unit} {uid!r}; keep or drop a group whole (as "
                    f"drop_uniform_groups does) or set trainer.async_mode=pipeline")
            passed.append((uid, stats))
        shards = _handle(result, self.out.name).refs
        self.client.keep(self.plan, self.plan.node(self.feed), shards,
                         [uid for uid, _ in passed], dropped)
        return passed, dropped

    def _record(self, result) -> None:
        for name in self.names:
            if name in result.node_metrics:
                self.node_metrics[name].append(result.node_metrics[name])
            key = timing_key(name)
            if key in result.metrics:
                self.timing[key] = self.timing.get(key, 0.0) + result.metrics[key]
        # the feed's driver span is no node of the run's plan (render reads plan.json)
        self.timeline += [e for e in result.timeline if e["node"] != self.feed]
        self.driver_bytes += result.driver_bytes

    def drain(self) -> tuple[dict, dict, list, int]:
        """(per entrance node its metrics over the passes since the last drain, the
        step's metrics of them, their timeline, driver bytes); then forgets them."""
        node_metrics = {n: sum_round_metrics(m) for n, m in self.node_metrics.items() if m}
        metrics = {k: v for m in node_metrics.values() for k, v in m.items()}
        out = node_metrics, {**metrics, **self.timing}, self.timeline, self.driver_bytes
        self._reset()
        return out


def _handle(result, name: str):
    """A node's `NodeOutput` in a step's result (the local runtime wraps outputs)."""
    outputs = result.outputs
    return outputs.handle(name) if hasattr(outputs, "handle") else outputs[name]
