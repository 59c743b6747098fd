"""The async schedule of a run with `trainer.staleness = k >= 1` (see async_split.py).

Step t trains on the batch generated k steps earlier: the rollout side of step t + k
runs in the same scheduler call as the train side of step t (on Ray, at the same
time on different pools). Batch t is generated with the weights after update
max(0, t - k - 1), so each row's `policy_version` is that many updates; the first k
batches are generated before step 1 (warm-up), with the initial weights.

State: `ready`, a queue of generated batches not yet trained (at most k between
steps): each keeps its rollout-side outputs on the workers (`NodeOutput`s), its
rollout-side metrics, and the loader's state from before its prompts were drawn.
Checkpoints do not save the queue: they save the loader state of its oldest batch,
so a resumed run re-draws exactly those prompts (re-generating them with the
restored weights) and no prompt is lost or trained twice.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hybridflow.plan.async_split import READY, iteration_plans
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.core.metric_names import (RUNTIME_PREFIX, SAMPLED_VERSION, TIMING_PREFIX,
                                          TRAINED_VERSION_SUFFIX)
from hybridflow.runtime.common import StepResult

__all__ = ["AsyncSchedule", "ReadyBatch", "busy_fractions"]


@dataclass
class ReadyBatch:
    """A batch generated ahead: the rollout side's outputs and metrics."""
    step: int                      # the step that will train on it
    outputs: dict                  # rollout node -> NodeOutput (shards on the workers)
    node_metrics: dict             # rollout node -> its metrics
    rows: dict                     # rollout node -> rows
    loader_state: dict             # the loader before this batch's prompts were drawn


def _handle(result: StepResult, name: str):
    outputs = result.outputs
    return outputs.handle(name) if hasattr(outputs, "handle") else outputs[name]


