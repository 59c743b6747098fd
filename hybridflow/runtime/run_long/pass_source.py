"""The run scheduler's source of samples for a synchronous or pipelined plan: the
rollout side runs inside the passes (run_scheduler.py has the step loop).

A plan with BUFFER nodes (plan/async_split.py, `trainer.staleness = k >= 1`) has a
rollout side (upstream of the buffers) and a train side (what reads them). A pass is
one `runtime.run_step` over the plan with the sides that are not ready skipped:

- the rollout side runs while the buffers have room (fewer than k batches held once
  the one being trained leaves) and batches are left to draw (`trainer.steps`); its
  fresh batch joins the ledger as one unit (`batch<t>`, its outputs left on the
  workers), with the numbers of its rows' `policy_version`s;
- the train side is ready when the ledger releases the oldest batch (batches are
  trained in the order they were drawn), once the buffers are full (k held) or
  nothing is left to draw. Filling first is what makes it a pipeline k deep:
  releasing a batch as soon as one is held would train on fresher samples but never
  let the rollout run more than one batch ahead.

The first step of a run generates k batches first (a pass each), then every pass
trains batch t while generating t + k, and the last k steps only train. Within a pass
the weights a generation samples with change only after it (`PlanNode.after`), so
batch t is sampled with the weights after update max(0, t - k - 1) on both runtimes.
Without buffers (synchronous, capacity 0) a step is one pass with every node: the
step the loop always ran, bit for bit, its result as the pass made it.

State (only its methods change it): `ledger` (the buffer: one unit per held batch),
`held` (unit -> `HeldBatch`: each buffer's producer output left on the workers, the
rollout side's metrics and rows from when it ran), `drawn` (batches drawn). The
loader is drawn through the run scheduler's `Draws`, one draw a batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybridflow.core.kinds import Op
from hybridflow.plan.async_split import buffer_nodes, sides_of, staleness_of
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.runtime.common import StepResult
from hybridflow.runtime.run_long.draws import Draws
from hybridflow.runtime.run_long.stream_buffer import GroupBuffer, GroupStats

__all__ = ["PassSource", "HeldBatch", "StaleBatchError", "batch_stats"]


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


def batch_stats(versions: dict) -> GroupStats:
    """A batch's numbers from its rows' versions (rows of an unknown version, -1, are
    not counted: weights not loaded yet)."""
    known = {v: c for v, c in versions.items() if v >= 0}
    rows = sum(known.values())
    return GroupStats(rows, min(known, default=0), float(sum(v * c for v, c in known.items())),
                      0.0, 0.0, 0, 0)


def _handle(result: StepResult, name: str):
    outputs = result.outputs
    return outputs.handle(name) if hasattr(outputs, "handle") else outputs[name]


class PassSource:
    def __init__(self, runtime, plan: ExecutionPlan, loader, draws: Draws):
        self.runtime, self.plan, self.loader, self.draws = runtime, plan, loader, draws
        self.pass_plan = plan  # every pass runs the one plan
        self.k = staleness_of(plan)
        self.buffers = buffer_nodes(plan)
        self.synchronous = not self.buffers
        sides = sides_of(plan)
        self.train_side = frozenset(sides.train) | {b.name for b in self.buffers} \
            if sides else frozenset()
        self.rollout_side = frozenset(n.name for n in plan.nodes) - self.train_side
        self.sources = [n.name for n in plan.nodes if n.op is Op.SOURCE]
        self.ledger = GroupBuffer("batch")
        self.held: dict[str, HeldBatch] = {}
        self.drawn = 0
        self.taking: HeldBatch | None = None
        self.fresh: str | None = None  # the unit the pass under way draws

    @property
    def groups(self) -> int:
        """Prompts a batch holds (a test loader may not say: 1)."""
        return int(getattr(self.loader, "batch_size", 1))

    def resumed(self, step: int) -> None:
        self.ledger.clear()
        self.held.clear()
        self.drawn = step

    def begin(self, step: int) -> None:
        pass

    # ------------------------------------------------------------------ steps
    def ready(self, step: int, last_step: int, trained: int) -> list | None:
        """The oldest held batch, once the buffers are full (or nothing is left to
        draw) and the ledger admits it for `step`'s update."""
        full = self.ledger.held() >= self.k or self.drawn >= last_step
        if self.synchronous or not full or not self.ledger.held():
            return None
        taken, stale = self.ledger.take(1, trained, min(b.buffer.max_staleness
                                                        for b in self.buffers))
        if stale:
            self._refuse(step, trained, stale[0])
        ((unit, stats),) = taken
        batch = self.taking = self.held.pop(unit)
        if batch.step != step:
            raise RuntimeError(f"the buffers hold the batch of step {batch.step} at step "
                               f"{step}")
        return taken

    def _refuse(self, step: int, trained: int, unit: str) -> None:
        batch = self.held.pop(unit)
        oldest = min(v for v in batch.versions if v >= 0)
        bound = min(b.buffer.max_staleness for b in self.buffers)
        raise StaleBatchError(
            f"buffer '{self.buffers[0].name}': the batch of step {step} holds rows of "
            f"policy_version {oldest}, more than {bound} update(s) behind the trained "
            f"version {trained}")

    def generates(self, step: int, last_step: int) -> bool:
        room = self.ledger.held() < self.k or self.synchronous  # the trained one left
        return room and self.drawn < last_step

    def wait(self, step: int) -> None:
        raise RuntimeError(f"step {step}: nothing to train and nothing left to generate "
                           f"(held batches: {[b.step for b in self.held.values()]})")

    def feeds(self, taken, generate: bool) -> tuple[dict, frozenset, object]:
        """(the pass's feeds, the nodes it skips, how a gather draws more)."""
        skip = (frozenset() if generate else self.rollout_side) | \
            (frozenset() if taken is not None or self.synchronous else self.train_side)
        feeds = dict(self.taking.outputs) if taken is not None else {}
        if generate:
            self.drawn += 1
            self.fresh = f"batch{self.drawn}"
            self.draws.record(self.loader.state_dict(), [self.fresh])
            feeds.update({s: self.loader.next_batch() for s in self.sources})
        return feeds, skip, lambda source: self.loader.next_batch()

    def after_pass(self, result: StepResult, generate: bool) -> None:
        """The fresh batch joins the ledger (synchronous: it was trained in the pass)."""
        if not generate:
            return
        if self.synchronous:
            self.draws.consume([self.fresh])
            return
        producers = {b.name: _handle(result, b.buffer.producer) for b in self.buffers}
        versions = dict(next((o.versions for o in producers.values() if o.versions), {}))
        names = [n for n in self.rollout_side if n in result.node_metrics]
        self.held[self.fresh] = HeldBatch(
            self.drawn, producers, versions, {n: result.node_metrics[n] for n in names},
            {n: result.rows.get(n, 0) for n in self.rollout_side if n in result.rows})
        stats = batch_stats(versions)
        self.ledger.expect({self.fresh: stats.rows})
        self.ledger.add({self.fresh: stats})

    def trained(self, step: int, last_step: int, taken: list) -> None:
        self.draws.consume([unit for unit, _ in taken])

    # ---------------------------------------------------------------- results
    def rollout_parts(self, taken: list) -> tuple[dict, dict, dict, list, int]:
        """(rollout node -> its metrics, rollout node -> rows, extra metrics, extra
        timeline, extra driver bytes) of the batch trained: from when it was made."""
        batch = self.taking
        return batch.node_metrics, batch.rows, {}, [], 0

    def ahead(self) -> int:
        """Prompts drawn ahead of the step trained (groups)."""
        return len(self.held) * self.groups
