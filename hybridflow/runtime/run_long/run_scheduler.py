"""The run-long scheduler: one step loop over one buffer, in every mode.

State first (only this class and the sources it owns change it; workers never see
it):
- `draws` (draws.py): what was drawn from the loader and not consumed — the one
  checkpoint state, in every mode;
- the source's `ledger` (stream_buffer.py): the buffer, as units with their numbers
  (rows, oldest `policy_version`, sums), never their rows, and the one admission
  rule (`admits`: every row sampled by weights >= the trained version - k);
- the source: where samples come from — `PassSource` (pass_source.py: a node's output,
  made inside the passes; capacity 0 is the synchronous loop, bit for bit) or
  `StreamSource` (stream_source.py: a rollout engine generating continuously, its
  samples waiting on the rollout workers).

A step, "submit what is ready", until it has trained:
1. `ready`: the units the step trains, once the ledger admits them (a pipeline
   releases its oldest batch when full; a stream, `data.batch_size` whole groups,
   after topping up the prompts in flight and generating stale groups again);
2. `generates`: whether this pass also runs the rollout side (pipelined: while the
   buffers have room and batches are left to draw);
3. neither: `wait` (a stream polls its engine; a pipeline has nothing to wait for:
   an error);
4. a pass (`runtime.run_step`) with the feeds the source gives (the taken units'
   rows, left on the workers, and fresh draws) and the sides not ready skipped;
5. `after_pass` (a fresh batch joins the ledger), `trained` (its prompts consumed).

One result assembly (`_result`): the rollout side's node metrics of the units trained
(from when they were made, or from the stream's numbers), the train side's of this
pass, in plan order; timings of every pass of the step; one definition of staleness
(`async/staleness/mean|max`: the trained version, step - 1, minus the rows'
`policy_version`; `token_mean` and `async/mixed_version_rows` where rows carry
per-token versions) and of `async/ahead` (prompts drawn and not trained beyond this
step's: groups). A synchronous plan returns its one pass's result as it is.

Checkpoints ask `state_dict()` (draws.py): the loader before the oldest draw not
consumed and what a resume must not draw again; `load_state_dict` empties the buffer:
no prompt is lost or trained twice.
"""
from __future__ import annotations


from hybridflow.core.metric_names import RUNTIME_PREFIX, TIMING_PREFIX
from hybridflow.plan.async_split import staleness_of
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.plan.streaming_split import is_streaming
from hybridflow.runtime.common import StepResult
from hybridflow.runtime.run_long.draws import Draws
from hybridflow.runtime.run_long.pass_source import HeldBatch, PassSource, StaleBatchError
from hybridflow.runtime.run_long.stream_source import StreamSource

__all__ = ["RunScheduler", "HeldBatch", "StaleBatchError", "make_run_scheduler"]


def make_run_scheduler(runtime, plan: ExecutionPlan, loader):
    """The run-long scheduler of `plan` (one for every mode)."""
    return RunScheduler(runtime, plan, loader)


class RunScheduler:
    def __init__(self, runtime, plan: ExecutionPlan, loader, background: bool | None = None):
        """`background`: whether a stream's engine loop runs on the rollout worker's own
        thread (default: on Ray with the rollout in a process of its own)."""
        self.runtime, self.plan, self.loader = runtime, plan, loader
        self.draws = Draws(loader)
        self.k = staleness_of(plan)  # the buffer's capacity: 0 is the synchronous loop
        self.source = StreamSource(runtime, plan, loader, self.draws, background) \
            if is_streaming(plan) else PassSource(runtime, plan, loader, self.draws)

    @property
    def ledger(self):
        return self.source.ledger

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return self.draws.state_dict()

    def load_state_dict(self, state: dict, step: int) -> None:
        """Resume after `step`: the loader restored, the buffer empty."""
        self.draws.load_state_dict(state)
        self.source.resumed(step)

    # ------------------------------------------------------------------ steps
    def step(self, step: int, last_step: int) -> StepResult:
        """Passes until step `step` has trained; its result as one step's."""
        trained, source, passes = step - 1, self.source, []
        source.begin(step)
        while True:
            taken = source.ready(step, last_step, trained)
            generate = source.generates(step, last_step)
            if taken is None and not generate:
                source.wait(step)
                continue
            feeds, skip, draw = source.feeds(taken, generate)
            result = self.runtime.run_step(feeds, plan=source.pass_plan, skip=skip, draw=draw)
            passes.append(result)
            source.after_pass(result, generate)
            if taken is None and source.synchronous:
                return result  # capacity 0: the pass trained what it made
            if taken is not None:
                source.trained(step, last_step, taken)
                return self._result(result, passes[:-1], taken, trained)

    # ---------------------------------------------------------------- results
    def _result(self, result: StepResult, earlier: list, taken: list,
                trained: int) -> StepResult:
        """The step's result as a synchronous step reports it (see the docstring)."""
        rollout, rows, extra, timeline, driver_bytes = self.source.rollout_parts(taken)
        side = self.source.rollout_side
        node_metrics = {}
        for node in self.plan.nodes:
            source = rollout if node.name in side else result.node_metrics
            if node.name in source:
                node_metrics[node.name] = source[node.name]
        merged = {}
        for metrics in node_metrics.values():
            merged.update(metrics)
        merged.update({k: v for k, v in result.metrics.items()
                       if k.startswith((TIMING_PREFIX, RUNTIME_PREFIX))})
        for run in earlier:
            for key, value in run.metrics.items():
                if key.startswith(TIMING_PREFIX):
                    merged[key] = merged.get(key, 0.0) + value
        merged.update(extra)
        merged.update(staleness([stats for _, stats in taken], trained))
        merged["async/ahead"] = float(self.source.ahead())
        timeline = sorted([e for run in earlier for e in run.timeline] + result.timeline
                          + timeline, key=lambda e: e["start"])
        return StepResult(outputs=result.outputs, metrics=merged, node_metrics=node_metrics,
                          rows={**result.rows, **rows}, timeline=timeline,
                          driver_bytes=result.driver_bytes + driver_bytes
                          + sum(r.driver_bytes for r in earlier))


def staleness(units: list, trained: int) -> dict:
    """Updates between the weights that sampled the trained rows (their
    `policy_version`s, from the units' numbers) and the trained version."""
    rows = sum(u.rows for u in units)
    if not rows:
        return {}
    out = {"async/staleness/mean": float(trained - sum(u.version_sum for u in units) / rows),
           "async/staleness/max": float(trained - min(u.min_version for u in units if u.rows))}
    tokens = sum(u.tokens for u in units)
    if tokens:  # rows that carry per-token versions (streamed ones)
        out["async/staleness/token_mean"] = float(
            trained - sum(u.token_version_sum for u in units) / tokens)
        out["async/mixed_version_rows"] = sum(u.mixed_rows for u in units) / rows
    return out
