"""Async runs from tests, pipelined (`trainer.staleness=k`) and streaming
(`trainer.async_mode=streaming`, the `STREAM` overrides): train a graph and record,
per step, the rows the update read, the step's metrics and, when streaming, the
prompts drawn and not yet trained; and what every streamed row must satisfy
(`check_rows`)."""
from __future__ import annotations

from typing import NamedTuple

from hybridflow.core.batch import Batch
from hybridflow.core.columns import TOKEN_VERSIONS
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.plan.async_split import BUFFER_PREFIX, buffer_nodes
from hybridflow.plan.streaming_split import is_streaming
from hybridflow.program.assemble import prepare
from hybridflow.run.loop import Trainer
from hybridflow.run.tracking import RunDir, new_run_dir
from tests.support.e2e import graph_file

UNCORRECTED = ("trainer.allow_uncorrected_async=true",)
SPLIT = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen")
STREAM = ("trainer.async_mode=streaming", "trainer.val_every=0", "data.batch_size=4",
          "rollout.n=4", "actor.mini_batch_size=16", "actor.micro_batch_size=16",
          # few slots, one decode step per look at the buffer: updates land mid-response
          "rollout.micro_batch_size=8", "rollout.stream_poll_steps=1")
KEYS = ("uid", "policy_version")  # recorded by default; streaming adds the per-token ones
STREAM_KEYS = (*KEYS, TOKEN_VERSIONS, "response_mask")


class StopAfter(Exception):
    pass


class Recorded(NamedTuple):
    """One step of a recorded run."""
    rows: Batch          # the recorded keys of the rows the update read
    metrics: dict
    pending: set         # streaming: prompts drawn and not trained after the step

    @property
    def uids(self) -> list:
        return list(self.rows["uid"])

    @property
    def versions(self) -> list[int]:
        return self.rows["policy_version"].tolist()


def update_rows_node(plan) -> str:
    """The node whose output the update reads as its samples: the generate node's, or
    a gather's of them; through its buffer when the plan has buffers."""
    samples = [n.name for n in plan.nodes if n.kind is NodeKind.GENERATE or n.op is Op.GATHER]
    return BUFFER_PREFIX + samples[-1] if buffer_nodes(plan) else samples[-1]


def run_recording(tmp_path, *overrides, graph="grpo", resume=None, stop_after=None,
                  keys=None):
    """Train; (trainer, {step: Recorded}) with the rows' `keys` (default `KEYS`, and
    `STREAM_KEYS` when streaming). The trainer keeps `timelines` (step -> every pass's
    timeline) and, when streaming, `filtered` (step -> uids the entrance filter of a
    graph with a gather dropped)."""
    loaded = prepare(graph_file(graph), [f"trainer.runs_dir={tmp_path}",
                                         "trainer.progress=false", *overrides])
    run = RunDir(resume) if resume else new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run, resume_from=resume)
    streaming = is_streaming(loaded.plan)
    name, keys = update_rows_node(loaded.plan), keys or (STREAM_KEYS if streaming else KEYS)
    seen, trainer.timelines, trainer.filtered = {}, {}, {}

    def record(step, metrics):
        trainer.timelines[step] = list(trainer.last_result.timeline)
        rows = trainer.runtime.fetch(trainer.last_result, name, keys)
        pending = set(trainer.scheduler.source.prompts) if streaming else set()
        seen[step] = Recorded(rows, metrics, pending)
        if streaming:
            trainer.filtered[step] = list(trainer.scheduler.source.last_filtered)
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


def trained_uids(seen: dict) -> list[str]:
    """Each step's groups, once per group, in step order."""
    return [u for step in sorted(seen) for u in dict.fromkeys(seen[step].rows["uid"])]


def check_rows(seen: dict, k: int, n: int = 4) -> None:
    """Per streamed sample and per token: what the admission rule and the engine
    promise."""
    for step, (rows, _, _) in seen.items():
        trained = step - 1  # updates before this step's
        pv, tv = rows["policy_version"], rows[TOKEN_VERSIONS]
        mask = rows["response_mask"].bool()
        assert ((pv >= trained - k) & (pv <= trained)).all(), (step, pv.tolist())
        for version, tokens, real in zip(pv.tolist(), tv, mask):
            sampled = tokens[real]
            assert sampled.min() == version  # a row's version: its oldest token's
            assert (sampled[1:] >= sampled[:-1]).all()  # new weights, never older ones
            assert (tokens[~real] == -1).all()
        counts = {u: list(rows["uid"]).count(u) for u in rows["uid"]}
        assert set(counts.values()) == {n}  # whole groups only
