"""The run-long scheduler (hybridflow/runtime/run_long/run_scheduler.py) without workers: which
passes a step runs (the sides skipped, the buffers fed), what it holds between steps,
its admission rule, and the state a checkpoint gets. A recording runtime stands in for
the executors; the plan is the compiled async GRPO."""
from __future__ import annotations

import os

import pytest

from hybridflow.plan.async_split import BUFFER_PREFIX, sides_of
from hybridflow.program.assemble import prepare
from hybridflow.runtime.common import StepResult
from hybridflow.runtime.outputs import NodeOutput
from hybridflow.runtime.run_long.pass_source import batch_stats
from hybridflow.runtime.run_long.run_scheduler import RunScheduler, StaleBatchError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATE = "rollout.generate"


def async_plan(k: int):
    return prepare(os.path.join(REPO, "graphs", "grpo.py"),
                   [f"trainer.staleness={k}", "trainer.allow_uncorrected_async=true"],
                   preflight=False).plan


class Loader:
    """Counts the batches drawn; its state is that count."""

    def __init__(self):
        self.drawn = 0

    def next_batch(self):
        self.drawn += 1
        return self.drawn

    def state_dict(self):
        return {"drawn": self.drawn}

    def load_state_dict(self, state):
        self.drawn = state["drawn"]


class Recording:
    """A runtime that records each pass and makes every node it runs: the generation's
    rows carry the version of the updates run so far."""

    def __init__(self, plan):
        self.plan, self.passes, self.updates = plan, [], 0

    def run_step(self, feeds, plan, skip, draw):
        ran = [n.name for n in plan.nodes if n.name not in skip]
        self.passes.append({"ran": ran, "feeds": dict(feeds)})
        result = StepResult(outputs={})
        for name in ran:
            fed = feeds.get(name)
            out = fed if isinstance(fed, NodeOutput) else NodeOutput(name, [], [], name, rows=[8])
            if name == GENERATE:
                out.versions = {self.updates: 8}
                out.metrics = {"drawn": feeds["prompts"]}
            result.outputs[name] = out
            result.node_metrics[name] = dict(out.metrics)
        if "actor.update" in ran:
            result.node_metrics["actor.update"] = {"actor/trained_version": self.updates}
            self.updates += 1
        return result


def run(k: int, steps: int):
    plan = async_plan(k)
    runtime, loader = Recording(plan), Loader()
    scheduler = RunScheduler(runtime, plan, loader)
    results = [scheduler.step(s, steps) for s in range(1, steps + 1)]
    return scheduler, runtime, results


@pytest.mark.parametrize("k", [1, 2])
def test_a_step_runs_the_passes_that_are_ready(k):
    scheduler, runtime, results = run(k, steps=5)
    sides = sides_of(scheduler.plan)
    kinds = []
    for p in runtime.passes:
        ran = set(p["ran"])
        kinds.append(("gen" if GENERATE in ran else "") + ("+train" if "actor.update" in ran
                                                           else ""))
        assert ran & set(sides.rollout) in (set(), set(sides.rollout))  # a side whole
    # the first step fills the buffers (k passes), then trains while generating; the
    # last k steps have nothing left to draw
    assert kinds == ["gen"] * k + ["gen+train"] * (5 - k) + ["+train"] * k
    assert [p["feeds"].get("prompts") for p in runtime.passes if GENERATE in p["ran"]] == \
        [1, 2, 3, 4, 5]
    for step, result in enumerate(results, start=1):  # each trains its own batch
        assert result.node_metrics[GENERATE]["drawn"] == step
        assert result.metrics["async/staleness/max"] == min(step - 1, k)
        assert result.metrics["async/ahead"] == min(k, 5 - step)
    trained = [p for p in runtime.passes if "actor.update" in p["ran"]]
    assert all(BUFFER_PREFIX + GENERATE in p["feeds"] for p in trained)


def test_synchronous_is_one_pass_a_step_with_every_node():
    plan = prepare(os.path.join(REPO, "graphs", "grpo.py"), [], preflight=False).plan
    runtime, loader = Recording(plan), Loader()
    scheduler = RunScheduler(runtime, plan, loader)
    for step in (1, 2, 3):
        result = scheduler.step(step, 3)
        assert result.metrics == {} and not scheduler.source.held  # the pass's own result
    assert [p["ran"] for p in runtime.passes] == [[n.name for n in plan.nodes]] * 3


def test_a_checkpoint_gets_the_loader_before_the_oldest_held_batch():
    plan = async_plan(2)
    runtime, loader = Recording(plan), Loader()
    scheduler = RunScheduler(runtime, plan, loader)
    scheduler.step(1, 6)
    scheduler.step(2, 6)
    assert [b.step for b in scheduler.source.held.values()] == [3, 4] and loader.drawn == 4
    # batches 3, 4 re-drawn; a pipeline consumes in order: nothing to skip
    assert scheduler.state_dict() == {"loader": {"drawn": 2}, "stream_skip": []}
    scheduler.load_state_dict(scheduler.state_dict(), step=2)
    assert not scheduler.source.held and scheduler.source.drawn == 2 and loader.drawn == 2
    scheduler.step(3, 6)  # refills: batches 3 and 4 again, then trains 3 with 5 drawn
    assert [p["feeds"].get("prompts") for p in runtime.passes[-3:]] == [3, 4, 5]


def test_a_batch_older_than_the_bound_is_refused_naming_the_buffer():
    plan = async_plan(1)
    runtime, loader = Recording(plan), Loader()
    scheduler = RunScheduler(runtime, plan, loader)
    scheduler.step(1, 5)
    scheduler.step(2, 5)
    (unit, held), = scheduler.source.held.items()
    assert held.versions == {1: 8}  # batch 3, after update 1: admissible
    held.versions = {0: 6, 1: 2}  # as if some rows were sampled earlier
    scheduler.ledger.whole[unit] = batch_stats(held.versions)
    with pytest.raises(StaleBatchError, match=r"buffer 'buffer/rollout.generate'.*step 3 "
                                              r"holds rows of policy_version 0, more than 1"):
        scheduler.step(3, 5)
