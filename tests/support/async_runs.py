"""Async runs from tests: train a graph and record, per step, the rows the update read."""
from __future__ import annotations

from hybridflow.plan.async_split import BUFFER_PREFIX, buffer_nodes
from hybridflow.run.loop import Trainer
from hybridflow.program.assemble import prepare
from hybridflow.run.tracking import RunDir, new_run_dir
from tests.support.e2e import graph_file

UNCORRECTED = ("trainer.allow_uncorrected_async=true",)
SPLIT = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen")


class StopAfter(Exception):
    pass


def run_recording(tmp_path, *overrides, graph="grpo", resume=None, stop_after=None):
    """Train; per step, the `uid` and `policy_version` of the rows the update read."""
    loaded = prepare(graph_file(graph), [f"trainer.runs_dir={tmp_path}",
                                         "trainer.progress=false", *overrides])
    run = RunDir(resume) if resume else new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run, resume_from=resume)
    seen = {}
    # the samples the update reads: the generate node's, or a gather's of them
    samples = [n.name for n in loaded.plan.nodes if n.kind == "generate" or n.op == "gather"]
    name = BUFFER_PREFIX + samples[-1] if buffer_nodes(loaded.plan) else samples[-1]

    trainer.timelines = {}  # step -> its timeline (every pass of the step)

    def record(step, metrics):
        trainer.timelines[step] = list(trainer.last_result.timeline)
        rows = trainer.runtime.fetch(trainer.last_result, name, ("uid", "policy_version"))
        seen[step] = (list(rows["uid"]), rows["policy_version"].tolist(), metrics)
    fit_recording(trainer, record, stop_after)
    return trainer, seen


def fit_recording(trainer, record, stop_after=None) -> None:
    """Train with `record(step, metrics)` after each step, stopping (as a kill would,
    no final save) after step `stop_after`; the trainer is closed either way."""
    def on_step(step, metrics):
        record(step, metrics)
        if step == stop_after:
            raise StopAfter()
    try:
        trainer.fit(on_step=on_step)
    except StopAfter:
        pass
    finally:
        trainer.close()


def worker_order(timeline: list[dict], pool: str, rank: int = 0) -> list[str]:
    """The nodes one worker ran, in the order it started them."""
    return [e["node"] for e in sorted(timeline, key=lambda e: e["start"])
            if e["pool"] == pool and e["rank"] == rank]
