"""The run-long scheduler: what outlives a step (buffers, the batches drawn) and what a
step is ("submit what is ready", pass after pass, until the step has trained).

A plan with BUFFER nodes (async_split.py, `trainer.staleness = k >= 1`) has a rollout
side (upstream of the buffers) and a train side (what reads them). One *pass* is one
`runtime.run_step` over the whole plan (scheduler.py), with the sides that are not
ready skipped:

- the rollout side is ready while the buffers have room: fewer than k batches held
  once the one being trained leaves, and batches left to draw (`trainer.steps`);
- the train side is ready when the buffers hold an admissible batch: the oldest
  (batches are trained in the order they were drawn), whose rows all have a
  `policy_version` >= the trained version - k (the buffer's admission rule), once
  the buffers are full (k held) or nothing is left to draw. Filling first is what
  makes it a pipeline k deep: releasing a batch as soon as one is held would train
  on fresher samples but never let the rollout run more than one batch ahead.

A step runs passes until one trained: the first step of a run generates k batches
first (each pass generates one), then every pass trains batch t while generating
t + k, and the last k steps only train. Within a pass the weights a generation
samples with change only after it (`PlanNode.after`), so batch t is sampled with the
weights after update max(0, t - k - 1) on both runtimes. A plan without buffers
(synchronous, capacity 0) runs one pass per step, every node in it: the step the
loop always ran, bit for bit.

State (only this class's methods change it; workers never see it):
- `held`: the buffers' contents, oldest first: per batch, each buffer's output left on
  the workers (`NodeOutput`: shards stay where they were made), the rows' versions
  (`{policy_version: rows}`, from the task metas), the rollout side's metrics and rows
  from when it ran, and the loader's state from before its prompts were drawn.
- `drawn`: the last step whose batch was drawn.
The loader (`PromptLoader`) is the loop's; only this scheduler draws from it.

Checkpoints ask `state_dict()`: the loader as it was before the oldest held batch, so
a resume re-draws exactly the prompts held (and in flight) at the save, and
`load_state_dict` empties the buffers: no prompt is lost or trained twice.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hybridflow.core.kinds import Op
from hybridflow.core.metric_names import RUNTIME_PREFIX, TIMING_PREFIX, TRAINED_VERSION_SUFFIX
from hybridflow.plan.async_split import buffer_nodes, sides_of, staleness_of
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.plan.streaming_split import is_streaming
from hybridflow.runtime.common import StepResult
from hybridflow.runtime.streaming import StreamingScheduler

__all__ = ["RunScheduler", "HeldBatch", "StaleBatchError", "make_run_scheduler"]


def make_run_scheduler(runtime, plan: ExecutionPlan, loader):
    """The run-long scheduler a plan needs: the streaming one for a streaming buffer
    (streaming.py), else this module's (synchronous or pipelined)."""
    if is_streaming(plan):
        return StreamingScheduler(runtime, plan, loader)
    return RunScheduler(runtime, plan, loader)


class StaleBatchError(RuntimeError):
    """A held batch that its buffer's admission rule refuses."""


@dataclass
class HeldBatch:
    """One batch in the buffers."""
    step: int                      # the step that trains it
    outputs: dict                  # buffer node -> its producer's NodeOutput
    versions: dict                 # policy_version -> rows, of its samples
    node_metrics: dict             # rollout node -> its metrics when it ran
    rows: dict                     # rollout node -> rows
    loader_state: dict             # the loader before its prompts were drawn


def _handle(result: StepResult, name: str):
    outputs = result.outputs
    return outputs.handle(name) if hasattr(outputs, "handle") else outputs[name]