class AsyncSchedule:
    def __init__(self, plan: ExecutionPlan, loader, runtime=None):
        self.plan, self.runtime, self.loader = plan, runtime, loader
        self.k = plan.sides.staleness
        self.plans = iteration_plans(plan)
        self.rollout_nodes = set(plan.sides.rollout)
        self.sources = [n.name for n in self.plans.rollout.nodes if n.op is Op.SOURCE]
        self.ready: deque[ReadyBatch] = deque()
        self.last_result: StepResult | None = None  # the last scheduler call's

    @property
    def extra_plans(self) -> list[ExecutionPlan]:
        return [self.plans.rollout, self.plans.both, self.plans.train]

    def loader_state(self) -> dict:
        """What a checkpoint saves: the loader as it was before the oldest batch not
        yet trained, so a resume re-draws the queued prompts."""
        return self.ready[0].loader_state if self.ready else self.loader.state_dict()

    def reset(self) -> None:
        """Forget the queue (after the loader was restored from a checkpoint)."""
        self.ready.clear()

    # ------------------------------------------------------------------ steps
    def _feeds(self) -> tuple[dict, dict]:
        state = self.loader.state_dict()
        return {s: self.loader.next_batch() for s in self.sources}, state

    def _draw(self, source: str):
        return self.loader.next_batch()

    def _keep(self, step: int, result: StepResult, state: dict) -> None:
        names = [n for n in self.plan.sides.rollout if n in result.node_metrics
                 or n in self.plan.sides.handoff]
        self.ready.append(ReadyBatch(
            step, {n: _handle(result, n) for n in self.plan.sides.handoff},
            {n: result.node_metrics.get(n, {}) for n in names},
            {n: result.rows.get(n, 0) for n in names}, state))

    def warm_up(self, step: int, last_step: int) -> list[StepResult]:
        """Generate batches up to step + k - 1 that are not generated yet."""
        runs = []
        while len(self.ready) < self.k and step + len(self.ready) <= last_step:
            feeds, state = self._feeds()
            result = self.runtime.run_step(feeds, plan=self.plans.rollout, draw=self._draw)
            self._keep(step + len(self.ready), result, state)
            runs.append(result)
        return runs

    def run(self, step: int, last_step: int) -> tuple[StepResult, ReadyBatch]:
        """Train step `step` on its queued batch while generating step + k's."""
        warm = self.warm_up(step, last_step)
        batch = self.ready.popleft()
        assert batch.step == step, f"queued batch of step {batch.step} at step {step}"
        feeds = {READY + n: out for n, out in batch.outputs.items()}
        ahead = step + self.k <= last_step
        plan, state = (self.plans.both, None) if ahead else (self.plans.train, None)
        if ahead:
            fresh, state = self._feeds()
            feeds.update(fresh)
        result = self.runtime.run_step(feeds, plan=plan, draw=self._draw)
        if ahead:
            self._keep(step + self.k, result, state)
        self.last_result = result
        return self._combined(result, batch, warm), batch

    def _combined(self, result: StepResult, batch: ReadyBatch, warm: list) -> StepResult:
        """The step's result as a synchronous step would report it: the rollout side's
        metrics of the batch trained (from when it was generated), the train side's of
        this call; timings and the timeline of this call (and of any warm-up)."""
        node_metrics = {}
        for node in self.plan.nodes:
            source = batch.node_metrics if node.name in self.rollout_nodes \
                else result.node_metrics
            if node.name in source:
                node_metrics[node.name] = source[node.name]
        merged = {}
        for metrics in node_metrics.values():
            merged.update(metrics)
        extra = {k: v for k, v in result.metrics.items()
                 if k.startswith((TIMING_PREFIX, RUNTIME_PREFIX))}
        for run in warm:
            for key, value in run.metrics.items():
                if key.startswith(TIMING_PREFIX):
                    extra[f"{key}"] = extra.get(key, 0.0) + value
        merged.update(extra)
        merged.update(self._staleness(batch, node_metrics))
        timeline = [e for run in warm for e in run.timeline] + result.timeline
        return StepResult(outputs=result.outputs, metrics=merged, node_metrics=node_metrics,
                          rows={**result.rows, **batch.rows}, timeline=timeline,
                          driver_bytes=result.driver_bytes + sum(r.driver_bytes for r in warm))

    def _staleness(self, batch: ReadyBatch, node_metrics: dict) -> dict:
        """Updates between the weights that generated the batch and those trained:
        the trained role reports its version (`<role>/trained_version`), the
        generate node the version it sampled with (`rollout/sampled_version`)."""
        generated = [m[SAMPLED_VERSION] for n, m in batch.node_metrics.items()
                     if self.plan.node(n).kind is NodeKind.GENERATE and SAMPLED_VERSION in m]
        trained = [v for n, m in node_metrics.items() if self.plan.node(n).kind.trains
                   for k, v in m.items() if k.endswith(TRAINED_VERSION_SUFFIX)]
        out = {"async/ahead": float(len(self.ready))}
        if generated and trained:
            gaps = [max(trained) - g for g in generated if g >= 0]
            if gaps:
                out["async/staleness/mean"] = float(sum(gaps) / len(gaps))
                out["async/staleness/max"] = float(max(gaps))
        return out


def busy_fractions(timeline: list[dict], ranks_of) -> dict:
    """`perf/busy/<pool>`: the share of the step's span each pool's ranks spent in a
    task (intervals of one rank merged), averaged over the pool's ranks."""
    spans = [e for e in timeline if e.get("pool")]
    if not spans:
        return {}
    start = min(e["start"] for e in timeline)
    wall = max(e["end"] for e in timeline) - start
    if wall <= 0:
        return {}
    by_rank: dict = {}
    for e in spans:
        by_rank.setdefault((e["pool"], e["rank"]), []).append((e["start"], e["end"]))
    busy: dict = {}
    for (pool, _), intervals in by_rank.items():
        busy.setdefault(pool, 0.0)
        busy[pool] += _union_length(intervals)
    return {f"perf/busy/{pool}": total / (wall * max(1, ranks_of(pool)))
            for pool, total in busy.items()}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