class RunScheduler:
    def __init__(self, runtime, plan: ExecutionPlan, loader):
        self.runtime, self.plan, self.loader = runtime, plan, loader
        self.k = staleness_of(plan)
        self.buffers = buffer_nodes(plan)
        sides = sides_of(plan)
        self.train_side = frozenset(sides.train) | {b.name for b in self.buffers} \
            if sides else frozenset()
        self.rollout_side = frozenset(n.name for n in plan.nodes) - self.train_side
        self.sources = [n.name for n in plan.nodes if n.op is Op.SOURCE]
        self.held: deque[HeldBatch] = deque()
        self.drawn = 0

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """What a checkpoint saves of the schedule: the loader before the oldest batch
        not yet trained (the buffers themselves are not saved: re-drawn on resume)."""
        return {"loader": self.held[0].loader_state if self.held
                else self.loader.state_dict()}

    def load_state_dict(self, state: dict, step: int) -> None:
        """Resume after `step`: the loader restored, the buffers empty."""
        self.loader.load_state_dict(state["loader"])
        self.held.clear()
        self.drawn = step

    # ------------------------------------------------------------------ steps
    def step(self, step: int, last_step: int) -> StepResult:
        """Passes until step `step` has trained; its result as one step's."""
        passes = []
        while True:
            full = len(self.held) >= self.k or self.drawn >= last_step
            batch = self._admissible(step) if full else None
            room = len(self.held) < self.k or not self.buffers  # the trained one left
            generate = room and self.drawn < last_step
            if batch is None and not generate:
                raise RuntimeError(f"step {step}: nothing to train and nothing left to "
                                   f"generate (held batches: {[b.step for b in self.held]})")
            result, fresh = self._pass(batch, generate)
            passes.append(result)
            trained = batch or (fresh if not self.buffers else None)
            if trained is not None:
                return self._combined(result, trained, passes[:-1])

    def _admissible(self, step: int) -> HeldBatch | None:
        """The oldest held batch, when the buffers admit it for `step`'s update."""
        if not self.held:
            return None
        batch = self.held[0]
        if batch.step != step:
            raise RuntimeError(f"the buffers hold the batch of step {batch.step} at step "
                               f"{step}")
        trained = step - 1  # updates so far: the version the update starts from
        oldest = min((v for v in batch.versions if v >= 0), default=None)
        bound = min(b.buffer.max_staleness for b in self.buffers)
        if oldest is not None and oldest < trained - bound:
            raise StaleBatchError(
                f"buffer '{self.buffers[0].name}': the batch of step {step} holds rows of "
                f"policy_version {oldest}, more than {bound} update(s) behind the trained "
                f"version {trained}")
        self.held.popleft()
        return batch

    def _pass(self, batch: HeldBatch | None, generate: bool):
        """One scheduler pass: the train side on `batch` (if any), the rollout side on
        fresh draws (if `generate`); the fresh batch goes into the buffers."""
        skip = (frozenset() if generate else self.rollout_side) | \
            (frozenset() if batch is not None or not self.buffers else self.train_side)
        feeds, state = dict(batch.outputs) if batch is not None else {}, None
        if generate:
            state = self.loader.state_dict()
            feeds.update({s: self.loader.next_batch() for s in self.sources})
            self.drawn += 1
        result = self.runtime.run_step(feeds, plan=self.plan, skip=skip,
                                       draw=lambda source: self.loader.next_batch())
        fresh = self._keep(result, state) if generate else None
        return result, fresh

    def _keep(self, result: StepResult, state: dict) -> HeldBatch:
        if not self.buffers:  # synchronous: trained in the pass that made it
            return HeldBatch(self.drawn, {}, {}, {}, {}, state)
        producers = {b.name: _handle(result, b.buffer.producer) for b in self.buffers}
        versions = next((o.versions for o in producers.values() if o.versions), {})
        names = [n for n in self.rollout_side if n in result.node_metrics]
        batch = HeldBatch(self.drawn, producers, dict(versions),
                          {n: result.node_metrics[n] for n in names},
                          {n: result.rows.get(n, 0) for n in self.rollout_side
                           if n in result.rows}, state)
        self.held.append(batch)
        return batch

    # ---------------------------------------------------------------- results
    def _combined(self, result: StepResult, batch: HeldBatch, earlier: list) -> StepResult:
        """The step's result as a synchronous step reports it: the rollout side's
        metrics of the batch trained (from when it was generated), the train side's of
        this pass; timings and the timeline of this pass and of earlier ones."""
        if not self.buffers:
            return result
        node_metrics = {}
        for node in self.plan.nodes:
            source = batch.node_metrics if node.name in self.rollout_side \
                else result.node_metrics
            if node.name in source:
                node_metrics[node.name] = source[node.name]
        merged = {}
        for metrics in node_metrics.values():
            merged.update(metrics)
        extra = {k: v for k, v in result.metrics.items()
                 if k.startswith((TIMING_PREFIX, RUNTIME_PREFIX))}
        for run in earlier:
            for key, value in run.metrics.items():
                if key.startswith(TIMING_PREFIX):
                    extra[key] = extra.get(key, 0.0) + value
        merged.update(extra)
        merged.update(self._staleness(batch, node_metrics))
        timeline = [e for run in earlier for e in run.timeline] + result.timeline
        return StepResult(outputs=result.outputs, metrics=merged, node_metrics=node_metrics,
                          rows={**result.rows, **batch.rows}, timeline=timeline,
                          driver_bytes=result.driver_bytes + sum(r.driver_bytes
                                                                 for r in earlier))

    def _staleness(self, batch: HeldBatch, node_metrics: dict) -> dict:
        """Updates between the weights that sampled the batch's rows (their
        `policy_version`s) and those trained (`<role>/trained_version`)."""
        trained = [v for n, m in node_metrics.items() if self.plan.node(n).kind.trains
                   for k, v in m.items() if k.endswith(TRAINED_VERSION_SUFFIX)]
        out = {"async/ahead": float(len(self.held))}
        rows = {v: c for v, c in batch.versions.items() if v >= 0}
        if trained and rows:
            top = max(trained)
            total = sum(rows.values())
            out["async/staleness/mean"] = float(sum((top - v) * c for v, c in rows.items())
                                                / total)
            out["async/staleness/max"] = float(top - min(rows))
        return out
